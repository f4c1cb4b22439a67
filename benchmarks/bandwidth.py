"""One-row decoding against this machine's memory bandwidth: how close a decoding step comes to the time it takes
just to read the weights it multiplies.

Run: ``python -m benchmarks.bandwidth [--quick] [--threads 2] [--tokens 32] [--repeats 5] [--out PATH]``.

* **Copy bandwidth**: ``dst.copy_(src)`` of two ``--copy-mib`` MiB float32 tensors (far larger than any cache), with
  ``--threads`` threads, the best of ``--repeats``: bytes read plus bytes written per second (STREAM's "copy"
  convention), and the read half of it, the rate at which a step could at best stream its weights.
* **Weight bytes per step**: every matrix one decoding step multiplies, counted during a one-token step by forward
  hooks on the model's linear maps (each attention's query, key, value and output maps, each MLP's three, the head)
  and, outside them, every ``F.linear`` (the identity's own maps where they run, as inference multiplies them), in
  the dtype it is stored in. The embedding lookup reads one row and the norms are vectors: neither is counted.
* **Decoding**: ``benchmarks.imprint_read``'s decoders at one row, float32, greedy, ``--tokens`` tokens (the end
  tokens banned): the stateless model (``dot``) and the shipped checkpoint with a full imprint (``imprint``);
  ``--repeats`` rounds, round-robin after one warm-up each; median ms per step.

Reported per decoder: weight bytes, ms per step, the weights' effective read rate (bytes / step time) and its share of
the read bandwidth (bytes / step time / (copy bandwidth / 2)). Target (the speed issue): >= 40 % at one row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from benchmarks.backbone import sia_decode
from benchmarks.imprint_read import decoders
from benchmarks.machine import machine_info
from sia.backbones.llama import LlamaModel
from sia.backbones.weights import bundled_gguf, resolve_base
from sia.identity.state import IdentityState
from sia.model.generate import SamplingParams, stream

DEFAULT_OUT = Path(__file__).parent / "results" / "bandwidth.json"
TARGET = 0.4


def copy_bandwidth(mib: int, repeats: int) -> dict[str, float]:
    """Bytes read + written per second by ``dst.copy_(src)`` of ``mib`` MiB float32 tensors, the best of ``repeats``."""
    n = mib * 2**20 // 4
    src, dst = torch.rand(n), torch.empty(n)
    dst.copy_(src)  # touch both once
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    moved = 2 * n * 4
    return {"bytes": float(n * 4), "seconds": best, "copy_gb_per_s": moved / best / 1e9, "read_gb_per_s": moved / best / 2e9}


class _Products(TorchFunctionMode):
    """Counts the weight of every ``F.linear`` the code calls outside the model's ``Linear`` modules (which the hooks
    count): the identity's maps that inference multiplies as tensors (the stateful attention's inference maps)."""

    def __init__(self, counted: list[int], live: list[bool], inside: list[int]) -> None:
        super().__init__()
        self.counted, self.live, self.inside = counted, live, inside

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is F.linear and self.live[0] and not self.inside[0]:
            weight = args[1] if len(args) > 1 else kwargs["weight"]
            self.counted.append(weight.numel() * weight.element_size())
        return func(*args, **(kwargs or {}))


def step_weight_bytes(model: LlamaModel, prompt: list[int], state: IdentityState) -> dict[str, float]:
    """The bytes of the weights of every linear map one decoding step runs (during the second token): forward hooks
    on the model's linear modules and its stacked products (``LlamaModel.stacks``), and every ``F.linear`` called
    outside them."""
    counted: list[int] = []
    live = [False]
    inside = [0]  # within a linear module: its own F.linear is the hook's to count

    def enter(module: nn.Module, _inputs: Any) -> None:
        inside[0] += 1

    def leave(module: nn.Module, _inputs: Any, _output: Any) -> None:
        inside[0] -= 1
        if live[0]:
            assert isinstance(module, nn.Linear)
            counted.append(module.weight.numel() * module.weight.element_size())

    passes: list[int] = []  # the first layer's calls while counting: the forward passes the count covers
    stacked = [stack.linear() for stack in model.stacks]  # the query, key and value maps (and gate and up) as one
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)] + stacked
    handles = [m.register_forward_pre_hook(enter) for m in linears] + [m.register_forward_hook(leave) for m in linears]
    handles.append(model.blocks[0].register_forward_hook(lambda *_: passes.append(1) if live[0] else None))
    try:
        with _Products(counted, live, inside):
            run = stream(model, [prompt], model.condition_states([state]), SamplingParams(max_new_tokens=2, temperature=0.0))
            next(run)  # the prefill and the first token
            live[0] = True
            for _ in run:  # the one decoding step
                pass
    finally:
        for h in handles:
            h.remove()
    if not passes:
        raise AssertionError("no decoding step ran")
    return {"weight_bytes": sum(counted) / len(passes), "linear_maps": len(counted) / len(passes)}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 tokens, 2 rounds, a 256 MiB copy: a sanity run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--copy-mib", type=int, default=1024)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats, args.copy_mib = 8, 2, 256
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    result: dict[str, Any] = {"machine": info, "copy": copy_bandwidth(args.copy_mib, args.repeats)}
    read_rate = result["copy"]["read_gb_per_s"] * 1e9
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        cache = Path(tmp) / "models"
        model, twin, fresh, held, prompts = decoders(None, cache, resolve_base(bundled_gguf(), cache))
        runs = {"dot": (twin, fresh), "imprint": (model, held)}
        for m, state in runs.values():
            sia_decode(m, prompts[:1], [state], args.tokens)  # warm-up
        steps: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, (m, state) in runs.items():
                d = sia_decode(m, prompts[:1], [state], args.tokens)
                steps[name].append(d.decode_s / d.steps)
        result["decode"] = {}
        for name, (m, state) in runs.items():
            weights = step_weight_bytes(m, prompts[0], state)
            step_s = statistics.median(steps[name])
            rate = weights["weight_bytes"] / step_s
            result["decode"][name] = {
                **weights,
                "ms_per_step": 1000 * step_s,
                "ms_per_step_samples": [1000 * s for s in steps[name]],
                "weights_gb_per_s": rate / 1e9,
                "share_of_read_bandwidth": rate / read_rate,
                "read_limit_ms_per_step": 1000 * weights["weight_bytes"] / read_rate,
            }
    info["loadavg_end"] = list(os.getloadavg())
    result["setup"] = {"tokens": args.tokens, "repeats": args.repeats, "copy_mib": args.copy_mib, "dtype": "float32", "rows": 1}
    result["target"] = {"share_of_read_bandwidth": TARGET}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    sys.stdout.write(table(result))


def table(result: dict[str, Any]) -> str:
    c = result["copy"]
    lines = [
        f"copy bandwidth: {c['copy_gb_per_s']:.1f} GB/s read + written ({c['read_gb_per_s']:.1f} GB/s read)",
        "",
        "| decoder | weight MB a step | ms/step | at the read bandwidth, ms/step | weights read at | share of read bandwidth |",
        "|---|---|---|---|---|---|",
    ]
    for name, d in result["decode"].items():
        lines.append(
            f"| {name} | {d['weight_bytes'] / 1e6:.0f} | {d['ms_per_step']:.1f} | {d['read_limit_ms_per_step']:.1f} |"
            f" {d['weights_gb_per_s']:.1f} GB/s | {d['share_of_read_bandwidth']:.0%} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
