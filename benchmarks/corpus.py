"""Benchmark the corpus generators: episodes per second of the native corpus and of the fact-dialogue corpus.

Run: ``python -m benchmarks.corpus [--episodes 20000] [--repeats 5] [--out PATH]``.

* ``native``: ``sia.learn.native.corpus.make_corpus(seed, n, 0)`` (the native model's training episodes).
* ``facts``: ``sia.learn.adapter.facts.episodes("train", n, seed, between=4)`` (the adapter's training episodes:
  three facts in one message, four unrelated turns, the questions).

Reported: the median over ``repeats`` runs of the wall time and episodes per second, single process. Both
generators are pure Python; they run once per training step or once per corpus, so the figure to watch is
that a training step never waits for its data. Results go to ``--out`` (JSON) and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import machine_info
from sia.learn.adapter import facts
from sia.learn.native.corpus import make_corpus

DEFAULT_OUT = Path(__file__).parent / "results" / "corpus.json"


def timed(run: Callable[[], int], repeats: int) -> dict[str, float]:
    seconds, count = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        count = run()
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {"episodes": count, "seconds_p50": median, "episodes_per_s": count / median}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.repeats < 1:
        parser.error("--episodes and --repeats must be at least 1")
    n = args.episodes
    rows = {
        "native": timed(lambda: len(make_corpus(11, n, 0).train), args.repeats),
        "facts": timed(lambda: len(facts.episodes("train", n, 11, between=4)), args.repeats),
    }
    result: dict[str, Any] = {
        "benchmark": "corpus",
        "machine": machine_info(torch.get_num_threads()),
        "repeats": args.repeats,
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| corpus | episodes | seconds (p50) | episodes/s |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {r['episodes']} | {r['seconds_p50']:.3f} | {r['episodes_per_s']:,.0f} |" for k, r in rows.items()]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
