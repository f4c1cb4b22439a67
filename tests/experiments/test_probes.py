"""The lab's probes (experiments/probes) still run: a recipe over seeds, pooled draws, training throughput, the misses'
ranks, a sweep that stops at a failed run, what each turn rewrites, what the write reads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sia.identity.state import Dynamics
from sia.learn.adapter import facts
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.trainable import build_model
from sia.learn.adapter.unroll import Carry
from tests.sia.adapter.conftest import open_read


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
    for key, figures in result["summary"].items():  # measured again: the same up to the threads' order of sums
        assert again["summary"][key] == pytest.approx(figures, rel=1e-5, abs=1e-6), key


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
