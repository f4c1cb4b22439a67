"""Continuous batching in the service: one thread owns a DecodeBatch and decodes the turns of many identities.

A turn whose identity is held is submitted with its request and decoding parameters. A second thread, the
prefiller, computes its conditioning and prefills it (with the turns that were waiting with it, in one padded
forward) while the batch goes on stepping; the batcher thread joins it to the running batch between two steps. Every
step decodes one token for every row in one forward (a joining turn's imprint is written after its prefill, on the
prefiller's thread, once the turn has joined: the write needs the prompt only, so the turn's first token does not wait
for it, only its conclusion does); a row that stops is concluded (shock, summary, new state: the
TurnResult it would reach alone) and leaves. What a turn sees, in order, through its ``deliver`` callback: its
StreamEvents (``row`` 0), then its TurnResult, or an exception instead of the rest. Storing the result is the
caller's: the identity's lease and transaction stay with the turn, as without batching.

Waiting turns queue in arrival order (at most ``max_queue``; more are refused with OverloadedError) and join as
rows leave, so no row starves; a cancelled turn leaves before the next step and its row is freed at once. One
prefill runs at a time: the turns that arrive during it are prefilled together next. When at least as many turns
join as rows decode, the batcher thread pauses the steps and prefills half of them while the prefiller does the
other half. Decoding and prefilling thus share out two cores (a prefill no longer
stops every row's stream while it computes), and a row's tokens are still the ones it decodes alone.

Threads (``threads`` > 1, the service's ``SIA_BATCH_THREADS``): while no prefill computes beside them, the steps run
on a third thread, ``sia-wide``, whose torch computations use ``threads`` threads, and so does the prefill of turns
that arrive while nothing decodes; the batcher thread and the prefiller compute on one thread each. Each of these
threads keeps its count for good (torch's counts are per thread): switching a thread's count would also change the
default every other thread of the process starts with.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from server.errors import OverloadedError
from server.observability import Metrics
from sia.identity.imprint import Imprint
from sia.identity.turn import (
    TurnPrompt,
    TurnRequest,
    TurnResult,
    conclude_turns,
    imprint_message,
    reply_params,
    turn_prompt,
)
from sia.model.batching import DecodeBatch, Prefilled
from sia.model.generate import SamplingParams, StreamEvent, check_room
from sia.model.identity_model import IdentityModel

__all__ = ["Batcher", "Delivery", "SubmittedTurn", "available_cores"]

log = logging.getLogger("sia.batcher")
T = TypeVar("T")

Delivery = Callable[[StreamEvent | TurnResult | BaseException], None]
Prefill = tuple[list["SubmittedTurn"], Prefilled | BaseException]  # turns prefilled together, or one turn's error


@dataclass(eq=False)
class SubmittedTurn:
    """A submitted turn; ``Batcher.cancel`` it when its reader is gone."""

    request: TurnRequest
    prompt: TurnPrompt
    params: SamplingParams
    deliver: Delivery
    cancelled: bool = False
    row: int | None = None  # its handle in the DecodeBatch once it joined
    writing: Future[Imprint] | None = None  # its identity's new imprint, written after its prefill (None: none kept)


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _own_threads(n: int) -> None:
    """This thread's torch computations on ``n`` threads for good. torch gives a thread the process's default count
    when it first computes, after any count set before: asking for the count makes that happen now."""
    torch.set_num_threads(n)
    torch.get_num_threads()


def _on(pool: ThreadPoolExecutor | None, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on the pool's thread (waiting for it), or on this one."""
    return fn(*args) if pool is None else pool.submit(fn, *args).result()


