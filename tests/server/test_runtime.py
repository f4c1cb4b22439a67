from __future__ import annotations

import math
import threading

import pytest
import torch
from safetensors.torch import save as st_save
from sqlalchemy import update

from server.db.tables import IdentityRow
from server.errors import BusyError, CorruptStateError, NotFoundError
from server.runtime import DEFAULT_PERSONA, Runtime, Sampling, TurnOutcome
from server.store import sha256
from sia.identity.state import IdentityState, state_from_bytes, state_to_bytes
from tests.conftest import random_state

GREEDY = Sampling(max_tokens=12, temperature=0.0)


def test_default_personas_exist(runtime: Runtime) -> None:
    names = [p.name for p in runtime.store.list_personas()]
    assert DEFAULT_PERSONA in names
    assert runtime.store.get_persona("sia").preamble == "[sia]"
    assert runtime.ensure_default_personas() == []  # idempotent


def test_turn_persists_state_and_record(runtime: Runtime) -> None:
    out = runtime.turn("sia", "ana", "Hi, my favourite colour is green.", GREEDY)
    assert (out.turn, out.state_version) == (0, 2)
    assert out.completion_tokens >= 1 and out.prompt_tokens > 30
    assert math.isfinite(out.shock) and out.nll > 0
    version, state = runtime.state("sia", "ana")
    assert version == 2 and state.turns == 1 and state.shock.count == 1
    assert float(state.trace.abs().sum()) > 0 and float(state.self_state.abs().sum()) > 0
    [turn] = runtime.store.turns("sia", "ana")
    assert (turn.reply, turn.shock, turn.completion_tokens) == (out.reply, out.shock, out.completion_tokens)
    out2 = runtime.turn("sia", "ana", "And you?", GREEDY)
    assert (out2.turn, out2.state_version) == (1, 3)
    ident = runtime.store.get_identity("sia", "ana")
    assert (ident.turn_count, ident.shock_count) == (2, 2)


def test_state_round_trip_is_bit_exact(runtime: Runtime) -> None:
    original = random_state(runtime.config, seed=3)
    blob = state_to_bytes(original)
    version = runtime.import_state("sia", "bob", blob)
    assert version == 2  # created at version 1, imported as version 2
    assert runtime.export_state("sia", "bob") == blob
    assert runtime.store.get_identity("sia", "bob").state_sha256 == sha256(blob)
    _, loaded = runtime.state("sia", "bob")
    assert torch.equal(loaded.trace, original.trace) and torch.equal(loaded.self_state, original.self_state)
    assert loaded.turns == original.turns


def test_history_depends_on_the_past_and_reset_reproduces_a_fresh_identity(runtime: Runtime) -> None:
    runtime.turn("sia", "a", "I am furious, this is the worst day ever!!", GREEDY)
    runtime.turn("sia", "a", "Tell me about cats and dogs.", GREEDY)
    prompt = Sampling(max_tokens=16, temperature=1.0, seed=7)
    fresh = runtime.turn("sia", "fresh", "What do you know about me?", prompt)
    runtime.reset("sia", "a")
    after_reset = runtime.turn("sia", "a", "What do you know about me?", prompt)
    assert (after_reset.reply, after_reset.shock, after_reset.nll) == (fresh.reply, fresh.shock, fresh.nll)
    assert runtime.export_state("sia", "a") == runtime.export_state("sia", "fresh")
    assert runtime.store.get_identity("sia", "a").turn_count == 3  # a reset keeps the conversation record


def test_partial_resets(runtime: Runtime) -> None:
    runtime.import_state("sia", "u", state_to_bytes(random_state(runtime.config, seed=1)))
    _, before = runtime.state("sia", "u")
    runtime.reset("sia", "u", layers=[1])
    _, after = runtime.state("sia", "u")
    assert torch.equal(after.trace[0], before.trace[0]) and not after.trace[1].any()
    assert torch.equal(after.self_state, before.self_state)
    runtime.reset("sia", "u", self_only=True)
    _, after_s = runtime.state("sia", "u")
    assert not after_s.self_state.any() and torch.equal(after_s.trace, after.trace)
    assert [v.reason for v in runtime.history("sia", "u")][:2] == ["reset:self", "reset:layers"]
    with pytest.raises(ValueError, match="layers must be"):
        runtime.reset("sia", "u", layers=[5])
    with pytest.raises(ValueError, match="not both"):
        runtime.reset("sia", "u", layers=[0], self_only=True)


