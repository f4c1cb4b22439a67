"""A state as the store keeps it: ``encode`` makes the blob and its column figures, ``decode`` parses a stored
blob back, and a blob that does not parse is a CorruptStateError (never silently re-initialised)."""

from __future__ import annotations

from server.errors import CorruptStateError
from server.records import Blob
from sia.identity.state import IdentityState, StateFormatError, state_from_bytes, state_to_bytes
from sia.model.config import AnyConfig

__all__ = ["decode", "encode"]


def encode(state: IdentityState) -> Blob:
    """The blob and the column figures the store keeps beside it."""
    s = state.shock
    return Blob(state_to_bytes(state), state.format_version, s.count, s.mean, s.m2)


def decode(blob: bytes, config: AnyConfig, what: str) -> IdentityState:
    """The stored state ``what`` (named in the error) parsed and validated against ``config``."""
    try:
        return state_from_bytes(blob, config)
    except StateFormatError as exc:
        raise CorruptStateError(f"the stored state of {what} is unusable: {exc}") from exc
