"""Identities: reading their state and administering it.

Reads (records, turns, states, history, diff, export, the imprint, the figure) hold nothing. Every change (reset,
roll back, import, clean-up, forgetting a span of the imprint) holds the identity through the store's lease, exactly
like a turn, so it is serial with the identity's turns, and commits the new state as a new version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from server.errors import NotFoundError
from server.plots import StateSummary, describe_state, draw_identity
from server.records import IdentityRecord, Lease, PersonaRecord, SnapshotRecord, TurnRecord, VersionRecord
from server.runtime.codec import decode, encode
from server.runtime.inputs import check_user
from server.runtime.personas import Personas
from server.store import Store
from sia.identity.imprint import Imprint, ImprintSpan, forget_span
from sia.identity.state import CleanupReport, IdentityState, distance, low_rank_cleanup, state_from_bytes, state_to_bytes
from sia.model.config import AnyConfig
from sia.model.tokenizer import Tokenizer

__all__ = ["Identities", "ImprintChange", "ImprintListing", "ImprintedSpan", "Inspection", "Page", "StateDiff", "VersionHistory"]

log = logging.getLogger("sia.runtime")

MAX_PLOTTED_TURNS = 500  # the figure's shock panel shows the most recent turns only

T = TypeVar("T")
StateChange = Callable[[IdentityState, PersonaRecord], IdentityState]


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing, and how many items the whole listing has."""

    total: int
    items: list[T]


@dataclass(frozen=True)
class Inspection:
    """An identity's record beside the numbers of one of its states (the current one, or a retained version)."""

    record: IdentityRecord
    state_version: int
    summary: StateSummary


@dataclass(frozen=True)
class VersionHistory:
    """The identity's current version and its retained versions, newest first."""

    current: int
    versions: list[VersionRecord]


@dataclass(frozen=True)
class ImprintedSpan:
    """One span of an identity's imprint as its owner sees it: where it came from, why, and its words."""

    index: int  # its number in the imprint of its version (what forgetting it takes)
    turn: int  # the turn that imprinted it
    offset: int  # its first token's position in that turn's message
    length: int  # tokens
    kind: str  # sia.identity.imprint.KINDS
    score: float  # its salience when imprinted (nats of token shock)
    text: str | None  # its tokens decoded; None where the turn's text was not kept


@dataclass(frozen=True)
class ImprintListing:
    """The imprint of one version of an identity's state."""

    version: int
    capacity: int  # entries (tokens) in all; 0 where the model keeps no imprint
    used: int  # entries filled
    spans: list[ImprintedSpan]


@dataclass(frozen=True)
class ImprintChange:
    """Spans in one version's imprint and not in the other's, told apart by (turn, offset, length)."""

    added: list[ImprintedSpan]  # in b only (indices of b)
    removed: list[ImprintedSpan]  # in a only (indices of a)


@dataclass(frozen=True)
class StateDiff:
    """Change from version ``a`` to version ``b``."""

    a: int
    b: int
    trace_norm: list[list[float]]  # [layer][head] Frobenius norm of T_b - T_a
    self_norm: float  # ||s_b - s_a||
    turns: int  # turns_b - turns_a (the state's own counter)
    imprint: ImprintChange


