"""Turns seen from the event loop: they compute off the loop, in the batcher's thread or in worker threads.

With a Batcher (the default, ``SIA_MAX_BATCH`` > 0), a turn holds its identity in a worker thread, is submitted
to the batch and reads its events from it as they come (one queue per turn, fed from the batcher's thread); its
result is committed in a worker thread. Without one, each turn computes on its own: at most ``max_concurrent``
turns and counterfactuals at once per process (an anyio capacity limiter), a streamed turn taking a slot only
while it computes its next token. Counterfactuals always take the limiter's slots. A stream that is closed early
(the client went away) cancels the turn's row or closes its generator, and the identity is released unchanged.
Each turn and each counterfactual is counted in the metrics by its outcome, with its latency and its tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial

import anyio
import anyio.to_thread

from server.errors import BusyError, OverloadedError
from server.observability import Metrics
from server.runtime.batcher import Batcher, SubmittedTurn
from server.runtime.turns import CommittedTurn, CounterfactualOutcome, HeldTurn, TurnRunner
from sia.identity.turn import TurnResult
from sia.model.generate import Sampling, Stream, StreamEvent
from sia.model.tokenizer import Tokenizer

__all__ = ["AsyncTurnStream", "ClientGone", "Disconnected", "TurnService"]

_END = object()
Disconnected = Callable[[], Awaitable[bool]]


class ClientGone(Exception):
    """The client disconnected before its turn completed; the turn was abandoned and nothing was kept."""


class AsyncTurnStream:
    """A turn seen from the event loop: its StreamEvents as they come (``async for``), then ``outcome``, the
    committed turn. ``aclose()`` abandons it (the identity is released, nothing is written)."""

    def __init__(self, events: Callable[[list[CommittedTurn]], AsyncGenerator[StreamEvent, None]]) -> None:
        self._ended: list[CommittedTurn] = []
        self._events = events(self._ended)

    def __aiter__(self) -> AsyncTurnStream:
        return self

    async def __anext__(self) -> StreamEvent:
        return await anext(self._events)

    @property
    def outcome(self) -> CommittedTurn:
        if not self._ended:
            raise RuntimeError("the turn has not ended: read its events first")
        return self._ended[0]

    async def aclose(self) -> None:
        await self._events.aclose()


class TurnService:
    def __init__(self, turns: TurnRunner, metrics: Metrics, max_concurrent: int, batcher: Batcher | None = None) -> None:
        self.turns = turns
        self.metrics = metrics
        self.limiter = anyio.CapacityLimiter(max_concurrent)
        self.batcher = batcher

    def close(self) -> None:
        """Stop the batcher (turns still in it fail); the app's lifespan calls this on shutdown."""
        if self.batcher is not None:
            self.batcher.close()

    @property
    def tokenizer(self) -> Tokenizer:
        """The loaded model's tokenizer (token texts and bytes for log-probability reports)."""
        return self.turns.tokenizer

    async def turn(
        self, persona: str, user: str, message: str, sampling: Sampling, *, gone: Disconnected | None = None
    ) -> CommittedTurn:
        """A whole turn. With ``gone``, a client that disconnects before the end abandons it (nothing is kept)."""
        turn = self.stream(persona, user, message, sampling, gone=gone)
        async for _ in turn:
            pass
        return turn.outcome

    def stream(
        self, persona: str, user: str, message: str, sampling: Sampling, *, gone: Disconnected | None = None
    ) -> AsyncTurnStream:
        """The turn, one event per worker-thread hop; ``gone()`` is asked before each hop. Nothing starts
        before the first event is asked for.

        Waiting for the identity happens outside the inference slots: a turn waiting for a busy identity must
        not hold a slot the turn that holds the identity needs in order to finish.
        """
        return AsyncTurnStream(partial(self._events, persona, user, message, sampling, gone))

    async def _events(
        self, persona: str, user: str, message: str, sampling: Sampling, gone: Disconnected | None, ended: list[CommittedTurn]
    ) -> AsyncGenerator[StreamEvent, None]:
        started = time.perf_counter()
        outcome = "abandoned"
        held: list[HeldTurn] = []  # filled in the worker thread, so a cancelled wait still finds its hold
        gen: Stream[CommittedTurn] | None = None
        batched: SubmittedTurn | None = None
        try:
            if gone is not None and await gone():
                raise ClientGone
            await anyio.to_thread.run_sync(lambda: held.append(self.turns.begin_turn(persona, user, message, sampling)))
            pending = held[0]
            if self.batcher is None:
                gen = pending.run()
                while True:
                    if gone is not None and await gone():
                        raise ClientGone
                    item = await anyio.to_thread.run_sync(next, gen, _END, limiter=self.limiter)
                    if item is _END:
                        break
                    assert isinstance(item, StreamEvent)
                    yield item
                done = gen.result
            else:
                loop = asyncio.get_running_loop()
                inbox: asyncio.Queue[StreamEvent | TurnResult | BaseException] = asyncio.Queue()
                decoding = time.perf_counter()

                def deliver(item: StreamEvent | TurnResult | BaseException) -> None:
                    with contextlib.suppress(RuntimeError):  # a closed event loop: nobody reads this turn any more
                        loop.call_soon_threadsafe(inbox.put_nowait, item)

                batched = self.batcher.submit(pending.request, pending.params, deliver)
                while True:
                    got = await inbox.get()
                    if isinstance(got, BaseException):
                        raise got
                    if isinstance(got, TurnResult):
                        break
                    if gone is not None and await gone():
                        raise ClientGone
                    yield got
                batched = None  # decoded: nothing left to cancel
                latency_ms = (time.perf_counter() - decoding) * 1000
                done = await anyio.to_thread.run_sync(pending.commit, got, latency_ms)
            outcome = "ok"
            self._record(time.perf_counter() - started, done.prompt_tokens, done.completion_tokens)
            self.metrics.shock.observe(done.shock)
            ended.append(done)
        except BusyError:
            outcome = "busy"
            raise
        except OverloadedError:
            outcome = "overloaded"
            raise
        except ClientGone:
            raise
        except Exception:
            outcome = "error"
            raise
        finally:
            if batched is not None and self.batcher is not None:
                self.batcher.cancel(batched)  # frees its row before the next step
            if outcome != "ok" and held:
                with anyio.CancelScope(shield=True):  # runs even when the request task is being cancelled
                    await anyio.to_thread.run_sync(_abandon, gen, held[0])
            self.metrics.turns.labels(outcome=outcome).inc()

    async def counterfactual(
        self, persona: str, user: str, message: str, sampling: Sampling, *, against: int | None = None
    ) -> CounterfactualOutcome:
        """The turns' counterfactual in a worker thread, in one inference slot (it holds no identity).

        Counted like a turn: by outcome, with its latency and the tokens of both sides; its shocks are not
        observed, since no identity's state moves.
        """
        started = time.perf_counter()
        outcome = "abandoned"
        try:
            run = partial(self.turns.counterfactual, persona, user, message, sampling, against=against)
            result = await anyio.to_thread.run_sync(run, limiter=self.limiter)
            outcome = "ok"
        except BusyError:
            outcome = "busy"
            raise
        except Exception:
            outcome = "error"
            raise
        finally:
            self.metrics.turns.labels(outcome=outcome).inc()
        sides = (result.current, result.other)
        self._record(time.perf_counter() - started, sum(s.prompt_tokens for s in sides), sum(s.completion_tokens for s in sides))
        return result

    def _record(self, seconds: float, prompt_tokens: int, completion_tokens: int) -> None:
        self.metrics.turn_seconds.observe(seconds)
        self.metrics.tokens.labels(kind="prompt").inc(prompt_tokens)
        self.metrics.tokens.labels(kind="completion").inc(completion_tokens)


def _abandon(gen: Stream[CommittedTurn] | None, pending: HeldTurn) -> None:
    """Close the turn's generator (if it started) and let go of the identity; nothing is written."""
    if gen is not None:
        gen.close()
    pending.release()
