"""Training the identity adapter (sia.learn): a few steps lower the loss, a run resumes where it stopped and its
checkpoint loads bit for bit, a turn written in training is the turn the service runs, candidate scoring is the
brute-force score, bad configs are refused, and ``sia train`` sends an adapter config to the adapter trainer."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.commands import main
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, TurnResult, stream_turns
from sia.learn.adapter import facts
from sia.learn.adapter import train as adapter_train
from sia.learn.adapter.batch import sample_batch
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.heldout import unroll_states
from sia.learn.adapter.losses import episode_losses
from sia.learn.adapter.readout import READOUT_FILE, ReadOut
from sia.learn.adapter.train import train
from sia.learn.adapter.trainable import build_model
from sia.learn.adapter.unroll import Carry, Rendered, probe_logits, render_turn, score_candidates, span, write_turn
from sia.learn.native import train as native_train
from sia.model.generate import SamplingParams
from sia.personas import PERSONAS

from .conftest import TinyVocab, write_tiny_gguf

# the fact episodes in bytes need more than the tiny base's 256 positions
ADAPTER = {"d_self": 8, "memory_tokens": 2, "write_gate": True, "eta": 1.0, "trace_layers": [1], "block_size": 2048}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as the configs here ask of train(), which sets it; given back afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_vocab: TinyVocab) -> Path:
    """A tiny LLaMA GGUF, its dequantised copy cached beside it in models/ once for this module."""
    return write_tiny_gguf(tmp_path_factory.mktemp("learn") / "tiny.gguf", tiny_vocab).path


@pytest.fixture
def cache(base: Path) -> Path:
    return base.parent / "models"


@pytest.fixture
def config(base: Path, tmp_path: Path) -> TrainConfig:
    """Two rows of one- or two-turn episodes; lr = min_lr and no warm-up, so the learning rate is one constant. No
    write stage, one question an episode, a distillation every 4th step, the read at lr and the read-out standardised
    per call: what the tests here were written against (the recipe's defaults differ)."""
    return TrainConfig(
        base=str(base),
        model=dict(ADAPTER),
        out_dir=str(tmp_path / "run"),
        batch_size=2,
        steps=4,
        lr=1e-2,
        read_lr=None,
        min_lr=1e-2,
        warmup_steps=0,
        write_stage_steps=0,
        curriculum=[[0, 1]],
        probes_per_episode=1,
        distill_every=4,
        readout_momentum=None,
        eval_every=1000,
        eval_episodes=2,
        eval_between=1,
        checkpoint_every=1000,
        threads=1,
        precision="fp32",
    )


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[LlamaModel]:
    """Every model ``train`` builds, in order (the trained weights, to compare runs)."""
    models: list[LlamaModel] = []

    def keep(*args: Any, **kwargs: Any) -> Any:
        model, ref = build_model(*args, **kwargs)
        models.append(model)
        return model, ref

    monkeypatch.setattr(adapter_train, "build_model", keep)
    return models


def open_read(model: LlamaModel, seed: int) -> None:
    """Nonzero slot values (they start at zero), so the self state changes what the model reads."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for attn in model.attentions:
            attn.self_value.weight.copy_(torch.randn(attn.self_value.weight.shape, generator=generator) * 0.3)


@pytest.mark.parametrize("rank", [None, 2])
def test_a_few_steps_on_one_batch_lower_its_loss_and_move_the_adapter(config: TrainConfig, cache: Path, rank: int | None) -> None:
    config = replace(config, model={**config.model, "slot_rank": rank})
    torch.manual_seed(0)
    model, _ = build_model(config, cache)
    readout = ReadOut(model.config.d_self)
    dynamics = Dynamics.from_config(model.config)
    batch = sample_batch(config, model, 0)
    assert any(ex.distill_at >= 0 for ex in batch)  # step 0 distils: every term of the loss is in play

    def total() -> torch.Tensor:
        losses = episode_losses(model, readout, batch, config, dynamics)
        return losses["answer"] + config.readout_weight * losses["readout"] + config.distill_weight * losses["distill"]

    def final_states() -> torch.Tensor:
        return unroll_states(model, [ex.episode for ex in batch], [ex.context for ex in batch], dynamics).self_state

    start = {k: v.clone() for k, v in model.identity_state_dict().items()}
    states = final_states()
    params = [p for p in model.parameters() if p.requires_grad] + list(readout.parameters())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and trainable == {n for n, _ in model.named_parameters() if n in start}  # the adapter's, and only those
    optimizer = torch.optim.Adam(params, lr=config.lr)
    before = float(total().detach())
    for _ in range(8):
        optimizer.zero_grad()
        total().backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    after = float(total().detach())
    assert after < 0.95 * before, (before, after)
    trained = model.identity_state_dict()
    value = "blocks.1.attn.self_value." + ("weight" if rank is None else "up.weight")  # a low-rank value: its up map
    for name in ("memory", "self_update.proj.weight", "self_update.gate.weight", value):
        assert not torch.equal(trained[name], start[name]), name
    assert not torch.allclose(final_states(), states, atol=1e-4)


@pytest.mark.parametrize("momentum", [None, 0.5])
def test_a_run_resumes_where_it_stopped_and_its_checkpoint_loads_bit_for_bit(
    config: TrainConfig, cache: Path, tmp_path: Path, built: list[LlamaModel], momentum: float | None
) -> None:
    config = replace(config, model={**config.model, "weights_dtype": "float16"})  # the served adapter's storage
    config = replace(config, readout_momentum=momentum)  # with a momentum, the read-out's running moments resume too
    torch.manual_seed(0)  # the read-out's initialisation
    out = train(replace(config, steps=2), progress=False, cache_dir=cache)
    with (out / "history.jsonl").open("a") as f:  # a step recorded after the checkpoint, then the run was stopped
        f.write(json.dumps({"step": 3, "loss": 0.0}) + "\n")
    assert train(replace(config, steps=4), progress=False, cache_dir=cache) == out
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # resumed at 2: no step twice
    assert "heldout" in records[1] and "heldout" in records[3]  # held-out recall at the end of each run
    trained = built[-1].identity_state_dict()
    loaded = load_model(out / "last", cache_dir=cache)
    assert isinstance(loaded, LlamaModel) and loaded.config == built[-1].config
    restored = loaded.identity_state_dict()
    assert set(restored) == set(trained)
    for name, tensor in trained.items():
        assert torch.equal(restored[name], tensor), name
    served = load_model(out / "adapter", cache_dir=cache)  # the finished run's adapter, stored in float16
    assert isinstance(served, LlamaModel)
    for name, tensor in served.identity_state_dict().items():
        assert torch.equal(tensor, trained[name].half().float()), name
    # the interrupted run is the uninterrupted one: model, read-out and optimizer state all came back
    torch.manual_seed(0)
    train(replace(config, steps=4, out_dir=str(tmp_path / "straight")), progress=False, cache_dir=cache)
    straight = built[-1].identity_state_dict()
    for name, tensor in trained.items():
        assert torch.equal(straight[name], tensor), name
    assert not torch.equal(built[0].identity_state_dict()["memory"], trained["memory"])  # steps 3 and 4 trained


def test_cosine_steps_replay_a_run_lengthened_while_it_trained(
    config: TrainConfig, cache: Path, tmp_path: Path, built: list[LlamaModel]
) -> None:
    """A run started for 2 steps and resumed for 4 is, step for step, the 4-step run whose cosine spans 2 steps, then
    4: the same weights bit for bit; the plain 4-step cosine is another run."""
    decaying = replace(config, min_lr=1e-3)  # lr 1e-2 decaying to 1e-3: the schedule matters
    train(replace(decaying, steps=2), progress=False, cache_dir=cache)
    train(replace(decaying, steps=4), progress=False, cache_dir=cache)  # lengthened at step 2
    lengthened = built[-1].identity_state_dict()
    replay = replace(decaying, steps=4, cosine_steps=[[0, 2], [2, 4]], out_dir=str(tmp_path / "replayed"))
    assert [replay.cosine_length(step) for step in range(4)] == [2, 2, 4, 4]
    train(replay, progress=False, cache_dir=cache)
    replayed = built[-1].identity_state_dict()
    train(replace(decaying, steps=4, out_dir=str(tmp_path / "straight")), progress=False, cache_dir=cache)
    straight = built[-1].identity_state_dict()
    for name, tensor in lengthened.items():
        assert torch.equal(replayed[name], tensor), name
    assert any(not torch.equal(straight[name], tensor) for name, tensor in lengthened.items())


def test_a_run_started_from_a_checkpoint_begins_at_its_identity_parameters(
    config: TrainConfig, cache: Path, tmp_path: Path, built: list[LlamaModel]
) -> None:
    """``init``: the served adapter (float16) fine-tuned; a checkpoint of another config or base is refused."""
    config = replace(config, model={**config.model, "weights_dtype": "float16"})
    first = train(replace(config, steps=2), progress=False, cache_dir=cache)
    adapter = load_model(first / "adapter", cache_dir=cache)
    assert isinstance(adapter, LlamaModel)
    still = replace(config, steps=1, lr=1e-9, min_lr=1e-9, gate_lr=1e-9, readout_lr=1e-9, init=str(first / "adapter"))
    train(replace(still, out_dir=str(tmp_path / "tuned")), progress=False, cache_dir=cache)
    tuned = built[-1].identity_state_dict()
    fresh = build_model(config, cache)[0].identity_state_dict()  # where a run without init starts
    learned = {name for name, p in built[-1].named_parameters() if p.requires_grad}  # not the running statistics
    assert learned and learned < set(tuned)
    for name in learned:
        assert torch.allclose(tuned[name], adapter.identity_state_dict()[name], atol=1e-6), name  # 1 step of lr 1e-9
    assert not torch.allclose(tuned["memory"], fresh["memory"], atol=1e-3)
    other = replace(still, model={**config.model, "d_self": 16}, out_dir=str(tmp_path / "other"))
    with pytest.raises(ValueError, match="another config"):
        train(other, progress=False, cache_dir=cache)
    base = json.loads((first / "adapter" / "base.json").read_text())
    (first / "adapter" / "base.json").write_text(json.dumps({**base, "sha256": "0" * 64}))
    with pytest.raises(ValueError, match="other base weights"):
        train(replace(still, out_dir=str(tmp_path / "moved")), progress=False, cache_dir=cache)


def test_an_init_brings_running_moments_only_to_a_recipe_with_them(config: TrainConfig, cache: Path, tmp_path: Path) -> None:
    """A run started from a training checkpoint takes its read-out; with a momentum it moves the moments it brought,
    without one it standardises per call as its recipe says."""

    def updates(run: Path) -> int:
        return int(load_file(str(run / "last" / READOUT_FILE))["updates"])

    first = train(replace(config, steps=1, readout_momentum=0.5), progress=False, cache_dir=cache)
    assert updates(first) > 0
    init = replace(config, steps=1, init=str(first / "last"))
    kept = train(replace(init, readout_momentum=0.5, out_dir=str(tmp_path / "kept")), progress=False, cache_dir=cache)
    assert updates(kept) > updates(first)
    assert updates(train(replace(init, out_dir=str(tmp_path / "per-call")), progress=False, cache_dir=cache)) == 0


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


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"curriculum": [[5, 1], [10, 2]]}, "curriculum"),
        ({"curriculum": [[0, 2], [10, 0]]}, "curriculum"),
        ({"min_between": -1}, "min_between"),
        ({"min_between": 1.5}, "min_between"),
        ({"precision": "fp16"}, "precision"),
        ({"value_weight": -1.0}, "weights"),
        ({"distill_weight": -0.5}, "weights"),
        ({"batch_size": 0}, "batch_size"),
        ({"read_lr": 0.0}, "read_lr"),
        ({"model": {"memory_tokens": -1}}, "memory_tokens"),
        ({"model": {"memory_token": 8}}, "unknown config keys \\[.memory_token.\\]"),
        ({"cosine_steps": [[5, 100]]}, "cosine_steps"),
        ({"cosine_steps": [[0, 100], [50, 100], [20, 300]]}, "cosine_steps"),
        ({"cosine_steps": [[0, 10]], "warmup_steps": 10}, "cosine_steps"),
        ({"readout_momentum": 0}, "readout_momentum"),
        ({"readout_momentum": 1.5}, "readout_momentum"),
        ({"readout_momentum": True}, "readout_momentum"),
        ({"readout_momentum": "0.1"}, "readout_momentum"),
    ],
)
def test_a_bad_training_config_is_refused(config: TrainConfig, change: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(config, **change)


def test_a_config_file_states_only_what_differs_and_an_unknown_key_is_refused(tmp_path: Path) -> None:
    """A config file's keys are the dataclass's fields, flat: the ones it leaves out take the defaults (the shipped
    recipe's first stage), and a key that is not a field (a removed option, a typo) is refused, named."""
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({"base": None, "steps": 650, "rank_weight": 0.5}))
    config = TrainConfig.from_file(path)
    assert asdict(config) == {**asdict(TrainConfig()), "steps": 650, "rank_weight": 0.5}
    assert (config.batch_size, config.write_stage_steps, config.curriculum, config.readout_momentum) == (
        6,
        100,
        [[0, 2], [250, 4]],
        0.05,
    )
    for key in ("write_warmup", "state_pool", "batch"):
        path.write_text(json.dumps({"base": None, key: None}))
        with pytest.raises(ValueError, match=f"unknown training config keys \\['{key}'\\]"):
            TrainConfig.from_file(path)


def test_sia_train_sends_an_adapter_config_to_the_adapter_trainer(
    config: TrainConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the command's model cache (sia-data/models) is relative to the working directory
    config_file = tmp_path / "adapter.json"
    config_file.write_text(json.dumps(asdict(replace(config, steps=50, threads=None))))
    out = tmp_path / "cli-run"
    args = ["train", "--config", str(config_file), "--out", str(out), "--steps", "2", "--threads", "1", "--device", "cpu"]
    assert main([*args, "--quiet"]) == 0
    assert (out / "last" / "identity.safetensors").is_file()
    assert len((out / "history.jsonl").read_text().splitlines()) == 2
    written = json.loads((out / "train.json").read_text())
    assert (written["steps"], written["threads"], written["out_dir"]) == (2, 1, str(out))


def test_sia_train_sends_a_native_config_to_the_native_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    native = tmp_path / "native.json"
    native.write_text(json.dumps({"steps": 10}))
    seen: list[native_train.TrainConfig] = []
    monkeypatch.setattr(native_train, "train", lambda config, progress: seen.append(config))
    assert main(["train", "--config", str(native), "--steps", "3", "--out", str(tmp_path / "n"), "--quiet"]) == 0
    assert len(seen) == 1 and isinstance(seen[0], native_train.TrainConfig)
    assert (seen[0].steps, seen[0].out_dir) == (3, str(tmp_path / "n"))
    assert main(["train", "--config", str(native), "--device", "cuda"]) == 2  # --device is the adapter trainer's
    assert main(["train", "--config", str(native), "--steps", "0"]) == 2  # overrides are validated
    assert len(seen) == 1


def test_sia_eval_measures_a_tiny_model_end_to_end(config: TrainConfig, cache: Path, tmp_path: Path) -> None:
    """The memory evaluation runs through on a tiny checkpoint: every figure present and in range, a fresh state reads as
    the base model, the report and the plots written; ``sia eval`` sends a backbone checkpoint to it."""
    from sia.checkpoint import save_llama_checkpoint
    from sia.learn.adapter.evaluate import EvalOptions, run_eval

    model, ref = build_model(config, cache)
    open_read(model, 1)
    save_llama_checkpoint(model, tmp_path / "ckpt", ref)
    torch.manual_seed(0)
    readout = ReadOut(model.config.d_self)  # a training directory keeps its read-out beside the checkpoint
    save_file(readout.state_dict(), str(tmp_path / "ckpt" / READOUT_FILE))
    history = tmp_path / "history.jsonl"
    record = {
        "step": 1,
        "answer": 2.0,
        "readout": 1.5,
        "distill": 0.1,
        "max_between": 1,
        "heldout": {"per_fact": 0.2, "all": 0.0},
    }
    history.write_text(json.dumps(record) + "\n")
    options = EvalOptions(episodes=2, depths=(0, 1), target_depth=1, conversations=2, read_shifts=(30.0, 0.0))
    figures = run_eval(tmp_path / "ckpt", tmp_path / "eval", options, history=history, cache_dir=cache)
    weakened, unshifted = figures["read_strength"]  # after a shift of 30 the slot biases came back: 0 is the main figure
    assert (weakened["shift"], unshifted["shift"]) == (30.0, 0.0)
    assert figures["read_shift"] == 0.0  # the checkpoint's own, at which every other figure is read
    assert [f["depth"] for f in figures["recall"]] == [0, 1]  # 0: asked right after the statement
    assert unshifted["state"] == figures["recall"][1]["state"]
    assert unshifted["perplexity_ratio"] == figures["perplexity"]["ratio"]
    assert weakened["perplexity_ratio"] != unshifted["perplexity_ratio"]  # the slots' weight is e^-30 of what it was
    assert "The read's strength" in (tmp_path / "eval" / "report.md").read_text()
    for depth in figures["recall"]:
        assert depth["episodes"] == 2 and depth["chance"]["per_fact"] == pytest.approx(1 / 6)
        for condition in ("state", "stateless", "other_user", "transcript"):
            assert 0.0 <= depth[condition]["per_fact"] <= 1.0
            assert set(depth[condition]["by_kind"]) == {"colour", "pet", "hobby"}
    assert set(figures["open_vocabulary"]["state"]["by_kind"]) == {"name", "city", "job"}
    assert figures["perplexity"]["tokens"] > 0 and figures["perplexity"]["ratio"] > 0
    assert figures["history_kl"] > 0  # two users' states read differently (the slot values are open)
    assert figures["reset"]["fresh_vs_fresh"] == 0.0
    assert [f["depth"] for f in figures["retention"]] == [0, 1]  # right after the statement, then each depth
    assert all(0.0 <= f["readout"] <= 1.0 for f in figures["retention"])
    assert "Is it still in the state?" in (tmp_path / "eval" / "report.md").read_text()
    moved = figures["rewrites"]
    assert 0.0 <= moved["statement"] <= 1.0 and len(moved["unrelated"]) == 1 and 0.0 <= moved["saturated"] <= 1.0
    assert "How much each turn rewrites" in (tmp_path / "eval" / "report.md").read_text()
    assert figures["reset"]["fresh_vs_base"] < 1e-4
    assert {t["name"].split(" ")[0] for t in figures["targets"]} >= {"per", "all", "stateless", "other"}
    for name in ("report.md", "figures.json", "recall.png", "self_state.png", "spectra.png", "training.png"):
        assert (tmp_path / "eval" / name).stat().st_size > 0
    assert "## Targets" in (tmp_path / "eval" / "report.md").read_text()

    args = ["eval", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "cli"), "--episodes", "1"]
    args += ["--conversations", "1", "--cache", str(cache)]
    assert main(args) == 2  # one episode cannot lend another user's state: refused with a message
    assert not (tmp_path / "cli").exists()


def test_sia_eval_pools_recall_over_held_out_draws_and_judges_the_targets_on_it(
    config: TrainConfig, cache: Path, tmp_path: Path
) -> None:
    """``sia eval --draws``: each draw is recall_at's own figures at that eval seed, at the target depth; the pooled
    figures are the mean over the draws, chance is over every episode drawn, the targets read the pooled figures, and
    report.md shows them; a draw given twice is refused."""
    from sia.checkpoint import save_llama_checkpoint
    from sia.learn.adapter.evaluate import CLOSED_TRIO, EvalOptions, chance, recall_at, report, run_eval, targets

    model, ref = build_model(config, cache)
    open_read(model, 7)
    save_llama_checkpoint(model, tmp_path / "ckpt", ref)
    options = EvalOptions(episodes=6, depths=(1,), target_depth=1, conversations=1, draws=(100, 300, 700))
    run_eval(tmp_path / "ckpt", tmp_path / "eval", options, cache_dir=cache)
    figures = json.loads((tmp_path / "eval" / "figures.json").read_text())
    pooled = figures["pooled"]
    assert [r["draw"] for r in pooled["draws"]] == [100, 300, 700] and figures["options"]["draws"] == [100, 300, 700]
    assert pooled["depth"] == 1 and pooled["episodes"] == 18 and all(r["episodes"] == 6 for r in pooled["draws"])
    model = model.eval()
    dynamics = Dynamics.from_config(model.config)
    drawn = []
    for row in pooled["draws"]:  # each draw measured again on its own
        alone_options = EvalOptions(episodes=6, depths=(1,), target_depth=1, seed=row["draw"])
        with torch.no_grad():
            alone, episodes, _ = recall_at(model, 1, CLOSED_TRIO, alone_options, dynamics, ("state", "stateless", "other_user"))
        drawn += episodes
        for name in ("state", "stateless", "other_user"):
            assert row[name] == alone[name], (row["draw"], name)
    assert pooled["state"]["per_fact"] > 0  # a mean of something
    for name in ("state", "stateless", "other_user"):
        for figure in ("per_fact", "all_three"):
            assert pooled[name][figure] == pytest.approx(sum(r[name][figure] for r in pooled["draws"]) / 3, abs=1e-12)
        for kind in CLOSED_TRIO:
            expected = sum(r[name]["by_kind"][kind] for r in pooled["draws"]) / 3
            assert pooled[name]["by_kind"][kind] == pytest.approx(expected, abs=1e-12)
    assert pooled["chance"] == pytest.approx(chance(drawn))
    assert pooled["draws"][0]["chance"]["per_fact_sd"] > pooled["chance"]["per_fact_sd"]  # 18 episodes against 6
    judged = {t["name"].split(" after")[0]: t for t in figures["targets"]}
    assert judged["per fact"]["measured"] == f"{100 * pooled['state']['per_fact']:.1f} %"
    assert judged["all three"]["measured"] == f"{100 * pooled['state']['all_three']:.1f} %"
    assert "(18 episodes, 3 draws)" in judged["per fact"]["name"]
    text = (tmp_path / "eval" / "report.md").read_text()
    assert "## The acceptance figure: recall after 1 turns over 3 held-out draws" in text
    assert f"| **pooled** | 18 | **{100 * pooled['state']['per_fact']:.1f} %** |" in text
    one_draw = {**figures, "pooled": None}  # without draws the targets read the one draw at the target depth
    plain = targets(one_draw, options)
    assert plain[0]["measured"] == f"{100 * figures['recall'][0]['state']['per_fact']:.1f} %" and "draws" not in plain[0]["name"]
    assert "acceptance figure" not in report(one_draw)

    with pytest.raises(ValueError, match="draws must be distinct"):
        EvalOptions(draws=(100, 300, 100))
    args = ["eval", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "twice"), "--cache", str(cache)]
    assert main([*args, "--draws", "100", "100"]) == 2  # refused before anything is measured
    assert not (tmp_path / "twice").exists()


