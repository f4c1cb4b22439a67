"""Where the natural set's wrong answers go: for every question a checkpoint got wrong (``sia eval --natural``'s
figures.json, which keeps every reply), whether the reply gave a value the user replaced (older), another of the
user's own facts (a name answered with their city: the read chose the wrong entry) or none of their values (a
miss, a garbled copy such as "Auélio" for "Aurelio", or a value from nowhere).

    python -m experiments.probes.natural_misses runs/eval-tune-NAME/figures.json [--depth 4] [--examples 6] [--out FILE]

Reads the figures only: no model, no generation.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sia.learn.natural import NaturalUser, answered, load_users, mentions

OUTCOMES = ("right", "older value", "another fact's value", "none of theirs")


def outcome(reply: str, user: NaturalUser, kind: str) -> str:
    """One of OUTCOMES for the reply to the question about ``kind``."""
    if answered(reply, user, kind):
        return "right"
    if any(mentions(reply, a) for f in user.older(kind) for a in f.accept):
        return "older value"
    if any(mentions(reply, a) for f in user.facts if f.kind != kind for a in f.accept):
        return "another fact's value"
    return "none of theirs"


def misses(figures: dict[str, Any], depth: int, examples: int) -> dict[str, Any]:
    """Per kind and in all, how many replies fall in each outcome, and up to ``examples`` (value, reply) of each miss."""
    users = {u.id: u for u in load_users(figures["part"])}
    at = [r for r in figures["state"] if r["depth"] == depth]
    if not at:
        raise SystemExit(f"no state figures at depth {depth}")
    by_kind: dict[str, Counter[str]] = {}
    shown: dict[str, list[tuple[str, str]]] = {}
    for uid, replies in at[0]["replies"].items():
        user = users[uid]
        for kind, reply in replies.items():
            got = outcome(reply, user, kind)
            by_kind.setdefault(kind, Counter())[got] += 1
            if got != "right" and len(shown.setdefault(f"{kind}: {got}", [])) < examples:
                shown[f"{kind}: {got}"].append((user.newest(kind).accept[0], reply))
    total: Counter[str] = Counter()
    for counts in by_kind.values():
        total.update(counts)
    return {
        "depth": depth,
        "all": {o: total[o] for o in OUTCOMES},
        "by_kind": {k: {o: c[o] for o in OUTCOMES} for k, c in sorted(by_kind.items())},
        "examples": shown,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("figures", type=Path)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--examples", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result = misses(json.loads(args.figures.read_text()), args.depth, args.examples)
    lines = [f"| kind | {' | '.join(OUTCOMES)} |", "|---|" + "---|" * len(OUTCOMES)]
    for kind, counts in [*result["by_kind"].items(), ("all", result["all"])]:
        lines.append(f"| {kind} | {' | '.join(str(counts[o]) for o in OUTCOMES)} |")
    sys.stdout.write("\n".join(lines) + "\n")
    for key, rows in result["examples"].items():
        sys.stdout.write(f"{key}: " + "; ".join(f"{value} -> {reply[:80]!r}" for value, reply in rows) + "\n")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
