"""Benchmark Trace Tensor Attention against its reference and against plain SDPA (CPU, float32).

Run: ``python -m benchmarks.attention [--quick] [--lengths 256 1024] [--out PATH]``.

What is measured, for every (L, B·H, d, causal) with B = 1 and H = B·H, q, k, v of shape (1, H, L, d) and a
random non-symmetric trace (H, d, d):

* ``reference``: ``trace_tensor_attention_reference`` (materialises a (B, H, L, L, d) tensor). Skipped where
  that float32 intermediate would exceed ``--ref-limit-gib`` (default 4 GiB).
* ``fast``: ``trace_tensor_attention`` (exact reduction to ``scaled_dot_product_attention``).
* ``sdpa``: plain ``F.scaled_dot_product_attention(q, k, v, is_causal=causal)`` on the same tensors, the
  baseline the fast form can at best match.
* ``codesigned``: the model's layout: ``trace_tensor_attention`` with query/key width d - 1 and value width
  d, so the augmented vectors are exactly d wide and the kernel runs at the same width as ``sdpa``.
* ``aug``: only the preparation step the fast form performs before SDPA (S = T + T^T and, for non-causal,
  ``q @ S`` plus ``key_bias``; for causal, ``augment_queries`` / ``augment_keys`` / zero-padding v), i.e. the
  fixed O(L·d²) cost of the reduction. ``fast - sdpa`` is reported next to it.

Timing: one warm-up call per method (which is also its memory measurement, below), then the median wall
time (``time.perf_counter``) of N timed calls under ``torch.inference_mode``. N = 5 for L <= 4096 and 3 above
unless ``--repeats`` is given, raised for short calls (up to 51) so that a method's timed calls take at least
0.25 s in all: a few 4 ms scheduler ticks would otherwise decide the median of a sub-millisecond call. The
timed calls of ``sdpa``, ``fast`` and ``aug`` are interleaved round-robin so that drift of the machine
(frequency, neighbours) hits them alike; the reference runs last, after them, so its multi-GiB allocations
cannot disturb the others. ``torch.set_num_threads`` is left at its default. A small call of every method is
made once at start-up so one-time initialisation does not land in any row.

Peak memory: the extra resident memory (RSS) of the process during one call, in MiB, so it includes the
output tensor and every temporary but not the pre-allocated inputs. Before the call ``malloc_trim(0)`` hands
freed heap pages back to the kernel (otherwise glibc would reuse them without RSS growing), then the kernel's
high-water mark is reset by writing ``5`` to ``/proc/self/clear_refs``; the result is ``VmHWM`` after the call
minus ``VmRSS`` before it, both from ``/proc/self/status``. This is exact to a page and needs no sampling.
Where ``clear_refs`` cannot be written, a background thread samples ``/proc/self/statm`` every ~1 ms instead
(peak sample minus baseline; may miss spikes shorter than a millisecond). The JSON records which was used.

Kernels: for one shape per (causal, d), ``torch.profiler`` records the aten ops of one ``fast`` and one
``sdpa`` call; the names containing ``flash``, ``math`` or ``scaled_dot_product`` are reported.

Results go to ``--out`` (JSON: machine info, kernels, rows) and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.machine import machine_info
from sia.model.attention import (
    augment_keys,
    augment_queries,
    key_bias,
    trace_tensor_attention,
    trace_tensor_attention_reference,
)

Method = Callable[[Tensor, Tensor, Tensor, Tensor, bool], object]

DEFAULT_LENGTHS: tuple[int, ...] = (256, 1024, 4096, 16384)
QUICK_LENGTHS: tuple[int, ...] = (256, 1024)
DEFAULT_HEADS: tuple[int, ...] = (4, 16)
DEFAULT_DIMS: tuple[int, ...] = (32, 64)
DEFAULT_OUT = Path("benchmarks/results/attention.json")
MIB = 2**20
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MIN_TIMED_S = 0.25
MAX_REPEATS = 51
KERNEL_KEYWORDS: tuple[str, ...] = ("flash", "math", "scaled_dot_product")


# --------------------------------------------------------------------------------------------- methods


def run_reference(q: Tensor, k: Tensor, v: Tensor, trace: Tensor, causal: bool) -> Tensor:
    return trace_tensor_attention_reference(q, k, v, trace, causal=causal)


def run_fast(q: Tensor, k: Tensor, v: Tensor, trace: Tensor, causal: bool) -> Tensor:
    return trace_tensor_attention(q, k, v, trace, causal=causal)


def run_sdpa(q: Tensor, k: Tensor, v: Tensor, trace: Tensor, causal: bool) -> Tensor:
    del trace  # same signature as the others; plain SDPA ignores the metric
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def run_codesigned(q: Tensor, k: Tensor, v: Tensor, trace: Tensor, causal: bool) -> Tensor:
    """The model's layout: query/key width d - 1, value width d, so the augmented kernel runs at width d."""
    d = q.shape[-1] - 1
    return trace_tensor_attention(q[..., :d], k[..., :d], v, trace[:, :d, :d], causal=causal)