def test_the_write_stage_plays_statements_alone_and_trains_the_write_by_the_read_out(config: TrainConfig, cache: Path) -> None:
    """The first stage: statement turns only, nothing asked, no distillation; the read-out alone moves the write."""
    config = replace(config, write_stage_steps=2, write_stage_batch=3)
    model, _ = build_model(config, cache)
    batch = sample_batch(config, model, 0)
    assert len(batch) == 3 and all(len(ex.episode.turns) == 1 and not ex.asked and ex.distill_at < 0 for ex in batch)
    assert len(sample_batch(config, model, 2)) == config.batch_size  # the stage is over at step 2
    torch.manual_seed(0)
    readout = ReadOut(model.config.d_self)
    losses = episode_losses(model, readout, batch, config, Dynamics.from_config(model.config))
    assert float(losses["answer"]) == 0.0 and float(losses["distill"]) == 0.0 and float(losses["readout"].detach()) > 0
    losses["readout"].backward()  # type: ignore[no-untyped-call]
    grad = model.self_update.proj.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0


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


def test_min_between_keeps_shallow_depths_in_a_deep_stage(config: TrainConfig, cache: Path) -> None:
    """By default a stage of up to 6 unrelated turns plays 3 to 6; with min_between 1, every depth from 1 to 6; with 0,
    also questions asked right after the statement (the statement the episode's last turn)."""
    model, _ = build_model(config, cache)

    def depths(config: TrainConfig) -> set[int]:
        return {ex.episode.between for step in range(40) for ex in sample_batch(config, model, step)}

    deep = replace(config, curriculum=[[0, 6]], batch_size=4)
    assert depths(deep) == {3, 4, 5, 6}
    assert depths(replace(deep, min_between=1)) == set(range(1, 7))
    assert depths(replace(deep, min_between=0)) == set(range(0, 7))
    right_after = [ex for ex in sample_batch(replace(deep, min_between=0, batch_size=40), model, 0) if ex.episode.between == 0]
    assert right_after and all(ex.episode.stated_at == len(ex.episode.turns) - 1 for ex in right_after)
    assert replace(deep, min_between=9).between_range(6) == (6, 6)  # never beyond the stage


