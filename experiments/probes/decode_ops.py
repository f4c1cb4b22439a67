"""Where a decoded token's time goes: the ATen operators of a greedy decode (``benchmarks.imprint_read``'s three
decoders: ``dot``, ``fresh``, ``imprint``, one row), counted and timed by the profiler per decode step, and each
decoder's excess over ``dot`` by operator.

    PYTHONPATH=. python -m experiments.probes.decode_ops [--tokens 16] [--rows 1] [--dtype bfloat16] [--shapes] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.backbone import sia_decode
from benchmarks.imprint_read import decoders
from sia.backbones.weights import bundled_gguf, resolve_base


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--shapes", action="store_true", help="operators told apart by their inputs' shapes too")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = p.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "models"
        hf_dir = resolve_base(bundled_gguf(), cache)
        model, twin, fresh, held, prompts = decoders(None, cache, hf_dir)
        prompts = prompts[: args.rows]
        for m in (model, twin):
            m.to(getattr(torch, args.dtype))
        runs = {"dot": (twin, fresh), "fresh": (model, fresh), "imprint": (model, held)}
        table: dict[str, dict[str, tuple[float, float]]] = {}
        for name, (m, state) in runs.items():
            sia_decode(m, prompts, [state] * args.rows, 4)  # warm-up
            short: dict[str, tuple[int, float]] = {}
            long: dict[str, tuple[int, float]] = {}
            for n, into in ((4, short), (4 + args.tokens, long)):
                with profile(activities=[ProfilerActivity.CPU], record_shapes=args.shapes) as prof:
                    sia_decode(m, prompts, [state] * args.rows, n)
                for e in prof.key_averages(group_by_input_shape=args.shapes):
                    key = f"{e.key} {e.input_shapes}" if args.shapes else e.key
                    into[key] = (e.count, e.self_cpu_time_total)
            # the difference of a long and a short decode: per decode step, prefill excluded
            table[name] = {
                k: ((long[k][0] - short.get(k, (0, 0))[0]) / args.tokens, (long[k][1] - short.get(k, (0, 0))[1]) / args.tokens)
                for k in long
            }
    out: dict[str, dict[str, object]] = {}
    for name, ops in table.items():
        count = sum(c for c, _ in ops.values())
        us = sum(t for _, t in ops.values())
        out[name] = {"ops_per_step": count, "self_cpu_us_per_step": us}
        sys.stdout.write(f"{name}: {count:.0f} ops, {us / 1000:.1f} ms self CPU a step\n")
    for name in ("fresh", "imprint"):
        excess: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for k in set(table[name]) | set(table["dot"]):
            a, b = table[name].get(k, (0, 0)), table["dot"].get(k, (0, 0))
            excess[k] = [a[0] - b[0], a[1] - b[1]]
        top = sorted(excess.items(), key=lambda kv: -kv[1][1])[: args.top]
        out[name]["excess_over_dot"] = {k: {"ops": c, "us": t} for k, (c, t) in top}
        sys.stdout.write(f"\n{name} over dot, per step (ops, µs):\n")
        for k, (c, t) in top:
            sys.stdout.write(f"  {k:40s} {c:8.1f} {t:9.0f}\n")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
