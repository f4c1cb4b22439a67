"""/admin/personas: create, list, read, update and delete personas, and set a persona's initial state."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter, Request, Response, status

from server.api.admin_schemas import Persona, PersonaCreate, PersonaList, PersonaUpdate
from server.api.bodies import OCTET_STREAM_BODY
from server.api.deps import PersonasDep
from server.api.errors import ApiError
from server.records import PERSONA_FIELDS, PersonaRecord
from server.runtime.personas import Personas
from sia.identity.state import StateFormatError

router = APIRouter(prefix="/personas")


def persona_out(record: PersonaRecord) -> Persona:
    return Persona(
        **{name: getattr(record, name) for name in ("name", *PERSONA_FIELDS, "created_at", "updated_at")},
        has_initial_state=record.initial_state is not None,
    )


@router.post("", status_code=status.HTTP_201_CREATED)
def create_persona(body: PersonaCreate, personas: PersonasDep) -> Persona:
    """Create a persona; fields left out take their defaults. 409 if the name is taken."""
    return persona_out(personas.create_persona(body.name, **body.model_dump(exclude={"name"}, exclude_none=True)))


@router.get("")
def list_personas(personas: PersonasDep) -> PersonaList:
    return PersonaList(data=[persona_out(p) for p in personas.list_personas()])


@router.get("/{persona}")
def get_persona(persona: str, personas: PersonasDep) -> Persona:
    return persona_out(personas.get_persona(persona))


@router.patch("/{persona}")
def update_persona(persona: str, body: PersonaUpdate, personas: PersonasDep) -> Persona:
    """Change the fields sent; the result is validated as a whole before it is stored.

    Identities that exist keep their state; new rates and sampling defaults apply from their next turn.
    """
    return persona_out(personas.update_persona(persona, **body.model_dump(exclude_unset=True)))


@router.delete("/{persona}", status_code=status.HTTP_204_NO_CONTENT)
def delete_persona(persona: str, personas: PersonasDep) -> None:
    """Delete the persona with its identities, their turns, history and snapshots."""
    personas.delete_persona(persona)


def _set_initial_state(personas: Personas, persona: str, blob: bytes) -> PersonaRecord:
    try:
        return personas.set_initial_state(persona, blob)
    except StateFormatError as exc:
        raise ApiError(422, f"body: not a usable identity state for this model: {exc}", code="invalid_state") from exc


@router.put("/{persona}/initial-state", openapi_extra=OCTET_STREAM_BODY)
async def set_initial_state(persona: str, request: Request, personas: PersonasDep) -> Persona:
    """Raw safetensors bytes (as GET .../state exports them) that new identities of this persona start from.

    Validated against the loaded model (422 if unusable); existing identities are not changed.
    """
    blob = await request.body()
    return persona_out(await anyio.to_thread.run_sync(_set_initial_state, personas, persona, blob))


@router.delete("/{persona}/initial-state", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
def clear_initial_state(persona: str, personas: PersonasDep) -> None:
    """New identities start from the zero state again."""
    personas.clear_initial_state(persona)
