"""What each loss trains: a turn written in training is the turn the service runs, candidate scoring is the
brute-force score, the read-out names facts (running moments), the read is detached from the write, the
distillation's teacher, and the ranking term with and without the write."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, TurnResult, stream_turns
from sia.learn.adapter import facts
from sia.learn.adapter.batch import sample_batch
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.heldout import unroll_states
from sia.learn.adapter.losses import episode_losses
from sia.learn.adapter.readout import ReadOut
from sia.learn.adapter.trainable import build_model
from sia.learn.adapter.unroll import Carry, Rendered, probe_logits, render_turn, score_candidates, span, write_turn
from sia.model.generate import SamplingParams
from sia.personas import PERSONAS

from .conftest import ADAPTER, open_read


def served_turn(model: LlamaModel, state: IdentityState, message: str, context: list[int]) -> tuple[list[int], TurnResult]:
    """The service's turn (sia.identity.turn, greedy) and the tokens it generated."""
    request = TurnRequest(state=state, message=message, dynamics=Dynamics.from_config(model.config), context=tuple(context))
    turn = stream_turns(model, [request], SamplingParams(max_new_tokens=6, temperature=0.0))
    tokens = [event.token for event in turn]
    return tokens, turn.result[0]


def test_a_turn_written_in_training_is_the_turn_the_service_runs(config: TrainConfig, cache: Path) -> None:
    # a float32 trace: float16 storage could round two traces that differ in float32's last bits apart
    config = replace(config, model={**ADAPTER, "state_dtype": "float32"})
    model, _ = build_model(config, cache)
    open_read(model, seed=1)
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    dynamics = Dynamics.from_config(model.config)
    context = tok.system_prompt(PERSONAS["sia"].system_prompt)
    state = IdentityState.fresh(model.config)
    # the first turn from a fresh state, ended by length; the second from the state it left (slot open, a trace,
    # shock history), ended by the end-of-turn token
    for message, ends in (("Hello there, my name is Aisha and I live in Lima.", False), ("What is the capital of France?", True)):
        if ends:  # the end-of-turn token outscores what the reply's third token was
            third = served_turn(model, state, message, context)[0][2]
            with torch.no_grad():
                model.lm_head.weight[tok.end_of_turn_id] = 1.5 * model.lm_head.weight[third]
        generated, result = served_turn(model, state, message, context)
        assert result.finish_reason == ("stop" if ends else "length") and (generated[-1] == tok.end_of_turn_id) == ends
        prompt, message_span = tok.turn_prompt(message, context)
        tokens = [*prompt, *generated]  # ended by the end-of-turn token or by length: the last token is the last sampled
        counted = [False] * len(context) + [True] * (len(tokens) - len(context) - 1) + [False]
        turn = Rendered(tokens, counted, message_span, (len(prompt), len(tokens)))
        shock = torch.tensor([[state.shock.count, state.shock.mean, state.shock.m2]], dtype=torch.float64)
        carry = Carry(state.self_state[None], state.trace[None], shock)
        for grad_tokens in (True, False):
            with torch.no_grad():
                new, _, _ = write_turn(model, carry, [turn], dynamics, grad_tokens=grad_tokens)
            assert torch.allclose(new.self_state[0], result.state.self_state, atol=1e-5)
            assert torch.allclose(new.trace[0], result.state.trace, atol=1e-5)
            served = result.state.shock
            assert torch.allclose(
                new.shock[0], torch.tensor([served.count, served.mean, served.m2], dtype=torch.float64), atol=1e-5
            )
        state = result.state
    assert state.self_state.abs().max() > 0.05 and state.trace.abs().max() > 0