def test_kind_weights_draw_a_kind_into_more_training_episodes(config: TrainConfig, cache: Path) -> None:
    """kind_weights: a kind weighing 3 is in nearly nine training episodes of ten (uniform: half), one weighing 0 in
    none; the batch is still a function of (seed, step); a bad weight or kind is refused when the config is made."""
    model, _ = build_model(config, cache)
    weighted = replace(config, batch_size=8, kind_weights={"hobby": 3.0, "name": 0.0})

    def share(config: TrainConfig) -> Counter[str]:
        return Counter(f.kind for step in range(50) for ex in sample_batch(config, model, step) for f in ex.episode.facts)

    uniform, drawn = share(replace(weighted, kind_weights=None)), share(weighted)
    assert drawn["name"] == 0 and uniform["name"] > 100
    assert drawn["hobby"] / 400 > 0.8 and uniform["hobby"] / 400 < 0.6
    stage = replace(weighted, write_stage_steps=10, write_stage_batch=40)  # the write stage's statements draw so too
    assert not any(f.kind == "name" for ex in sample_batch(stage, model, 0) for f in ex.episode.facts)
    assert any(f.kind == "name" for ex in sample_batch(replace(stage, kind_weights=None), model, 0) for f in ex.episode.facts)
    again = sample_batch(weighted, model, 7)
    assert [ex.episode for ex in again] == [ex.episode for ex in sample_batch(weighted, model, 7)]
    for bad in ({"mood": 1.0}, {"hobby": -1.0}, {"hobby": True}, [1.0]):
        with pytest.raises(ValueError, match=r"kind|weight"):
            replace(config, kind_weights=bad)
    with pytest.raises(ValueError, match="distinct kinds"):
        replace(config, n_facts=5, kind_weights={"pet": 0, "job": 0})


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


