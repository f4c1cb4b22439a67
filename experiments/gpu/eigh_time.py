"""The metric's eigendecomposition on a device: torch.linalg.eigh of an identity's traces where they live, against
``stabilised_metric`` (which decomposes on the CPU). Run: ``python -m experiments.gpu.eigh_time [cuda]``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

from sia.checkpoint import DEFAULT_CHECKPOINT
from sia.identity.state import stabilised_metric
from sia.model.config import LlamaConfig


def ms(f: Callable[[], object], device: str, n: int = 5) -> float:
    f()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1000


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    config = LlamaConfig.from_file(DEFAULT_CHECKPOINT / "config.json")
    layers = len(config.trace_layers or range(config.n_layer))
    for batch in (1, 8):
        trace = torch.randn(batch, layers, config.n_kv_head, config.head_dim, config.head_dim, device=device)
        sym = 0.5 * (trace + trace.transpose(-1, -2))
        here = ms(lambda: torch.linalg.eigh(sym.double()), device)  # noqa: B023
        cpu = ms(lambda: stabilised_metric(trace, config), device)  # noqa: B023
        sys.stdout.write(f"{batch} identities on {device}: eigh there {here:.1f} ms, stabilised_metric {cpu:.1f} ms\n")


if __name__ == "__main__":
    main()