def test_scoring_candidates_is_scoring_each_reply_in_full(config: TrainConfig, cache: Path) -> None:
    model, _ = build_model(config, cache)
    open_read(model, seed=2)
    model.eval()
    tok = model.tokenizer
    c = model.config
    generator = torch.Generator().manual_seed(3)
    trace = (torch.randn(2, *c.trace_shape, generator=generator) * 0.3).to(IdentityState.fresh(c).trace.dtype)
    carry = Carry(torch.rand(2, c.d_self, generator=generator) * 2 - 1, trace, torch.zeros(2, 3, dtype=torch.float64))
    # rows of different lengths (left padding); candidates of one token ("the", "a", "is") and of several
    prompts = [tok.turn_prompt("What is my favourite colour?", tok.system_prompt("Be brief."))[0], tok.turn_prompt("Where?")[0]]
    prefixes = ["Your favourite colour is", "You live in"]
    candidates = [["red", "the", "purple", "a"], ["Paris", "is", "hello"]]
    scores = score_candidates(model, carry, prompts, prefixes, candidates)
    lengths = set()
    for b, (prompt, prefix, values) in enumerate(zip(prompts, prefixes, candidates, strict=True)):
        own = tok.encode(prefix)
        assert scores[b].shape == (len(values),)
        for j, value in enumerate(values):
            full = tok.encode(f"{prefix} {value}")
            assert full[: len(own)] == own
            row = [*prompt, *full]
            with torch.no_grad():
                logits = probe_logits(model, carry.take([b]), [row])
            a = len(prompt) + len(own)
            log_p = F.log_softmax(span(logits[0], len(row), a, len(row)).float(), dim=-1)  # (n, V)
            expected = log_p.gather(-1, torch.tensor(row[a:]).unsqueeze(-1)).sum()
            assert abs(float(scores[b][j]) - float(expected)) < 1e-4, (value, float(scores[b][j]), float(expected))
            lengths.add(len(full) - len(own))
    assert 1 in lengths and max(lengths) > 2


def _one_users_facts(rng: torch.Generator, codes: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[facts.Fact]]:
    """A synthetic self state of one user who stated a colour, a pet and a hobby: a large offset common to every user,
    a small code per stated value, noise; the state once per fact, as the trainer passes it to the read-out."""
    said, parts = [], []
    for kind, code in codes.items():  # each kind in 8 features of its own
        options = facts.values(kind, "train")
        pick = int(torch.randint(len(options), (1,), generator=rng))
        said.append(facts.Fact(kind, options[pick]))
        parts.append(4.0 + 0.3 * code[pick])
    s = torch.cat(parts) + 0.01 * torch.randn(24, generator=rng)
    return s.expand(len(said), 24), said


@pytest.mark.parametrize("momentum", [None, 0.1])
def test_running_moments_let_the_read_out_name_the_facts_of_one_user_alone(momentum: float | None) -> None:
    """At a turn where one episode of the batch still plays, the read-out gets one user's state (once per fact).
    Standardised across those rows it is all zeros, and the read-out names nothing beyond its prior; by running
    moments it is read as well as in a batch."""
    rng = torch.Generator().manual_seed(0)
    kinds = ("colour", "pet", "hobby")
    codes = {kind: torch.randn(len(facts.values(kind, "train")), 8, generator=rng) for kind in kinds}
    torch.manual_seed(0)
    readout = ReadOut(24, momentum)
    optimizer = torch.optim.Adam(readout.parameters(), lr=0.05)
    for _ in range(400):
        s, said = _one_users_facts(rng, codes)
        loss, _ = readout.loss(s, said, update=True)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    named = [readout.loss(*_one_users_facts(rng, codes))[1] for _ in range(60)]
    accuracy = sum(named) / len(named)
    chance = sum(1 / len(facts.values(kind, "train")) for kind in kinds) / 3
    if momentum is None:
        assert int(readout.updates) == 0 and accuracy < chance + 0.2
    else:
        assert int(readout.updates) == 400 and accuracy > 0.9


def test_running_moments_move_by_the_momentum_in_training_calls_alone(tmp_path: Path) -> None:
    readout = ReadOut(3, momentum=0.25)
    first = torch.tensor([[1.0, 2.0, 0.0], [3.0, 2.0, 4.0]])
    fact = facts.Fact("colour", facts.values("colour", "train")[0])
    readout.loss(first, [fact, fact], update=True)  # the first call sets the moments
    assert torch.allclose(readout.moments, torch.tensor([[2.0, 2.0, 2.0], [5.0, 4.0, 8.0]]))
    readout.loss(torch.zeros(2, 3), [fact, fact], update=False)  # an evaluation leaves them
    assert int(readout.updates) == 1 and torch.allclose(readout.moments[0], torch.tensor([2.0, 2.0, 2.0]))
    second = torch.tensor([[6.0, 2.0, 2.0]])
    readout.loss(second, [fact], update=True)  # then each training call moves them by the momentum
    assert torch.allclose(readout.moments, torch.tensor([[3.0, 2.0, 2.0], [12.75, 4.0, 7.0]]))
    assert torch.allclose(readout.standardise(torch.tensor([[3.0, 2.0, 2.0]])), torch.zeros(1, 3))  # the running mean
    deviation = float(readout.standardise(torch.tensor([[5.0, 2.0, 2.0]]))[0, 0])  # by the running deviation
    assert deviation == pytest.approx(2.0 / (math.sqrt(12.75 - 9.0) + 1e-3), rel=1e-5)
    save_file(readout.state_dict(), str(tmp_path / "running.safetensors"))
    again = ReadOut(3)  # the moments are the read-out's, whatever momentum it is built with
    again.load(tmp_path / "running.safetensors")
    assert int(again.updates) == 2 and torch.equal(again.moments, readout.moments)
    older = {k: v for k, v in ReadOut(3).state_dict().items() if k not in ("moments", "updates")}
    save_file(older, str(tmp_path / "older.safetensors"))  # saved before running moments existed
    again.load(tmp_path / "older.safetensors")
    assert int(again.updates) == 0  # standardises per call, as it was trained
    assert torch.allclose(again.standardise(first), (first - first.mean(0)) / (first.std(0) + 1e-3))
    with pytest.raises(ValueError, match="momentum"):
        ReadOut(3, momentum=0.0)


