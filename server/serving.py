"""The runtime seen from the event loop: turns run in worker threads, never on the loop itself.

At most ``max_concurrent_turns`` turns compute at once per process (an anyio capacity limiter); a streamed
turn takes a slot only while it computes its next token, so a slow reader does not hold one. A stream that is
closed early (the client went away) closes the runtime's generator, which releases the identity unchanged.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator

import anyio
import anyio.to_thread

from server.errors import BusyError
from server.observability import Metrics
from server.runtime import PendingTurn, Runtime, Sampling, TurnOutcome
from sia.model.generate import StreamEvent

__all__ = ["ClientGone", "Disconnected", "TurnService"]

_END = object()
Disconnected = Callable[[], Awaitable[bool]]


class ClientGone(Exception):
    """The client disconnected before its turn completed; the turn was abandoned and nothing was kept."""


class TurnService:
    def __init__(self, runtime: Runtime, metrics: Metrics, max_concurrent: int) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.limiter = anyio.CapacityLimiter(max_concurrent)

    async def turn(
        self, persona: str, user: str, message: str, sampling: Sampling, *, gone: Disconnected | None = None
    ) -> TurnOutcome:
        """A whole turn. With ``gone``, a client that disconnects before the end abandons it (nothing is kept)."""
        async for item in self.stream(persona, user, message, sampling, gone=gone):
            if isinstance(item, TurnOutcome):
                return item
        raise AssertionError("a turn ended without an outcome")

    async def stream(
        self, persona: str, user: str, message: str, sampling: Sampling, *, gone: Disconnected | None = None
    ) -> AsyncGenerator[StreamEvent | TurnOutcome, None]:
        """The runtime's turn, one item per worker-thread hop; ``gone()`` is asked before each hop.

        Waiting for the identity happens outside the inference slots: a turn waiting for a busy identity must
        not hold a slot the turn that holds the identity needs in order to finish.
        """
        started = time.perf_counter()
        outcome = "abandoned"
        held: list[PendingTurn] = []  # filled in the worker thread, so a cancelled wait still finds its hold
        gen: Generator[StreamEvent | TurnOutcome, None, None] | None = None
        try:
            if gone is not None and await gone():
                raise ClientGone
            await anyio.to_thread.run_sync(lambda: held.append(self.runtime.begin_turn(persona, user, message, sampling)))
            gen = held[0].run()
            while True:
                if gone is not None and await gone():
                    raise ClientGone
                item = await anyio.to_thread.run_sync(next, gen, _END, limiter=self.limiter)
                if item is _END:
                    break
                assert isinstance(item, StreamEvent | TurnOutcome)
                if isinstance(item, TurnOutcome):
                    outcome = "ok"
                    self._record(item, time.perf_counter() - started)
                yield item
        except BusyError:
            outcome = "busy"
            raise
        except ClientGone:
            raise
        except Exception:
            outcome = "error"
            raise
        finally:
            if outcome != "ok" and held:
                with anyio.CancelScope(shield=True):  # runs even when the request task is being cancelled
                    await anyio.to_thread.run_sync(_abandon, gen, held[0])
            self.metrics.turns.labels(outcome=outcome).inc()

    def _record(self, out: TurnOutcome, seconds: float) -> None:
        self.metrics.turn_seconds.observe(seconds)
        self.metrics.tokens.labels(kind="prompt").inc(out.prompt_tokens)
        self.metrics.tokens.labels(kind="completion").inc(out.completion_tokens)
        self.metrics.shock.observe(out.shock)


def _abandon(gen: Generator[StreamEvent | TurnOutcome, None, None] | None, pending: PendingTurn) -> None:
    """Close the turn's generator (if it started) and let go of the identity; nothing is written."""
    if gen is not None:
        gen.close()
    pending.release()
