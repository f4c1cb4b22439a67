"""The turn with durable state (docs/store.md, "One atomic, serial turn per identity"). Used by the HTTP service
(through serving.py) and the command line.

hold the identity (store lease) -> load and validate its state -> run the turn (sia.identity.turn: shock,
generation, summary, update) with no transaction open -> commit the new state, the turn and a history row in
one transaction. A counterfactual runs the model on two states of an identity and holds and writes nothing.

A turn's context is the persona's prompt, then the recent prompt window (window.py) where one is set. In privacy
mode (``store_text=False``) a turn keeps no text: its record stores no message or reply, its imprint no token ids,
and there is no window to build.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Generator
from dataclasses import dataclass, replace

from server.records import Lease, NewTurn
from server.runtime.codec import encode
from server.runtime.identities import Identities
from server.runtime.inputs import check_message, check_user
from server.runtime.personas import Personas
from server.runtime.window import recent_window
from server.store import Store
from sia.identity.turn import TurnReply, TurnRequest, TurnResult, stream_turns
from sia.model.generate import Sampling, SamplingParams, Stream, StreamEvent
from sia.model.identity_model import IdentityModel

__all__ = ["CommittedTurn", "CounterfactualOutcome", "CounterfactualSide", "HeldTurn", "TurnRunner"]

log = logging.getLogger("sia.runtime")


@dataclass(frozen=True)
class CommittedTurn(TurnReply):
    """A committed turn: the library's TurnReply, this turn's index, the identity's version after it, its latency."""

    turn: int  # this turn's index for the identity (0, 1, ...)
    state_version: int  # the identity's version after the turn
    latency_ms: float


@dataclass(frozen=True)
class CounterfactualSide(TurnReply):
    """One side of a counterfactual: what a state would answer (nothing of it is stored)."""

    version: int | None  # the state's version; None for the persona's initial state


@dataclass(frozen=True)
class CounterfactualOutcome:
    """The same message, decoding parameters and seed answered by two states of one identity."""

    seed: int
    current: CounterfactualSide
    other: CounterfactualSide


