"""Where and under what load a benchmark ran: stored as ``machine`` in every result file, and named beside every
figure of docs/performance.md (``benchmarks.report``)."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what ``platform`` knows of it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int) -> dict[str, Any]:
    """Call it at the start of a run and add ``loadavg_end`` (``os.getloadavg()``) at the end."""
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # AVX2: bfloat16 products converted, not native
        "loadavg_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": threads,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
    }
