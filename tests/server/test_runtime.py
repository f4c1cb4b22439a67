from __future__ import annotations

import math
import threading

import pytest
import torch
from safetensors.torch import save as st_save
from sqlalchemy import update

from server.db.tables import IdentityRow
from server.errors import BusyError, CorruptStateError, NotFoundError
from server.runtime.identities import Identities
from server.runtime.personas import Personas
from server.runtime.turns import CommittedTurn, TurnRunner
from server.store import Store, sha256
from sia.identity.state import IdentityState, state_from_bytes, state_to_bytes
from sia.model.generate import Sampling
from sia.personas import DEFAULT_PERSONA
from tests.conftest import random_state

GREEDY = Sampling(max_tokens=12, temperature=0.0)


def test_default_personas_exist(personas: Personas, store: Store) -> None:
    names = [p.name for p in store.list_personas()]
    assert DEFAULT_PERSONA in names
    assert store.get_persona("sia").preamble == "[sia]"
    assert personas.ensure_defaults() == []  # idempotent


def test_turn_persists_state_and_record(identities: Identities, turns: TurnRunner, store: Store) -> None:
    out = turns.turn("sia", "ana", "Hi, my favourite colour is green.", GREEDY)
    assert (out.turn, out.state_version) == (0, 2)
    assert out.completion_tokens >= 1 and out.prompt_tokens > 30
    assert math.isfinite(out.shock) and out.nll > 0
    version, state = identities.state("sia", "ana")
    assert version == 2 and state.turns == 1 and state.shock.count == 1
    assert float(state.trace.abs().sum()) > 0 and float(state.self_state.abs().sum()) > 0
    [turn] = store.turns("sia", "ana")
    assert (turn.reply, turn.shock, turn.completion_tokens) == (out.reply, out.shock, out.completion_tokens)
    out2 = turns.turn("sia", "ana", "And you?", GREEDY)
    assert (out2.turn, out2.state_version) == (1, 3)
    ident = store.get_identity("sia", "ana")
    assert (ident.turn_count, ident.shock_count) == (2, 2)


def test_state_round_trip_is_bit_exact(identities: Identities, store: Store) -> None:
    original = random_state(identities.config, seed=3)
    blob = state_to_bytes(original)
    version = identities.import_state("sia", "bob", blob)
    assert version == 2  # created at version 1, imported as version 2
    assert identities.export_state("sia", "bob")[1] == blob
    assert store.get_identity("sia", "bob").state_sha256 == sha256(blob)
    _, loaded = identities.state("sia", "bob")
    assert torch.equal(loaded.trace, original.trace) and torch.equal(loaded.self_state, original.self_state)
    assert loaded.turns == original.turns


def test_history_depends_on_the_past_and_reset_reproduces_a_fresh_identity(
    identities: Identities, turns: TurnRunner, store: Store
) -> None:
    turns.turn("sia", "a", "I am furious, this is the worst day ever!!", GREEDY)
    turns.turn("sia", "a", "Tell me about cats and dogs.", GREEDY)
    prompt = Sampling(max_tokens=16, temperature=1.0, seed=7)
    fresh = turns.turn("sia", "fresh", "What do you know about me?", prompt)
    identities.reset("sia", "a")
    after_reset = turns.turn("sia", "a", "What do you know about me?", prompt)
    assert (after_reset.reply, after_reset.shock, after_reset.nll) == (fresh.reply, fresh.shock, fresh.nll)
    assert identities.export_state("sia", "a")[1] == identities.export_state("sia", "fresh")[1]
    assert store.get_identity("sia", "a").turn_count == 3  # a reset keeps the conversation record


def test_partial_resets(identities: Identities) -> None:
    identities.import_state("sia", "u", state_to_bytes(random_state(identities.config, seed=1)))
    _, before = identities.state("sia", "u")
    identities.reset("sia", "u", layers=[1])
    _, after = identities.state("sia", "u")
    assert torch.equal(after.trace[0], before.trace[0]) and not after.trace[1].any()
    assert torch.equal(after.self_state, before.self_state)
    identities.reset("sia", "u", self_only=True)
    _, after_s = identities.state("sia", "u")
    assert not after_s.self_state.any() and torch.equal(after_s.trace, after.trace)
    assert [v.reason for v in identities.history("sia", "u").versions][:2] == ["reset:self", "reset:layers"]
    with pytest.raises(ValueError, match="layers must be"):
        identities.reset("sia", "u", layers=[5])
    with pytest.raises(ValueError, match="not both"):
        identities.reset("sia", "u", layers=[0], self_only=True)


