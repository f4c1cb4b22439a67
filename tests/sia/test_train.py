from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from sia.checkpoint import load_checkpoint
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, run_turn
from sia.learn.native.corpus import make_corpus, short_episode
from sia.learn.native.episodes import StateBatch, batch_turns, encode_turn, forward_turn
from sia.learn.native.train import (
    RECALL_FILE,
    RecallProbe,
    TrainConfig,
    _episode_batch,
    encode_episode_turns,
    episode_loss,
    train,
)
from sia.model.generate import SamplingParams
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer
from sia.personas import persona_preamble
from tests.conftest import tiny_config

TINY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "d_self": 4, "block_size": 512}


def _config(tmp_path: Path, **overrides: object) -> TrainConfig:
    base: dict[str, object] = dict(
        model=TINY,
        out_dir=str(tmp_path / "run"),
        steps=30,
        batch_size=4,
        train_episodes=200,
        heldout_episodes=8,
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=5,
        eval_every=15,
        checkpoint_every=15,
        transcript_prob=0.2,
    )
    base.update(overrides)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_a_few_steps_lower_the_loss(tmp_path: Path) -> None:
    out = train(_config(tmp_path), progress=False)
    history = json.loads((out / "history.json").read_text())
    losses = history["loss"]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert history["heldout_loss"][-1] < history["heldout_loss"][0] or len(history["heldout_loss"]) == 2
    assert (out / "loss.png").stat().st_size > 1000
    model = load_checkpoint(out / "final")
    assert model.config.n_embd == 32
    assert ByteTokenizer.from_file(out / "final" / "tokenizer.json").vocab_size == 260
    # the checkpoint of the lowest held-out loss is kept beside the final one
    lowest = min(range(len(history["heldout_loss"])), key=history["heldout_loss"].__getitem__)
    assert history["best_step"] == history["heldout_step"][lowest]
    assert history["best_heldout_loss"] == history["heldout_loss"][lowest]
    best = load_checkpoint(out / "best")
    assert best.config == model.config and (out / "best" / "tokenizer.json").is_file()
    same = all(torch.equal(a, b) for a, b in zip(best.state_dict().values(), model.state_dict().values(), strict=True))
    assert same == (history["best_step"] == 30)


def test_resuming_gives_the_same_weights_as_one_run(tmp_path: Path) -> None:
    straight = train(_config(tmp_path / "a", steps=12, checkpoint_every=6, eval_every=100), progress=False)
    first = _config(tmp_path / "b", steps=6, checkpoint_every=6, eval_every=100)
    train(first, progress=False)
    resumed = train(_config(tmp_path / "b", steps=12, checkpoint_every=6, eval_every=100), progress=False)
    a, b = load_checkpoint(straight / "final"), load_checkpoint(resumed / "final")
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name
    assert json.loads((resumed / "history.json").read_text())["step"] == list(range(1, 13))


def test_transcript_context_is_cut_to_fit() -> None:
    tok = ByteTokenizer()
    episode = make_corpus(3, 20, 1).train[0]
    bare = encode_episode_turns(tok, episode, transcript=False, block_size=1024)
    full = encode_episode_turns(tok, episode, transcript=True, block_size=1024)
    preamble = tok.encode(persona_preamble(episode.persona))
    assert all(t.ids[: len(preamble)] == preamble and t.context_len == len(preamble) for t in bare)
    assert full[0].ids == bare[0].ids
    assert full[-1].context_len == len(preamble) + sum(len(t.ids) - len(preamble) for t in bare[:-1])
    longest = max(len(t.ids) for t in bare)
    cut = encode_episode_turns(tok, episode, transcript=True, block_size=longest + 10)
    assert all(len(t.ids) <= longest + 10 for t in cut)
    assert cut[-1].context_len < full[-1].context_len  # the oldest turns were dropped
    assert cut[-1].ids[-len(bare[-1].ids) + len(preamble) :] == bare[-1].ids[len(preamble) :]
    with pytest.raises(ValueError, match="does not fit"):
        encode_episode_turns(tok, episode, transcript=False, block_size=10)


