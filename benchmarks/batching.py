"""Benchmark continuous batching in the library: N identities decoding together vs one after another.

Run: ``python -m benchmarks.batching [--users 1 2 4 8 16] [--tokens 32] [--threads 1] [--checkpoint DIR] [--out PATH]
[--device cuda] [--dtype bfloat16] [--weights plain packed packed-bf16]``.

Setup: the bundled model (or ``--checkpoint``), N distinct identity states (random traces and self states), each
with its own message under the persona ``sia``'s system prompt, greedy decoding of at most ``--tokens`` tokens.

* **sequential**: ``sia.model.generate.generate`` for one identity after another (what the service does today
  with one inference slot);
* **batched**: every identity joins one ``sia.model.batching.DecodeBatch`` (its own prefill), then ``step()``
  until all have stopped: one forward per step for all rows;
* **prefilled together**: the same, the N prompts prefilled in one left-padded forward (``join_many``), as the
  service's batcher does for turns that arrive together.

``--weights``: each of the three with the matrices as loaded (``plain``), packed for oneDNN's float32 CPU
products (``packed``, ``LlamaModel.pack_weights``, what the service does by default) and/or packed in bfloat16
(``packed-bf16``, ``pack_weights(torch.bfloat16)``, ``SIA_PACKED_WEIGHTS=bfloat16``), one after the other in the
same run. All produce the same tokens (checked here, row by row). Reported per N: aggregate generated tokens per second,
the ratio batched / sequential, and the p50 / p95 time to each row's first token when all N arrive at once.
Results go to ``--out`` (JSON, with machine info) and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import machine_info
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.state import IdentityState
from sia.model.batching import DecodeBatch
from sia.model.generate import SamplingParams, generate, stream
from sia.model.identity_model import IdentityModel
from sia.personas import PERSONAS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PACKINGS = {"packed": torch.float32, "packed-bf16": torch.bfloat16}  # --weights: LlamaModel.pack_weights(dtype)

MESSAGES = [
    "What is the capital of France?",
    "Give me a tip for sleeping better.",
    "How do plants make food?",
    "Name three colours of the rainbow.",
    "What is a good name for a cat?",
    "Why is the sky blue?",
    "How many legs does a spider have?",
    "Tell me something about the moon.",
]


def identities(model: IdentityModel, n: int) -> list[IdentityState]:
    out = []
    for i in range(n):
        fresh = IdentityState.fresh(model.config)
        g = torch.Generator().manual_seed(i)
        trace = (torch.randn(model.config.trace_shape, generator=g) * 0.05).to(fresh.trace.dtype)
        out.append(IdentityState(trace=trace, self_state=torch.rand(model.config.d_self, generator=g) - 0.5, turns=5))
    return out


def prompts(model: IdentityModel, n: int) -> list[list[int]]:
    tok = model.tokenizer
    system = tok.system_prompt(PERSONAS["sia"].system_prompt)
    return [tok.turn_prompt(MESSAGES[i % len(MESSAGES)] + f" ({i})", system)[0] for i in range(n)]


def sequential(
    model: IdentityModel, rows: list[list[int]], states: list[IdentityState], params: SamplingParams
) -> dict[str, Any]:
    started, first, tokens = time.perf_counter(), [], []
    for prompt, state in zip(rows, states, strict=True):
        run = stream(model, [prompt], model.condition_states([state]), params)
        for i, _ in enumerate(run):
            if i == 0:
                first.append(time.perf_counter() - started)
        tokens.append(run.result[0].tokens)
    return {"seconds": time.perf_counter() - started, "first": first, "tokens": tokens}


def batched(
    model: IdentityModel, rows: list[list[int]], states: list[IdentityState], params: SamplingParams, together: bool = False
) -> dict[str, Any]:
    started = time.perf_counter()
    batch = DecodeBatch(model)
    if together:
        handles = batch.join_many(rows, model.condition_states(states), [params] * len(rows))
    else:
        handles = [batch.join(p, model.condition_states([s]), params) for p, s in zip(rows, states, strict=True)]
    first: dict[int, float] = {}
    while len(batch):
        for event in batch.sample():  # streamed before the forward that feeds the tokens back, as the service does
            first.setdefault(event.row, time.perf_counter() - started)
        batch.advance()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "first": [first[h] for h in handles], "tokens": [batch.take(h).tokens for h in handles]}


def modes(times: dict[str, float]) -> str:
    return " / ".join(f"{times[k]:.2f}" for k in ("sequential", "batched", "together"))


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/batching.json"))
    parser.add_argument("--device", default="cpu", help="the torch device to decode on (e.g. cuda)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--weights", nargs="+", choices=("plain", *PACKINGS), default=["plain"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    device = torch.device(args.device)
    info["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    info["dtype"] = args.dtype
    model = load_model(args.checkpoint).eval().to(device=device, dtype=DTYPES[args.dtype])
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0.0)
    warm = prompts(model, 2)
    generate(model, warm, model.condition_states(identities(model, 2)), params)  # warm-up
    results = []
    for weights, n in [(w, n) for w in args.weights for n in args.users]:
        if weights in PACKINGS:
            if not isinstance(model, LlamaModel):
                raise SystemExit(f"--weights {weights}: only a pretrained backbone's matrices are packed")
            model.unpack_weights()
            model.pack_weights(PACKINGS[weights])
        elif isinstance(model, LlamaModel):
            model.unpack_weights()
        rows, states = prompts(model, n), identities(model, n)
        seq = sequential(model, rows, states, params)
        bat = batched(model, rows, states, params)
        tog = batched(model, rows, states, params, together=True)
        same = seq["tokens"] == bat["tokens"] == tog["tokens"]
        total = sum(len(t) for t in seq["tokens"])
        entry = {
            "weights": weights,
            "users": n,
            "tokens": total,
            "same_tokens": same,
            "sequential_tok_s": total / seq["seconds"],
            "batched_tok_s": total / bat["seconds"],
            "together_tok_s": total / tog["seconds"],
            "speedup": seq["seconds"] / bat["seconds"],
            "speedup_together": seq["seconds"] / tog["seconds"],
            "ttft_p50_s": {
                "sequential": pct(seq["first"], 50),
                "batched": pct(bat["first"], 50),
                "together": pct(tog["first"], 50),
            },
            "ttft_p95_s": {
                "sequential": pct(seq["first"], 95),
                "batched": pct(bat["first"], 95),
                "together": pct(tog["first"], 95),
            },
        }
        results.append(entry)
        sys.stderr.write(json.dumps(entry) + "\n")
    info["loadavg_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": info, "max_new_tokens": args.tokens, "results": results}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "| weights | users | tokens | sequential tok/s | batched tok/s | together tok/s | speed-up (together) "
        "| TTFT p50 seq / batched / together (s) | TTFT p95 seq / batched / together (s) | same tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['weights']} | {r['users']} | {r['tokens']} | {r['sequential_tok_s']:.1f} | {r['batched_tok_s']:.1f} "
            f"| {r['together_tok_s']:.1f} | {r['speedup']:.2f}x ({r['speedup_together']:.2f}x) "
            f"| {modes(r['ttft_p50_s'])} | {modes(r['ttft_p95_s'])} | {r['same_tokens']} |"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