class TurnRunner:
    """Turns of one loaded model over one store. Thread-safe; turns of one identity are serial, others run in parallel.

    ``store_text``: turns keep their words (records, the imprint's tokens); ``window_tokens``: the most tokens of
    recent exchanges a turn's context holds (0: none; always 0 without ``store_text``, there being nothing to read).
    """

    def __init__(
        self,
        model: IdentityModel,
        store: Store,
        personas: Personas,
        identities: Identities,
        *,
        store_text: bool = True,
        window_tokens: int = 0,
    ) -> None:
        if not model.stateful:
            raise ValueError(f"the runtime needs a stateful model; {model.config.attention!r} keeps no identity state")
        if window_tokens < 0:
            raise ValueError(f"window_tokens must be >= 0; got {window_tokens}")
        if window_tokens and not store_text:
            log.warning(
                "SIA_PROMPT_WINDOW_TOKENS=%d is ignored: SIA_STORE_TURN_TEXT=false keeps no text to build a window from",
                window_tokens,
            )
            window_tokens = 0
        self.model = model.eval()
        self.tokenizer = model.tokenizer
        self.store = store
        self.personas = personas
        self.identities = identities
        self.store_text = store_text
        self.window_tokens = window_tokens

    def turn(self, persona: str, user: str, message: str, sampling: Sampling | None = None) -> CommittedTurn:
        """One whole turn; the identity is created from the persona on its first turn."""
        return self.stream_turn(persona, user, message, sampling).finish()

    def stream_turn(self, persona: str, user: str, message: str, sampling: Sampling | None = None) -> Stream[CommittedTurn]:
        """StreamEvents as the reply is generated; the result is the CommittedTurn, once the turn is committed.

        Nothing is held before the first event is asked for, and nothing is written unless the stream runs to
        its end: closing it early (a client that went away) or an exception anywhere leaves the identity
        exactly as it was.
        """

        def run() -> Generator[StreamEvent, None, CommittedTurn]:
            pending = self.begin_turn(persona, user, message, sampling)
            try:
                events = pending.run()
                yield from events
                return events.result
            finally:
                pending.release()  # a no-op once the turn committed

        return Stream(run())

    def begin_turn(self, persona: str, user: str, message: str, sampling: Sampling | None = None) -> HeldTurn:
        """Hold the identity (waiting up to the busy timeout) and load its state; inference has not started.

        The caller must either run the returned turn to its end or release it. Waiting for the identity is
        kept apart from generation so a server can wait outside its inference slots (a turn that waits for a
        busy identity must not occupy a slot that the turn holding the identity needs to finish).
        """
        check_user(user)
        check_message(message)
        sampling = sampling or Sampling()
        lease = self.store.acquire(persona, user, create=self.personas.initial_blob)
        try:
            record = lease.persona_record
            params = self.personas.sampling_params(record, sampling)
            context, shared = self.context(record.preamble, persona, user, message, params.max_new_tokens)
            request = TurnRequest(
                state=self.identities.held_state(lease),
                message=message,
                dynamics=self.personas.dynamics(record),
                context=context,
                keep_text=self.store_text,
                shared=shared,
            )
            return HeldTurn(self, lease, request, params)
        except BaseException:
            self.store.release(lease)
            raise

    def counterfactual(
        self, persona: str, user: str, message: str, sampling: Sampling | None = None, *, against: int | None = None
    ) -> CounterfactualOutcome:
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
        params = self.personas.sampling_params(record, sampling)
        current_version, current = self.identities.state(persona, user)
        if against is None:
            other_version, other = None, self.personas.initial_state(record)
        else:
            other_version, other = self.identities.state(persona, user, against)
        dynamics = self.personas.dynamics(record)
        context, shared = self.context(record.preamble, persona, user, message, params.max_new_tokens)
        requests = [
            TurnRequest(state=s, message=message, dynamics=dynamics, context=context, keep_text=self.store_text, shared=shared)
            for s in (current, other)
        ]
        results = stream_turns(self.model, requests, params, tokenizer=self.tokenizer).finish()
        current_side, other_side = (
            CounterfactualSide(**r.reply_fields(), version=v)
            for v, r in zip((current_version, other_version), results, strict=True)
        )
        return CounterfactualOutcome(seed=sampling.seed, current=current_side, other=other_side)

    def context(self, preamble: str, persona: str, user: str, message: str, max_new_tokens: int) -> tuple[tuple[int, ...], int]:
        """What a turn of (persona, user) reads before ``message``: the persona's prompt, then the recent window; and
        how many of its tokens are the persona's prompt (every turn of the persona begins with them).

        The window takes at most ``window_tokens``, and no more than leaves room in the model's context for the
        message and a reply of ``max_new_tokens`` (counted as sia.model.generate.check_room counts): a window never
        makes a turn too long that fits without one.
        """
        system = self.tokenizer.system_prompt(preamble)
        if not self.window_tokens:
            return tuple(system), len(system)
        config = self.model.config
        prompt = len(self.tokenizer.turn_prompt(message, system)[0])
        room = config.block_size - config.memory_tokens - prompt - max_new_tokens
        window = recent_window(self.store, self.tokenizer, persona, user, min(self.window_tokens, room))
        return (*system, *window), len(system)


class HeldTurn:
    """A turn whose identity is held: ``run()`` generates, updates and commits (or a batch decodes ``request``
    under ``params`` and ``commit`` stores its result); ``release()`` gives up."""

    def __init__(self, turns: TurnRunner, lease: Lease, request: TurnRequest, params: SamplingParams) -> None:
        self.turns, self.lease, self.request, self.params = turns, lease, request, params
        self._finished = False

    def run(self) -> Stream[CommittedTurn]:
        """StreamEvents; the result is the CommittedTurn after the commit. Closing it early releases the identity."""
        return Stream(self._run())

    def _run(self) -> Generator[StreamEvent, None, CommittedTurn]:
        try:
            started = time.perf_counter()
            replies = stream_turns(self.turns.model, [self.request], self.params, tokenizer=self.turns.tokenizer)
            yield from replies
            return self.commit(replies.result[0], (time.perf_counter() - started) * 1000)
        finally:
            self.release()

    def commit(self, result: TurnResult, latency_ms: float) -> CommittedTurn:
        """Store the turn's result, however it was decoded (alone here, or in the service's batch): the new state,
        the turn and a history row in one transaction; the identity is let go."""
        try:
            turn = NewTurn.of(result, self.request.message, latency_ms, keep_text=self.turns.store_text)
            version = self.turns.store.commit(self.lease, encode(result.state), reason="turn", turn=turn)
            self._finished = True
        finally:
            self.release()
        return CommittedTurn(**result.reply_fields(), turn=self.lease.turn_count, state_version=version, latency_ms=latency_ms)

    def release(self) -> None:
        """Let go of the identity, writing nothing; idempotent, and a no-op after the commit."""
        if not self._finished:
            self._finished = True
            self.turns.store.release(self.lease)