def test_teacher_forced_turn_matches_serving() -> None:
    """A turn replayed by forward_turn leaves the same shock and state as the same turn served by run_turn."""
    config = tiny_config(block_size=256)
    torch.manual_seed(0)
    model = SIAModel(config).eval()
    tok = ByteTokenizer()

    steps = [0]

    def end_late(module: torch.nn.Module, args: object, logits: torch.Tensor) -> torch.Tensor:
        """Only the last position's logits (the next token) change: the prompt's NLL stays as it is.

        ASCII only, so the reply text re-encodes to the very same bytes; <|end|> after a few tokens."""
        steps[0] += 1
        logits = logits.clone()
        logits[:, -1, 128:256] -= 100.0
        logits[:, -1, tok.end_id] += 100.0 if steps[0] >= 5 else -100.0
        return logits

    context = tuple(tok.encode(persona_preamble("sia")))
    state = IdentityState.fresh(config)
    handle = model.lm_head.register_forward_hook(end_late)
    try:
        served = run_turn(
            model, TurnRequest(state, "Hello there", Dynamics.from_config(config), context), SamplingParams(temperature=0.0)
        )
    finally:
        handle.remove()
    assert served.finish_reason == "stop" and served.reply
    encoded = encode_turn(tok, context, "Hello there", served.reply)
    with torch.no_grad():
        out = forward_turn(
            model, batch_turns([encoded], pad_id=tok.pad_id), StateBatch.fresh(config, 1), Dynamics.from_config(config)
        )
    replayed = out.state.row(0)
    assert float(out.message_nll[0]) == pytest.approx(served.nll, rel=1e-5)
    assert float(out.shock[0]) == pytest.approx(served.shock, rel=1e-5)
    torch.testing.assert_close(replayed.trace, served.state.trace, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(replayed.self_state, served.state.self_state, atol=1e-5, rtol=1e-4)
    assert replayed.shock.count == 1 and replayed.shock.mean == pytest.approx(served.state.shock.mean)


def test_gradients_flow_through_the_self_state_across_turns() -> None:
    config = tiny_config(block_size=512)
    torch.manual_seed(0)
    model = SIAModel(config)
    tok = ByteTokenizer()
    episode = make_corpus(0, 5, 1).train[0]
    turns = encode_episode_turns(tok, episode, transcript=False, block_size=512)
    dynamics = Dynamics.from_config(config)
    first = forward_turn(model, batch_turns([turns[0]], pad_id=tok.pad_id), StateBatch.fresh(config, 1), dynamics)
    second = forward_turn(model, batch_turns([turns[1]], pad_id=tok.pad_id), first.state, dynamics)
    second.token_nll.sum().backward()
    # turn 2's loss reaches the self-update map only through the state that turn 1 produced
    grad = model.self_update.proj.weight.grad
    assert grad is not None and grad.abs().max() > 0


def test_bad_training_configs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="min_lr"):
        _config(tmp_path, min_lr=1.0)
    with pytest.raises(ValueError, match="steps"):
        _config(tmp_path, steps=0)
    with pytest.raises(ValueError, match="unknown config keys"):
        _config(tmp_path, model={"layers": 2})
    (tmp_path / "bad.json").write_text(json.dumps({"stepz": 3}))
    with pytest.raises(ValueError, match="unknown training keys"):
        TrainConfig.from_file(tmp_path / "bad.json")


def test_probe_answers_are_marked_and_weighted() -> None:
    tok = ByteTokenizer()
    episode = next(e for e in make_corpus(1, 50, 1).train if e.probes)
    probe = episode.probes[0]
    turns = encode_episode_turns(tok, episode, transcript=False, block_size=1024)
    marked = [i for i, t in enumerate(turns) if t.answer is not None]
    assert marked == sorted(p.turn for p in episode.probes)
    start, end = turns[probe.turn].answer  # type: ignore[misc]
    assert tok.decode(turns[probe.turn].ids[start:end]) == probe.answer
    batch = batch_turns([turns[probe.turn]], pad_id=tok.pad_id)
    targets = batch.tokens[0, 1:][batch.answer_targets[0]]
    assert tok.decode(targets.tolist()) == probe.answer
    assert bool((batch.answer_targets <= batch.reply_targets).all())
    with pytest.raises(ValueError, match="does not start with"):
        encode_turn(tok, [], "hi", "hello there", answer=("hello ", "world"))


