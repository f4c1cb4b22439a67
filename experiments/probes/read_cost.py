"""Where the imprint's cost to ordinary replies comes from: reply perplexity of the held-out dialogue with a natural
tuning user's imprint present against the base model, (a) as the checkpoint reads it, (b) with the read adapter off
(the imprinted entries still attended), (c) with every entry's logit lowered by ``--shifts``. Nothing is generated.

    python -m experiments.probes.read_cost [--users 10] [--conversations 8] [--shifts 2 4] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from sia.checkpoint import DEFAULT_CACHE, DEFAULT_CHECKPOINT, load_llama_checkpoint
from sia.learn.imprint_read import imprint_of
from sia.learn.natural import load_users
from sia.learn.natural_eval import imprint_perplexity
from sia.personas import PERSONAS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--shifts", type=float, nargs="*", default=[2.0, 4.0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model = load_llama_checkpoint(args.checkpoint, DEFAULT_CACHE)
    system = model.tokenizer.system_prompt(PERSONAS["sia"].system_prompt)
    imprints = [imprint_of(model, system, u.messages) for u in load_users("tune")[: args.users]]
    rows = {"as shipped": imprint_perplexity(model, imprints, args.conversations)}
    shipped = model.config
    for shift in args.shifts:
        model.config = replace(shipped, imprint_shift=shift)
        rows[f"entries lowered by {shift:g}"] = imprint_perplexity(model, imprints, args.conversations)
    model.config = shipped
    layers = list(model.attentions)
    for attn in layers:
        attn.read_rank = 0  # the adapter skipped; the entries are still attended
    rows["read adapter off"] = imprint_perplexity(model, imprints, args.conversations)
    for attn in layers:
        attn.read_rank = shipped.imprint_read_rank
    text = json.dumps({"checkpoint": str(args.checkpoint), "users": args.users, "rows": rows}, indent=1)
    sys.stdout.write(text + "\n")
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