class Identities:
    """The identities of one store, their states read and checked against one model's config (their imprints' words
    read with its tokenizer). Thread-safe."""

    def __init__(self, config: AnyConfig, store: Store, personas: Personas, tokenizer: Tokenizer) -> None:
        self.config = config
        self.store = store
        self.personas = personas
        self.tokenizer = tokenizer

    # --- records ---------------------------------------------------------------------------------------

    def list_identities(self, persona: str, *, limit: int = 100, offset: int = 0) -> Page[IdentityRecord]:
        """The persona's identities ordered by user id (NotFoundError for an unknown persona)."""
        items = self.store.list_identities(persona, limit=limit, offset=offset)
        return Page(total=self.store.count_identities(persona), items=items)

    def get_identity(self, persona: str, user: str) -> IdentityRecord:
        return self.store.get_identity(persona, user)

    def inspect(self, persona: str, user: str, version: int | None = None) -> Inspection:
        """The identity's record, and the counters, self state and trace spectra of its current (or a retained) state."""
        record = self.store.get_identity(persona, user)
        state_version, state = self.state(persona, user, version)
        return Inspection(record=record, state_version=state_version, summary=describe_state(state, self.config))

    def list_turns(self, persona: str, user: str, *, limit: int = 100, offset: int = 0) -> Page[TurnRecord]:
        """The identity's turn records, oldest first."""
        total = self.store.get_identity(persona, user).turn_count
        return Page(total=total, items=self.store.turns(persona, user, limit=limit, offset=offset))

    def history(self, persona: str, user: str) -> VersionHistory:
        """The retained versions, newest first, and the current version."""
        versions = self.store.history(persona, user)
        return VersionHistory(current=self.store.get_identity(persona, user).version, versions=versions)

    # --- reading state ---------------------------------------------------------------------------------

    def state(self, persona: str, user: str, version: int | None = None) -> tuple[int, IdentityState]:
        """(version, state): the current state, or a retained earlier version."""
        current, blob = self.store.read_state(persona, user)
        if version is not None and version != current:
            blob = self.store.read_version(persona, user, version)
            current = version
        return current, decode(blob, self.config, f"version {current} of ({persona!r}, {user!r})")

    def export_state(self, persona: str, user: str, version: int | None = None) -> tuple[int, bytes]:
        """(version, safetensors bytes) of the current (or a retained) state, validated before they leave."""
        state_version, state = self.state(persona, user, version)
        return state_version, state_to_bytes(state)

    def diff(self, persona: str, user: str, a: int, b: int | None = None) -> StateDiff:
        """Per layer and head ||T_b - T_a||_F, and ||s_b - s_a||; b defaults to the current version."""
        va, sa = self.state(persona, user, a)
        vb, sb = self.state(persona, user, b)
        trace, self_norm = distance(sa, sb)  # (n_layer, H), float
        spans_a, spans_b = self._spans(sa.imprint), self._spans(sb.imprint)
        where_a, where_b = ({_place(s) for s in spans} for spans in (spans_a, spans_b))
        imprint = ImprintChange(
            added=[s for s in spans_b if _place(s) not in where_a], removed=[s for s in spans_a if _place(s) not in where_b]
        )
        return StateDiff(a=va, b=vb, trace_norm=trace.tolist(), self_norm=self_norm, turns=sb.turns - sa.turns, imprint=imprint)

    def imprint(self, persona: str, user: str, version: int | None = None) -> ImprintListing:
        """The spans of the current (or a retained) state's imprint, oldest entry first, their words where kept."""
        state_version, state = self.state(persona, user, version)
        return self._listing(state_version, state)

    def _listing(self, version: int, state: IdentityState) -> ImprintListing:
        imprint = state.imprint
        capacity = self.config.imprint_tokens if imprint is None else imprint.capacity
        used = 0 if imprint is None else imprint.used
        return ImprintListing(version=version, capacity=capacity, used=used, spans=self._spans(imprint))

    def _spans(self, imprint: Imprint | None) -> list[ImprintedSpan]:
        return [] if imprint is None else [self._shown(s) for s in imprint.spans()]

    def _shown(self, span: ImprintSpan) -> ImprintedSpan:
        text = None if span.tokens is None else self.tokenizer.decode(span.tokens)
        return ImprintedSpan(span.index, span.turn, span.offset, span.length, span.kind, span.score, text)

    def figure(self, persona: str, user: str) -> bytes:
        """The identity's PNG: spectra of its current trace, and its retained versions and turns over time."""
        history = sorted(self.store.history(persona, user), key=lambda v: v.version)
        current_version, current = self.state(persona, user)
        versions: list[tuple[int, IdentityState]] = []
        for record in history:
            if record.version < current_version:
                try:
                    versions.append((record.version, self.state(persona, user, record.version)[1]))
                except NotFoundError:  # pruned by a commit since the history was read
                    continue
        versions.append((current_version, current))
        count = self.store.get_identity(persona, user).turn_count
        offset = max(0, count - MAX_PLOTTED_TURNS)
        turns = self.store.turns(persona, user, limit=MAX_PLOTTED_TURNS, offset=offset)
        shocks = [(t.index, t.shock) for t in turns]
        return draw_identity(f"{persona} / {user} (version {current_version})", versions, shocks, self.config)

    # --- snapshots -------------------------------------------------------------------------------------

    def create_snapshot(self, persona: str, user: str, name: str, version: int | None = None) -> SnapshotRecord:
        """Name the current state (or a retained version); kept until deleted (ConflictError if the name is taken)."""
        return self.store.create_snapshot(persona, user, name, version)

    def list_snapshots(self, persona: str, user: str) -> list[SnapshotRecord]:
        return self.store.list_snapshots(persona, user)

    def delete_snapshot(self, persona: str, user: str, name: str) -> None:
        self.store.delete_snapshot(persona, user, name)

    # --- changing state (each serial with turns) -------------------------------------------------------

    def reset(self, persona: str, user: str, *, layers: Sequence[int] | None = None, self_only: bool = False) -> int:
        """Reset everything (a fresh identity from the persona), or only the trace of ``layers``, or only s.

        The conversation's turn records stay; returns the new version.
        """
        if layers is not None and self_only:
            raise ValueError("reset either chosen layers or only the self state, not both")
        traced = self.config.trace_layer_ids  # the layers that carry a trace, in the order the state stores them
        rows: list[int] = []
        if layers is not None:
            bad = [i for i in layers if i not in traced]
            if bad or not layers:
                raise ValueError(f"layers must be a non-empty list of layers that carry a trace, {traced}; got {list(layers)}")
            rows = [traced.index(i) for i in layers]

        def change(state: IdentityState, persona_record: PersonaRecord) -> IdentityState:
            initial = self.personas.initial_state(persona_record)
            if self_only:
                return replace(state, self_state=initial.self_state.clone())
            if layers is not None:
                trace = state.trace.clone()
                trace[rows] = initial.trace[rows]
                return replace(state, trace=trace)
            return initial

        reason = "reset:self" if self_only else "reset:layers" if layers is not None else "reset"
        return self._apply(persona, user, change, reason, reads_current=self_only or layers is not None)

    def rollback(self, persona: str, user: str, *, version: int | None = None, snapshot: str | None = None) -> int:
        """Make a retained version (or a named snapshot) current again, as a new version; returns it."""
        if (version is None) == (snapshot is None):
            raise ValueError("roll back to exactly one of a version or a snapshot")
        if snapshot is not None:
            target, what = self.store.read_snapshot(persona, user, snapshot)[1], f"snapshot {snapshot!r}"
        else:
            assert version is not None
            target, what = self.store.read_version(persona, user, version), f"version {version}"
        state = decode(target, self.config, f"{what} of ({persona!r}, {user!r})")
        return self._apply(persona, user, lambda _s, _p: state, f"rollback:{snapshot or version}", reads_current=False)

    def import_state(self, persona: str, user: str, blob: bytes) -> int:
        """Replace the state with validated safetensors bytes (creating the identity if needed)."""
        state = state_from_bytes(blob, self.config)  # StateFormatError (a ValueError) names what is wrong
        return self._apply(persona, user, lambda _s, _p: state, "import", reads_current=False, create=True)

    def cleanup(self, persona: str, user: str, energy: float = 0.95) -> tuple[int, CleanupReport]:
        """Low-rank clean-up of the trace; returns the new version and the ranks kept."""
        reports: list[CleanupReport] = []

        def change(state: IdentityState, _p: PersonaRecord) -> IdentityState:
            cleaned, report = low_rank_cleanup(state, energy)
            reports.append(report)
            return cleaned

        if not 0 < energy <= 1:
            raise ValueError(f"energy must be in (0, 1]; got {energy}")
        version = self._apply(persona, user, change, "cleanup", reads_current=True)
        return version, reports[0]

    def forget(self, persona: str, user: str, index: int) -> ImprintListing:
        """Drop span ``index`` of the imprint (the spans after it move up), as a new version that a roll back undoes;
        returns the new imprint. NotFoundError if the imprint has no such span."""
        forgotten: list[IdentityState] = []

        def change(state: IdentityState, _p: PersonaRecord) -> IdentityState:
            count = 0 if state.imprint is None else len(state.imprint.spans())
            if not 0 <= index < count:
                spans = "none" if count == 0 else "only span 0" if count == 1 else f"spans 0 to {count - 1}"
                raise NotFoundError(f"the imprint of ({persona!r}, {user!r}) has no span {index}; it has {spans}")
            assert state.imprint is not None
            forgotten.append(replace(state, imprint=forget_span(state.imprint, index)))
            return forgotten[0]

        version = self._apply(persona, user, change, "forget", reads_current=True)
        return self._listing(version, forgotten[0])

    def _apply(
        self, persona: str, user: str, change: StateChange, reason: str, *, reads_current: bool, create: bool = False
    ) -> int:
        """Hold the identity, compute its new state with ``change``, commit it as a new version.

        Operations that replace the state wholesale (``reads_current=False``) neither read nor verify the
        stored blob, so they also repair an identity whose stored state is damaged; ``change`` then gets the
        persona's initial state in its place.
        """
        check_user(user)
        create_from = self.personas.initial_blob if create else None
        lease = self.store.acquire(persona, user, create=create_from, verify=reads_current)
        committed = False
        try:
            record = lease.persona_record
            state = self.held_state(lease) if reads_current else self.personas.initial_state(record)
            new_state = change(state, record)
            new_state.validate(self.config)
            version = self.store.commit(lease, encode(new_state), reason=reason)
            committed = True
        finally:
            if not committed:
                self.store.release(lease)
        log.info("identity (%r, %r): %s -> version %d", persona, user, reason, version)
        return version

    def held_state(self, lease: Lease) -> IdentityState:
        """The state a hold read, parsed (CorruptStateError if it does not parse)."""
        return decode(lease.state, self.config, f"identity ({lease.persona!r}, {lease.user_id!r})")


def _place(span: ImprintedSpan) -> tuple[int, int, int]:
    """Where a span's words came from: the same in every version that holds it, whatever its index there."""
    return span.turn, span.offset, span.length