def test_read_out_loss_is_the_mean_of_each_rows_cross_entropy_over_mixed_kinds() -> None:
    """Rows of one kind are read together: the loss is still each row's own cross-entropy, averaged over all rows
    in the order given, and the share counts each row named right."""
    torch.manual_seed(0)
    readout = ReadOut(6)
    said = [
        facts.Fact(kind, facts.values(kind, "train")[i])
        for kind, i in [("pet", 1), ("colour", 0), ("pet", 3), ("job", 2), ("colour", 4)]
    ]
    s = torch.randn(len(said), 6)
    with torch.no_grad():  # row 0 named right, row 1 not: the share is exact
        readout.heads["pet"].bias.copy_(torch.arange(len(facts.values("pet", "train"))) == 1).mul_(100.0)
        readout.heads["colour"].bias.copy_(torch.arange(len(facts.values("colour", "train"))) == 2).mul_(100.0)
        readout.heads["job"].bias.copy_(torch.arange(len(facts.values("job", "train"))) == 2).mul_(100.0)
    loss, share = readout.loss(s, said)
    z = readout.standardise(s)
    rows = [
        F.cross_entropy(readout.heads[f.kind](z[i]).unsqueeze(0), torch.tensor([readout.index[f.kind][f.value]]))
        for i, f in enumerate(said)
    ]
    assert float(loss.detach()) == pytest.approx(float(torch.stack(rows).mean().detach()), rel=1e-6)
    assert share == pytest.approx(2 / 5)  # pet 1 and job 2 named; pet 3, colour 0 and colour 4 not


def test_a_probe_differentiated_from_the_question_on_reads_the_logits_of_the_full_probe(config: TrainConfig, cache: Path) -> None:
    """grad_tail runs the system block without recording: the logits are the full forward's, the slots still learn."""
    model, _ = build_model(replace(config, model={**ADAPTER, "self_slots": 2}), cache)
    open_read(model, seed=4)
    tok = model.tokenizer
    c = model.config
    assert model.prefix_len == 2
    fresh = Carry.fresh(model, 2)
    carry = Carry(torch.rand(2, c.d_self, generator=torch.Generator().manual_seed(5)) * 2 - 1, fresh.trace, fresh.shock)
    rows = [
        tok.turn_prompt("What is my favourite colour?", tok.system_prompt("Be brief and kind."))[0] + tok.encode("Blue."),
        tok.turn_prompt("Who am I?", tok.system_prompt("Be brief."))[0] + tok.encode("Sam."),
    ]
    with torch.no_grad():
        full = probe_logits(model, carry, rows, tail=12)
    for p in model.parameters():
        p.grad = None
    part = probe_logits(model, carry, rows, tail=12, grad_tail=20)
    torch.testing.assert_close(part, full, atol=1e-5, rtol=1e-5)
    part.float().logsumexp(-1).sum().backward()  # type: ignore[no-untyped-call]
    for attn in model.attentions:
        assert attn.self_value.weight.grad is not None and attn.self_value.weight.grad.abs().max() > 0
    with pytest.raises(ValueError, match="grad_tail"):
        probe_logits(model, carry, rows, tail=12, grad_tail=5)


