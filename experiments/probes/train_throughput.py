"""Adapter training throughput by batch size: seconds a step, steps and episodes a minute, peak memory.

What a bigger batch costs a step, and so what a device is worth for training: on one H100 (bf16) a step of the
2-4-turn stage took 7.4 s at batch 6 and 23.6 s at 96 (docs/model.md), so the batch buys episodes a minute, not
steps. Each batch size trains ``--steps`` steps of the config's recipe in its unrelated-turn stage
(``--between``: 2 to 4 unrelated turns by default, every fact asked), after ``--warmup`` steps that are not timed, on
a model whose adapter starts fresh; the batches are the recipe's own for steps 0, 1, ... at each size.

    python -m experiments.probes.train_throughput --config configs/train-smollm2.json --batches 6 16 48 \\
        [--device cuda] [--steps 4] [--warmup 1] [--between 4] [--base DIR] [--random-weights] [--out FILE]

``--random-weights``: ``--base`` is a directory with the model's config.json and tokenizer alone, filled here with
random weights of the same shapes (timing does not depend on the values): for a machine the real weights cannot
reach. Results go to ``--out`` (JSON, with the machine) and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import machine_info
from sia.backbones.weights import write_random_weights
from sia.checkpoint import DEFAULT_CACHE
from sia.identity.state import Dynamics
from sia.learn.adapter.batch import sample_batch
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.losses import episode_losses
from sia.learn.adapter.readout import ReadOut
from sia.learn.adapter.train import use_bf16
from sia.learn.adapter.trainable import build_model

RESULTS = Path(__file__).parent / "results"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_batch(config: TrainConfig, batch: int, steps: int, warmup: int, cache: Path) -> dict[str, Any]:
    """Train ``warmup + steps`` steps at ``batch`` episodes a step; the last ``steps`` timed one by one."""
    config = replace(config, batch_size=batch)
    device = torch.device(config.device)
    model, _ = build_model(config, cache)
    model.to(device).train()
    readout = ReadOut(model.config.d_self, config.readout_momentum).to(device)
    params = [p for p in model.parameters() if p.requires_grad] + list(readout.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.lr)
    dynamics = Dynamics.from_config(model.config)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16(config.precision, device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for step in range(warmup + steps):
        examples = sample_batch(config, model, step)
        _sync(device)
        began = time.perf_counter()
        with amp:
            losses = episode_losses(model, readout, examples, config, dynamics)
        total = losses["answer"] + config.readout_weight * losses["readout"] + config.distill_weight * losses["distill"]
        optimizer.zero_grad(set_to_none=True)
        total.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        optimizer.step()
        _sync(device)
        if step >= warmup:
            seconds.append(time.perf_counter() - began)
    per_step = statistics.mean(seconds)
    row: dict[str, Any] = {
        "batch": batch,
        "seconds_per_step": per_step,
        "seconds_each": seconds,
        "steps_per_min": 60 / per_step,
        "episodes_per_min": 60 * batch / per_step,
    }
    if device.type == "cuda":
        row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    del model, readout, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    base = rows[0]["episodes_per_min"]
    lines = [
        f"Adapter training throughput on {result['device_name']} ({result['precision']}), {result['stage']}",
        "",
        "| batch | s / step | steps / min | episodes / min | vs first | peak GiB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        peak = f"{r['peak_memory_gib']:.1f}" if "peak_memory_gib" in r else "–"
        lines.append(
            f"| {r['batch']} | {r['seconds_per_step']:.2f} | {r['steps_per_min']:.1f} | {r['episodes_per_min']:.0f} "
            f"| {r['episodes_per_min'] / base:.2f}x | {peak} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/train-smollm2.json"), help="the recipe")
    parser.add_argument("--batches", type=int, nargs="+", default=[6, 16, 48], help="episodes a step, one run each")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per batch size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (allocator, kernels' first calls)")
    parser.add_argument("--between", type=int, default=4, help="the stage: the most unrelated turns (half that the least)")
    parser.add_argument("--device", default=None, help="the torch device (default: the config's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the config's)")
    parser.add_argument("--base", type=Path, default=None, help="the base model (default: the config's, the bundled one)")
    parser.add_argument("--random-weights", action="store_true", help="fill --base (config and tokenizer) with random weights")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where a GGUF base is dequantised")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (default results/train_throughput.json)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or min(args.batches) < 1 or args.between < 1:
        parser.error("--steps, --batches and --between must be >= 1 and --warmup >= 0")
    if args.random_weights:
        if args.base is None:
            parser.error("--random-weights needs --base: a directory with the model's config.json and tokenizer")
        write_random_weights(args.base)
    config = TrainConfig.from_file(args.config)
    config = replace(
        config,
        device=args.device or config.device,
        threads=args.threads or config.threads,
        base=str(args.base) if args.base is not None else config.base,
        init=None,
        write_stage_steps=0,
        curriculum=[[0, args.between]],
    )
    if config.threads:
        torch.set_num_threads(config.threads)
    device = torch.device(config.device)
    result: dict[str, Any] = {
        "config": str(args.config),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": "bf16 autocast" if use_bf16(config.precision, device) else "float32",
        "stage": f"{config.between_range(args.between)[0]}-{args.between} unrelated turns, "
        f"{config.n_facts} facts asked, distillation every {config.distill_every} steps",
        "base": "random weights of the base's shapes" if args.random_weights else (config.base or "bundled"),
        "steps": args.steps,
        "warmup": args.warmup,
        "machine": machine_info(torch.get_num_threads()),
        "rows": [],
    }
    out = args.out or RESULTS / "train_throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for batch in args.batches:  # written after each size: a run stopped early keeps the sizes it finished
        result["rows"].append(time_batch(config, batch, args.steps, args.warmup, args.cache))
        out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(table(result))


if __name__ == "__main__":
    main()