class Batcher:
    """Turns of many identities decoding in one batch, on a thread of its own (``start()``, ``close()``)."""

    def __init__(
        self,
        model: IdentityModel,
        *,
        max_batch: int,
        max_queue: int,
        wait_s: float = 0.0,
        threads: int = 1,
        metrics: Metrics | None = None,
    ) -> None:
        if max_batch < 1 or max_queue < 1 or wait_s < 0 or threads < 1:
            raise ValueError(
                "need max_batch >= 1, max_queue >= 1, wait_s >= 0, threads >= 1;"
                f" got {max_batch}, {max_queue}, {wait_s}, {threads}"
            )
        if not model.stateful:
            raise ValueError(f"batched turns need a stateful model; {model.config.attention!r} keeps no identity state")
        self.model, self.tokenizer = model, model.tokenizer
        self.max_batch, self.max_queue, self.wait_s, self.threads = max_batch, max_queue, wait_s, threads
        self.metrics = metrics
        self._waiting: deque[SubmittedTurn] = deque()
        self._cancelled: list[SubmittedTurn] = []
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="sia-batcher", daemon=True)
        self._ready = threading.Event()  # the threads' counts are set

    def start(self) -> Batcher:
        """Start the batcher's threads. torch takes a thread's count as the default of threads yet to compute; the
        threads' own counts set, the default is put back to the calling thread's, so that no other thread of the
        process starts computing on the batch's many threads (a second OpenMP team beside the batch's would make
        every parallel region of every step wait for a sleeping thread: 2 users 26 instead of 43 tokens/s)."""
        mine = torch.get_num_threads()
        self._thread.start()
        self._ready.wait()
        torch.set_num_threads(mine)
        return self

    def close(self) -> None:
        """Stop the thread; turns still waiting or decoding get a RuntimeError."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def submit(self, request: TurnRequest, params: SamplingParams, deliver: Delivery) -> SubmittedTurn:
        """Queue a turn. ValueError when its prompt and reply do not fit the context; OverloadedError when the queue
        is full; RuntimeError once closed. ``deliver`` is called on the batcher thread and must not block."""
        prompt = turn_prompt(self.tokenizer, request)
        check_room(self.model, len(prompt.tokens), params.max_new_tokens)
        turn = SubmittedTurn(request, prompt, reply_params(params, request), deliver)
        with self._lock:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            if len(self._waiting) >= self.max_queue:
                raise OverloadedError(f"{len(self._waiting)} turns are already waiting for the model; retry shortly")
            self._waiting.append(turn)
            self._gauge_queue()
            self._lock.notify_all()
        return turn

    def cancel(self, turn: SubmittedTurn) -> None:
        """Drop a turn (its reader is gone): from the queue now, from the batch before the next step; nothing more
        is delivered to it. Idempotent."""
        with self._lock:
            if turn.cancelled:
                return
            turn.cancelled = True
            if turn in self._waiting:
                self._waiting.remove(turn)
                self._gauge_queue()
            else:
                self._cancelled.append(turn)
            self._lock.notify_all()

    @property
    def queued(self) -> int:
        with self._lock:
            return len(self._waiting)

    # --- the batcher thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        _own_threads(1)  # this thread steps the batch beside a prefill: one core each
        prefiller = ThreadPoolExecutor(1, "sia-prefill", _own_threads, (1,))
        wide = ThreadPoolExecutor(1, "sia-wide", _own_threads, (self.threads,)) if self.threads > 1 else None
        with prefiller, wide or contextlib.nullcontext():
            try:
                for pool in (prefiller, wide):
                    if pool is not None:
                        pool.submit(int).result()  # its count is set now, while start() waits to restore the default
            finally:
                self._ready.set()
            self._loop(prefiller, wide)

    def _loop(self, prefiller: ThreadPoolExecutor, wide: ThreadPoolExecutor | None) -> None:
        batch = DecodeBatch(self.model, self.tokenizer)
        rows: dict[int, SubmittedTurn] = {}
        prefilling: Future[list[Prefill]] | None = None  # at most one group at a time; the next gathers who came meanwhile
        while True:
            joining, leaving = self._next_changes(rows, prefilling is not None)
            if joining is None:
                break
            for turn in leaving:
                if turn.row in rows:
                    batch.cancel(turn.row)
                    del rows[turn.row]
            if len(joining) > 1 and len(joining) >= len(rows):  # more to prefill than to decode: half each
                ahead = prefiller.submit(self._prefill, batch, joining[: len(joining) // 2], prefiller)
                mine = self._prefill(batch, joining[len(joining) // 2 :], prefiller)
                self._admit(batch, ahead.result() + mine, rows)
            elif joining and not rows and prefilling is None:  # nothing decodes: prefilled on every thread
                self._admit(batch, _on(wide, self._prefill, batch, joining, prefiller), rows)
            elif joining:  # beside the steps, which then run on this thread alone
                prefilling = prefiller.submit(self._prefill, batch, joining, prefiller)
            if prefilling is not None and (prefilling.done() or not rows):  # nothing to step: wait for it
                self._admit(batch, prefilling.result(), rows)
                prefilling = None
            if not rows:
                continue
            try:
                _on(None if prefilling is not None else wide, self._step, batch, rows)
            except Exception as exc:  # a failed step fails every row in it; the batch starts afresh
                log.exception("a batched decode step failed; its %d turns fail with it", len(rows))
                for turn in rows.values():
                    turn.deliver(exc)
                rows.clear()
                batch = DecodeBatch(self.model, self.tokenizer)
            if self.metrics is not None:
                self.metrics.batch_rows.set(len(rows))
        closed = RuntimeError("the service is shutting down")
        for turn in rows.values():
            turn.deliver(closed)
        if prefilling is not None:
            for group, _ in prefilling.result():
                for turn in group:
                    turn.deliver(closed)
        with self._lock:
            for turn in self._waiting:
                turn.deliver(closed)
            self._waiting.clear()

    def _step(self, batch: DecodeBatch, rows: dict[int, SubmittedTurn]) -> None:
        """One token for every row, streamed before the forward that feeds it back; the rows that stop are concluded
        and leave ``rows``."""
        started = time.perf_counter()
        events = batch.sample()
        for event in events:
            if not rows[event.row].cancelled:
                rows[event.row].deliver(replace(event, row=0))
        batch.advance()
        self._observe(len(events), time.perf_counter() - started)
        for rid in [r for r in rows if r in batch.done]:
            turn = rows.pop(rid)
            generation = batch.take(rid)
            if turn.cancelled:
                continue
            try:
                imprint = None if turn.writing is None else turn.writing.result()  # written long before, as a rule
            except Exception as exc:  # the write failed: this turn fails alone, the batch goes on
                turn.deliver(exc)
                continue
            concluded = conclude_turns(self.model, [turn.request], [turn.prompt], [generation], self.tokenizer, [imprint])
            turn.deliver(concluded[0])

    def _prefill(self, batch: DecodeBatch, joining: list[SubmittedTurn], writer: ThreadPoolExecutor) -> list[Prefill]:
        """On the prefill thread, while the batch steps: the joining turns prefilled together, in one padded forward;
        if that fails, one by one, so that only a turn that fails alone gets its error (the batch goes on). Each turn's
        imprint write is handed to ``writer`` (the prefiller: after this prefill, while the turns already decode)."""
        groups = [joining] if len(joining) > 1 else [[turn] for turn in joining]
        done: list[Prefill] = []
        while groups:
            group = groups.pop(0)
            try:
                with torch.no_grad():
                    states = [turn.request.state for turn in group]
                    reads_from = [len(turn.request.context) for turn in group]
                    cond = self.model.condition_states(states, reads_from, [turn.prompt.message for turn in group])
                prompts, counted = [t.prompt.tokens for t in group], [t.prompt.counted for t in group]
                scored = [t.prompt.scored[0] for t in group]  # the message's NLL on: no logits for the persona's prompt
                prefilled = batch.prefill(prompts, cond, [t.params for t in group], counted, scored)
                if self.model.config.imprint_tokens:  # the write needs the prefill only: not on the steps' thread
                    for b, turn in enumerate(group):
                        turn.writing = writer.submit(self._write, turn, prefilled.row_nll(b))
                done.append((group, prefilled))
            except Exception as exc:
                if len(group) == 1:
                    done.append((group, exc))
                else:
                    groups.extend([turn] for turn in group)
        return done

    def _write(self, turn: SubmittedTurn, nll: torch.Tensor) -> Imprint:
        """The turn's new imprint from its message's NLL under its prefill (``imprint_message``)."""
        with torch.no_grad():
            return imprint_message(self.model, self.tokenizer, turn.request, turn.prompt, nll)

    def _admit(self, batch: DecodeBatch, prefilled: list[Prefill], rows: dict[int, SubmittedTurn]) -> None:
        """Between two steps: the prefilled turns join the batch (one that was cancelled meanwhile leaves at once)
        and ``rows``; a turn whose prefill failed gets its error."""
        for group, result in prefilled:
            if isinstance(result, BaseException):
                group[0].deliver(result)
                continue
            for turn, handle in zip(group, batch.admit(result), strict=True):
                if turn.cancelled:
                    batch.cancel(handle)
                    continue
                turn.row = handle
                rows[handle] = turn

    def _next_changes(
        self, rows: dict[int, SubmittedTurn], prefilling: bool
    ) -> tuple[list[SubmittedTurn] | None, list[SubmittedTurn]]:
        """Block until there is work; the turns that join now (None once closed; none while a prefill is under way,
        so that the turns arriving meanwhile are prefilled together next) and the rows to cancel."""
        n_rows = len(rows)
        with self._lock:
            while not self._closed and not self._waiting and not self._cancelled and n_rows == 0 and not prefilling:
                self._lock.wait()
            if n_rows == 0 and self.wait_s > 0 and self._waiting and not prefilling:  # an idle batch waits for mates
                deadline = time.monotonic() + self.wait_s
                while not self._closed and len(self._waiting) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                    self._lock.wait(left)
            if self._closed:
                return None, []
            leaving, self._cancelled = self._cancelled, []
            joining: list[SubmittedTurn] = []
            room = self.max_batch - n_rows + sum(1 for t in leaving if t.row in rows)
            while self._waiting and len(joining) < room and not prefilling:
                joining.append(self._waiting.popleft())
            self._gauge_queue()
            return joining, leaving

    def _gauge_queue(self) -> None:
        if self.metrics is not None:
            self.metrics.batch_queue.set(len(self._waiting))

    def _observe(self, rows: int, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.batch_size.observe(rows)
            self.metrics.batch_step_seconds.observe(seconds)
            self.metrics.batch_tokens.inc(rows)
