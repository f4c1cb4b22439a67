"""Errors of the store and the runtime. The service maps each to one HTTP status."""

from __future__ import annotations

from sqlalchemy.exc import InterfaceError, OperationalError

__all__ = [
    "DATABASE_UNAVAILABLE",
    "BusyError",
    "ConflictError",
    "CorruptStateError",
    "NotFoundError",
    "OverloadedError",
    "StoreError",
]

# what the database driver raises when the database cannot be reached (HTTP 503); the service names these
# classes here so that nothing above the store imports SQLAlchemy
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


class StoreError(Exception):
    """Base class: something about stored identities or personas prevents the operation."""


class NotFoundError(StoreError, LookupError):
    """An unknown persona, identity, state version or snapshot (HTTP 404)."""


class ConflictError(StoreError):
    """The operation clashes with what is stored: a name already taken, or an identity that changed under a
    turn whose hold had expired (HTTP 409)."""


class BusyError(ConflictError):
    """Another turn holds the identity and did not let go within the bounded wait (HTTP 409, retry later)."""


class CorruptStateError(StoreError):
    """A stored state fails its checksum or does not parse; never silently re-initialised (HTTP 500 for that
    identity only; an admin can roll back, import or reset it)."""


class OverloadedError(Exception):
    """The service has as many turns waiting as it queues (``SIA_MAX_QUEUED_TURNS``); nothing was held or
    written (HTTP 503 with Retry-After: try again shortly)."""