def test_rollback_and_diff(runtime: Runtime) -> None:
    first = runtime.turn("sia", "u", "My dog is called Rex.", GREEDY)
    snap = runtime.store.create_snapshot("sia", "u", "after-dog")
    runtime.turn("sia", "u", "I hate everything!", GREEDY)
    runtime.turn("sia", "u", "Sorry about that.", GREEDY)
    d = runtime.diff("sia", "u", first.state_version)
    assert (d.a, d.b, d.turns) == (2, 4, 2)
    assert len(d.trace_norm) == runtime.config.n_layer and len(d.trace_norm[0]) == runtime.config.n_head
    _, sa = runtime.state("sia", "u", 2)
    _, sb = runtime.state("sia", "u", 4)
    expected = torch.linalg.matrix_norm(sb.trace.double() - sa.trace.double())
    assert torch.allclose(torch.tensor(d.trace_norm, dtype=torch.float64), expected)
    assert d.self_norm == pytest.approx(float((sb.self_state.double() - sa.self_state.double()).norm()))
    assert all(x > 0 for row in d.trace_norm for x in row)
    assert runtime.diff("sia", "u", 3, 3).self_norm == 0.0

    v = runtime.rollback("sia", "u", version=2)
    assert v == 5
    assert runtime.export_state("sia", "u") == runtime.export_state("sia", "u", version=2)
    runtime.turn("sia", "u", "Again.", GREEDY)
    v = runtime.rollback("sia", "u", snapshot=snap.name)
    assert runtime.export_state("sia", "u") == runtime.export_state("sia", "u", version=snap.version)
    assert [h.reason for h in runtime.history("sia", "u")[:3]] == ["rollback:after-dog", "turn", "rollback:2"]
    with pytest.raises(NotFoundError):
        runtime.rollback("sia", "u", version=99)
    with pytest.raises(ValueError, match="exactly one"):
        runtime.rollback("sia", "u")


def test_cleanup_lowers_rank_and_keeps_energy(runtime: Runtime) -> None:
    runtime.import_state("sia", "u", state_to_bytes(random_state(runtime.config, seed=2)))
    version, report = runtime.cleanup("sia", "u", energy=0.5)
    assert version == 3
    assert bool((report.ranks < runtime.config.qk_dim).all()) and bool((report.energy_kept >= 0.5).all())
    _, cleaned = runtime.state("sia", "u")
    ranks = torch.linalg.matrix_rank(cleaned.trace.double(), rtol=1e-6)
    assert torch.equal(ranks, report.ranks)


