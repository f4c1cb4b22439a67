"""The identity store: personas, identities, their state history and API keys in SQL (SQLite or PostgreSQL).

Bytes in, bytes out: this module never parses a state blob (the runtime does); it checks each blob's sha256
on the way out, so a blob damaged at rest raises CorruptStateError instead of reaching the model.

Serial turns per identity
-------------------------
A turn holds its identity with a *lease*: a short transaction sets ``lease_token`` when the identity is free
(or its previous lease expired) and reads the state; inference then runs with no transaction open; a second
short transaction writes the new state, the turn and the history row, but only if the lease is still this
turn's and ``version`` is unchanged (the optimistic check), and clears the lease. A failed or abandoned turn
clears its lease and writes nothing. Waiters poll with backoff up to a bounded wait, then raise BusyError.
Within one process waiters are served first come, first served: they queue per identity and only the first
of them polls, so a turn that keeps arriving cannot overtake one that has waited longer (between processes
the poll decides). The same protocol works across threads, processes and hosts, on SQLite and PostgreSQL alike, and no write
lock is ever held during generation. A process killed mid-turn leaves a lease that expires after
``lease_s``; the stored state is the pre-turn state.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import Any, TypeVar

from sqlalchemy import Engine, delete, func, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from server.core.config import Settings
from server.db.engine import READ_ONLY, make_engine, make_sessionmaker
from server.db.tables import ApiKeyRow, IdentityRow, PersonaRow, SnapshotRow, StateVersionRow, TurnRow, utcnow
from server.errors import BusyError, ConflictError, CorruptStateError, NotFoundError
from server.records import (
    PERSONA_FIELDS,
    ApiKey,
    Blob,
    IdentityRecord,
    Lease,
    NewTurn,
    PersonaRecord,
    SnapshotRecord,
    TurnRecord,
    VersionRecord,
)

__all__ = ["PRUNE_EVERY", "SERVICE_FIELDS", "Store", "sha256"]

# a persona's fields that the service sets, not an admin: the state its new identities start from (set through its
# own route) and the release of the defaults it was last brought to
SERVICE_FIELDS = ("initial_state", "defaults_release")

PRUNE_EVERY = 8  # history is pruned on every 8th version: one statement fewer in most commits


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


R = TypeVar("R")


def _record(cls: type[R], row: object, **extra: Any) -> R:
    """A record dataclass filled from the row's attributes of the same names (plus ``extra``)."""
    names = [f.name for f in fields(cls) if f.name not in extra]  # type: ignore[arg-type]
    return cls(**{n: getattr(row, n) for n in names}, **extra)


# ---------------------------------------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------------------------------------


