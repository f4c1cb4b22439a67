"""/admin/personas: create, list, read, update and delete personas, and set a persona's initial state."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter, Request, Response, status

from server.api.admin_schemas import Persona, PersonaCreate, PersonaList, PersonaUpdate
from server.api.deps import RuntimeDep
from server.api.errors import ApiError
from server.runtime import Runtime
from server.store import PERSONA_FIELDS, PersonaRecord
from sia.identity.state import StateFormatError

router = APIRouter(prefix="/personas")

OCTET_STREAM_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def persona_out(record: PersonaRecord) -> Persona:
    return Persona(
        **{name: getattr(record, name) for name in ("name", *PERSONA_FIELDS, "created_at", "updated_at")},
        has_initial_state=record.initial_state is not None,
    )


@router.post("", status_code=status.HTTP_201_CREATED)
def create_persona(body: PersonaCreate, runtime: RuntimeDep) -> Persona:
    """Create a persona; fields left out take their defaults. 409 if the name is taken."""
    values = body.model_dump(exclude={"name"}, exclude_none=True)
    runtime.validate_persona_values(values)
    return persona_out(runtime.store.create_persona(body.name, **values))


@router.get("")
def list_personas(runtime: RuntimeDep) -> PersonaList:
    return PersonaList(data=[persona_out(p) for p in runtime.store.list_personas()])


@router.get("/{persona}")
def get_persona(persona: str, runtime: RuntimeDep) -> Persona:
    return persona_out(runtime.store.get_persona(persona))


@router.patch("/{persona}")
def update_persona(persona: str, body: PersonaUpdate, runtime: RuntimeDep) -> Persona:
    """Change the fields sent; the result is validated as a whole before it is stored.

    Identities that exist keep their state; new rates and sampling defaults apply from their next turn.
    """
    changes = body.model_dump(exclude_unset=True)
    current = runtime.store.get_persona(persona)
    runtime.validate_persona_values({**{name: getattr(current, name) for name in PERSONA_FIELDS}, **changes})
    return persona_out(runtime.store.update_persona(persona, **changes))


@router.delete("/{persona}", status_code=status.HTTP_204_NO_CONTENT)
def delete_persona(persona: str, runtime: RuntimeDep) -> None:
    """Delete the persona with its identities, their turns, history and snapshots."""
    runtime.store.delete_persona(persona)


def _set_initial_state(runtime: Runtime, persona: str, blob: bytes) -> PersonaRecord:
    try:
        runtime.validate_persona_values({"initial_state": blob})
    except StateFormatError as exc:
        raise ApiError(422, f"body: not a usable identity state for this model: {exc}", code="invalid_state") from exc
    return runtime.store.update_persona(persona, initial_state=blob)


@router.put("/{persona}/initial-state", openapi_extra=OCTET_STREAM_BODY)
async def set_initial_state(persona: str, request: Request, runtime: RuntimeDep) -> Persona:
    """Raw safetensors bytes (as GET .../state exports them) that new identities of this persona start from.

    Validated against the loaded model (422 if unusable); existing identities are not changed.
    """
    blob = await request.body()
    return persona_out(await anyio.to_thread.run_sync(_set_initial_state, runtime, persona, blob))


@router.delete("/{persona}/initial-state", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
def clear_initial_state(persona: str, runtime: RuntimeDep) -> None:
    """New identities start from the zero state again."""
    runtime.store.update_persona(persona, initial_state=None)
