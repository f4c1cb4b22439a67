"""The imprint's read cost per decoded token: the bundled SmolLM2 model decoding with a full imprint against the same
weights without state.

Run: ``python -m benchmarks.imprint_read [--quick] [--threads 2] [--tokens 32] [--repeats 7] [--rows 1 8]
[--device cuda] [--checkpoint DIR] [--out PATH]``.

Decoders, one set of weights (the bundled GGUF dequantised into a temporary cache), greedy, ``--tokens`` new tokens
per row (the end tokens banned, ``benchmarks.fixed_length.endless``), the chat prompts of ``benchmarks.backbone``
(batch 1, and 8 different prompts left-padded into one batch; ``--rows`` other widths, the prompts repeated), on the
CPU in float32 unless ``--device`` and ``--dtype`` say otherwise (the full imprint is written on the CPU first):

* ``dot``: the same code with ``attention="dot"``: no state, no slots, no imprint (the stateless model);
* ``fresh``: the shipped checkpoint with a fresh identity (the base model's logits; the slots and the N entries are
  still in every layer's keys, all closed);
* ``imprint``: the shipped checkpoint with a full imprint (every entry filled: natural-set users' messages imprinted
  one after another, as turns imprint them), so the entries are read and the read adapter (and the imprint's read
  gate, where the checkpoint has one) acts on every token; the copy read (``imprint_copy``, where the checkpoint has
  it) on every token too, as in a turn that asks for one of the user's facts (the decoders read no message, so no ask
  head turns it off);
* ``imprint_no_copy`` (a checkpoint with the copy read): the same without it, as in every turn that asks for no fact.

Timing as ``benchmarks.backbone``'s decode: one untimed warm-up call each, then ``--repeats`` rounds in which the
decoders run round-robin; decode rate = tokens after the first ones / time from the first token event to the last;
medians. Reported: tokens/s, ms per step, and each decoder over ``dot``, as the ratio of the medians and as the
median of each round's ratio (``over_dot_paired``: steadier where other work on the machine comes and goes). Target
(the open-memory issue): ``imprint`` >= 0.9x ``dot`` at 1 and 8 rows.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.backbone import MESSAGES, SYSTEM, Decode, checkpoint_base, dot_twin, median_ms, sia_decode, timed_rounds
from benchmarks.fixed_length import endless
from benchmarks.machine import machine_info
from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.imprint import Imprint
from sia.identity.state import IdentityState
from sia.learn.imprint_read import imprint_turns
from sia.learn.natural import load_users

DEFAULT_OUT = Path(__file__).parent / "results" / "imprint_read.json"
TARGET = 0.9


def full_imprint(model: LlamaModel, system: list[int]) -> Imprint:
    """An imprint with every entry filled: the tuning part's users' messages, one after another, until it is full; with
    their token ids, as the service keeps them by default (``SIA_STORE_TURN_TEXT``), so the copy read has tokens to copy
    (an imprint without them is read as the privacy mode reads it, without the copy)."""
    messages = [m for u in load_users("tune") for m in u.messages]
    last = Imprint.empty(model.config)
    for imprint, _ in imprint_turns(model, system, messages, keep_text=True):
        last = imprint
        if imprint.used == imprint.capacity:
            return imprint
    raise AssertionError(f"the messages filled {last.used} of {last.capacity} entries")


def decoders(
    checkpoint: Path | None, cache: Path, hf_dir: Path
) -> tuple[LlamaModel, LlamaModel, IdentityState, IdentityState, list[list[int]]]:
    """What the three decoders run: the checkpoint's model (its tokenizer made endless), its stateless twin, a fresh
    identity, one holding a full imprint, and the chat prompts of MESSAGES."""
    model = load_model(checkpoint, cache_dir=cache)
    if not isinstance(model, LlamaModel) or not model.config.imprint_tokens:
        raise SystemExit("the checkpoint keeps no imprint")
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    system = tok.system_prompt(SYSTEM)
    imprint = full_imprint(model, system)
    model.tokenizer = endless(tok)
    fresh = IdentityState.fresh(model.config)
    prompts = [tok.turn_prompt(m, system)[0] for m in MESSAGES]
    return model, dot_twin(model, hf_dir), fresh, replace(fresh, imprint=imprint), prompts


def without_copy(model: LlamaModel) -> LlamaModel:
    """The same weights read without the copy read: a shallow copy whose config says ``imprint_copy`` 0."""
    twin = copy.copy(model)
    twin.config = replace(model.config, imprint_copy=0.0)
    return twin


def measure(calls: dict[str, Callable[[], Decode]], repeats: int, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, runs in timed_rounds(calls, repeats, n).items():
        rates = [r.decode_tokens / r.decode_s for r in runs]
        out[name] = {
            "decode_tokens_per_s": statistics.median(rates),
            "decode_ms_per_step": median_ms([r.decode_s / r.steps for r in runs]),
            "decode_tokens_per_s_samples": rates,
        }
    dot = out["dot"]["decode_tokens_per_s_samples"]
    for name in calls:
        rates = out[name]["decode_tokens_per_s_samples"]
        out[name]["over_dot"] = out[name]["decode_tokens_per_s"] / out["dot"]["decode_tokens_per_s"]
        # each round's ratio, then their median: a load that drifts between rounds moves both sides of a round alike
        out[name]["over_dot_paired"] = statistics.median(r / d for r, d in zip(rates, dot, strict=True))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 tokens, 2 rounds: a sanity run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=32, help="new tokens per row")
    p.add_argument("--repeats", type=int, default=15, help="timed rounds (each calls every decoder once)")
    p.add_argument("--checkpoint", type=Path, default=None, help="default: the bundled one")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both models cast to it")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8], help="batch widths")
    p.add_argument("--device", default="cpu", help="the torch device both models decode on (e.g. cuda)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="a bfloat16 run goes under the file's 'bfloat16' key")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats = 8, 2
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    result: dict[str, Any] = {"machine": info}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "models"
        hf_dir = checkpoint_base(args.checkpoint, cache)
        model, twin, fresh, held, prompts = decoders(args.checkpoint, cache, hf_dir)
        imprint = held.imprint
        assert imprint is not None
        for m in (model, twin):
            m.to(args.device)
            m.to(getattr(torch, args.dtype))
        result["decode"] = {}
        for rows in args.rows:
            sys.stdout.write(f"decoding, {rows} rows...\n")
            batch = [prompts[i % len(prompts)] for i in range(rows)]
            calls: dict[str, Callable[[], Decode]] = {
                "dot": partial(sia_decode, twin, batch, [fresh] * rows, args.tokens),
                "fresh": partial(sia_decode, model, batch, [fresh] * rows, args.tokens),
                "imprint": partial(sia_decode, model, batch, [held] * rows, args.tokens),
            }
            if model.config.imprint_copy:
                calls["imprint_no_copy"] = partial(sia_decode, without_copy(model), batch, [held] * rows, args.tokens)
            result["decode"][str(rows)] = measure(calls, args.repeats, args.tokens)
    info["loadavg_end"] = list(os.getloadavg())
    result["setup"] = {
        "checkpoint": str(args.checkpoint or "bundled"),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "entries": imprint.capacity,
        "read_rank": model.config.imprint_read_rank,
        "imprint_gate": model.config.imprint_gate,
        "imprint_copy": model.config.imprint_copy,
        "imprint_copy_heads": model.config.imprint_copy_heads,
        "dtype": args.dtype,
        "device": args.device,
    }
    result["target"] = {"imprint_over_dot": TARGET}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.dtype != "float32":  # beside the float32 run, which the file's top level holds
        stored = {**kept, args.dtype: result}
    else:  # the float32 run replaces the top level and keeps a bfloat16 run beside it
        stored = {**result, **{k: kept[k] for k in ("bfloat16",) if k in kept}}
    args.out.write_text(json.dumps(stored, indent=1) + "\n")
    sys.stdout.write(table(result))


def table(result: dict[str, Any]) -> str:
    lines = ["| rows | decoder | tokens/s | ms/step | over dot | over dot, paired |", "|---|---|---|---|---|---|"]
    for rows, decoders in result["decode"].items():
        for name, r in decoders.items():
            lines.append(
                f"| {rows} | {name} | {r['decode_tokens_per_s']:.1f} | {r['decode_ms_per_step']:.1f} | {r['over_dot']:.2f}× "
                f"| {r['over_dot_paired']:.2f}× |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
