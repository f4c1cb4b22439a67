"""The turn runtime: DESIGN §2 with durable state. Used by the HTTP service and the command line alike.

hold the identity (store lease) -> load and validate its state -> run the turn (sia.identity.turn: shock, generation,
summary, update) with no transaction open -> commit the new state, the turn and a history row in one
transaction. Every state operation (reset, rollback, import, clean-up) goes through the same hold, so it is
serial with turns; reads (export, diff, history) need no hold.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace

import torch

from server.core.config import Settings
from server.errors import CorruptStateError
from server.store import Blob, Lease, NewTurn, PersonaRecord, Store, VersionRecord
from sia.identity.state import (
    CleanupReport,
    Dynamics,
    IdentityState,
    ShockStats,
    StateFormatError,
    low_rank_cleanup,
    state_from_bytes,
    state_to_bytes,
)
from sia.identity.turn import TurnRequest, TurnResult, stream_turns
from sia.model.generate import SamplingParams, StreamEvent
from sia.model.tokenizer import Tokenizer
from sia.model.transformer import IdentityModel
from sia.personas import DEFAULT_PERSONA, PERSONAS, persona_defaults

__all__ = [
    "DEFAULT_PERSONA",
    "Counterfactual",
    "CounterfactualReply",
    "PendingTurn",
    "Runtime",
    "Sampling",
    "StateDiff",
    "TurnOutcome",
    "check_message",
    "check_user",
    "encode",
]

log = logging.getLogger("sia.runtime")

StateChange = Callable[[IdentityState, PersonaRecord], IdentityState]


@dataclass(frozen=True)
class Sampling:
    """What a request may say about decoding; None means the persona's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0  # report this many alternatives with every generated token

    def __post_init__(self) -> None:
        # the fields given are checked now, before any identity is held; the persona fills in the rest
        SamplingParams(
            max_new_tokens=64 if self.max_tokens is None else self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=tuple(self.stop),
            top_logprobs=self.top_logprobs,
        )


@dataclass(frozen=True)
class TurnOutcome:
    reply: str
    finish_reason: str
    turn: int  # this turn's index for the identity (0, 1, ...)
    shock: float
    nll: float
    state_version: int  # the identity's version after the turn
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float


@dataclass(frozen=True)
class StateDiff:
    """Change from version ``a`` to version ``b``."""

    a: int
    b: int
    trace_norm: list[list[float]]  # [layer][head] Frobenius norm of T_b - T_a
    self_norm: float  # ||s_b - s_a||
    turns: int  # turns_b - turns_a (the state's own counter)


@dataclass(frozen=True)
class CounterfactualReply:
    """One side of a counterfactual: what a state would answer (nothing of it is stored)."""

    version: int | None  # the state's version; None for the persona's initial state
    reply: str
    finish_reason: str
    shock: float
    nll: float
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Counterfactual:
    """The same message, decoding parameters and seed answered by two states of one identity."""

    seed: int
    current: CounterfactualReply
    other: CounterfactualReply