def test_rollback_and_diff(identities: Identities, turns: TurnRunner, store: Store) -> None:
    first = turns.turn("sia", "u", "My dog is called Rex.", GREEDY)
    snap = store.create_snapshot("sia", "u", "after-dog")
    turns.turn("sia", "u", "I hate everything!", GREEDY)
    turns.turn("sia", "u", "Sorry about that.", GREEDY)
    d = identities.diff("sia", "u", first.state_version)
    assert (d.a, d.b, d.turns) == (2, 4, 2)
    assert len(d.trace_norm) == identities.config.n_layer and len(d.trace_norm[0]) == identities.config.n_head
    _, sa = identities.state("sia", "u", 2)
    _, sb = identities.state("sia", "u", 4)
    expected = torch.linalg.matrix_norm(sb.trace.double() - sa.trace.double())
    assert torch.allclose(torch.tensor(d.trace_norm, dtype=torch.float64), expected)
    assert d.self_norm == pytest.approx(float((sb.self_state.double() - sa.self_state.double()).norm()))
    assert all(x > 0 for row in d.trace_norm for x in row)
    assert identities.diff("sia", "u", 3, 3).self_norm == 0.0

    v = identities.rollback("sia", "u", version=2)
    assert v == 5
    assert identities.export_state("sia", "u")[1] == identities.export_state("sia", "u", version=2)[1]
    turns.turn("sia", "u", "Again.", GREEDY)
    v = identities.rollback("sia", "u", snapshot=snap.name)
    assert identities.export_state("sia", "u")[1] == identities.export_state("sia", "u", version=snap.version)[1]
    assert [h.reason for h in identities.history("sia", "u").versions[:3]] == ["rollback:after-dog", "turn", "rollback:2"]
    with pytest.raises(NotFoundError):
        identities.rollback("sia", "u", version=99)
    with pytest.raises(ValueError, match="exactly one"):
        identities.rollback("sia", "u")


def test_cleanup_lowers_rank_and_keeps_energy(identities: Identities) -> None:
    identities.import_state("sia", "u", state_to_bytes(random_state(identities.config, seed=2)))
    version, report = identities.cleanup("sia", "u", energy=0.5)
    assert version == 3
    assert bool((report.ranks < identities.config.qk_dim).all()) and bool((report.energy_kept >= 0.5).all())
    _, cleaned = identities.state("sia", "u")
    ranks = torch.linalg.matrix_rank(cleaned.trace.double(), rtol=1e-6)
    assert torch.equal(ranks, report.ranks)