def test_recall_read_out_adds_its_cross_entropy_and_reaches_the_stating_turn() -> None:
    config = tiny_config(block_size=512)
    torch.manual_seed(0)
    model = SIAModel(config)
    tok = ByteTokenizer()
    dynamics = Dynamics.from_config(config)
    episodes = [e for e in make_corpus(2, 40, 1).train if e.probes][:3]
    probes = [p for e in episodes for p in e.probes]
    head = RecallProbe(config.d_self)
    torch.nn.init.zeros_(head.proj.weight)
    torch.nn.init.zeros_(head.proj.bias)
    # a zero read-out is uniform over the probed fact's candidates: log(n) per probe
    uniform = sum(math.log(len(p.candidates)) for p in probes) / len(probes)
    plain, _ = episode_loss(model, episodes, tok, dynamics, transcript=False, user_weight=0.3)
    with_recall, _ = episode_loss(
        model, episodes, tok, dynamics, transcript=False, user_weight=0.3, recall=head, recall_weight=0.5
    )
    assert float((with_recall - plain).detach()) == pytest.approx(0.5 * uniform, rel=1e-5)

    # with a live read-out, its term alone (the difference of the two losses) trains the self-update map and
    # the hidden states of the turns before the probe
    torch.nn.init.normal_(head.proj.weight)
    with_recall, _ = episode_loss(
        model, episodes, tok, dynamics, transcript=False, user_weight=0.3, recall=head, recall_weight=0.5
    )
    model.zero_grad()
    (with_recall - plain).backward()
    grad = model.self_update.proj.weight.grad
    assert grad is not None and grad.abs().max() > 0
    assert model.wte.weight.grad is not None and model.wte.weight.grad.abs().max() > 0


def test_recall_weight_trains_and_resumes_exactly(tmp_path: Path) -> None:
    straight = train(_config(tmp_path / "a", steps=8, checkpoint_every=4, eval_every=100, recall_weight=1.0), progress=False)
    train(_config(tmp_path / "b", steps=4, checkpoint_every=4, eval_every=100, recall_weight=1.0), progress=False)
    resumed = train(_config(tmp_path / "b", steps=8, checkpoint_every=4, eval_every=100, recall_weight=1.0), progress=False)
    a, b = load_checkpoint(straight / "final"), load_checkpoint(resumed / "final")
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name
    # the read-out is training-only: the final checkpoint holds exactly the model's weights
    assert not (straight / "final" / RECALL_FILE).exists() and (straight / "checkpoint" / RECALL_FILE).is_file()
    with pytest.raises(ValueError, match="recall_weight"):
        _config(tmp_path, recall_weight=-1.0)


def test_curriculum_starts_on_short_episodes(tmp_path: Path) -> None:
    config = _config(tmp_path, steps=2, short_episode_steps=1, transcript_prob=0.0, eval_every=100, checkpoint_every=100)
    history = json.loads((train(config, progress=False) / "history.json").read_text())
    corpus = make_corpus(config.seed, config.train_episodes, config.heldout_episodes)
    tok = ByteTokenizer()
    torch.manual_seed(config.seed)
    model = SIAModel(config.model_config())
    dynamics = Dynamics.from_config(model.config)
    batch = _episode_batch(corpus.train, random.Random(config.seed * 1_000_003), config.batch_size)
    with torch.no_grad():
        short, short_tokens = episode_loss(
            model, [short_episode(e) for e in batch], tok, dynamics, transcript=False, user_weight=0.3
        )
        full, full_tokens = episode_loss(model, batch, tok, dynamics, transcript=False, user_weight=0.3)
    assert short_tokens < full_tokens
    assert history["loss"][0] == pytest.approx(float(short), rel=1e-6)
    assert history["loss"][0] != pytest.approx(float(full), rel=1e-6)  # the full batch's loss differs (~4e-5 here)
    with pytest.raises(ValueError, match="short_episode_steps"):
        _config(tmp_path, short_episode_steps=-1)