class Runtime:
    """One loaded model over one store. Thread-safe; turns of one identity are serial, others run in parallel."""

    def __init__(self, model: IdentityModel, store: Store, tokenizer: Tokenizer | None = None) -> None:
        if not model.stateful:
            raise ValueError(f"the runtime needs a stateful model; {model.config.attention!r} keeps no identity state")
        self.model = model.eval()
        self.store = store
        self.tokenizer = tokenizer or model.tokenizer
        self.config = model.config

    @property
    def settings(self) -> Settings:
        return self.store.settings

    # --- personas --------------------------------------------------------------------------------------

    def ensure_default_personas(self) -> list[str]:
        """Create the default personas (``sia`` first) if they are missing, each with the prompt this model reads."""
        existing = {p.name for p in self.store.list_personas()}
        created = []
        for name in sorted(PERSONAS, key=lambda n: (n != DEFAULT_PERSONA, n)):
            if name not in existing:
                self.store.create_persona(name, **persona_defaults(self.model, name))
                created.append(name)
        return created

    def validate_persona_values(self, values: dict[str, object]) -> None:
        """Raise ValueError for rates, sampling defaults or an initial state this model cannot use."""
        base = Dynamics.from_config(self.config)
        Dynamics(
            alpha=_float(values.get("alpha"), base.alpha),
            decay=_float(values.get("decay"), base.decay),
            eta=_float(values.get("eta"), base.eta),
        )
        SamplingParams(
            max_new_tokens=int(str(values.get("max_tokens", 64))),
            temperature=_float(values.get("temperature"), 0.8),
            top_p=None if values.get("top_p") is None else _float(values.get("top_p"), 1.0),
            top_k=None if values.get("top_k") is None else int(str(values.get("top_k"))),
        )
        blob = values.get("initial_state")
        if blob is not None:
            if not isinstance(blob, bytes):
                raise ValueError("initial_state must be bytes (a serialised identity state)")
            state_from_bytes(blob, self.config)

    def _dynamics(self, persona: PersonaRecord) -> Dynamics:
        base = Dynamics.from_config(self.config)
        return Dynamics(
            alpha=base.alpha if persona.alpha is None else persona.alpha,
            decay=base.decay if persona.decay is None else persona.decay,
            eta=base.eta if persona.eta is None else persona.eta,
        )

    def sampling_params(self, persona: PersonaRecord, sampling: Sampling) -> SamplingParams:
        """The request's decoding parameters with the persona's defaults filled in (ValueError if invalid)."""
        return SamplingParams(
            max_new_tokens=persona.max_tokens if sampling.max_tokens is None else sampling.max_tokens,
            temperature=persona.temperature if sampling.temperature is None else sampling.temperature,
            top_p=persona.top_p if sampling.top_p is None else sampling.top_p,
            top_k=persona.top_k if sampling.top_k is None else sampling.top_k,
            seed=sampling.seed,
            stop=tuple(sampling.stop),
            top_logprobs=sampling.top_logprobs,
        )

    def _initial_state(self, persona: PersonaRecord) -> IdentityState:
        if persona.initial_state is None:
            return IdentityState.fresh(self.config)
        try:
            return state_from_bytes(persona.initial_state, self.config)
        except StateFormatError as exc:
            raise CorruptStateError(f"persona {persona.name!r} has an unusable initial state: {exc}") from exc

    def _initial_blob(self, persona: PersonaRecord) -> Blob:
        return encode(self._initial_state(persona))

    # --- turns -----------------------------------------------------------------------------------------

    def turn(self, persona: str, user: str, message: str, sampling: Sampling | None = None) -> TurnOutcome:
        """One whole turn; the identity is created from the persona on its first turn."""
        for item in self.stream_turn(persona, user, message, sampling):
            if isinstance(item, TurnOutcome):
                return item
        raise AssertionError("a turn stream ended without an outcome")

    def stream_turn(
        self, persona: str, user: str, message: str, sampling: Sampling | None = None
    ) -> Generator[StreamEvent | TurnOutcome, None, None]:
        """Yield StreamEvents as the reply is generated, then the TurnOutcome once the turn is committed.

        Nothing is written unless the generator runs to its end: closing it early (a client that went away)
        or an exception anywhere leaves the identity exactly as it was.
        """
        pending = self.begin_turn(persona, user, message, sampling)
        try:
            yield from pending.run()
        finally:
            pending.release()  # a no-op once the turn committed

    def begin_turn(self, persona: str, user: str, message: str, sampling: Sampling | None = None) -> PendingTurn:
        """Hold the identity (waiting up to the busy timeout) and load its state; inference has not started.

        The caller must either run the returned turn to its end or release it. Waiting for the identity is
        kept apart from generation so a server can wait outside its inference slots (a turn that waits for a
        busy identity must not occupy a slot that the turn holding the identity needs to finish).
        """
        check_user(user)
        check_message(message)
        sampling = sampling or Sampling()
        lease = self.store.acquire(persona, user, create=self._initial_blob)
        try:
            record = lease.persona_record
            request = TurnRequest(
                state=self._decode(lease.state, lease),
                message=message,
                dynamics=self._dynamics(record),
                context=tuple(self.tokenizer.system_prompt(record.preamble)),
            )
            return PendingTurn(self, lease, request, self.sampling_params(record, sampling))
        except BaseException:
            self.store.release(lease)
            raise

    def counterfactual(
        self, persona: str, user: str, message: str, sampling: Sampling | None = None, *, against: int | None = None
    ) -> Counterfactual:
        """What the identity's current state answers to ``message``, beside what another state answers: the
        retained version ``against``, or (None) the persona's initial state, i.e. the identity after a full reset.

        Both rows decode in one batch with the same parameters and seed (a random one, reported, if the request
        gives none; rows are independent of their batch). Nothing is held or written: the identity's version,
        turns and history stay as they were, and a turn running meanwhile is neither blocked nor seen half-done.
        """
        check_user(user)
        check_message(message)
        sampling = sampling or Sampling()
        if sampling.seed is None:
            sampling = replace(sampling, seed=secrets.randbelow(2**63))
        assert sampling.seed is not None
        record = self.store.get_persona(persona)
        params = self.sampling_params(record, sampling)
        current_version, current = self.state(persona, user)
        if against is None:
            other_version, other = None, self._initial_state(record)
        else:
            other_version, other = self.state(persona, user, against)
        dynamics = self._dynamics(record)
        context = tuple(self.tokenizer.system_prompt(record.preamble))
        requests = [TurnRequest(state=s, message=message, dynamics=dynamics, context=context) for s in (current, other)]
        results: list[TurnResult] = []
        for item in stream_turns(self.model, requests, params, tokenizer=self.tokenizer):
            if isinstance(item, list):
                results = item
        current_reply, other_reply = (
            CounterfactualReply(
                version=v,
                reply=r.reply,
                finish_reason=r.finish_reason,
                shock=r.shock,
                nll=r.nll,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
            )
            for v, r in zip((current_version, other_version), results, strict=True)
        )
        return Counterfactual(seed=sampling.seed, current=current_reply, other=other_reply)

    # --- reading state ---------------------------------------------------------------------------------

    def state(self, persona: str, user: str, version: int | None = None) -> tuple[int, IdentityState]:
        """(version, state): the current state, or a retained earlier version."""
        current, blob = self.store.read_state(persona, user)
        if version is not None and version != current:
            blob = self.store.read_version(persona, user, version)
            current = version
        return current, self._parse(blob, f"version {current} of ({persona!r}, {user!r})")

    def export_state(self, persona: str, user: str, version: int | None = None) -> bytes:
        """The safetensors bytes of the current (or a retained) state, validated before they leave."""
        return state_to_bytes(self.state(persona, user, version)[1])

    def diff(self, persona: str, user: str, a: int, b: int | None = None) -> StateDiff:
        """Per layer and head ||T_b - T_a||_F, and ||s_b - s_a||; b defaults to the current version."""
        va, sa = self.state(persona, user, a)
        vb, sb = self.state(persona, user, b)
        trace = torch.linalg.matrix_norm(sb.trace.double() - sa.trace.double())  # (n_layer, H)
        return StateDiff(
            a=va,
            b=vb,
            trace_norm=trace.tolist(),
            self_norm=float(torch.linalg.vector_norm(sb.self_state.double() - sa.self_state.double())),
            turns=sb.turns - sa.turns,
        )

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
            initial = self._initial_state(persona_record)
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
        state = self._parse(target, f"{what} of ({persona!r}, {user!r})")
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

    def history(self, persona: str, user: str) -> list[VersionRecord]:
        return self.store.history(persona, user)

    def _apply(
        self, persona: str, user: str, change: StateChange, reason: str, *, reads_current: bool, create: bool = False
    ) -> int:
        """Hold the identity, compute its new state with ``change``, commit it as a new version.

        Operations that replace the state wholesale (``reads_current=False``) neither read nor verify the
        stored blob, so they also repair an identity whose stored state is damaged; ``change`` then gets the
        persona's initial state in its place.
        """
        check_user(user)
        lease = self.store.acquire(persona, user, create=self._initial_blob if create else None, verify=reads_current)
        committed = False
        try:
            record = lease.persona_record
            state = self._decode(lease.state, lease) if reads_current else self._initial_state(record)
            new_state = change(state, record)
            new_state.validate(self.config)
            version = self.store.commit(lease, encode(new_state), reason=reason)
            committed = True
        finally:
            if not committed:
                self.store.release(lease)
        log.info("identity (%r, %r): %s -> version %d", persona, user, reason, version)
        return version

    # --- parsing ---------------------------------------------------------------------------------------

    def _decode(self, blob: bytes, lease: Lease) -> IdentityState:
        return self._parse(blob, f"identity ({lease.persona!r}, {lease.user_id!r})")

    def _parse(self, blob: bytes, what: str) -> IdentityState:
        try:
            return state_from_bytes(blob, self.config)
        except StateFormatError as exc:
            raise CorruptStateError(f"the stored state of {what} is unusable: {exc}") from exc


