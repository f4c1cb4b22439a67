"""API keys: created and revoked from the command line, stored hashed, checked on every request.

An admin key may do everything. A user key is bound to one user id: it can talk to any persona, but only as
that user, and cannot reach /admin. With no active key at all the service runs in development mode: no key
is asked for, and ``sia serve`` binds 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from server.records import ApiKey
from server.store import Store

__all__ = ["KEY_PREFIX", "KeyRing", "Principal", "Role"]

KEY_PREFIX = "sia_"
Role = Literal["admin", "user"]


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: an admin, a user bound to ``user_id``, or anyone (development mode)."""

    role: Literal["admin", "user", "dev"]
    user_id: str | None = None
    key_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.role in ("admin", "dev")

    def may_act_as(self, user_id: str) -> bool:
        return self.role != "user" or self.user_id == user_id


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """API keys in the store's database. ``dev_mode`` is cached for ``cache_s`` to spare a query per request."""

    def __init__(self, store: Store, cache_s: float = 2.0) -> None:
        self.store = store
        self.cache_s = cache_s
        self._active: tuple[float, int] | None = None

    def create(self, role: Role, *, user_id: str | None = None, name: str = "") -> tuple[ApiKey, str]:
        """A new key; returns its record and the key itself, which is not stored and cannot be shown again."""
        if role not in ("admin", "user"):
            raise ValueError(f"role must be 'admin' or 'user'; got {role!r}")
        if (role == "user") != (user_id is not None):
            raise ValueError("a user key needs exactly one user id; an admin key takes none")
        if user_id is not None and not (0 < len(user_id) <= 256 and user_id.isprintable()):
            raise ValueError("user must be 1 to 256 printable characters")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        record = self.store.create_api_key(name=name[:128], role=role, user_id=user_id, key_hash=_hash(key), prefix=key[:10])
        self._active = None
        return record, key

    def list(self) -> list[ApiKey]:
        return self.store.list_api_keys()

    def revoke(self, key_id: int) -> ApiKey:
        record = self.store.revoke_api_key(key_id)
        self._active = None
        return record

    def active_count(self) -> int:
        now = time.monotonic()
        if self._active is None or now - self._active[0] > self.cache_s:
            self._active = (now, self.store.count_active_api_keys())
        return self._active[1]

    def dev_mode(self) -> bool:
        return self.active_count() == 0

    def verify(self, key: str) -> Principal | None:
        """The principal an active key stands for, or None."""
        if not key.startswith(KEY_PREFIX) or len(key) > 128:
            return None
        record = self.store.active_api_key(_hash(key))
        if record is None:
            return None
        role: Literal["admin", "user"] = "admin" if record.role == "admin" else "user"
        return Principal(role=role, user_id=record.user_id, key_id=record.id)
