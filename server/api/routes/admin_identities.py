"""/admin/personas/{persona}/identities: inspect identities and operate on their state.

Reads (detail, turns, history, diff, export, imprint, plot) hold nothing; changes (import, reset, rollback,
clean-up, forgetting a span of the imprint) go through the identity's hold, so they are serial with the identity's
turns (409 if it stays busy). The counterfactual runs the model on two states in one inference slot and writes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Path, Query, Request, Response, status

from server.api.admin_schemas import (
    MAX_INT,
    Cleanup,
    CleanupRequest,
    Counterfactual,
    CounterfactualReply,
    CounterfactualRequest,
    Diff,
    History,
    IdentityDetail,
    IdentityList,
    IdentitySummary,
    ImprintView,
    ResetRequest,
    RollbackRequest,
    Snapshot,
    SnapshotCreate,
    SnapshotList,
    StateVersion,
    TurnList,
    Version,
    identity_detail,
    imprint_view,
    state_diff,
    summary_fields,
    turn_view,
)
from server.api.bodies import OCTET_STREAM_BODY, check_limits
from server.api.deps import IdentitiesDep, SettingsDep, TurnServiceDep
from server.api.errors import ApiError
from server.api.schemas import Usage
from server.runtime.identities import Identities
from server.runtime.turns import CounterfactualSide
from sia.identity.state import StateFormatError

router = APIRouter(prefix="/personas/{persona}/identities")

Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many items")]
Offset = Annotated[int, Query(ge=0, le=MAX_INT, description="skip this many items")]
SpanIndex = Annotated[int, Path(ge=0, le=MAX_INT, description="the span's index in the current imprint")]
OCTET_STREAM: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "safetensors bytes of the state"}
}
PNG: dict[int | str, dict[str, Any]] = {200: {"content": {"image/png": {}}, "description": "the identity's figure"}}


@router.get("")
def list_identities(persona: str, identities: IdentitiesDep, limit: Limit = 100, offset: Offset = 0) -> IdentityList:
    """The persona's identities ordered by user id (404 for an unknown persona)."""
    page = identities.list_identities(persona, limit=limit, offset=offset)
    return IdentityList(
        persona=persona,
        total=page.total,
        limit=limit,
        offset=offset,
        data=[IdentitySummary(**summary_fields(r)) for r in page.items],
    )


@router.get("/{user}")
def get_identity(
    persona: str,
    user: str,
    identities: IdentitiesDep,
    version: Annotated[int | None, Query(ge=1, le=MAX_INT, description="a retained version instead of the current state")] = None,
) -> IdentityDetail:
    """Counters, shock statistics, the self state and the spectra of the trace per layer and head."""
    return identity_detail(identities.inspect(persona, user, version))


@router.get("/{user}/turns")
def list_turns(persona: str, user: str, identities: IdentitiesDep, limit: Limit = 100, offset: Offset = 0) -> TurnList:
    """The identity's turn records, oldest first."""
    page = identities.list_turns(persona, user, limit=limit, offset=offset)
    return TurnList(total=page.total, limit=limit, offset=offset, data=[turn_view(t) for t in page.items])


@router.get("/{user}/plot.png", response_class=Response, responses=PNG)
def plot(persona: str, user: str, identities: IdentitiesDep) -> Response:
    """Eigenvalue heatmap of the current trace, trace norms and self state over the retained versions, shocks."""
    return Response(identities.figure(persona, user), media_type="image/png", headers={"Cache-Control": "no-store"})


# --- state ---------------------------------------------------------------------------------------------------


@router.get("/{user}/state", response_class=Response, responses=OCTET_STREAM)
def export_state(
    persona: str,
    user: str,
    identities: IdentitiesDep,
    version: Annotated[int | None, Query(ge=1, le=MAX_INT, description="a retained version instead of the current state")] = None,
) -> Response:
    """The state as safetensors bytes; the version travels in the X-SIA-State-Version header."""
    state_version, data = identities.export_state(persona, user, version)
    return Response(
        data,
        media_type="application/octet-stream",
        headers={
            "X-SIA-State-Version": str(state_version),
            "Content-Disposition": f'attachment; filename="state-v{state_version}.safetensors"',
        },
    )


def _import(identities: Identities, persona: str, user: str, blob: bytes) -> int:
    try:
        return identities.import_state(persona, user, blob)
    except StateFormatError as exc:
        raise ApiError(422, f"body: not a usable identity state for this model: {exc}", code="invalid_state") from exc


@router.put("/{user}/state", openapi_extra=OCTET_STREAM_BODY)
async def import_state(persona: str, user: str, request: Request, identities: IdentitiesDep) -> StateVersion:
    """Replace the state with raw safetensors bytes (validated; 422 if unusable), creating the identity if needed."""
    blob = await request.body()
    return StateVersion(version=await anyio.to_thread.run_sync(_import, identities, persona, user, blob))