def test_failure_mid_turn_changes_nothing(
    identities: Identities, turns: TurnRunner, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns.turn("sia", "u", "hello", GREEDY)
    before = (identities.export_state("sia", "u")[1], store.get_identity("sia", "u"))
    calls = {"n": 0}
    original = turns.model.forward

    def failing(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 3:  # after the prefill, mid-decode
            raise RuntimeError("injected failure")
        return original(*args, **kwargs)

    monkeypatch.setattr(turns.model, "forward", failing)
    with pytest.raises(RuntimeError, match="injected"):
        turns.turn("sia", "u", "this turn fails", GREEDY)
    monkeypatch.undo()
    after = (identities.export_state("sia", "u")[1], store.get_identity("sia", "u"))
    assert after[0] == before[0]
    assert (after[1].version, after[1].turn_count, after[1].busy) == (before[1].version, before[1].turn_count, False)
    assert len(store.turns("sia", "u")) == 1
    assert turns.turn("sia", "u", "works again", GREEDY).turn == 1  # no stale hold left behind


def test_failing_commit_changes_nothing(
    identities: Identities, turns: TurnRunner, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns.turn("sia", "u", "hello", GREEDY)
    before = identities.export_state("sia", "u")[1]

    def broken(*_a: object, **_k: object) -> int:
        raise RuntimeError("database went away")

    monkeypatch.setattr(store, "commit", broken)
    with pytest.raises(RuntimeError, match="went away"):
        turns.turn("sia", "u", "lost", GREEDY)
    monkeypatch.undo()
    assert identities.export_state("sia", "u")[1] == before
    assert not store.get_identity("sia", "u").busy


def test_abandoned_stream_changes_nothing(identities: Identities, turns: TurnRunner, store: Store) -> None:
    turns.turn("sia", "u", "hello", GREEDY)
    before = identities.export_state("sia", "u")[1]
    stream = turns.stream_turn("sia", "u", "a long answer please", Sampling(max_tokens=40, temperature=1.0, seed=1))
    next(stream)
    next(stream)
    stream.close()  # the client went away
    assert identities.export_state("sia", "u")[1] == before
    ident = store.get_identity("sia", "u")
    assert (ident.turn_count, ident.busy) == (1, False)
    again = turns.stream_turn("sia", "u", "again", GREEDY)
    events = list(again)
    assert again.result.turn == 1
    assert "".join(e.text for e in events) == again.result.reply


def test_a_stream_has_no_result_before_its_end(turns: TurnRunner) -> None:
    stream = turns.stream_turn("sia", "early", "hello", GREEDY)
    next(stream)
    with pytest.raises(RuntimeError, match="has not ended"):
        stream.result  # noqa: B018
    assert stream.finish().completion_tokens >= 1


@pytest.mark.parametrize("damage", ["garbage", "checksum", "nan", "shape"])
def test_corrupt_state_raises_and_is_isolated(identities: Identities, turns: TurnRunner, store: Store, damage: str) -> None:
    turns.turn("sia", "bad", "hello", GREEDY)
    turns.turn("sia", "good", "hello", GREEDY)
    good = identities.export_state("sia", "bad")[1]
    state = state_from_bytes(good, identities.config)
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
    with store.transaction() as s:
        s.execute(update(IdentityRow).where(IdentityRow.user_id == "bad").values(state=blob, state_sha256=digest))
    with pytest.raises(CorruptStateError):
        turns.turn("sia", "bad", "hello again", GREEDY)
    with pytest.raises(CorruptStateError):
        identities.export_state("sia", "bad")[1]
    assert store.get_identity("sia", "bad").version == 2  # never silently re-initialised
    assert turns.turn("sia", "good", "still fine", GREEDY).turn == 1
    identities.rollback("sia", "bad", version=2) if damage == "checksum" else identities.reset("sia", "bad")
    assert turns.turn("sia", "bad", "repaired", GREEDY).turn == 1


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


def test_bad_imports_are_refused(identities: Identities, turns: TurnRunner, store: Store) -> None:
    turns.turn("sia", "u", "hello", GREEDY)
    before = identities.export_state("sia", "u")[1]
    wrong_shape = _raw_blob(state_from_bytes(before, identities.config), trace=torch.zeros(1, 1, 2, 2))
    for blob in (b"", b"not safetensors", before[: len(before) // 2], wrong_shape):
        with pytest.raises(ValueError):
            identities.import_state("sia", "u", blob)
    assert identities.export_state("sia", "u")[1] == before
    assert not store.get_identity("sia", "u").busy


def test_bad_arguments(identities: Identities, turns: TurnRunner) -> None:
    with pytest.raises(NotFoundError, match="persona"):
        turns.turn("nobody", "u", "hi", GREEDY)
    with pytest.raises(ValueError, match="user"):
        turns.turn("sia", "", "hi", GREEDY)
    with pytest.raises(ValueError, match="user"):
        turns.turn("sia", "a\r\nb", "hi", GREEDY)
    with pytest.raises(ValueError, match="NUL"):
        turns.turn("sia", "u", "a\x00b", GREEDY)
    with pytest.raises(ValueError, match="temperature"):
        turns.turn("sia", "u", "hi", Sampling(temperature=-1.0))
    with pytest.raises(NotFoundError):
        identities.state("sia", "u")  # refused before the identity was created
    with pytest.raises(NotFoundError):
        identities.state("sia", "never-seen")


def test_persona_dynamics_and_sampling_defaults(identities: Identities, turns: TurnRunner, store: Store) -> None:
    store.create_persona("still", preamble="[sia]", alpha=0.0, temperature=0.0, max_tokens=5)
    out = turns.turn("still", "u", "I am so angry!!!")
    assert out.completion_tokens <= 5
    _, state = identities.state("still", "u")
    assert not state.trace.any()  # alpha = 0: experience does not deform this persona's metric
    initial = random_state(identities.config, seed=9)
    store.create_persona("primed", preamble="[sia]", initial_state=state_to_bytes(initial))
    turns.turn("primed", "u", "hi", GREEDY)
    _, v1 = identities.state("primed", "u", version=1)
    assert torch.equal(v1.trace, initial.trace)


def test_concurrent_turns_in_threads_are_serial(identities: Identities, turns: TurnRunner, store: Store) -> None:
    outcomes: list[CommittedTurn] = []
    errors: list[Exception] = []

    def worker(i: int) -> None:
        try:
            outcomes.append(turns.turn("sia", "shared", f"message {i}", Sampling(max_tokens=6, temperature=1.0, seed=i)))
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
    turns = store.turns("sia", "shared")
    assert [(t.version_before, t.version_after) for t in turns] == [(v, v + 1) for v in range(1, 9)]
    _, state = identities.state("sia", "shared")
    assert state.turns == 8