def run_augmentation(q: Tensor, k: Tensor, v: Tensor, trace: Tensor, causal: bool) -> tuple[Tensor, ...]:
    """The preparation trace_tensor_attention does before SDPA (same branch choice, d_v == d here)."""
    tr = trace.unsqueeze(0)
    sym = tr + tr.transpose(-1, -2)
    if not causal:
        return q @ sym, key_bias(k, tr).transpose(-1, -2)
    d = q.shape[-1]
    width = d + 1
    return augment_queries(q, sym, width), augment_keys(k, tr, width), F.pad(v, (0, width - d))


METHODS: dict[str, Method] = {"reference": run_reference, "fast": run_fast, "sdpa": run_sdpa, "codesigned": run_codesigned}


# ---------------------------------------------------------------------------------------------- memory


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


LIBC = _libc()


def malloc_trim() -> None:
    """Return freed heap pages to the kernel so that later allocations show up in RSS again."""
    if LIBC is not None and hasattr(LIBC, "malloc_trim"):
        LIBC.malloc_trim(0)


def status_kib(key: str) -> int:
    """A ``kB`` field of /proc/self/status, e.g. VmRSS or VmHWM."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE_SIZE


def reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS; False if not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


HWM_WORKS = reset_hwm()
MEMORY_METHOD = (
    "VmHWM after minus VmRSS before (clear_refs reset, malloc_trim)"
    if HWM_WORKS
    else "peak of /proc/self/statm sampled every ~1 ms minus baseline (malloc_trim)"
)


@dataclass
class RssSampler:
    """Samples RSS from a background thread; ``peak`` is the largest value seen."""

    interval_s: float = 0.001
    peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval_s)

    def __enter__(self) -> RssSampler:
        self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, rss_bytes())


@dataclass
class WarmCall:
    """One call outside the timed ones: its output, extra peak RSS (MiB) and duration (s)."""

    output: object
    peak_mib: float
    seconds: float


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def call_with_peak_memory(fn: Callable[[], object]) -> WarmCall:
    """Call ``fn`` once, measuring the extra peak RSS during the call (see the module docstring)."""
    malloc_trim()
    if HWM_WORKS:
        reset_hwm()
        before = status_kib("VmRSS") * 1024
        out, seconds = _timed(fn)
        return WarmCall(out, (status_kib("VmHWM") * 1024 - before) / MIB, seconds)
    before = rss_bytes()
    with RssSampler() as sampler:
        out, seconds = _timed(fn)
    return WarmCall(out, (sampler.peak - before) / MIB, seconds)


# ---------------------------------------------------------------------------------------------- timing


def time_calls(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def choose_repeats(length: int, call_s: float, override: int | None) -> int:
    """``override`` if given; else 5 (L <= 4096) or 3 timed calls, more for calls so short that a few
    scheduler ticks would dominate: enough for MIN_TIMED_S in all, at most MAX_REPEATS."""
    if override:
        return override
    base = 5 if length <= 4096 else 3
    return max(base, min(MAX_REPEATS, math.ceil(MIN_TIMED_S / max(call_s, 1e-6))))


# ------------------------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Shape:
    length: int
    heads: int  # B·H, with B = 1
    dim: int
    causal: bool

    def reference_bytes(self) -> int:
        """Size of the reference's (B, H, L, L, d) float32 difference tensor."""
        return self.heads * self.length * self.length * self.dim * 4


