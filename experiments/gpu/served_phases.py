"""A served turn's phases on a device: the share of a turn spent loading and storing the identity state.

Run: ``python -m experiments.gpu.served_phases --checkpoint DIR [--device cuda] [--turns 8] [--tokens 32] --out PATH
[--profile PATH]``. The service's model (``served_model``: the device, SIA_DTYPE auto) over a fresh SQLite store,
``benchmarks.served_turn``'s phased turns (load, shock, generation, update, persist) and streamed turns, medians and
p95s. ``--profile``: then one more whole turn under torch's profiler (the operators' table by host time, and on a GPU
the kernels' by device time), and on a GPU every place in the code where that turn made the host wait for the device
(``torch.cuda.set_sync_debug_mode``), counted, into that file."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import torch

from benchmarks.machine import machine_info
from benchmarks.served_turn import run_turns, sqlite_services
from server.core.config import Settings
from server.runtime.services import Services, served_model
from sia.backbones.llama import LlamaModel
from sia.model.generate import Sampling


def profiled_turn(services: Services, args: argparse.Namespace) -> str:
    """One streamed turn under the profiler, then the same turn again counting the host's waits on a GPU."""
    sampling = Sampling(max_tokens=args.tokens, seed=0, max_sentences=0)
    message = "Tell me something about the last day of the voyage."
    gpu = args.device.startswith("cuda")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    with torch.profiler.profile(activities=activities) as prof:
        services.turns.turn("sia", "real", message, sampling)
    averages = prof.key_averages()
    text: str = "## operators by host time\n\n" + averages.table(sort_by="self_cpu_time_total", row_limit=40) + "\n"
    if gpu:
        text += "## by device time\n\n" + averages.table(sort_by="self_cuda_time_total", row_limit=30) + "\n"
        waits: Counter[str] = Counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                services.turns.turn("sia", "real", message, sampling)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        for w in caught:
            waits[f"{w.filename}:{w.lineno}"] += 1
        text += f"## the host's waits on the device in one turn: {sum(waits.values())}\n\n"
        text += "\n".join(f"{n:6d}  {where}" for where, n in waits.most_common()) + "\n"
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--profile", type=Path, default=None)
    args = p.parse_args()
    info = machine_info(1)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), device=args.device, checkpoint=args.checkpoint)
        model = served_model(settings)
        assert isinstance(model, LlamaModel)
        with sqlite_services(model, Path(tmp)) as services:
            result = run_turns(services, args)
            if args.profile:
                args.profile.write_text(profiled_turn(services, args))
    payload = {"machine": info, "device": args.device, "checkpoint": str(args.checkpoint or "bundled"), **result}
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    summary = {k: payload[k] for k in ("phases", "store_share", "real_turn", "real_turn_ttft")}
    sys.stdout.write(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