def test_a_recipe_judged_over_seeds_trains_exports_and_measures_each_run(
    config: TrainConfig, cache: Path, tmp_path: Path
) -> None:
    """experiments.probes.recipe_seeds: one run per seed (the seeds give different adapters), each exported in float16 and
    measured; the summary is over the runs; a second sweep finds the runs finished and trains nothing again."""
    from experiments.probes import recipe_seeds

    recipe = tmp_path / "recipe.json"
    config.to_file(recipe)
    runs, out = tmp_path / "runs", tmp_path / "result.json"
    argv = ["--config", str(recipe), "--seeds", "3", "4", "--runs", str(runs), "--parallel", "2", "--slot-rank", "0"]
    argv += ["--episodes", "2", "--between", "1", "--conversations", "1", "--cache", str(cache), "--out", str(out)]
    recipe_seeds.main(argv)
    result = json.loads(out.read_text())
    assert [r["seed"] for r in result["runs"]] == [3, 4]
    for r in result["runs"]:
        assert 0.0 <= r["per_fact"] <= 1.0 and 0.0 <= r["all_three"] <= r["per_fact"]
        assert 0.0 <= r["stateless"] <= 1.0 and 0.0 <= r["other_user"] <= 1.0
        assert r["perplexity_ratio"] > 0 and r["episodes"] == 2 and r["between"] == 1
        assert json.loads((Path(r["run"]) / "train.json").read_text())["seed"] == r["seed"]
        assert json.loads((Path(r["run"]) / "served" / "config.json").read_text())["weights_dtype"] == "float16"
    ratios = [r["perplexity_ratio"] for r in result["runs"]]
    assert result["summary"]["perplexity_ratio"]["mean"] == pytest.approx(sum(ratios) / 2)
    assert result["summary"]["perplexity_ratio"]["min"] == min(ratios)
    first, second = (load_file(str(Path(r["run"]) / "last" / "identity.safetensors")) for r in result["runs"])
    assert any(not torch.equal(first[k], second[k]) for k in first)  # another seed, another run

    trained = (runs / "recipe-seed3" / "last" / "identity.safetensors").stat().st_mtime_ns
    recipe_seeds.main(argv)
    assert (runs / "recipe-seed3" / "last" / "identity.safetensors").stat().st_mtime_ns == trained
    again = json.loads(out.read_text())
    assert again["trained"] == [] and result["trained"] == [3, 4]
    assert again["summary"] == result["summary"]