@pytest.mark.parametrize("detached", [False, True])
def test_a_detached_read_trains_the_read_and_not_the_write(config: TrainConfig, cache: Path, detached: bool) -> None:
    """A loss on a turn's reply reaches the write of the turn before only while the read is not detached."""
    model, _ = build_model(config, cache)
    open_read(model, seed=6)
    tok = model.tokenizer
    dynamics = Dynamics.from_config(model.config)
    context = tok.system_prompt(PERSONAS["sia"].system_prompt)
    first = [render_turn(tok, context, "My pet is a cat.", "Noted.")]
    second = [render_turn(tok, context, "What do I keep?", "A cat.")]
    carry, _, _ = write_turn(model, Carry.fresh(model, 1), first, dynamics, grad_tokens=False)
    _, logits, _ = write_turn(model, carry, second, dynamics, grad_tokens=True, read_detached=detached)
    model.zero_grad()
    logits.float().logsumexp(-1).sum().backward()  # type: ignore[no-untyped-call]
    write = model.self_update.proj.weight.grad
    read = model.blocks[1].attn.self_value.weight.grad
    assert read is not None and read.abs().max() > 0  # the read learns either way
    assert (write is None or float(write.abs().max()) == 0.0) == detached


def test_the_answer_never_reaches_the_write(config: TrainConfig, cache: Path) -> None:
    """The read's losses stop at the state: the answer's gradient trains the read and never the write."""
    config = replace(config, readout_weight=0.0, distill_weight=0.0, curriculum=[[0, 2]])
    torch.manual_seed(0)
    model, _ = build_model(config, cache)
    open_read(model, seed=3)
    batch = sample_batch(config, model, 0)
    losses = episode_losses(model, ReadOut(model.config.d_self), batch, config, Dynamics.from_config(model.config))
    losses["answer"].backward()  # type: ignore[no-untyped-call]
    write = model.self_update.proj.weight.grad
    assert write is None or float(write.abs().max()) == 0.0
    read = model.blocks[1].attn.self_value.weight.grad
    assert read is not None and float(read.abs().max()) > 0  # the read learns


def test_every_logged_figure_is_finite_for_a_batch_of_one(config: TrainConfig, cache: Path) -> None:
    """The states' spread needs two users; one alone logs 0, not NaN."""
    config = replace(config, curriculum=[[0, 2]])
    torch.manual_seed(0)
    model, _ = build_model(config, cache)
    batch = sample_batch(config, model, 0)
    with torch.no_grad():
        one = episode_losses(model, ReadOut(model.config.d_self), batch[:1], config, Dynamics.from_config(model.config))
        many = episode_losses(model, ReadOut(model.config.d_self), batch, config, Dynamics.from_config(model.config))
    assert all(math.isfinite(float(v)) for v in one.values()), {k: float(v) for k, v in one.items()}
    assert float(one["spread"]) == 0.0 and float(many["spread"]) > 0.0


def test_the_distillation_teacher_reads_the_whole_transcript_with_a_fresh_state(config: TrainConfig, cache: Path) -> None:
    """The teacher is the base model reading the conversation up to the distilled turn: an identity that reads nothing
    (the slots shut, the trace frozen at zero) matches it exactly on the first turn (the transcript is that turn) and
    not on a later one (the teacher reads the earlier turns)."""
    config = replace(config, curriculum=[[0, 2]], readout_weight=0.0, slot_bias=-1e4)
    model, _ = build_model(config, cache)
    batch = sample_batch(config, model, 0)
    first = [replace(ex, distill_at=0) for ex in batch]
    last = [replace(ex, distill_at=len(ex.episode.turns) - 1) for ex in batch]
    assert all(ex.distill_at > 0 for ex in last)
    silent = Dynamics(alpha=0.0, decay=1.0, eta=1.0)
    readout = ReadOut(model.config.d_self)
    with torch.no_grad():
        assert float(episode_losses(model, readout, first, config, silent)["distill"]) < 1e-6
        assert float(episode_losses(model, readout, last, config, silent)["distill"]) > 1e-3


