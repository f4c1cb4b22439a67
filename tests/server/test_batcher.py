"""The service's batcher (server.runtime.batcher): turns of different identities submitted at different times decode in
one batch and each ends as it would alone; a full queue refuses, a cancelled turn frees its row, a failing turn fails
alone, closing fails what is left."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

import server.runtime.batcher as batcher_module
import sia.model.generate as generate_module
from server.errors import OverloadedError
from server.observability import Metrics
from server.runtime.batcher import Batcher, SubmittedTurn
from sia.backbones.llama import LlamaModel
from sia.identity.state import Dynamics, IdentityState, StateFormatError
from sia.identity.turn import TurnRequest, TurnResult, run_turn
from sia.model.generate import SamplingParams, StreamEvent
from sia.model.identity_model import IdentityModel
from tests.sia.test_batching import llama, native, states

WAIT = 60.0  # seconds a test waits for a delivery before it fails (never reached when the batcher works)


class Reader:
    """One submitted turn's deliveries, read as the service reads them (in order, from another thread)."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[StreamEvent | TurnResult | BaseException] = queue.Queue()
        self.events: list[StreamEvent] = []
        self.turn: SubmittedTurn | None = None

    def deliver(self, item: StreamEvent | TurnResult | BaseException) -> None:
        self.inbox.put(item)

    def next_event(self) -> StreamEvent:
        item = self.inbox.get(timeout=WAIT)
        assert isinstance(item, StreamEvent), item
        self.events.append(item)
        return item

    def result(self) -> TurnResult:
        while True:
            item = self.inbox.get(timeout=WAIT)
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, TurnResult):
                return item
            self.events.append(item)


@pytest.fixture
def model() -> IdentityModel:
    return llama(2, 2)


def batcher_of(model: IdentityModel, **kw: object) -> Iterator[Batcher]:
    b = Batcher(model, **{"max_batch": 4, "max_queue": 8, **kw}).start()  # type: ignore[arg-type]
    try:
        yield b
    finally:
        b.close()


def requests_for(model: IdentityModel, n: int) -> list[TurnRequest]:
    dynamics = Dynamics.from_config(model.config)
    # each but the question says something of the user (a clause that only greets, "hello there", imprints nothing)
    messages = [
        "hello there, I knit",
        "a longer message, which joins late",
        "I row",
        "what do you remember?",
        "ok",
        "tell me more",
    ]
    return [
        TurnRequest(state=s, message=messages[i % len(messages)], dynamics=dynamics, context=(1, 2, 3)[: i % 3])
        for i, s in enumerate(states(model, n))
    ]


PARAMS = [
    SamplingParams(max_new_tokens=7, temperature=0.0),
    SamplingParams(max_new_tokens=5, temperature=0.9, seed=3, top_k=20),
    SamplingParams(max_new_tokens=9, temperature=1.0, seed=4, top_p=0.9),
    SamplingParams(max_new_tokens=3, temperature=0.0),
]


def assert_same_turn(got: TurnResult, want: TurnResult) -> None:
    assert got.reply == want.reply and got.finish_reason == want.finish_reason
    assert got.completion_tokens == want.completion_tokens and got.prompt_tokens == want.prompt_tokens
    assert got.shock == pytest.approx(want.shock, abs=1e-5) and got.nll == pytest.approx(want.nll, abs=1e-5)
    assert got.state.turns == want.state.turns
    torch.testing.assert_close(got.state.self_state, want.state.self_state, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.state.trace.float(), want.state.trace.float(), atol=1e-3, rtol=0)


