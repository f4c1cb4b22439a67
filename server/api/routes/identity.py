"""/v1/personas/{persona}/identity: the caller's own identity (its state's numbers, turns, history, imprint).

A user key reads the identity of its own user (naming another is 403, as on chat); an admin key, or
development mode, names the user. The one change allowed here: a user may forget a span of their own words from
the imprint. Every other change to a state (reset, rollback, import, ...) stays under /admin.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from server.api.admin_schemas import (
    MAX_INT,
    History,
    IdentityDetail,
    ImprintView,
    TurnList,
    Version,
    identity_detail,
    imprint_view,
    turn_view,
)
from server.api.deps import CallerDep, IdentitiesDep, acting_user
from server.api.schemas import ERROR_RESPONSES

router = APIRouter(prefix="/v1/personas/{persona}/identity", tags=["identity"], responses=ERROR_RESPONSES)

User = Annotated[
    str | None,
    Query(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$", description="the user id; a user key's own if left out"),
]
Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many items")]
Offset = Annotated[int, Query(ge=0, le=MAX_INT, description="skip this many items")]
StateVersionQuery = Annotated[int | None, Query(ge=1, le=MAX_INT, description="a retained version instead of the current state")]


@router.get("")
def get_own_identity(
    persona: str,
    caller: CallerDep,
    identities: IdentitiesDep,
    user: User = None,
    version: StateVersionQuery = None,
) -> IdentityDetail:
    """Counters, shock statistics, the self state and the trace spectra of the caller's identity with this persona."""
    return identity_detail(identities.inspect(persona, acting_user(caller, user), version))


@router.get("/turns")
def list_own_turns(
    persona: str, caller: CallerDep, identities: IdentitiesDep, user: User = None, limit: Limit = 100, offset: Offset = 0
) -> TurnList:
    """The caller's turn records with this persona, oldest first."""
    page = identities.list_turns(persona, acting_user(caller, user), limit=limit, offset=offset)
    return TurnList(total=page.total, limit=limit, offset=offset, data=[turn_view(t) for t in page.items])


@router.get("/history")
def own_history(persona: str, caller: CallerDep, identities: IdentitiesDep, user: User = None) -> History:
    """The retained versions of the caller's state, newest first."""
    retained = identities.history(persona, acting_user(caller, user))
    return History(current=retained.current, data=[Version(**vars(v)) for v in retained.versions])


@router.get("/imprint")
def own_imprint(
    persona: str, caller: CallerDep, identities: IdentitiesDep, user: User = None, version: StateVersionQuery = None
) -> ImprintView:
    """The spans of the caller's imprint: their own words the identity keeps, with the text where it was kept."""
    return imprint_view(identities.imprint(persona, acting_user(caller, user), version))


@router.delete("/imprint/{index}")
def forget_own_span(
    persona: str,
    index: Annotated[int, Path(ge=0, le=MAX_INT, description="the span's index in the current imprint")],
    caller: CallerDep,
    identities: IdentitiesDep,
    user: User = None,
) -> ImprintView:
    """Forget one span of the caller's own words, as a new version (an admin's roll back undoes it); returns the
    imprint after it. 404 for an index the imprint does not have, 409 while the identity stays busy."""
    return imprint_view(identities.forget(persona, acting_user(caller, user), index))