class Store:
    """Durable personas and identities. Thread-safe: every method runs its own short transaction."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.engine = engine or make_engine(settings)
        self._sessions = make_sessionmaker(self.engine)
        self._read_sessions = make_sessionmaker(self.engine.execution_options(**{READ_ONLY: True}))
        self._lines = WaitingLines()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self, *, read_only: bool = False) -> Iterator[Session]:
        """One short transaction; SQLite's 'database is locked' past its busy timeout becomes BusyError."""
        try:
            with (self._read_sessions if read_only else self._sessions).begin() as session:
                yield session
        except OperationalError as exc:
            if "database is locked" in str(exc):
                raise BusyError("the database stayed locked past its busy timeout; retry") from exc
            raise

    def schema_revision(self) -> str | None:
        """The migration revision the database is at. Raises whatever the driver raises when the database does
        not answer, or has no revision table yet."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        return None if revision is None else str(revision)

    # --- personas --------------------------------------------------------------------------------------

    def create_persona(self, name: str, **values: Any) -> PersonaRecord:
        unknown = set(values) - {*PERSONA_FIELDS, *SERVICE_FIELDS}
        if unknown:
            raise ValueError(f"unknown persona fields: {sorted(unknown)}")
        try:
            with self.transaction() as s:
                row = PersonaRow(name=name, **{k: v for k, v in values.items() if v is not None})  # None: the default
                s.add(row)
                s.flush()
                return _persona(row)
        except IntegrityError as exc:
            raise ConflictError(f"persona {name!r} already exists") from exc

    def get_persona(self, name: str) -> PersonaRecord:
        with self.transaction(read_only=True) as s:
            return _persona(self._persona_row(s, name))

    def list_personas(self) -> list[PersonaRecord]:
        with self.transaction(read_only=True) as s:
            return [_persona(r) for r in s.scalars(select(PersonaRow).order_by(PersonaRow.name))]

    def update_persona(self, name: str, **values: Any) -> PersonaRecord:
        unknown = set(values) - {*PERSONA_FIELDS, *SERVICE_FIELDS}
        if unknown:
            raise ValueError(f"unknown persona fields: {sorted(unknown)}")
        with self.transaction() as s:
            row = self._persona_row(s, name)
            for key, value in values.items():
                setattr(row, key, value)
            row.updated_at = utcnow()
            s.flush()
            return _persona(row)

    def delete_persona(self, name: str) -> None:
        """Delete a persona and, by cascade, its identities, turns, history and snapshots."""
        with self.transaction() as s:
            row = self._persona_row(s, name)
            s.execute(delete(PersonaRow).where(PersonaRow.id == row.id))

    @staticmethod
    def _persona_row(s: Session, name: str) -> PersonaRow:
        row = s.scalar(select(PersonaRow).where(PersonaRow.name == name))
        if row is None:
            raise NotFoundError(f"persona {name!r} does not exist")
        return row

    # --- identities ------------------------------------------------------------------------------------

    def _identity_row(self, s: Session, persona: str, user_id: str) -> IdentityRow:
        p = self._persona_row(s, persona)
        row = s.scalar(select(IdentityRow).where(IdentityRow.persona_id == p.id, IdentityRow.user_id == user_id))
        if row is None:
            raise NotFoundError(f"identity ({persona!r}, {user_id!r}) does not exist")
        return row

    def get_identity(self, persona: str, user_id: str) -> IdentityRecord:
        with self.transaction(read_only=True) as s:
            return _identity(self._identity_row(s, persona, user_id), persona)

    def list_identities(self, persona: str, *, limit: int = 100, offset: int = 0) -> list[IdentityRecord]:
        with self.transaction(read_only=True) as s:
            p = self._persona_row(s, persona)
            query = select(IdentityRow).where(IdentityRow.persona_id == p.id).order_by(IdentityRow.user_id)
            rows = s.scalars(query.limit(limit).offset(offset))
            return [_identity(r, persona) for r in rows]

    def count_identities(self, persona: str) -> int:
        with self.transaction(read_only=True) as s:
            p = self._persona_row(s, persona)
            return int(s.scalar(select(func.count()).select_from(IdentityRow).where(IdentityRow.persona_id == p.id)) or 0)

    def read_state(self, persona: str, user_id: str) -> tuple[int, bytes]:
        """(version, blob) of the current state, checksum verified."""
        with self.transaction(read_only=True) as s:
            row = self._identity_row(s, persona, user_id)
            return row.version, _verified(row.state, row.state_sha256, f"identity ({persona!r}, {user_id!r})")

    def _create_identity(self, persona: str, user_id: str, initial: Callable[[PersonaRecord], Blob]) -> None:
        """Insert the identity at version 1 from ``initial(persona)``; a concurrent creator winning is fine."""
        with self.transaction() as s:
            p = self._persona_row(s, persona)
            if s.scalar(select(IdentityRow.id).where(IdentityRow.persona_id == p.id, IdentityRow.user_id == user_id)):
                return
            blob = initial(_persona(p))
        try:
            with self.transaction() as s:
                row = IdentityRow(persona_id=p.id, user_id=user_id, version=1, turn_count=0, **_blob_columns(blob))
                s.add(row)
                s.flush()
                s.add(StateVersionRow(identity_id=row.id, version=1, reason="init", **_blob_ref(blob)))
        except IntegrityError:
            pass  # another turn created it first: use theirs

    # --- leases: one turn (or state operation) at a time per identity -----------------------------------

    def acquire(
        self,
        persona: str,
        user_id: str,
        *,
        create: Callable[[PersonaRecord], Blob] | None = None,
        timeout: float | None = None,
        verify: bool = True,
    ) -> Lease:
        """Hold (persona, user_id) for one turn; create it with ``create`` if it does not exist.

        Raises NotFoundError (unknown persona, or unknown identity and no ``create``), BusyError when another
        holder keeps it past ``timeout`` (default settings.busy_timeout_s), CorruptStateError for a damaged blob
        (the hold is released first). ``verify=False`` skips the checksum, for operations that replace the state
        wholesale (reset, rollback, import): they are how a damaged identity is repaired.
        """
        wait = self.settings.busy_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + wait
        busy = BusyError(f"identity ({persona!r}, {user_id!r}) is busy with another turn; retry later")
        token = str(uuid.uuid4())
        delay = 0.002
        with self._lines.first((persona, user_id), token, deadline, busy):
            while True:
                lease = self._try_acquire(persona, user_id, token, create, verify)
                if lease is not None:
                    return lease
                if time.monotonic() >= deadline:
                    raise busy
                time.sleep(min(delay * (0.5 + random.random()), max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, 0.05)

    def waiting(self, persona: str, user_id: str) -> int:
        """How many callers of this process are waiting for the identity right now."""
        return self._lines.length((persona, user_id))

    def _try_acquire(
        self, persona: str, user_id: str, token: str, create: Callable[[PersonaRecord], Blob] | None, verify: bool
    ) -> Lease | None:
        """The lease, or None while another holder has the identity."""
        try:
            found, lease = self._claim(persona, user_id, token, verify)
            if not found:
                if create is None:
                    raise NotFoundError(f"identity ({persona!r}, {user_id!r}) does not exist")
                self._create_identity(persona, user_id, create)
                found, lease = self._claim(persona, user_id, token, verify)
        except BusyError:
            return None  # SQLite's write lock timed out: keep waiting like any other busy case
        if not found:
            raise NotFoundError(f"identity ({persona!r}, {user_id!r}) was deleted while being created")
        return lease

    def _claim(self, persona: str, user_id: str, token: str, verify: bool) -> tuple[bool, Lease | None]:
        """(whether the identity exists, the lease if it was free). A damaged blob releases and raises.

        Two statements on the fast path: the persona, then a conditional UPDATE ... RETURNING that takes the
        hold and reads the state at once.
        """
        with self.transaction() as s:
            p = self._persona_row(s, persona)
            now = time.time()
            claimed = s.execute(
                update(IdentityRow)
                .where(
                    IdentityRow.persona_id == p.id,
                    IdentityRow.user_id == user_id,
                    (IdentityRow.lease_token.is_(None)) | (IdentityRow.lease_expires < now),
                )
                .values(lease_token=token, lease_expires=now + self.settings.lease_s)
                .returning(
                    IdentityRow.id, IdentityRow.version, IdentityRow.turn_count, IdentityRow.state, IdentityRow.state_sha256
                )
                .execution_options(synchronize_session=False)
            ).one_or_none()
            if claimed is None:
                exists = s.scalar(select(IdentityRow.id).where(IdentityRow.persona_id == p.id, IdentityRow.user_id == user_id))
                return exists is not None, None
            record = _persona(p)
        lease = Lease(claimed.id, record, user_id, token, claimed.version, claimed.turn_count, bytes(claimed.state))
        if not verify:
            return True, lease
        try:
            _verified(lease.state, claimed.state_sha256, f"identity ({persona!r}, {user_id!r})")
        except CorruptStateError:
            self.release(lease)
            raise
        return True, lease

    def release(self, lease: Lease) -> None:
        """Let go of the identity without writing anything (a failed or abandoned turn)."""
        with self.transaction() as s:
            s.execute(
                update(IdentityRow)
                .where(IdentityRow.id == lease.identity_id, IdentityRow.lease_token == lease.token)
                .values(lease_token=None, lease_expires=None)
                .execution_options(synchronize_session=False)
            )

    def commit(self, lease: Lease, blob: Blob, *, reason: str, turn: NewTurn | None = None) -> int:
        """Write the new state (and the turn record), append a history row, prune history, let go.

        Returns the new version. Raises ConflictError, writing nothing, if the lease expired and another
        holder changed the identity meanwhile.
        """
        new_version = lease.version + 1
        with self.transaction() as s:
            values: dict[str, Any] = dict(
                version=new_version, lease_token=None, lease_expires=None, updated_at=utcnow(), **_blob_columns(blob)
            )
            if turn is not None:
                values["turn_count"] = lease.turn_count + 1
            done = s.execute(
                update(IdentityRow)
                .where(
                    IdentityRow.id == lease.identity_id,
                    IdentityRow.lease_token == lease.token,
                    IdentityRow.version == lease.version,
                )
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if done.rowcount != 1:  # type: ignore[attr-defined]
                raise ConflictError(
                    f"identity ({lease.persona!r}, {lease.user_id!r}) changed while this operation ran (its hold "
                    f"expired after {self.settings.lease_s:g} s); nothing was written"
                )
            turn_index = None
            if turn is not None:
                turn_index = lease.turn_count
                s.add(
                    TurnRow(
                        identity_id=lease.identity_id,
                        index=turn_index,
                        version_before=lease.version,
                        version_after=new_version,
                        **_turn_columns(turn),
                    )
                )
            s.add(
                StateVersionRow(
                    identity_id=lease.identity_id, version=new_version, reason=reason, turn_index=turn_index, **_blob_ref(blob)
                )
            )
            if new_version % PRUNE_EVERY == 0:  # history holds between retention and retention + PRUNE_EVERY - 1
                s.execute(
                    delete(StateVersionRow).where(
                        StateVersionRow.identity_id == lease.identity_id,
                        StateVersionRow.version <= new_version - self.settings.history_retention,
                    )
                )
        return new_version

    # --- history, turns, snapshots ---------------------------------------------------------------------

    def history(self, persona: str, user_id: str) -> list[VersionRecord]:
        """The retained versions, newest first."""
        with self.transaction(read_only=True) as s:
            ident = self._identity_row(s, persona, user_id)
            rows = s.scalars(
                select(StateVersionRow).where(StateVersionRow.identity_id == ident.id).order_by(StateVersionRow.version.desc())
            )
            return [_record(VersionRecord, r) for r in rows]

    def read_version(self, persona: str, user_id: str, version: int) -> bytes:
        with self.transaction(read_only=True) as s:
            ident = self._identity_row(s, persona, user_id)
            row = s.scalar(
                select(StateVersionRow).where(StateVersionRow.identity_id == ident.id, StateVersionRow.version == version)
            )
            if row is None:
                raise NotFoundError(
                    f"identity ({persona!r}, {user_id!r}) has no retained version {version} (current is {ident.version})"
                )
            return _verified(row.state, row.state_sha256, f"version {version} of ({persona!r}, {user_id!r})")

    def turns(self, persona: str, user_id: str, *, limit: int = 100, offset: int = 0) -> list[TurnRecord]:
        """Turns in order, oldest first."""
        with self.transaction(read_only=True) as s:
            ident = self._identity_row(s, persona, user_id)
            rows = s.scalars(
                select(TurnRow).where(TurnRow.identity_id == ident.id).order_by(TurnRow.index).limit(limit).offset(offset)
            )
            return [_turn(r) for r in rows]

    def recent_turns(self, persona: str, user_id: str, *, limit: int, offset: int = 0) -> list[TurnRecord]:
        """Turns newest first: the ``limit`` turns after the ``offset`` newest ones."""
        with self.transaction(read_only=True) as s:
            ident = self._identity_row(s, persona, user_id)
            rows = s.scalars(
                select(TurnRow).where(TurnRow.identity_id == ident.id).order_by(TurnRow.index.desc()).limit(limit).offset(offset)
            )
            return [_turn(r) for r in rows]

    def create_snapshot(self, persona: str, user_id: str, name: str, version: int | None = None) -> SnapshotRecord:
        """Name the current state (or a retained version); kept until deleted."""
        if not name or len(name) > 128:
            raise ValueError("a snapshot name must have 1 to 128 characters")
        try:
            with self.transaction() as s:
                ident = self._identity_row(s, persona, user_id)
                if version is None or version == ident.version:
                    data, digest, at = ident.state, ident.state_sha256, ident.version
                else:
                    row = s.scalar(
                        select(StateVersionRow).where(StateVersionRow.identity_id == ident.id, StateVersionRow.version == version)
                    )
                    if row is None:
                        raise NotFoundError(f"identity ({persona!r}, {user_id!r}) has no retained version {version}")
                    data, digest, at = row.state, row.state_sha256, version
                _verified(data, digest, f"version {at} of ({persona!r}, {user_id!r})")
                snap = SnapshotRow(identity_id=ident.id, name=name, version=at, state=data, state_sha256=digest)
                s.add(snap)
                s.flush()
                return _record(SnapshotRecord, snap)
        except IntegrityError as exc:
            raise ConflictError(f"identity ({persona!r}, {user_id!r}) already has a snapshot named {name!r}") from exc

    def list_snapshots(self, persona: str, user_id: str) -> list[SnapshotRecord]:
        with self.transaction(read_only=True) as s:
            ident = self._identity_row(s, persona, user_id)
            rows = s.scalars(select(SnapshotRow).where(SnapshotRow.identity_id == ident.id).order_by(SnapshotRow.created_at))
            return [_record(SnapshotRecord, r) for r in rows]

    def read_snapshot(self, persona: str, user_id: str, name: str) -> tuple[SnapshotRecord, bytes]:
        with self.transaction(read_only=True) as s:
            ident = self._identity_row(s, persona, user_id)
            row = self._snapshot_row(s, ident, name)
            return _record(SnapshotRecord, row), _verified(row.state, row.state_sha256, f"snapshot {name!r}")

    def delete_snapshot(self, persona: str, user_id: str, name: str) -> None:
        with self.transaction() as s:
            ident = self._identity_row(s, persona, user_id)
            s.delete(self._snapshot_row(s, ident, name))

    @staticmethod
    def _snapshot_row(s: Session, ident: IdentityRow, name: str) -> SnapshotRow:
        row = s.scalar(select(SnapshotRow).where(SnapshotRow.identity_id == ident.id, SnapshotRow.name == name))
        if row is None:
            raise NotFoundError(f"identity has no snapshot named {name!r}")
        return row

    # --- API keys (stored as sha256 hashes; the keys themselves never reach the database) ----------------

    def create_api_key(self, *, name: str, role: str, user_id: str | None, key_hash: str, prefix: str) -> ApiKey:
        with self.transaction() as s:
            row = ApiKeyRow(name=name, role=role, user_id=user_id, key_hash=key_hash, prefix=prefix)
            s.add(row)
            s.flush()
            return _api_key(row)

    def list_api_keys(self) -> list[ApiKey]:
        with self.transaction(read_only=True) as s:
            return [_api_key(r) for r in s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id))]

    def revoke_api_key(self, key_id: int) -> ApiKey:
        """Revoke the key (a key already revoked keeps its first revocation time)."""
        with self.transaction() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                raise NotFoundError(f"no API key with id {key_id}")
            if row.revoked_at is None:
                s.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id).values(revoked_at=utcnow()))
                s.refresh(row)
            return _api_key(row)

    def count_active_api_keys(self) -> int:
        with self.transaction(read_only=True) as s:
            count = s.scalar(select(func.count()).select_from(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None)))
        return int(count or 0)

    def active_api_key(self, key_hash: str) -> ApiKey | None:
        """The active key with this hash (the match confirmed in constant time), or None."""
        with self.transaction(read_only=True) as s:
            row = s.scalar(select(ApiKeyRow).where(ApiKeyRow.key_hash == key_hash, ApiKeyRow.revoked_at.is_(None)))
            if row is None or not hmac.compare_digest(row.key_hash, key_hash):
                return None
            return _api_key(row)


# ---------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------


def _verified(data: bytes, digest: str, what: str) -> bytes:
    data = bytes(data)
    if sha256(data) != digest:
        raise CorruptStateError(f"the stored state of {what} fails its checksum; roll back, import or reset it")
    return data


def _blob_ref(blob: Blob) -> dict[str, Any]:
    return {"state": blob.data, "state_sha256": sha256(blob.data)}


def _blob_columns(blob: Blob) -> dict[str, Any]:
    return {
        **_blob_ref(blob),
        "format_version": blob.format_version,
        "shock_count": blob.shock_count,
        "shock_mean": blob.shock_mean,
        "shock_m2": blob.shock_m2,
    }


def _persona(row: PersonaRow) -> PersonaRecord:
    return _record(PersonaRecord, row)


def _identity(row: IdentityRow, persona: str) -> IdentityRecord:
    busy = row.lease_token is not None and (row.lease_expires or 0.0) >= time.time()
    return _record(IdentityRecord, row, persona=persona, busy=busy)


def _turn_columns(turn: NewTurn) -> dict[str, Any]:
    """A new turn's columns: NULL message and reply where its text is not kept."""
    values = {f.name: getattr(turn, f.name) for f in fields(NewTurn) if f.name != "text_kept"}
    if not turn.text_kept:
        values.update(message=None, reply=None)
    return values