class PendingTurn:
    """A turn whose identity is held: ``run()`` generates, updates and commits; ``release()`` gives up."""

    def __init__(self, runtime: Runtime, lease: Lease, request: TurnRequest, params: SamplingParams) -> None:
        self.runtime, self.lease, self.request, self.params = runtime, lease, request, params
        self._finished = False

    def run(self) -> Generator[StreamEvent | TurnOutcome, None, None]:
        """StreamEvents, then the TurnOutcome after the commit; closing it early releases the identity."""
        rt, lease = self.runtime, self.lease
        try:
            started = time.perf_counter()
            result: TurnResult | None = None
            for item in stream_turns(rt.model, [self.request], self.params, tokenizer=rt.tokenizer):
                if isinstance(item, StreamEvent):
                    yield item
                else:
                    result = item[0]
            assert result is not None
            latency_ms = (time.perf_counter() - started) * 1000
            turn = NewTurn(
                message=self.request.message,
                reply=result.reply,
                finish_reason=result.finish_reason,
                shock=result.shock,
                nll=result.nll,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                latency_ms=latency_ms,
            )
            version = rt.store.commit(lease, encode(result.state), reason="turn", turn=turn)
            self._finished = True
        finally:
            self.release()
        yield TurnOutcome(
            reply=result.reply,
            finish_reason=result.finish_reason,
            turn=lease.turn_count,
            shock=result.shock,
            nll=result.nll,
            state_version=version,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            latency_ms=latency_ms,
        )

    def release(self) -> None:
        """Let go of the identity, writing nothing; idempotent, and a no-op after the commit."""
        if not self._finished:
            self._finished = True
            self.runtime.store.release(self.lease)


def encode(state: IdentityState) -> Blob:
    """The blob and the column figures the store keeps beside it."""
    s: ShockStats = state.shock
    return Blob(state_to_bytes(state), state.format_version, s.count, s.mean, s.m2)


def check_user(user: str) -> None:
    """User ids are 1 to 256 printable characters (they appear in logs and URLs)."""
    if not isinstance(user, str) or not 0 < len(user) <= 256 or not user.isprintable():
        raise ValueError("user must be 1 to 256 printable characters")


def check_message(message: str) -> None:
    """A message is text without NUL characters (no text store or terminal takes them)."""
    if not isinstance(message, str):
        raise TypeError(f"message must be str; got {type(message).__name__}")
    if "\x00" in message:
        raise ValueError("message must not contain NUL characters")


def _float(value: object, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number; got {value!r}")
    return float(value)
