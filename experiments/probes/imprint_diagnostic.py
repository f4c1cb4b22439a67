"""The open-memory diagnostic: on the natural set's tuning part, what do the transcript, the oracle, the shipped self
slots and a training-free imprint recall, and does token-shock selection keep the facts' words?

Run: ``python -m experiments.probes.imprint_diagnostic [--users 20] [--depth 4] [--modes ...] [--tokens 48]
[--min-shock 4] [--out PATH]``.

Modes (sia.learn.natural.play_user, greedy, persona ``sia``):
- ``transcript`` (D0): the base model reading the whole conversation at every turn;
- ``oracle`` (D1): the fact's clause alone as the previous user turn;
- ``fresh``: a stranger (chance-level answers);
- ``slots``: the bundled adapter as shipped (no imprint);
- ``imprint`` (D2): the imprint alone (``--tokens`` entries, selection by token shock above ``--min-shock``; the
  self slots shut by a read shift of 20), untrained;
- ``both``: the imprint and the shipped slots.
For the imprint modes it also reports the span hit rate: the share of facts whose accepted answer is among the
imprinted tokens when the questions are asked (after the unrelated turns). Tuning part only: the held-out part is
never read here.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.learn.natural import answered, load_fillers, load_users, play_user
from sia.personas import persona_prompt

log = logging.getLogger("experiments.probes.imprint_diagnostic")

MODES = ("transcript", "oracle", "fresh", "slots", "imprint", "both")


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = load_model(args.checkpoint)
    assert isinstance(model, LlamaModel)
    shipped = model.config
    tok = model.tokenizer
    system = tok.system_prompt(persona_prompt(model, "sia"))
    users = load_users("tune")[: args.users]
    fillers = load_fillers("tune")
    out: dict[str, Any] = {"users": len(users), "depth": args.depth, "tokens": args.tokens, "min_shock": args.min_shock}
    for mode in args.modes:
        imprinting = mode in ("imprint", "both")
        model.config = replace(
            shipped,
            imprint_tokens=args.tokens if imprinting else 0,
            imprint_min_shock=args.min_shock,
            imprint_span=args.span,
            imprint_per_turn=args.per_turn,
        )
        model.set_read_shift(20.0 if mode == "imprint" else shipped.read_shift)
        started = time.perf_counter()
        kinds: dict[str, list[bool]] = {}
        whole, hits, rows = list[bool](), list[bool](), list[dict[str, Any]]()
        for i, user in enumerate(users):
            between = [fillers[(i * 7 + j) % len(fillers)] for j in range(args.depth)]
            play = "state" if mode in ("slots", "imprint", "both") else mode
            result = play_user(model, tok, user, between, system=system, mode=play)
            for kind, ok in result.right.items():
                kinds.setdefault(kind, []).append(ok)
            whole.append(all(result.right.values()))
            row: dict[str, Any] = {"user": user.id, "right": result.right, "replies": result.replies}
            if imprinting and result.state.imprint is not None:
                kept = " ".join(tok.decode(s.tokens or ()) for s in result.state.imprint.spans())
                row["imprinted"] = kept
                hits.extend(answered(kept, user, q.kind) for q in user.questions)
            rows.append(row)
            log.info("%s %s %s", mode, user.id, result.right)
        per_fact = [ok for oks in kinds.values() for ok in oks]
        out[mode] = {
            "per_fact": sum(per_fact) / len(per_fact),
            "all_facts": sum(whole) / len(whole),
            "by_kind": {k: sum(v) / len(v) for k, v in sorted(kinds.items())},
            "counts": {k: len(v) for k, v in sorted(kinds.items())},
            "span_hit": sum(hits) / len(hits) if hits else None,
            "seconds": round(time.perf_counter() - started, 1),
            "rows": rows,
        }
        log.info(
            "%s: per fact %.3f, all %.3f, span hit %s", mode, out[mode]["per_fact"], out[mode]["all_facts"], out[mode]["span_hit"]
        )
    return out


def table(out: dict[str, Any], modes: list[str]) -> str:
    kinds = sorted({k for m in modes for k in out[m]["by_kind"]})
    lines = ["| mode | per fact | all facts | span hit | " + " | ".join(kinds) + " |", "|---" * (4 + len(kinds)) + "|"]
    for m in modes:
        r = out[m]
        hit = "" if r["span_hit"] is None else f"{100 * r['span_hit']:.0f} %"
        cells = [f"{100 * r['by_kind'][k]:.0f} %" if k in r["by_kind"] else "" for k in kinds]
        lines.append(f"| {m} | {100 * r['per_fact']:.1f} % | {100 * r['all_facts']:.1f} % | {hit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--min-shock", type=float, default=4.0)
    parser.add_argument("--span", type=int, default=12)
    parser.add_argument("--per-turn", type=int, default=24)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = run(args)
    print(table(out, args.modes))  # noqa: T201
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
