"""Whether a recall reply that opens the way the read was taught to answer the asked kind ("You work as", "You're
really into", "You have") gives the user's value more often than a reply the model opens itself.

The natural set's part is played as ``sia eval --natural`` plays it (through the state, greedy), and each question's
prompt ends with an opening chosen by ``--by``: ``kind`` the question's own kind (what a perfect question reader
would give), ``ask`` the ask head's likeliest kind where it says a fact is asked (p(none) < 1/2), ``none`` no opening
(the shipped reply). The opening is one of the read's training answers for that kind, cut before the value
(``OPENINGS``); a kind with none (birthday, employer, pet's name, ...) is left to the model. The reply is judged on
what follows the opening, as ``sia eval --natural`` judges a whole reply.

    PYTHONPATH=. python -m experiments.probes.recall_opening --part tune --by kind ask [--depth 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sia.checkpoint import DEFAULT_CACHE, DEFAULT_CHECKPOINT, load_llama_checkpoint
from sia.identity.imprint import KINDS
from sia.learn.natural import load_fillers, load_users, recall_by_depth
from sia.personas import PERSONAS

# each kind's opening: a training answer of the read (sia/learn/data/read_templates.json) up to its value
OPENINGS = {
    "name": "Your name is",
    "city": "You're based in",
    "job": "You work as",
    "colour": "Your favourite colour is",
    "pet": "You have",
    "hobby": "You're really into",
    "food": "Your favourite food is",
    "instrument": "You play",
    "language": "You're learning",
    "origin": "You grew up in",
}
# ``--openings echo``: the descriptive kinds opened so that the reply says back the user's own clause ("I restore pipe
# organs" -> "You told me you restore pipe organs"); the other kinds left to the model
ECHO = {"job": "You told me you", "hobby": "You told me you"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("tune", "train"), default="tune")
    parser.add_argument("--by", nargs="+", choices=("none", "kind", "ask"), default=["kind", "ask"])
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--users", type=int, default=None)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--openings", choices=("taught", "echo"), default="taught", help="OPENINGS, or ECHO")
    args = parser.parse_args(argv)
    openings = OPENINGS if args.openings == "taught" else ECHO
    model = load_llama_checkpoint(args.checkpoint, DEFAULT_CACHE)
    tok = model.tokenizer
    system = tok.system_prompt(PERSONAS["sia"].system_prompt)
    users = load_users(args.part)[: args.users]
    fillers = load_fillers("tune" if args.part == "train" else args.part)
    questions = {q.text: q.kind for u in users for q in u.questions}
    plain = tok.turn_prompt
    out: dict[str, Any] = {"part": args.part, "depth": args.depth, "users": len(users), "openings": openings}
    for by in args.by:
        opening: dict[str, str] = {}
        if by == "kind":
            opening = {text: openings[kind] for text, kind in questions.items() if kind in openings}
        elif by == "ask":
            texts = list(questions)
            asked = model.asked_kinds([tok.encode(t) for t in texts])
            for text, p in zip(texts, asked, strict=True):
                kind = KINDS[int(p[1:].argmax()) + 1]
                if float(p[0]) < 0.5 and kind in openings:
                    opening[text] = openings[kind]

        def opened(message: str, context: Sequence[int] = (), opening: dict[str, str] = opening) -> Any:
            tokens, span = plain(message, context)
            if message in opening:
                tokens = [*tokens, *tok.encode(opening[message])]
            return tokens, span

        tok.turn_prompt = opened  # type: ignore[method-assign]
        try:
            (result,) = recall_by_depth(model, tok, users, fillers, [args.depth], system=system)
        finally:
            tok.turn_prompt = plain  # type: ignore[method-assign]
        per_kind = {k: sum(v) / len(v) for k, v in sorted(result.per_kind().items())}
        opened_right = [result.right[u.id][q.kind] for u in users for q in u.questions if q.text in opening]
        out[by] = {
            "per_fact": result.per_fact,
            "all_facts": result.all_facts,
            "per_kind": per_kind,
            "opened": len(opening),
            "opened_right": sum(opened_right) / max(1, len(opened_right)),
            "replies": result.replies,
        }
        sys.stdout.write(
            f"{by}: per fact {result.per_fact:.1%}, opened {len(opening)}, "
            + ", ".join(f"{k} {v:.1%}" for k, v in per_kind.items())
            + "\n"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
