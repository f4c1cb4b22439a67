"""A served turn's phases on a device: the share of a turn spent loading and storing the identity state.

Run: ``python -m experiments.gpu.served_phases --checkpoint DIR [--device cuda] [--turns 8] [--tokens 32] --out PATH``.
The service's model (``served_model``: the device, SIA_DTYPE auto) over a fresh SQLite store, ``benchmarks.served_turn``'s
phased turns (load, shock, generation, update, persist) and streamed turns, medians and p95s."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.machine import machine_info
from benchmarks.served_turn import run_turns, sqlite_services
from server.core.config import Settings
from server.runtime.services import served_model
from sia.backbones.llama import LlamaModel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    info = machine_info(1)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), device=args.device, checkpoint=args.checkpoint)
        model = served_model(settings)
        assert isinstance(model, LlamaModel)
        with sqlite_services(model, Path(tmp)) as services:
            result = run_turns(services, args)
    payload = {"machine": info, "device": args.device, "checkpoint": str(args.checkpoint or "bundled"), **result}
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    summary = {k: payload[k] for k in ("phases", "store_share", "real_turn", "real_turn_ttft")}
    sys.stdout.write(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
