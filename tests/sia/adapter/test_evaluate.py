"""``sia eval`` on a tiny model end to end, and recall pooled over held-out draws (the acceptance figure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from sia.commands import main
from sia.identity.state import Dynamics
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.readout import READOUT_FILE, ReadOut
from sia.learn.adapter.trainable import build_model

from .conftest import open_read


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