def make_inputs(shape: Shape, seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v (1, H, L, d) standard normal and a non-symmetric trace (H, d, d) of scale 1/d."""
    gen = torch.Generator().manual_seed(seed)
    size = (1, shape.heads, shape.length, shape.dim)
    q, k, v = (torch.randn(size, generator=gen) for _ in range(3))
    trace = torch.randn(shape.heads, shape.dim, shape.dim, generator=gen) / shape.dim
    return q, k, v, trace


@dataclass
class Row:
    length: int
    batch: int
    heads: int
    dim: int
    causal: bool
    repeats: dict[str, int]
    ms: dict[str, float | None]
    peak_mib: dict[str, float | None]
    aug_ms: float
    fast_over_sdpa: float
    fast_minus_sdpa_ms: float
    codesigned_over_sdpa: float
    max_abs_err_vs_reference: float | None


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms per name, calling the functions round-robin so that machine drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def max_abs_err(a: object, b: object) -> float | None:
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return float((a - b).abs().max())
    return None


def measure_shape(shape: Shape, repeats: int | None, ref_limit_bytes: int) -> Row:
    """sdpa, fast and aug first (warm-up/memory call each, then interleaved timing), the reference last."""
    inputs = (*make_inputs(shape), shape.causal)
    fns = {name: _bind(METHODS[name], *inputs) for name in ("sdpa", "fast", "codesigned")}
    fns["aug"] = _bind(run_augmentation, *inputs)
    warm = {name: call_with_peak_memory(fn) for name, fn in fns.items()}
    n = {"interleaved": choose_repeats(shape.length, warm["fast"].seconds, repeats)}
    timed = time_interleaved(fns, n["interleaved"])
    ms: dict[str, float | None] = {
        "reference": None,
        "fast": timed["fast"],
        "sdpa": timed["sdpa"],
        "codesigned": timed["codesigned"],
    }
    if shape.reference_bytes() <= ref_limit_bytes:
        reference = _bind(METHODS["reference"], *inputs)
        warm["reference"] = call_with_peak_memory(reference)
        n["reference"] = choose_repeats(shape.length, warm["reference"].seconds, repeats)
        ms["reference"] = time_calls(reference, n["reference"])
    ref_out = warm["reference"].output if "reference" in warm else None
    return Row(
        length=shape.length,
        batch=1,
        heads=shape.heads,
        dim=shape.dim,
        causal=shape.causal,
        repeats=n,
        ms=ms,
        peak_mib={name: warm[name].peak_mib if name in warm else None for name in METHODS},
        aug_ms=timed["aug"],
        fast_over_sdpa=timed["fast"] / timed["sdpa"],
        fast_minus_sdpa_ms=timed["fast"] - timed["sdpa"],
        codesigned_over_sdpa=timed["codesigned"] / timed["sdpa"],
        max_abs_err_vs_reference=max_abs_err(warm["fast"].output, ref_out),
    )


def _bind(
    method: Callable[[Tensor, Tensor, Tensor, Tensor, bool], object],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    trace: Tensor,
    causal: bool,
) -> Callable[[], object]:
    def call() -> object:
        return method(q, k, v, trace, causal)

    return call


def warm_up_all() -> None:
    """One small call of everything so that one-time initialisation is not charged to any row."""
    for causal in (False, True):
        q, k, v, trace = make_inputs(Shape(length=256, heads=4, dim=32, causal=causal))
        for method in (*METHODS.values(), run_augmentation):
            method(q, k, v, trace, causal)


# --------------------------------------------------------------------------------------------- kernels


def profiled_kernels(fn: Callable[[], object]) -> list[str]:
    """Names of the SDPA-related aten ops that one call of ``fn`` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = {evt.key for evt in prof.key_averages()}
    return sorted(n for n in names if any(word in n.lower() for word in KERNEL_KEYWORDS))


def observe_kernels(dims: Sequence[int], length: int, heads: int) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    for causal in (False, True):
        for dim in dims:
            shape = Shape(length=length, heads=heads, dim=dim, causal=causal)
            q, k, v, trace = make_inputs(shape)
            entry: dict[str, object] = {"length": length, "heads": heads, "dim": dim, "causal": causal}
            for name in ("fast", "sdpa"):
                entry[name] = profiled_kernels(_bind(METHODS[name], q, k, v, trace, causal))
            found.append(entry)
    return found


# ---------------------------------------------------------------------------------------------- output


def run_info() -> dict[str, object]:
    return machine_info(torch.get_num_threads()) | {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "dtype": "float32",
        "batch": 1,
        "memory_method": MEMORY_METHOD,
    }


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "skipped" if value is None else format(value, spec)


TABLE_HEADER = (
    "| L | B·H | d | causal | reference ms | fast ms | sdpa ms | fast/sdpa | aug ms | fast−sdpa ms "
    "| co-designed ms | co-designed/sdpa | reference MiB | fast MiB | sdpa MiB | max err |\n"
    "|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
)


def format_row(row: Row) -> str:
    cells = [
        str(row.length),
        str(row.batch * row.heads),
        str(row.dim),
        "yes" if row.causal else "no",
        _fmt(row.ms["reference"], ".2f"),
        _fmt(row.ms["fast"], ".2f"),
        _fmt(row.ms["sdpa"], ".2f"),
        f"{row.fast_over_sdpa:.2f}",
        f"{row.aug_ms:.3f}",
        f"{row.fast_minus_sdpa_ms:+.2f}",
        _fmt(row.ms["codesigned"], ".2f"),
        f"{row.codesigned_over_sdpa:.2f}",
        _fmt(row.peak_mib["reference"]),
        _fmt(row.peak_mib["fast"]),
        _fmt(row.peak_mib["sdpa"]),
        "—" if row.max_abs_err_vs_reference is None else f"{row.max_abs_err_vs_reference:.1e}",
    ]
    return "| " + " | ".join(cells) + " |\n"


def format_kernels(kernels: Sequence[dict[str, object]]) -> str:
    lines = ["| d | causal | fast kernels | sdpa kernels |\n", "|---:|:---:|---|---|\n"]
    for entry in kernels:
        fast = ", ".join(str(n) for n in entry["fast"]) if isinstance(entry["fast"], list) else ""
        sdpa = ", ".join(str(n) for n in entry["sdpa"]) if isinstance(entry["sdpa"], list) else ""
        causal = "yes" if entry["causal"] else "no"
        lines.append(f"| {entry['dim']} | {causal} | {fast} | {sdpa} |\n")
    return "".join(lines)


def write_json(path: Path, info: dict[str, object], kernels: object, rows: Sequence[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": info, "kernels": kernels, "rows": [asdict(r) for r in rows]}
    path.write_text(json.dumps(payload, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="only L in {256, 1024} (smoke run)")
    parser.add_argument("--lengths", type=int, nargs="+", help=f"sequence lengths (default {DEFAULT_LENGTHS})")
    parser.add_argument("--heads", type=int, nargs="+", default=list(DEFAULT_HEADS), help="B·H values (B = 1)")
    parser.add_argument("--dims", type=int, nargs="+", default=list(DEFAULT_DIMS), help="head widths d")
    parser.add_argument("--repeats", type=int, help="timed calls per method (default adaptive)")
    parser.add_argument("--ref-limit-gib", type=float, default=4.0, help="skip reference above this (GiB)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def chosen_lengths(args: argparse.Namespace) -> list[int]:
    if args.lengths:
        return list(args.lengths)
    return list(QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)


def run_grid(args: argparse.Namespace, info: dict[str, object], kernels: object) -> list[Row]:
    """Measure every shape, printing each row and rewriting the JSON as soon as it is done."""
    ref_limit = int(args.ref_limit_gib * 2**30)
    rows: list[Row] = []
    for length in chosen_lengths(args):
        for heads in args.heads:
            for dim in args.dims:
                for causal in (False, True):
                    shape = Shape(length=length, heads=heads, dim=dim, causal=causal)
                    rows.append(measure_shape(shape, args.repeats, ref_limit))
                    sys.stdout.write(format_row(rows[-1]))
                    sys.stdout.flush()
                    write_json(args.out, info, kernels, rows)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    info = run_info()
    sys.stdout.write(f"machine: {json.dumps(info)}\n\n")
    with torch.inference_mode():
        warm_up_all()
        heads = min(args.heads)
        kernels = observe_kernels(args.dims, length=1024, heads=heads)
        sys.stdout.write(f"SDPA kernels observed (L=1024, B·H={heads}):\n\n{format_kernels(kernels)}\n")
        sys.stdout.write(TABLE_HEADER)
        sys.stdout.flush()
        run_grid(args, info, kernels)
    sys.stdout.write(f"\nwrote {args.out}\n")


if __name__ == "__main__":
    main()
