"""API keys: created and revoked from the command line, stored hashed, checked on every request.

An admin key may do everything. A user key is bound to one user id: it can talk to any persona, but only as
that user, and cannot reach /admin. With no active key at all the service runs in development mode: no key
is asked for, and ``sia serve`` binds 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import func, select, update

from server.db.tables import ApiKeyRow, utcnow
from server.errors import NotFoundError
from server.store import Store

__all__ = ["KEY_PREFIX", "ApiKey", "KeyRing", "Principal"]

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


@dataclass(frozen=True)
class ApiKey:
    id: int
    name: str
    role: str
    user_id: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


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
        row = ApiKeyRow(name=name[:128], role=role, user_id=user_id, key_hash=_hash(key), prefix=key[:10])
        with self.store.transaction() as s:
            s.add(row)
            s.flush()
            record = _key(row)
        self._active = None
        return record, key

    def list(self) -> list[ApiKey]:
        with self.store.transaction(read_only=True) as s:
            return [_key(r) for r in s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id))]

    def revoke(self, key_id: int) -> ApiKey:
        with self.store.transaction() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                raise NotFoundError(f"no API key with id {key_id}")
            if row.revoked_at is None:
                s.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id).values(revoked_at=utcnow()))
                s.refresh(row)
            record = _key(row)
        self._active = None
        return record

    def active_count(self) -> int:
        now = time.monotonic()
        if self._active is None or now - self._active[0] > self.cache_s:
            with self.store.transaction(read_only=True) as s:
                count = s.scalar(select(func.count()).select_from(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None)))
            self._active = (now, int(count or 0))
        return self._active[1]

    def dev_mode(self) -> bool:
        return self.active_count() == 0

    def verify(self, key: str) -> Principal | None:
        """The principal an active key stands for, or None."""
        if not key.startswith(KEY_PREFIX) or len(key) > 128:
            return None
        digest = _hash(key)
        with self.store.transaction(read_only=True) as s:
            row = s.scalar(select(ApiKeyRow).where(ApiKeyRow.key_hash == digest, ApiKeyRow.revoked_at.is_(None)))
            if row is None or not hmac.compare_digest(row.key_hash, digest):
                return None
            role: Literal["admin", "user"] = "admin" if row.role == "admin" else "user"
            return Principal(role=role, user_id=row.user_id, key_id=row.id)


def _key(row: ApiKeyRow) -> ApiKey:
    return ApiKey(row.id, row.name, row.role, row.user_id, row.prefix, row.created_at, row.revoked_at)