def test_measuring_one_adapter_pools_its_draws_of_held_out_episodes(config: TrainConfig, cache: Path, tmp_path: Path) -> None:
    """recipe_seeds measure --draws: each draw is recall_at's own figures at that eval seed; the top level pools
    them (the mean over draws of equal size), with chance over every episode drawn."""
    from experiments.probes import recipe_seeds
    from sia.checkpoint import save_llama_checkpoint
    from sia.learn.adapter.evaluate import CLOSED_TRIO, EvalOptions, recall_at

    model, ref = build_model(config, cache)
    with torch.no_grad():  # a state that reads something: the self slots' values away from zero
        for attention in model.attentions:
            attention.self_value.weight.normal_(0.0, 0.5)
    save_llama_checkpoint(model, tmp_path / "ckpt", ref)
    out = tmp_path / "measure.json"
    argv = ["measure", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(out), "--episodes", "2", "--between", "1"]
    recipe_seeds.main([*argv, "--conversations", "1", "--draws", "100", "300", "--cache", str(cache)])
    result = json.loads(out.read_text())
    assert [r["draw"] for r in result["draws"]] == [100, 300] and result["episodes"] == 4
    model = model.eval()
    dynamics = Dynamics.from_config(model.config)
    for row in result["draws"]:
        options = EvalOptions(episodes=2, depths=(1,), target_depth=1, seed=row["draw"])
        with torch.no_grad():
            recall, _, _ = recall_at(model, 1, CLOSED_TRIO, options, dynamics, ("state", "stateless"))
        assert row["per_fact"] == pytest.approx(recall["state"]["per_fact"], abs=1e-6)
        assert row["all_three"] == pytest.approx(recall["state"]["all_three"], abs=1e-6)
        assert row["stateless"] == pytest.approx(recall["stateless"]["per_fact"], abs=1e-6)
    for name in ("per_fact", "all_three", "stateless", "other_user"):
        assert result[name] == pytest.approx(sum(r[name] for r in result["draws"]) / 2)
    assert result["by_kind"]["hobby"] == pytest.approx(sum(r["by_kind"]["hobby"] for r in result["draws"]) / 2)
    assert result["chance"]["per_fact_sd"] < recall["chance"]["per_fact_sd"]  # four episodes against two
    assert result["read_shift"] == model.config.read_shift and result["perplexity_ratio"] > 0
    with pytest.raises(ValueError, match="draws must be distinct"):
        recipe_seeds.measure(tmp_path / "ckpt", episodes=2, between=1, conversations=1, device="cpu", draws=(5, 5), cache=cache)


