"""Where an adapter's recall misses go: for every held-out probe, the value read and the rank of the true one.

Recall through the state (``sia eval``'s figure) counts a probe right when the true value ranks first among its kind's
values. This keeps the whole ranking: per kind, how many are right, the mean rank of the truth (1 is right; 6 values
a kind), which values the model names and how often each is the truth, and every miss as (true, named). A miss whose
truth ranks second is a weak read of a fact the state holds; misses that pile onto one value are a default the read
falls back to. The episodes are ``sia eval``'s own (the same held-out episodes at the same depth).

    python -m experiments.probes.recall_misses --checkpoint sia/checkpoints/smollm2 [--between 4] [--episodes 32] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.checkpoint import DEFAULT_CACHE, load_model
from sia.identity.state import Dynamics
from sia.learn.adapter import facts
from sia.learn.adapter.evaluate import CLOSED_TRIO, EvalOptions, play
from sia.learn.adapter.unroll import persona_contexts, score_candidates

RESULTS = Path(__file__).parent / "results"


@torch.no_grad()
def misses(model: LlamaModel, between: int, episodes: int, dynamics: Dynamics) -> dict[str, Any]:
    """Every probe of ``episodes`` held-out episodes (``sia eval``'s, at ``between`` unrelated turns; 0: asked right
    after the statement) read through the state after the last turn: the value ranked first and the true value's
    rank, and a summary per kind."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    played = facts.episodes("heldout", episodes, EvalOptions().seed + between, between=between, kinds=tuple(CLOSED_TRIO))
    contexts = persona_contexts(model, len(played))
    final = play(model, played, contexts, dynamics)[-1]
    probes = []
    for b, episode in enumerate(played):
        for probe in episode.probes:
            values = facts.values(probe.kind, episode.split)
            prompt = tok.turn_prompt(probe.question, list(contexts[b]))[0]
            scores = score_candidates(model, final.take([b]), [prompt], [probe.reply_prefix], [values])[0]
            order = scores.argsort(descending=True, stable=True)  # ties: the first, as the eval's argmax picks
            ranked = [values[i] for i in order.tolist()]
            probes.append(
                {"episode": b, "kind": probe.kind, "true": probe.value, "named": ranked[0], "rank": ranked.index(probe.value) + 1}
            )
    kinds: dict[str, dict[str, Any]] = {}
    for kind in CLOSED_TRIO:
        rows = [p for p in probes if p["kind"] == kind]
        kinds[kind] = {
            "right": sum(p["rank"] == 1 for p in rows),
            "probes": len(rows),
            "mean_rank": sum(p["rank"] for p in rows) / len(rows),
            "values": len(facts.values(kind, "heldout")),
            "named": dict(Counter(p["named"] for p in rows).most_common()),
            "true": dict(Counter(p["true"] for p in rows).most_common()),
            "misses": [[p["true"], p["named"]] for p in rows if p["rank"] > 1],
            "second": sum(p["rank"] == 2 for p in rows),
        }
    right = sum(k["right"] for k in kinds.values())
    return {"between": between, "episodes": len(played), "per_fact": right / len(probes), "kinds": kinds, "probes": probes}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Recall through the state after {result['between']} unrelated turns, {result['episodes']} held-out episodes: "
        f"{100 * result['per_fact']:.1f} % per fact",
        "",
        "| kind | right | truth second | mean rank of the truth | named most |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for kind, k in result["kinds"].items():
        named = ", ".join(f"{v} {n}" for v, n in list(k["named"].items())[:3])
        lines.append(
            f"| {kind} | {k['right']} / {k['probes']} | {k['second']} | {k['mean_rank']:.2f} of {k['values']} | {named} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("sia/checkpoints/smollm2"), help="an adapter checkpoint")
    parser.add_argument("--between", type=int, default=4, help="unrelated turns between statement and questions (0: none)")
    parser.add_argument("--episodes", type=int, default=32, help="held-out episodes (three facts each)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the base is dequantised")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (default results/recall_misses.json)")
    args = parser.parse_args(argv)
    if args.between < 0 or args.episodes < 1:
        parser.error("--between must be >= 0 (0: asked right after the statement) and --episodes >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.checkpoint, cache_dir=args.cache)
    if not isinstance(model, LlamaModel):
        parser.error(f"{args.checkpoint} is not a checkpoint over a pretrained backbone")
    model.eval()
    result = {
        "checkpoint": str(args.checkpoint),
        **misses(model, args.between, args.episodes, Dynamics.from_config(model.config)),
    }
    out = args.out or RESULTS / "recall_misses.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    sys.stdout.write(table(result))


if __name__ == "__main__":
    main()