@router.post("/{user}/reset")
def reset(persona: str, user: str, identities: IdentitiesDep, body: ResetRequest | None = None) -> StateVersion:
    """No body: a fresh identity from the persona. {"layers": [...]}: those traces only. {"self_only": true}: s only.

    The turn records stay; 400 for a layer index this model does not have.
    """
    body = body or ResetRequest()
    return StateVersion(version=identities.reset(persona, user, layers=body.layers, self_only=body.self_only))


@router.get("/{user}/history")
def history(persona: str, user: str, identities: IdentitiesDep) -> History:
    """The retained versions, newest first (settings.history_retention of them, plus up to 7 before pruning)."""
    retained = identities.history(persona, user)
    return History(current=retained.current, data=[Version(**vars(v)) for v in retained.versions])


@router.get("/{user}/diff")
def diff(
    persona: str,
    user: str,
    identities: IdentitiesDep,
    a: Annotated[int, Query(ge=1, le=MAX_INT, description="the earlier version")],
    b: Annotated[int | None, Query(ge=1, le=MAX_INT, description="the later version; the current one if left out")] = None,
) -> Diff:
    """Per layer and head ||T_b - T_a||_F, and ||s_b - s_a||, between two retained versions."""
    return state_diff(identities.diff(persona, user, a, b))


@router.get("/{user}/imprint")
def imprint(
    persona: str,
    user: str,
    identities: IdentitiesDep,
    version: Annotated[int | None, Query(ge=1, le=MAX_INT, description="a retained version instead of the current state")] = None,
) -> ImprintView:
    """The spans of the imprint (the user's own words the identity keeps), with their text where it was kept."""
    return imprint_view(identities.imprint(persona, user, version))


@router.delete("/{user}/imprint/{index}")
def forget(persona: str, user: str, index: SpanIndex, identities: IdentitiesDep) -> ImprintView:
    """Forget one span of the imprint, as a new version (a roll back undoes it); returns the imprint after it.

    404 for an index the imprint does not have.
    """
    return imprint_view(identities.forget(persona, user, index))


@router.post("/{user}/rollback")
def rollback(persona: str, user: str, body: RollbackRequest, identities: IdentitiesDep) -> StateVersion:
    """Make a retained version or a named snapshot current again, as a new version."""
    return StateVersion(version=identities.rollback(persona, user, version=body.version, snapshot=body.snapshot))


@router.post("/{user}/snapshots", status_code=status.HTTP_201_CREATED)
def create_snapshot(persona: str, user: str, body: SnapshotCreate, identities: IdentitiesDep) -> Snapshot:
    """Name the current state (or a retained version); kept until deleted. 409 if the name is taken."""
    return Snapshot(**vars(identities.create_snapshot(persona, user, body.name, body.version)))


@router.get("/{user}/snapshots")
def list_snapshots(persona: str, user: str, identities: IdentitiesDep) -> SnapshotList:
    return SnapshotList(data=[Snapshot(**vars(s)) for s in identities.list_snapshots(persona, user)])


@router.delete("/{user}/snapshots/{name}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
def delete_snapshot(persona: str, user: str, name: str, identities: IdentitiesDep) -> None:
    identities.delete_snapshot(persona, user, name)


@router.post("/{user}/cleanup")
def cleanup(persona: str, user: str, identities: IdentitiesDep, body: CleanupRequest | None = None) -> Cleanup:
    """Keep, per layer and head, the fewest singular components of T holding ``energy`` of ||T||_F^2."""
    body = body or CleanupRequest()
    version, report = identities.cleanup(persona, user, body.energy)
    return Cleanup(version=version, ranks=report.ranks.tolist(), energy_kept=report.energy_kept.tolist())


# --- counterfactual ------------------------------------------------------------------------------------------


def _reply(r: CounterfactualSide) -> CounterfactualReply:
    return CounterfactualReply(
        state_version=r.version,
        reply=r.reply,
        finish_reason=r.finish_reason,
        shock=r.shock,
        nll=r.nll,
        usage=Usage.of(r.prompt_tokens, r.completion_tokens),
    )


@router.post("/{user}/counterfactual")
async def counterfactual(
    persona: str, user: str, body: CounterfactualRequest, turns: TurnServiceDep, settings: SettingsDep
) -> Counterfactual:
    """The reply of the current state beside the reply of the persona's initial state (``"against": "reset"``)
    or of a retained version, with the same seed. Nothing is written: no turn, no new version."""
    check_limits(settings, body.message, body.max_tokens)
    against = None if body.against == "reset" else body.against.version
    result = await turns.counterfactual(persona, user, body.message, body.sampling(), against=against)
    return Counterfactual(
        seed=result.seed,
        current=_reply(result.current),
        other=_reply(result.other),
        same=result.current.reply == result.other.reply,
    )