def test_training_throughput_times_each_batch_size_over_the_base_or_random_weights_of_its_shapes(
    config: TrainConfig, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from experiments.probes import train_throughput
    from sia.backbones.weights import resolve_base

    recipe, out = tmp_path / "recipe.json", tmp_path / "throughput.json"
    config.to_file(recipe)
    argv = ["--config", str(recipe), "--steps", "2", "--warmup", "1", "--between", "2", "--cache", str(cache), "--out", str(out)]
    train_throughput.main([*argv, "--batches", "1", "3"])
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["rows"]] == [1, 3]
    assert result["stage"].startswith("1-2 unrelated turns") and result["precision"] == "float32"
    for r in result["rows"]:
        assert len(r["seconds_each"]) == 2 and min(r["seconds_each"]) > 0
        assert r["seconds_per_step"] == pytest.approx(sum(r["seconds_each"]) / 2)
        assert r["episodes_per_min"] == pytest.approx(60 * r["batch"] / r["seconds_per_step"])
    assert "| 3 |" in capsys.readouterr().out

    shaped = tmp_path / "shaped"  # the base's config and tokenizer alone: random weights of its shapes fill it
    shaped.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (shaped / name).write_bytes((resolve_base(Path(str(config.base)), cache) / name).read_bytes())
    train_throughput.main([*argv, "--batches", "2", "--base", str(shaped), "--random-weights"])
    result = json.loads(out.read_text())
    assert (shaped / "model.safetensors").is_file() and result["base"].startswith("random weights")
    assert [r["batch"] for r in result["rows"]] == [2]
    with pytest.raises(SystemExit):
        train_throughput.main([*argv, "--random-weights"])


