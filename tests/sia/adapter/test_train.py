"""Training the identity adapter (sia.learn.adapter): a few steps lower the loss, a run resumes where it stopped and
its checkpoint loads bit for bit, a run starts from a checkpoint, the write stage, the curriculum and the fact draw,
bad configs are refused, and ``sia train`` sends each config to its trainer."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.commands import main
from sia.identity.state import Dynamics
from sia.learn.adapter.batch import sample_batch
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.heldout import unroll_states
from sia.learn.adapter.losses import episode_losses
from sia.learn.adapter.readout import READOUT_FILE, ReadOut
from sia.learn.adapter.train import train
from sia.learn.adapter.trainable import build_model
from sia.learn.native import train as native_train


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
    for _ in range(16):
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


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[3] / "configs").glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_config_is_a_valid_config_of_its_trainer(path: Path) -> None:
    """Each recipe in configs/ loads as what ``sia train`` would read it as: an adapter config where it names a base
    (null: the bundled one), else a native one; a field renamed or a value out of range fails here, not at a run."""
    from sia.learn.native.train import TrainConfig as NativeConfig

    data = json.loads(path.read_text())
    config = TrainConfig.from_file(path) if "base" in data else NativeConfig.from_file(path)
    assert asdict(config) == {**asdict(config), **data}  # every field it states is the one it holds
