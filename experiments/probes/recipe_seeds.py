"""A training recipe judged over several seeds: train one run per seed, serve-export each, measure each the same way.

One run of a recipe says little: three runs of the shipped recipe span 54-65 % per fact at 4 unrelated turns. This
trains ``sia train --config CONFIG --seed S`` for every seed (``--parallel`` runs at once: one GPU holds several of
these small runs), exports each as the shipped adapter is exported (slot maps factored to ``--slot-rank``, float16),
and measures each exported adapter on the same held-out episodes: recall of colour, pet and hobby through the state
after ``--between`` unrelated turns (per fact, all three, per kind; a fresh state and another user's state beside
it), and reply perplexity on the held-out dialogue with the state carried against the base model. ``--draws`` sets
how many draws of ``--episodes`` are pooled (each an eval seed; ``sia eval`` draws 100): 32 episodes leave one
standard deviation of about 4 points per fact and 8 all three, five draws of 32 about 1.5 and 3.7. Then the mean,
standard deviation and range over seeds. Runs resume: a finished run is not trained again, a stopped one goes on
from its last checkpoint.

    python -m experiments.probes.recipe_seeds --config configs/train-smollm2.json --seeds 0 1 2 \\
        [--device cuda] [--parallel 3] [--runs runs/seeds] [--episodes 32] [--conversations 60] [--out FILE]
    python -m experiments.probes.recipe_seeds measure --checkpoint DIR --out FILE \\
        [--draws 100 200 300 400 500]   # one adapter (what the sweep runs)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import torch

from sia.backbones.llama import LlamaModel
from sia.checkpoint import DEFAULT_CACHE, load_model
from sia.identity.state import Dynamics
from sia.learn.adapter.evaluate import CLOSED_TRIO, EvalOptions, chance, dialogue_perplexity, recall_at
from sia.learn.adapter.train import HISTORY_FILE, TRAINER_FILE, TrainConfig

RESULTS = Path(__file__).parent / "results"
SERVED = "served"  # each run's exported adapter, beside its last/
FIGURES = ("per_fact", "all_three", "perplexity_ratio")


def measure(
    checkpoint: Path,
    *,
    episodes: int,
    between: int,
    conversations: int,
    device: str,
    draws: Sequence[int] = (EvalOptions.seed,),
    cache: Path = DEFAULT_CACHE,
) -> dict[str, Any]:
    """Recall through the state (and a fresh state, another user's) at ``between`` unrelated turns, and the reply
    perplexity ratio. Each of ``draws`` (an ``EvalOptions.seed``; ``sia eval`` draws 100) is its own set of
    ``episodes`` held-out episodes; the top-level figures pool every draw, ``draws`` holds each one's."""
    if not draws or len(set(draws)) != len(draws):
        raise ValueError(f"draws must be distinct and at least one; got {list(draws)}")
    model = load_model(checkpoint, cache_dir=cache)
    if not isinstance(model, LlamaModel):
        raise ValueError(f"{checkpoint} is not a checkpoint over a pretrained backbone")
    model.to(torch.device(device)).eval()
    dynamics = Dynamics.from_config(model.config)
    began = time.perf_counter()
    rows, held = [], []
    for draw in draws:
        options = EvalOptions(episodes=episodes, depths=(between,), target_depth=between, conversations=conversations, seed=draw)
        recall, drawn, _ = recall_at(model, between, CLOSED_TRIO, options, dynamics, ("state", "stateless", "other_user"))
        held += drawn
        rows.append(
            {
                "draw": draw,
                "per_fact": recall["state"]["per_fact"],
                "all_three": recall["state"]["all_three"],
                "by_kind": recall["state"]["by_kind"],
                "stateless": recall["stateless"]["per_fact"],
                "other_user": recall["other_user"]["per_fact"],
            }
        )
    ppl = dialogue_perplexity(model, dynamics, conversations)
    pooled = {name: statistics.fmean(r[name] for r in rows) for name in ("per_fact", "all_three", "stateless", "other_user")}
    return {
        "checkpoint": str(checkpoint),
        "read_shift": model.config.read_shift,
        "between": between,
        "episodes": episodes * len(draws),
        **pooled,
        "by_kind": {kind: statistics.fmean(r["by_kind"][kind] for r in rows) for kind in CLOSED_TRIO},
        "chance": chance(held),
        "perplexity_ratio": ppl["ratio"],
        "perplexity": ppl,
        "draws": rows,
        "seconds": time.perf_counter() - began,
    }


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, standard deviation (over seeds; 0 for one run), minimum and maximum of each figure."""
    out = {}
    for name in FIGURES:
        values = [float(r[name]) for r in runs]
        out[name] = {
            "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values),
            "max": max(values),
        }
    return out


def _run_all(commands: Sequence[tuple[list[str], Path]], parallel: int) -> None:
    """Run each command (its output to its log file), at most ``parallel`` at once; any failure stops the sweep."""
    waiting = list(commands)
    running: list[tuple[list[str], subprocess.Popen[bytes], IO[str], Path]] = []
    while waiting or running:
        while waiting and len(running) < parallel:
            argv, log_path = waiting.pop(0)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            out = log_path.open("a")
            running.append((argv, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT), out, log_path))
        time.sleep(0.2)
        for job in [job for job in running if job[1].poll() is not None]:
            running.remove(job)
            job[2].close()
            if job[1].returncode != 0:
                for _, proc, log_file, _ in running:
                    proc.terminate()
                    proc.wait()
                    log_file.close()
                raise SystemExit(f"{' '.join(job[0])} failed ({job[1].returncode}); see {job[3]}")


def _finished(run: Path, steps: int) -> bool:
    trainer = run / "last" / TRAINER_FILE
    return trainer.is_file() and int(json.loads(trainer.read_text())["step"]) >= steps


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    config = TrainConfig.from_file(args.config)
    steps = args.steps or config.steps
    runs = {seed: args.runs / f"{args.config.stem}-seed{seed}" for seed in args.seeds}
    sia = [sys.executable, "-m", "sia", "--log-level", "WARNING"]
    common = ["--cache", str(args.cache)] + ([] if args.threads is None else ["--threads", str(args.threads)])
    device = args.device or config.device
    train = [*sia, "train", "--config", str(args.config), "--quiet", "--device", device, *common]
    if args.steps:
        train += ["--steps", str(args.steps)]
    export = [*sia, "export", "--dtype", "float16", "--cache", str(args.cache)]
    if args.slot_rank:
        export += ["--slot-rank", str(args.slot_rank)]
    score = [sys.executable, "-m", "experiments.probes.recipe_seeds", "measure", "--device", device, *common]
    score += ["--episodes", str(args.episodes), "--between", str(args.between), "--conversations", str(args.conversations)]
    score += ["--draws", *map(str, args.draws)]
    began = time.perf_counter()
    todo = [(seed, run) for seed, run in runs.items() if not _finished(run, steps)]
    _run_all([([*train, "--seed", str(seed), "--out", str(run)], run / "train.log") for seed, run in todo], args.parallel)
    trained = time.perf_counter() - began
    _run_all(
        [([*export, "--checkpoint", str(run / "last"), "--out", str(run / SERVED)], run / "export.log") for run in runs.values()],
        args.parallel,
    )
    _run_all(
        [
            ([*score, "--checkpoint", str(run / SERVED), "--out", str(run / "measure.json")], run / "measure.log")
            for run in runs.values()
        ],
        args.parallel,
    )
    rows = []
    for seed, run in runs.items():
        row = {"seed": seed, "run": str(run), **json.loads((run / "measure.json").read_text())}
        records = [json.loads(line) for line in (run / HISTORY_FILE).read_text().splitlines()]
        checks = [r["heldout"] for r in records if "heldout" in r]
        row["trainer_heldout"] = checks[-1] if checks else None  # the trainer's own small check, for comparison
        rows.append(row)
    return {
        "config": str(args.config),
        "config_values": json.loads(args.config.read_text()),
        "steps": steps,
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
        "slot_rank": args.slot_rank,
        "trained": [seed for seed, _ in todo],
        "train_seconds": trained,
        "total_seconds": time.perf_counter() - began,
        "runs": rows,
        "summary": summary(rows),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['config']}, {len(result['runs'])} seeds, {result['steps']} steps on {result['device']}, "
        f"{result['runs'][0]['episodes']} held-out episodes at {result['runs'][0]['between']} unrelated turns",
        "",
        "| seed | per fact | all three | fresh state | perplexity / base | trainer's check |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        check = r["trainer_heldout"]
        lines.append(
            f"| {r['seed']} | {r['per_fact']:.1%} | {r['all_three']:.1%} | {r['stateless']:.1%} | "
            f"{r['perplexity_ratio']:.3f}x | {'-' if check is None else format(check['per_fact'], '.1%')} |"
        )
    s = result["summary"]
    lines.append(
        f"| mean ± sd | {s['per_fact']['mean']:.1%} ± {s['per_fact']['sd']:.1%} | "
        f"{s['all_three']['mean']:.1%} ± {s['all_three']['sd']:.1%} | | "
        f"{s['perplexity_ratio']['mean']:.3f}x ± {s['perplexity_ratio']['sd']:.3f} | |"
    )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["measure"]:
        one = argparse.ArgumentParser(description="measure one exported adapter")
        one.add_argument("--checkpoint", type=Path, required=True)
        one.add_argument("--out", type=Path, required=True)
        one.add_argument("--episodes", type=int, default=32)
        one.add_argument("--between", type=int, default=4)
        one.add_argument("--conversations", type=int, default=60)
        one.add_argument("--draws", type=int, nargs="+", default=[EvalOptions.seed], help="held-out draws (eval seeds)")
        one.add_argument("--device", default="cpu")
        one.add_argument("--threads", type=int, default=None)
        one.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
        a = one.parse_args(argv[1:])
        if a.threads:
            torch.set_num_threads(a.threads)
        figures = measure(
            a.checkpoint,
            episodes=a.episodes,
            between=a.between,
            conversations=a.conversations,
            device=a.device,
            draws=a.draws,
            cache=a.cache,
        )
        a.out.write_text(json.dumps(figures, indent=2) + "\n")
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="an adapter training config (the recipe)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="override the config's steps")
    parser.add_argument("--runs", type=Path, default=Path("runs/seeds"), help="where each seed's run is kept")
    parser.add_argument("--parallel", type=int, default=1, help="runs trained (and measured) at once")
    parser.add_argument("--device", default=None, help="the torch device to train and measure on (default: the config's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run")
    parser.add_argument("--slot-rank", type=int, default=128, help="factor the slot maps to this rank on export (0: keep)")
    parser.add_argument("--episodes", type=int, default=32, help="held-out episodes (three facts each)")
    parser.add_argument("--draws", type=int, nargs="+", default=[EvalOptions.seed], help="held-out draws of --episodes each")
    parser.add_argument("--between", type=int, default=4, help="unrelated turns between statement and questions")
    parser.add_argument("--conversations", type=int, default=60, help="held-out dialogues for reply perplexity")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the base is dequantised")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (default results/recipe_seeds-CONFIG.json)")
    args = parser.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds) or args.parallel < 1:
        parser.error("seeds must differ and --parallel must be >= 1")
    args.slot_rank = args.slot_rank or None
    result = sweep(args)
    out = args.out or RESULTS / f"recipe_seeds-{args.config.stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(table(result))


if __name__ == "__main__":
    main()