def test_recall_misses_ranks_every_probe_and_agrees_with_the_evals_recall(
    config: TrainConfig, cache: Path, tmp_path: Path
) -> None:
    """experiments.probes.recall_misses reads the eval's own episodes: its share of probes whose truth ranks first is
    recall_at's per-fact recall through the state, to the probe."""
    from experiments.probes import recall_misses
    from sia.learn.adapter.evaluate import CLOSED_TRIO, EvalOptions, recall_at

    model = build_model(config, cache)[0].eval()
    dynamics = Dynamics.from_config(model.config)
    result = recall_misses.misses(model, 1, 3, dynamics)
    options = EvalOptions(episodes=3, depths=(1,), target_depth=1)
    with torch.no_grad():
        recall, _, _ = recall_at(model, 1, CLOSED_TRIO, options, dynamics, ("state",))
    assert result["per_fact"] == pytest.approx(recall["state"]["per_fact"])
    assert len(result["probes"]) == 9 and {p["kind"] for p in result["probes"]} == set(CLOSED_TRIO)
    for kind, k in result["kinds"].items():
        rows = [p for p in result["probes"] if p["kind"] == kind]
        assert all(1 <= p["rank"] <= k["values"] for p in rows) and k["probes"] == 3
        assert all((p["rank"] == 1) == (p["named"] == p["true"]) for p in rows)
        assert k["right"] + len(k["misses"]) == 3 and sum(k["named"].values()) == 3
        assert recall["state"]["by_kind"][kind] == pytest.approx(k["right"] / 3)


