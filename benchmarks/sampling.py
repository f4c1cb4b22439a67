"""Benchmark sampled decoding: the nucleus (top-p) filter among the most likely tokens vs a full sort; the draw.

Run: ``python -m benchmarks.sampling [--users 1 8] [--tokens 32] [--threads 1] [--checkpoint DIR] [--out PATH]``.

The personas' chat sampling (temperature 0.4, top_p 0.9) filters every row's 49 152 logits at every decode step.
Measured in one run, with the same rows, states and seeds:

* **filter alone**: the time of ``sample_next`` on the logits a real decode step left, with ``nucleus`` (the most
  likely tokens first) and with ``nucleus_reference`` (the whole vocabulary sorted, what decoding did before);
* **the draw**: the token drawn among the kept tokens (``draw``) or by one multinomial over the whole vocabulary
  (``draw_over_vocabulary``, what decoding did before): the same distribution, other tokens for a given seed;
* **decoding**: ``--users`` identities decoding together in one ``DecodeBatch`` (as the service's batcher runs
  them), each with its own seed, as decoding is now (nucleus, kept-token draw), with the whole-vocabulary draw, and
  with the full sort and the whole-vocabulary draw (as before both changes): aggregate tokens per second, and
  whether every row's tokens are the same under both filters (they must be: the two keep the same tokens).

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
from benchmarks.machine import machine_info
from sia.checkpoint import load_model
from sia.model import generate as generation
from sia.model.generate import SamplingParams, draw, draw_over_vocabulary, nucleus, nucleus_reference, sample_next
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
    variants = {  # name: (filter, draw)
        "now": (nucleus, draw),
        "vocabulary draw": (nucleus, draw_over_vocabulary),
        "full sort, vocabulary draw": (nucleus_reference, draw_over_vocabulary),
    }
    # the filter alone, on the logits of a real reply's next token
    rows, states = prompts(model, 1), identities(model, 1)
    with torch.inference_mode():
        out = model(torch.tensor(rows), model.condition_states(states))
    logits = out.logits[0, -1]
    alone = {}
    for name, (fn, pick) in variants.items():
        generation.nucleus, generation.draw = fn, pick  # sample_next looks both up at each call
        alone[name] = filter_ms(logits, chat)
    results: list[dict[str, Any]] = []
    for n in args.users:
        rows, states = prompts(model, n), identities(model, n)
        runs = {}
        for name, (fn, pick) in variants.items():
            generation.nucleus, generation.draw = fn, pick
            runs[name] = batched(model, rows, states, chat)
        generation.nucleus, generation.draw = nucleus, draw
        same = runs["vocabulary draw"]["tokens"] == runs["full sort, vocabulary draw"]["tokens"]
        total = sum(len(t) for t in runs["now"]["tokens"])
        entry = {
            "users": n,
            "tokens": total,
            "same_tokens": same,
            "tok_s": {name: sum(len(t) for t in r["tokens"]) / r["seconds"] for name, r in runs.items()},
        }
        entry["speedup"] = entry["tok_s"]["now"] / entry["tok_s"]["full sort, vocabulary draw"]
        results.append(entry)
        sys.stderr.write(json.dumps(entry) + "\n")
    generation.nucleus, generation.draw = nucleus, draw
    report: dict[str, Any] = {
        "machine": info,
        "sampling": {"temperature": chat.temperature, "top_p": chat.top_p},
        "sample_next_ms": alone,
        "decoding": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    names = list(variants)
    sys.stdout.write(
        f"sample_next alone (one row, {logits.shape[-1]} logits): "
        + ", ".join(f"{k} {v:.2f} ms" for k, v in alone.items())
        + "\n\n| users | tokens | "
        + " | ".join(f"tok/s, {k}" for k in names)
        + " | now / before | same tokens under both filters |\n|---|---|---|---|---|---|---|\n"
    )
    for e in results:
        rates = " | ".join(f"{e['tok_s'][k]:.1f}" for k in names)
        sys.stdout.write(f"| {e['users']} | {e['tokens']} | {rates} | {e['speedup']:.2f}x | {e['same_tokens']} |\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