def test_the_ranking_term_adds_a_cross_entropy_among_the_kinds_values_where_the_value_begins(
    config: TrainConfig, cache: Path
) -> None:
    """``rank_weight``: the answer gains that weight times the mean, over probes, of a cross-entropy among the first
    tokens of the kind's values at the position where the reply's value begins, read from the same state."""
    config = replace(config, curriculum=[[0, 1]], readout_weight=0.0, distill_every=1000, batch_size=3, probes_per_episode=3)
    model, _ = build_model(config, cache)
    open_read(model, seed=4)
    dynamics = Dynamics.from_config(model.config)
    model.eval()  # the write's running statistics stay put: every pass reads the same states
    readout = ReadOut(model.config.d_self)
    batch = sample_batch(config, model, 3)
    assert any(ex.asked for ex in batch)
    with torch.no_grad():
        plain = episode_losses(model, readout, batch, config, dynamics)["answer"]
        ranked = [episode_losses(model, readout, batch, replace(config, rank_weight=w), dynamics)["answer"] for w in (1.0, 2.5)]
        final = unroll_states(model, [ex.episode for ex in batch], [ex.context for ex in batch], dynamics)
        tok = model.tokenizer
        terms = []
        for i, ex in enumerate(batch):
            for probe in (ex.episode.probes[j] for j in ex.asked):
                turn = render_turn(tok, ex.context, probe.question, probe.reply)
                head = len(tok.encode(probe.reply_prefix))
                at = turn.reply[0] + head
                firsts = []
                for value in facts.values(probe.kind, ex.episode.split):
                    token = tok.encode(f"{probe.reply_prefix} {value}")[head]
                    firsts += [] if token in firsts else [token]
                assert turn.tokens[at] in firsts
                logits = probe_logits(model, final.take([i]), [turn.tokens])[0]
                among = logits[at - 1].float()[firsts]
                terms.append(float(torch.logsumexp(among, 0) - among[firsts.index(turn.tokens[at])]))
    expected = sum(terms) / len(terms)
    assert expected > 0
    assert float(ranked[0] - plain) == pytest.approx(expected, rel=1e-4)
    assert float(ranked[1] - plain) == pytest.approx(2.5 * expected, rel=1e-4)
    with pytest.raises(ValueError, match="loss weights"):
        replace(config, rank_weight=-1.0)


def test_the_ranking_term_can_reach_the_write_while_the_reply_stays_shielded(config: TrainConfig, cache: Path) -> None:
    """``rank_to_write``: the ranking term, computed in a pass of its own cut before the value, is the same figure
    as the one read with the reply; its gradient reaches the write, which the answer alone does not while the read is
    shielded; it needs a ranking term to send."""
    config = replace(config, curriculum=[[0, 1]], readout_weight=0.0, distill_every=1000, rank_weight=1.0)
    torch.manual_seed(0)
    model, _ = build_model(config, cache)
    open_read(model, seed=5)
    model.eval()  # the write's running statistics stay put, so both passes read the same states
    dynamics = Dynamics.from_config(model.config)
    readout = ReadOut(model.config.d_self)
    batch = [replace(ex, distill_at=-1) for ex in sample_batch(config, model, 1)]
    assert any(ex.asked for ex in batch)
    write = [p for n, p in model.named_parameters() if n.startswith(("memory", "pool", "self_update")) and p.requires_grad]
    assert write

    def write_grad(cfg: TrainConfig) -> tuple[float, float]:
        model.zero_grad()
        answer = episode_losses(model, readout, batch, cfg, dynamics)["answer"]
        answer.backward()  # type: ignore[no-untyped-call]
        return float(answer), sum(float(p.grad.abs().sum()) for p in write if p.grad is not None)

    shielded_answer, shielded = write_grad(config)
    reaching_answer, reaching = write_grad(replace(config, rank_to_write=True))
    assert shielded == 0.0
    assert reaching > 0.0
    assert reaching_answer == pytest.approx(shielded_answer, rel=1e-4)  # the same loss, only its gradient differs
    with pytest.raises(ValueError, match="rank_to_write"):
        replace(config, rank_weight=0.0, rank_to_write=True)


def test_the_write_reads_the_turn_under_the_state_it_is_written_for(config: TrainConfig, cache: Path) -> None:
    """The memory tokens read the turn after the reply under the state being written: two states give two z for
    the same turn, and the write trains the memory tokens."""
    model, _ = build_model(replace(config, model=ADAPTER), cache)
    open_read(model, seed=3)
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    dynamics = Dynamics.from_config(model.config)
    turn = render_turn(tok, tok.system_prompt(PERSONAS["sia"].system_prompt), "I have a cat.", "How lovely!")
    seen: list[torch.Tensor] = []
    forward = model.self_update.forward

    def keep(z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        seen.append(z)
        return forward(z, s)

    model.self_update.forward = keep  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        carry = Carry.fresh(model, 1)
        carry = Carry(torch.rand(1, model.config.d_self, generator=g) * 2 - 1, carry.trace, carry.shock)
        new, _, _ = write_turn(model, carry, [turn], dynamics, grad_tokens=False)
    assert not torch.equal(seen[0], seen[1])
    new.self_state.sum().backward()  # type: ignore[no-untyped-call]
    assert model.memory is not None and model.memory.grad is not None and model.memory.grad.abs().sum() > 0