def test_a_recipe_sweep_stops_at_a_failed_run_and_names_its_log(config: TrainConfig, cache: Path, tmp_path: Path) -> None:
    from experiments.probes import recipe_seeds

    recipe = tmp_path / "recipe.json"
    replace(config, base=str(tmp_path / "missing.gguf")).to_file(recipe)
    argv = ["--config", str(recipe), "--seeds", "0", "--runs", str(tmp_path / "runs"), "--cache", str(cache)]
    with pytest.raises(SystemExit, match=r"train\.log"):
        recipe_seeds.main(argv)
    assert "missing.gguf" in (tmp_path / "runs" / "recipe-seed0" / "train.log").read_text()


def test_rewrites_counts_the_dimensions_each_kind_of_turn_moves() -> None:
    """Episode 0 states its facts in turn 0, then chats twice; episode 1 chats, states, chats once."""
    from sia.learn.adapter.evaluate import rewrites
    from sia.learn.dialogue import Exchange

    said = Exchange("I like red.", "Noted.")
    talk = Exchange("Nice day?", "Yes.")
    first = facts.Episode("u0", "heldout", (), (said, talk, talk), 0, ())
    second = facts.Episode("u1", "heldout", (), (talk, said, talk), 1, ())
    s = [
        torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]]),  # u0: 4 of 4 moved; u1 (opening): 1 of 4
        torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]]),  # u0 1st unrelated: 1; u1 statement: 2
        torch.tensor([[1.0, 1.0, 0.2, 0.0], [0.0, 1.0, 1.0, 0.0]]),  # u0 2nd unrelated (0.8 moved): 1; u1 1st: 1
    ]
    states = [Carry(x, torch.zeros(2, 1), torch.zeros(2, 3, dtype=torch.float64)) for x in s]
    moved = rewrites(states, [first, second])
    assert moved["statement"] == pytest.approx((1.0 + 0.5) / 2)
    assert moved["opening"] == pytest.approx(0.25)
    assert moved["unrelated"] == pytest.approx([(0.25 + 0.25) / 2, 0.25])
    assert moved["saturated"] == pytest.approx(4 / 8)


def test_write_input_splits_the_variance_of_z_between_turn_and_state(config: TrainConfig, cache: Path) -> None:
    from experiments.probes.write_input import measure, variance_shares

    turn_part = torch.tensor([1.0, -1.0, 3.0]).view(3, 1, 1) * torch.ones(3, 4, 5)
    state_part = torch.tensor([2.0, 0.0, -2.0, 0.0]).view(1, 4, 1) * torch.ones(3, 4, 5)
    assert variance_shares(turn_part) == pytest.approx({"turn": 1.0, "state": 0.0, "rest": 0.0})
    assert variance_shares(state_part) == pytest.approx({"turn": 0.0, "state": 1.0, "rest": 0.0})
    mixed = variance_shares(turn_part + state_part)  # per cell: the turns vary by 8/3, the states by 2
    assert mixed["turn"] == pytest.approx((8 / 3) / (8 / 3 + 2)) and mixed["rest"] == pytest.approx(0.0, abs=1e-12)

    model, _ = build_model(config, cache)
    open_read(model, 2)
    result = measure(model.eval(), users=2, turns=2, between=1)
    shares = [result["all"], result["pooled"], *result["memory_tokens"]]
    assert len(result["memory_tokens"]) == model.config.memory_tokens
    assert all(s["turn"] >= 0 and s["state"] >= 0 and s["turn"] + s["state"] + s["rest"] == pytest.approx(1) for s in shares)


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


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "configs").glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_config_is_a_valid_config_of_its_trainer(path: Path) -> None:
    """Each recipe in configs/ loads as what ``sia train`` would read it as: an adapter config where it names a base
    (null: the bundled one), else a native one; a field renamed or a value out of range fails here, not at a run."""
    from sia.learn.native.train import TrainConfig as NativeConfig

    data = json.loads(path.read_text())
    config = TrainConfig.from_file(path) if "base" in data else NativeConfig.from_file(path)
    assert asdict(config) == {**asdict(config), **data}  # every field it states is the one it holds