@pytest.mark.parametrize("build", [lambda: llama(2, 2), native], ids=["llama-memory-slots", "native"])
def test_turns_submitted_at_different_steps_end_as_they_would_alone(build: object) -> None:
    model: IdentityModel = build()  # type: ignore[operator]
    requests = requests_for(model, 4)
    alone = [run_turn(model, r, p) for r, p in zip(requests, PARAMS, strict=True)]
    metrics = Metrics()
    for b in batcher_of(model, metrics=metrics):
        readers = [Reader() for _ in requests]
        readers[0].turn = b.submit(requests[0], PARAMS[0], readers[0].deliver)
        readers[0].next_event()
        readers[0].next_event()  # the first row has decoded two tokens when the next two join
        for i in (1, 2):
            readers[i].turn = b.submit(requests[i], PARAMS[i], readers[i].deliver)
        readers[1].next_event()
        readers[3].turn = b.submit(requests[3], PARAMS[3], readers[3].deliver)
        results = [r.result() for r in readers]
    for reader, got, want in zip(readers, results, alone, strict=True):
        assert_same_turn(got, want)
        assert "".join(e.text for e in reader.events) == want.reply  # the streamed text is the reply
        assert {e.row for e in reader.events} == {0}  # each turn sees itself as row 0
    sizes = metrics.batch_size.collect()[0].samples
    steps = next(s.value for s in sizes if s.name == "sia_batch_size_count")
    tokens = next(s.value for s in sizes if s.name == "sia_batch_size_sum")
    assert tokens == sum(r.completion_tokens for r in results)  # every token decoded once, in some step
    assert steps < tokens  # rows shared steps: fewer forwards than tokens


def test_a_full_batch_queues_in_order_and_a_full_queue_refuses(model: IdentityModel) -> None:
    requests = requests_for(model, 5)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    alone = [run_turn(model, r, params) for r in requests]
    gate, decoding = threading.Event(), threading.Event()
    started: list[int] = []

    def held(i: int, reader: Reader) -> object:
        def deliver(item: StreamEvent | TurnResult | BaseException) -> None:
            if not started or started[-1] != i:
                started.append(i)
            decoding.set()
            gate.wait(WAIT)  # the batcher thread stops here until the test has filled the queue
            reader.deliver(item)

        return deliver

    for b in batcher_of(model, max_batch=1, max_queue=3):
        readers = [Reader() for _ in range(4)]
        readers[0].turn = b.submit(requests[0], params, held(0, readers[0]))  # type: ignore[arg-type]
        assert decoding.wait(WAIT)  # the first turn holds the only row
        for i, reader in enumerate(readers[1:], start=1):
            reader.turn = b.submit(requests[i], params, held(i, reader))  # type: ignore[arg-type]
        with pytest.raises(OverloadedError, match="3 turns are already waiting"):
            b.submit(requests[4], params, Reader().deliver)
        assert b.queued == 3  # the refused turn left no trace
        gate.set()
        results = [r.result() for r in readers]
    assert started == [0, 1, 2, 3]  # one row at a time, in arrival order: none starves
    for got, want in zip(results, alone[:4], strict=True):
        assert_same_turn(got, want)


def test_a_cancelled_turn_frees_its_row_and_gets_nothing_more(model: IdentityModel) -> None:
    requests = requests_for(model, 3)
    long = SamplingParams(max_new_tokens=40, temperature=0.0)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    metrics = Metrics()
    for b in batcher_of(model, max_batch=2, metrics=metrics):
        gone, queued, stays = Reader(), Reader(), Reader()
        gone.turn = b.submit(requests[0], long, gone.deliver)
        stays.turn = b.submit(requests[1], params, stays.deliver)
        gone.next_event()
        queued.turn = b.submit(requests[2], params, queued.deliver)  # the batch is full: it waits
        b.cancel(queued.turn)  # cancelled while queued: never decoded
        b.cancel(gone.turn)  # cancelled while decoding: its row goes before the next step
        b.cancel(gone.turn)  # idempotent
        result = stays.result()
        late = Reader()
        late.turn = b.submit(requests[2], params, late.deliver)  # the freed row takes a new turn
        late_result = late.result()
    assert_same_turn(result, run_turn(model, requests[1], params))
    assert_same_turn(late_result, run_turn(model, requests[2], params))
    assert queued.inbox.empty()
    delivered = gone.events + list(gone.inbox.queue)
    assert all(isinstance(x, StreamEvent) for x in delivered) and len(delivered) < 40  # no result, stopped early
    assert metrics.batch_tokens.collect()[0].samples[0].value < 40 + 2 * 6  # the long row did not run to its end


