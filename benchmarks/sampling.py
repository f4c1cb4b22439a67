"""Benchmark sampled decoding: the nucleus (top-p) filter found among the most likely tokens vs a full sort.

Run: ``python -m benchmarks.sampling [--users 1 8] [--tokens 32] [--threads 1] [--checkpoint DIR] [--out PATH]``.

The personas' chat sampling (temperature 0.4, top_p 0.9) filters every row's 49 152 logits at every decode step.
Measured in one run, with the same rows, states and seeds:

* **filter alone**: the time of ``sample_next`` on the logits a real decode step left, with ``nucleus`` (the most
  likely tokens first) and with ``nucleus_reference`` (the whole vocabulary sorted, what decoding did before);
* **decoding**: ``--users`` identities decoding together in one ``DecodeBatch`` (as the service's batcher runs
  them), each with its own seed, with either filter: aggregate tokens per second, and whether every row's tokens
  are the same under both (they must be: the two filters keep the same tokens).

Results go to ``--out`` (JSON, with machine info) and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.batching import batched, identities, prompts
from benchmarks.generation import machine_info
from sia.checkpoint import load_model
from sia.model import generate as generation
from sia.model.generate import SamplingParams, nucleus, nucleus_reference, sample_next
from sia.personas import CHAT_SAMPLING


def filter_ms(logits: torch.Tensor, params: SamplingParams, repeat: int = 50) -> float:
    """Milliseconds of one ``sample_next`` call on these logits (the generator reseeded, so every call is alike)."""
    g = torch.Generator()
    for _ in range(3):
        sample_next(logits, params, g.manual_seed(0))
    started = time.perf_counter()
    for _ in range(repeat):
        sample_next(logits, params, g.manual_seed(0))
    return (time.perf_counter() - started) / repeat * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sampling.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    model = load_model(args.checkpoint).eval()
    chat = SamplingParams(
        max_new_tokens=args.tokens,
        temperature=float(str(CHAT_SAMPLING["temperature"])),
        top_p=float(str(CHAT_SAMPLING["top_p"])),
        seed=0,  # every row's generator seeded alike, so both filters' runs can be compared token for token
    )
    filters = {"nucleus": nucleus, "full sort": nucleus_reference}
    # the filter alone, on the logits of a real reply's next token
    rows, states = prompts(model, 1), identities(model, 1)
    with torch.inference_mode():
        out = model(torch.tensor(rows), model.condition_states(states))
    logits = out.logits[0, -1]
    alone = {}
    for name, fn in filters.items():
        generation.nucleus = fn  # sample_next looks the filter up at each call
        alone[name] = filter_ms(logits, chat)
    results: list[dict[str, Any]] = []
    for n in args.users:
        rows, states = prompts(model, n), identities(model, n)
        runs = {}
        for name, fn in filters.items():
            generation.nucleus = fn
            runs[name] = batched(model, rows, states, chat)
        generation.nucleus = nucleus
        same = runs["nucleus"]["tokens"] == runs["full sort"]["tokens"]
        total = sum(len(t) for t in runs["nucleus"]["tokens"])
        entry = {
            "users": n,
            "tokens": total,
            "same_tokens": same,
            "tok_s": {name: sum(len(t) for t in r["tokens"]) / r["seconds"] for name, r in runs.items()},
        }
        entry["speedup"] = entry["tok_s"]["nucleus"] / entry["tok_s"]["full sort"]
        results.append(entry)
        sys.stderr.write(json.dumps(entry) + "\n")
    generation.nucleus = nucleus
    report: dict[str, Any] = {
        "machine": info,
        "sampling": {"temperature": chat.temperature, "top_p": chat.top_p},
        "filter_ms": alone,
        "decoding": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(
        f"filter alone (one row, {logits.shape[-1]} logits): nucleus {alone['nucleus']:.2f} ms, "
        f"full sort {alone['full sort']:.2f} ms\n\n"
        "| users | tokens | tok/s, nucleus | tok/s, full sort | speed-up | same tokens |\n|---|---|---|---|---|---|\n"
    )
    for e in results:
        sys.stdout.write(
            f"| {e['users']} | {e['tokens']} | {e['tok_s']['nucleus']:.1f} | {e['tok_s']['full sort']:.1f} | "
            f"{e['speedup']:.2f}x | {e['same_tokens']} |\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
