"""Diagnostic: how much of the recall lost on held-out episodes is the statement's wording, how much the question's?

Recall through the state alone (the value ranked first among its kind's six candidates, as ``sia eval`` ranks it) of
colour, pet and hobby, ``between`` unrelated turns after they were stated, on four kinds of episode: statements and
chit-chat of the training split or of the held-out split, crossed with questions (and reply prefixes) of either.
Users, values and turn orders are new in all four; only the wordings' split changes. A gap between training and
held-out statements is the write's (or the read's of what the write made of unseen statements), a gap between
training and held-out questions is the read's.

    python -m experiments.probes.wording_gap [--checkpoint DIR] [--episodes 24] [--between 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path

import torch

from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.state import Dynamics
from sia.learn.adapter import facts
from sia.learn.adapter.heldout import probe_accuracy, unroll_states
from sia.learn.adapter.train import use_bf16
from sia.learn.adapter.unroll import persona_contexts

RESULTS = Path(__file__).parent / "results" / "wording_gap.json"
KINDS = ("colour", "pet", "hobby")


def asked_in(episodes: list[facts.Episode], split: str) -> list[facts.Episode]:
    """The same episodes with each fact asked in a wording of ``split``."""
    rng = random.Random(f"swap:{split}")
    return [dataclasses.replace(e, probes=tuple(facts.ask(rng, split, f) for f in e.facts)) for e in episodes]


def measure(model: LlamaModel, n: int, between: int, seed: int = 7) -> list[dict[str, object]]:
    dynamics = Dynamics.from_config(model.config)
    contexts = persona_contexts(model, n)
    rows: list[dict[str, object]] = []
    for stated in facts.SPLITS:
        episodes = facts.episodes(stated, n, seed, between=between, kinds=KINDS)
        carry = unroll_states(model, episodes, contexts, dynamics)
        for asked in facts.SPLITS:
            right = probe_accuracy(model, carry, episodes if asked == stated else asked_in(episodes, asked), contexts)
            rows.append(
                {
                    "statements": stated,
                    "questions": asked,
                    "per_fact": float(right.float().mean()),
                    "all_three": float(right.all(dim=1).float().mean()),
                    "by_kind": {kind: float(right[:, k].float().mean()) for k, kind in enumerate(KINDS)},
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="a SIA checkpoint of a pretrained backbone (default: bundled)")
    parser.add_argument("--episodes", type=int, default=24, help="episodes per kind of episode (three facts each)")
    parser.add_argument("--between", type=int, default=4, help="unrelated turns between statement and questions")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    model = load_model(args.checkpoint).eval()
    if not isinstance(model, LlamaModel):
        raise SystemExit("wording_gap measures a model over a pretrained backbone")
    with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=use_bf16("auto", model.device)):
        rows = measure(model, args.episodes, args.between)
    result = {"checkpoint": args.checkpoint or "bundled", "episodes": args.episodes, "between": args.between, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(
        f"{args.episodes} episodes each, {args.between} unrelated turns\n\n"
        "| statements | questions | per fact | all three |\n|---|---|---|---|\n"
    )
    for row in rows:
        sys.stdout.write(f"| {row['statements']} | {row['questions']} | {row['per_fact']:.1%} | {row['all_three']:.1%} |\n")


if __name__ == "__main__":
    main()