def test_failure_mid_turn_changes_nothing(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime.turn("sia", "u", "hello", GREEDY)
    before = (runtime.export_state("sia", "u"), runtime.store.get_identity("sia", "u"))
    calls = {"n": 0}
    original = runtime.model.forward

    def failing(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 3:  # after the prefill, mid-decode
            raise RuntimeError("injected failure")
        return original(*args, **kwargs)

    monkeypatch.setattr(runtime.model, "forward", failing)
    with pytest.raises(RuntimeError, match="injected"):
        runtime.turn("sia", "u", "this turn fails", GREEDY)
    monkeypatch.undo()
    after = (runtime.export_state("sia", "u"), runtime.store.get_identity("sia", "u"))
    assert after[0] == before[0]
    assert (after[1].version, after[1].turn_count, after[1].busy) == (before[1].version, before[1].turn_count, False)
    assert len(runtime.store.turns("sia", "u")) == 1
    assert runtime.turn("sia", "u", "works again", GREEDY).turn == 1  # no stale hold left behind


def test_failing_commit_changes_nothing(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime.turn("sia", "u", "hello", GREEDY)
    before = runtime.export_state("sia", "u")

    def broken(*_a: object, **_k: object) -> int:
        raise RuntimeError("database went away")

    monkeypatch.setattr(runtime.store, "commit", broken)
    with pytest.raises(RuntimeError, match="went away"):
        runtime.turn("sia", "u", "lost", GREEDY)
    monkeypatch.undo()
    assert runtime.export_state("sia", "u") == before
    assert not runtime.store.get_identity("sia", "u").busy


def test_abandoned_stream_changes_nothing(runtime: Runtime) -> None:
    runtime.turn("sia", "u", "hello", GREEDY)
    before = runtime.export_state("sia", "u")
    stream = runtime.stream_turn("sia", "u", "a long answer please", Sampling(max_tokens=40, temperature=1.0, seed=1))
    next(stream)
    next(stream)
    stream.close()  # the client went away
    assert runtime.export_state("sia", "u") == before
    ident = runtime.store.get_identity("sia", "u")
    assert (ident.turn_count, ident.busy) == (1, False)
    items = list(runtime.stream_turn("sia", "u", "again", GREEDY))
    outcome = items[-1]
    assert isinstance(outcome, TurnOutcome) and outcome.turn == 1
    assert "".join(e.text for e in items[:-1]) == outcome.reply  # type: ignore[union-attr]


@pytest.mark.parametrize("damage", ["garbage", "checksum", "nan", "shape"])
def test_corrupt_state_raises_and_is_isolated(runtime: Runtime, damage: str) -> None:
    runtime.turn("sia", "bad", "hello", GREEDY)
    runtime.turn("sia", "good", "hello", GREEDY)
    good = runtime.export_state("sia", "bad")
    state = state_from_bytes(good, runtime.config)
    if damage == "garbage":
        blob = b"\x00garbage"
    elif damage == "checksum":
        blob = good[:-1] + bytes([good[-1] ^ 1])
    elif damage == "nan":
        trace = state.trace.clone()
        trace[0, 0, 0, 0] = float("nan")
        blob = _raw_blob(state, trace=trace)
    else:
        blob = _raw_blob(state, trace=state.trace[:1].clone())
    digest = sha256(good) if damage == "checksum" else sha256(blob)
    with runtime.store.transaction() as s:
        s.execute(update(IdentityRow).where(IdentityRow.user_id == "bad").values(state=blob, state_sha256=digest))
    with pytest.raises(CorruptStateError):
        runtime.turn("sia", "bad", "hello again", GREEDY)
    with pytest.raises(CorruptStateError):
        runtime.export_state("sia", "bad")
    assert runtime.store.get_identity("sia", "bad").version == 2  # never silently re-initialised
    assert runtime.turn("sia", "good", "still fine", GREEDY).turn == 1
    runtime.rollback("sia", "bad", version=2) if damage == "checksum" else runtime.reset("sia", "bad")
    assert runtime.turn("sia", "bad", "repaired", GREEDY).turn == 1


def _raw_blob(state: IdentityState, trace: torch.Tensor) -> bytes:
    """A well-formed safetensors blob with the given trace, bypassing state_to_bytes's invariants."""
    return bytes(
        st_save(
            {
                "trace": trace.contiguous(),
                "self_state": state.self_state.contiguous(),
                "counters": torch.tensor([state.turns, state.shock.count], dtype=torch.int64),
                "shock": torch.tensor([state.shock.mean, state.shock.m2], dtype=torch.float64),
                "format_version": torch.tensor([1], dtype=torch.int64),
            }
        )
    )


def test_bad_imports_are_refused(runtime: Runtime) -> None:
    runtime.turn("sia", "u", "hello", GREEDY)
    before = runtime.export_state("sia", "u")
    wrong_shape = _raw_blob(state_from_bytes(before, runtime.config), trace=torch.zeros(1, 1, 2, 2))
    for blob in (b"", b"not safetensors", before[: len(before) // 2], wrong_shape):
        with pytest.raises(ValueError):
            runtime.import_state("sia", "u", blob)
    assert runtime.export_state("sia", "u") == before
    assert not runtime.store.get_identity("sia", "u").busy


def test_bad_arguments(runtime: Runtime) -> None:
    with pytest.raises(NotFoundError, match="persona"):
        runtime.turn("nobody", "u", "hi", GREEDY)
    with pytest.raises(ValueError, match="user"):
        runtime.turn("sia", "", "hi", GREEDY)
    with pytest.raises(ValueError, match="user"):
        runtime.turn("sia", "a\r\nb", "hi", GREEDY)
    with pytest.raises(ValueError, match="NUL"):
        runtime.turn("sia", "u", "a\x00b", GREEDY)
    with pytest.raises(ValueError, match="temperature"):
        runtime.turn("sia", "u", "hi", Sampling(temperature=-1.0))
    with pytest.raises(NotFoundError):
        runtime.state("sia", "u")  # refused before the identity was created
    with pytest.raises(NotFoundError):
        runtime.state("sia", "never-seen")


def test_persona_dynamics_and_sampling_defaults(runtime: Runtime) -> None:
    runtime.store.create_persona("still", preamble="[sia]", alpha=0.0, temperature=0.0, max_tokens=5)
    out = runtime.turn("still", "u", "I am so angry!!!")
    assert out.completion_tokens <= 5
    _, state = runtime.state("still", "u")
    assert not state.trace.any()  # alpha = 0: experience does not deform this persona's metric
    initial = random_state(runtime.config, seed=9)
    runtime.store.create_persona("primed", preamble="[sia]", initial_state=state_to_bytes(initial))
    runtime.turn("primed", "u", "hi", GREEDY)
    _, v1 = runtime.state("primed", "u", version=1)
    assert torch.equal(v1.trace, initial.trace)


def test_concurrent_turns_in_threads_are_serial(runtime: Runtime) -> None:
    outcomes: list[TurnOutcome] = []
    errors: list[Exception] = []

    def worker(i: int) -> None:
        try:
            outcomes.append(runtime.turn("sia", "shared", f"message {i}", Sampling(max_tokens=6, temperature=1.0, seed=i)))
        except BusyError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(o.turn for o in outcomes) == list(range(8))
    assert sorted(o.state_version for o in outcomes) == list(range(2, 10))
    turns = runtime.store.turns("sia", "shared")
    assert [(t.version_before, t.version_after) for t in turns] == [(v, v + 1) for v in range(1, 9)]
    _, state = runtime.state("sia", "shared")
    assert state.turns == 8