def _turn(row: TurnRow) -> TurnRecord:
    kept = row.message is not None and row.reply is not None
    return _record(TurnRecord, row, message=row.message or "", reply=row.reply or "", text_kept=kept)


def _api_key(row: ApiKeyRow) -> ApiKey:
    return _record(ApiKey, row)


class WaitingLines:
    """First come, first served among one process's waiters for each identity.

    ``first(key, ...)`` queues the caller and returns (as a context) once it heads its line; it leaves the line
    when the context ends, whether it got the identity or gave up. Waiting past ``deadline`` (``time.monotonic``)
    raises ``busy``.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._lines: dict[tuple[str, str], deque[str]] = {}

    def length(self, key: tuple[str, str]) -> int:
        with self._changed:
            return len(self._lines.get(key, ()))

    @contextmanager
    def first(self, key: tuple[str, str], token: str, deadline: float, busy: Exception) -> Iterator[None]:
        with self._changed:
            line = self._lines.setdefault(key, deque())
            line.append(token)
            try:
                while line[0] != token:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise busy
                    self._changed.wait(remaining)
            except BaseException:
                self._leave(key, line, token)
                raise
        try:
            yield
        finally:
            with self._changed:
                self._leave(key, line, token)

    def _leave(self, key: tuple[str, str], line: deque[str], token: str) -> None:
        line.remove(token)
        if not line:
            del self._lines[key]
        self._changed.notify_all()