def test_a_prefill_runs_on_its_own_thread_while_the_batch_goes_on_stepping(
    model: IdentityModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While fewer turns join than rows decode, the joining turns are prefilled (held here) on the prefiller thread
    and the running rows keep streaming; then they join and end as they would alone. A turn cancelled during its
    prefill gets nothing, and its row leaves."""
    from sia.model.batching import DecodeBatch

    requests = requests_for(model, 5)
    # long enough that the rows still decode when the later turns join, however fast the steps go
    long = SamplingParams(max_new_tokens=90, temperature=0.0)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    hold, release, holding = threading.Event(), threading.Event(), threading.Event()
    threads: list[str] = []
    original = DecodeBatch.prefill

    def held_prefill(self: DecodeBatch, *args: object, **kw: object) -> object:
        if hold.is_set():  # the running rows' prefills went through; the later ones wait for the test
            threads.append(threading.current_thread().name)
            holding.set()
            assert release.wait(WAIT)
        return original(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(DecodeBatch, "prefill", held_prefill)
    metrics = Metrics()
    for b in batcher_of(model, metrics=metrics):
        running = [Reader() for _ in range(3)]
        for reader, request in zip(running, requests[:3], strict=True):
            reader.turn = b.submit(request, long, reader.deliver)
            reader.next_event()  # one at a time: three rows decode
        hold.set()
        joining, dropped = Reader(), Reader()
        joining.turn = b.submit(requests[3], params, joining.deliver)
        dropped.turn = b.submit(requests[4], params, dropped.deliver)
        assert holding.wait(WAIT)
        for _ in range(5):
            running[0].next_event()  # the rows decode on while the others are being prefilled
        b.cancel(dropped.turn)
        release.set()
        got = joining.result()
        results = [r.result() for r in running]
    assert threads and {name.startswith("sia-prefill") for name in threads} == {True}
    assert_same_turn(got, run_turn(model, requests[3], params))
    for result, request in zip(results, requests[:3], strict=True):
        assert_same_turn(result, run_turn(model, request, long))
    assert dropped.inbox.empty()
    tokens = metrics.batch_tokens.collect()[0].samples[0].value
    assert tokens == sum(r.completion_tokens for r in results) + got.completion_tokens  # the cancelled row never decoded


def test_turns_that_outnumber_the_rows_are_prefilled_half_on_each_thread(
    model: IdentityModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four turns gathered by an idle batch (``wait_s``: more to prefill than to decode) are prefilled two on the
    batcher thread and two on the prefiller, at the same time, and each ends as it would alone."""
    from sia.model.batching import DecodeBatch

    requests = requests_for(model, 4)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    calls: list[tuple[str, int]] = []
    original = DecodeBatch.prefill

    def recorded(self: DecodeBatch, prompts: list[list[int]], *args: object, **kw: object) -> object:
        calls.append((threading.current_thread().name, len(prompts)))
        return original(self, prompts, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(DecodeBatch, "prefill", recorded)
    for b in batcher_of(model, wait_s=2.0):
        readers = [Reader() for _ in requests]
        for reader, request in zip(readers, requests, strict=True):
            reader.turn = b.submit(request, params, reader.deliver)
        results = [r.result() for r in readers]
    assert sorted((name.split("_")[0], n) for name, n in calls) == [("sia-batcher", 2), ("sia-prefill", 2)]
    for got, request in zip(results, requests, strict=True):
        assert_same_turn(got, run_turn(model, request, params))


def test_the_batch_computes_on_its_threads_unless_a_prefill_computes_beside_it(
    model: IdentityModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``threads``: a turn that arrives while nothing decodes is prefilled on the wide thread with all of them, and the
    steps run there while no prefill computes beside them; a prefill beside the steps runs on the prefiller with one
    thread, and the steps meanwhile on the batcher thread with one. Each turn ends as it would alone, and a thread
    that starts computing afterwards still gets the process's count, not the batch's."""
    from sia.model.batching import DecodeBatch

    requests = requests_for(model, 2)
    long = SamplingParams(max_new_tokens=30, temperature=0.0)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    prefills: list[tuple[str, int]] = []
    steps: list[tuple[str, int]] = []
    prefill, advance = DecodeBatch.prefill, DecodeBatch.advance

    def where() -> tuple[str, int]:
        return threading.current_thread().name.split("_")[0], torch.get_num_threads()

    def counted_prefill(self: DecodeBatch, *args: object, **kw: object) -> object:
        prefills.append(where())
        return prefill(self, *args, **kw)  # type: ignore[arg-type]

    def counted_advance(self: DecodeBatch) -> None:
        steps.append(where())
        advance(self)

    def fresh_count() -> int:
        counts: list[int] = []
        thread = threading.Thread(target=lambda: counts.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        return counts[0]

    default = fresh_count()
    wide = default + 1  # differs from the default, so that leaking it would show
    monkeypatch.setattr(DecodeBatch, "prefill", counted_prefill)
    monkeypatch.setattr(DecodeBatch, "advance", counted_advance)
    for b in batcher_of(model, threads=wide):
        assert fresh_count() == default
        first, second = Reader(), Reader()
        first.turn = b.submit(requests[0], long, first.deliver)
        for _ in range(3):
            first.next_event()  # two steps of the lone row
        second.turn = b.submit(requests[1], params, second.deliver)
        results = [first.result(), second.result()]
        assert fresh_count() == default
    assert prefills[0] == ("sia-wide", wide) and prefills[1] == ("sia-prefill", 1)
    assert steps[:2] == [("sia-wide", wide)] * 2 and set(steps) <= {("sia-wide", wide), ("sia-batcher", 1)}
    for got, request, p in zip(results, requests, (long, params), strict=True):
        assert_same_turn(got, run_turn(model, request, p))


def test_a_turn_that_cannot_fit_is_refused_at_submit_and_a_failing_turn_fails_alone(model: IdentityModel) -> None:
    requests = requests_for(model, 2)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    for b in batcher_of(model):
        with pytest.raises(ValueError, match="exceeds the model's context"):
            b.submit(requests[0], SamplingParams(max_new_tokens=model.config.block_size), Reader().deliver)
        bad_state = IdentityState(
            trace=requests[1].state.trace, self_state=torch.zeros(model.config.d_self + 1), turns=0
        )  # a wrong self-state width: its conditioning fails in the batcher thread
        bad, good = Reader(), Reader()
        bad.turn = b.submit(TurnRequest(bad_state, "hello", requests[1].dynamics), params, bad.deliver)
        good.turn = b.submit(requests[0], params, good.deliver)
        with pytest.raises(StateFormatError, match="self_state has shape"):
            bad.result()
        assert_same_turn(good.result(), run_turn(model, requests[0], params))


def test_closing_fails_the_turns_left_and_refuses_new_ones(model: IdentityModel) -> None:
    requests = requests_for(model, 2)
    b = Batcher(model, max_batch=1, max_queue=4).start()
    first, second = Reader(), Reader()
    first.turn = b.submit(requests[0], SamplingParams(max_new_tokens=60, temperature=0.0), first.deliver)
    second.turn = b.submit(requests[1], SamplingParams(max_new_tokens=5, temperature=0.0), second.deliver)
    first.next_event()
    b.close()
    for reader in (first, second):
        with pytest.raises(RuntimeError, match="shutting down"):
            reader.result()
    with pytest.raises(RuntimeError, match="closed"):
        b.submit(requests[0], SamplingParams(max_new_tokens=5), Reader().deliver)


def test_bad_settings_are_refused(model: IdentityModel) -> None:
    for kw in (
        {"max_batch": 0, "max_queue": 1},
        {"max_batch": 1, "max_queue": 0},
        {"max_batch": 1, "max_queue": 1, "wait_s": -1},
        {"max_batch": 1, "max_queue": 1, "threads": 0},
    ):
        with pytest.raises(ValueError, match="need max_batch"):
            Batcher(model, **kw)  # type: ignore[arg-type]


def test_turns_of_a_model_with_an_imprint_write_it_as_they_would_alone() -> None:
    """The imprint's write needs a turn's prefill only, so the batcher writes it on the prefiller's thread, beside the
    decoding: each turn's new imprint is still the one it writes alone."""
    model = llama(2, 2)
    assert isinstance(model, LlamaModel)
    model.add_imprint(24, 4)
    model.config = replace(model.config, imprint_min_shock=0.0)  # a tiny random model: every clause surprises enough
    requests = requests_for(model, 3)
    alone = [run_turn(model, r, p) for r, p in zip(requests, PARAMS[:3], strict=True)]
    assert all(a.state.imprint is not None and a.state.imprint.used > 0 for a in alone)
    for b in batcher_of(model):
        readers = [Reader() for _ in requests]
        for reader, request, params in zip(readers, requests, PARAMS[:3], strict=True):
            reader.turn = b.submit(request, params, reader.deliver)
        got = [reader.result() for reader in readers]
    for g, a in zip(got, alone, strict=True):
        assert_same_turn(g, a)
        assert g.state.imprint is not None and a.state.imprint is not None
        for name in ("span", "token", "turn", "offset", "kind", "keys", "values"):
            assert torch.equal(getattr(g.state.imprint, name), getattr(a.state.imprint, name)), name
        torch.testing.assert_close(g.state.imprint.score, a.state.imprint.score)


def test_a_turns_first_token_does_not_wait_for_its_imprint_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The write runs after the turn has joined the batch: a write that waits for the turn's first token is let go by
    it (a write before the first token would wait for ever), and the turn still ends with the imprint it writes alone
    and the result it reaches alone."""
    model = llama(2, 2)
    assert isinstance(model, LlamaModel)
    model.add_imprint(24, 4)
    model.config = replace(model.config, imprint_min_shock=0.0)
    (request,) = requests_for(model, 1)
    alone = run_turn(model, request, PARAMS[0])
    first_token, waited = threading.Event(), []
    write = batcher_module.imprint_message

    def after_the_first_token(*args: object) -> object:
        waited.append(first_token.wait(timeout=WAIT))
        return write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(batcher_module, "imprint_message", after_the_first_token)
    for b in batcher_of(model):
        reader = Reader()
        reader.turn = b.submit(request, PARAMS[0], reader.deliver)
        reader.next_event()
        first_token.set()
        got = reader.result()
    assert waited == [True]
    assert_same_turn(got, alone)
    assert got.state.imprint is not None and alone.state.imprint is not None
    assert torch.equal(got.state.imprint.keys, alone.state.imprint.keys) and got.state.imprint.used > 0


def test_a_failing_imprint_write_fails_its_turn_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that raises: its turn gets the error after its streamed tokens, the turn beside it ends as alone."""
    model = llama(2, 2)
    assert isinstance(model, LlamaModel)
    model.add_imprint(24, 4)
    model.config = replace(model.config, imprint_min_shock=0.0)
    requests = requests_for(model, 2)
    alone = run_turn(model, requests[1], PARAMS[1])
    write = batcher_module.imprint_message

    def failing_for_the_first(m: object, tok: object, request: TurnRequest, *rest: object) -> object:
        if request is requests[0]:
            raise RuntimeError("the write failed")
        return write(m, tok, request, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(batcher_module, "imprint_message", failing_for_the_first)
    for b in batcher_of(model):
        readers = [Reader() for _ in requests]
        for reader, request, params in zip(readers, requests, PARAMS[:2], strict=True):
            reader.turn = b.submit(request, params, reader.deliver)
        with pytest.raises(RuntimeError, match="the write failed"):
            readers[0].result()
        assert_same_turn(readers[1].result(), alone)


def test_turns_in_the_batcher_keep_to_their_messages_language_as_they_do_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every first word judged another language's: the batcher's turns are taken back and begun again, as a turn
    alone is (the batcher decodes each turn as a reply to its own message), and stream only the reply they keep."""
    model = llama(2, 2)
    requests = requests_for(model, 3)
    monkeypatch.setattr(generate_module, "foreign_opening", lambda opening, user, ended=False: False)
    unjudged = run_turn(model, requests[0], PARAMS[0])
    monkeypatch.setattr(generate_module, "foreign_opening", lambda opening, user, ended=False: True)
    alone = [run_turn(model, r, p) for r, p in zip(requests, PARAMS, strict=False)]
    assert alone[0].reply != unjudged.reply  # the rule really took the reply back
    for b in batcher_of(model):
        readers = [Reader() for _ in requests]
        for reader, request, params in zip(readers, requests, PARAMS, strict=False):
            reader.turn = b.submit(request, params, reader.deliver)
        results = [r.result() for r in readers]
    for reader, got, want in zip(readers, results, alone, strict=True):
        assert_same_turn(got, want)
        assert "".join(e.text for e in reader.events) == want.reply
        assert len(reader.events) == want.completion_tokens  # no event of a reply taken back
