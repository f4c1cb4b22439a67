"""What the persona replies when a user tells it something, with an imprint to read: an answer about the user's facts
("On weekends I go bouldering with my sister." -> "You told me you're working out, sir."; "I moved to York last month"
-> "You're Priya, unless you've changed it since, sir!"), or a reply to what was said?

The natural set's part is played as ``sia eval --natural`` plays it (each user's messages, then ``--depth`` unrelated
turns, sia's prompt, its 16-token greedy talk), batched. Every turn whose message asks nothing
(``sia.model.language.asks``) and whose identity already holds imprinted entries is a row: its message, its reply, and
whether the reply takes a recall answer's form: the echo opening ("You told me you"), the untold reply, or one of the
read's taught answers (``sia/learn/data/read_templates.json``'s, their fixed words in order around the value).

    PYTHONPATH=. python -m experiments.probes.statement_replies [--part tune] [--depth 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from experiments.probes.natural_play import Played
from sia.identity.turn import TurnRequest, stream_turns
from sia.learn.natural import TALK
from sia.model.language import ECHO_OPENING, asks

TEMPLATES = Path(__file__).resolve().parents[2] / "sia" / "learn" / "data" / "read_templates.json"
SAID_UNTOLD = "I don't think you've told me"


def recall_forms() -> list[re.Pattern[str]]:
    """A pattern per taught answer with at least ten letters of its own: its fixed words in order, the value between."""
    answers = json.loads(TEMPLATES.read_text(encoding="utf-8"))["answers"]
    out = []
    for forms in answers.values():
        for form in forms:
            parts = [p.strip(" .!,") for p in re.split(r"\{a?v\}", form)]
            if sum(len(p) for p in parts) >= 10:
                out.append(re.compile(r".{1,40}?".join(re.escape(p) for p in parts if p), re.IGNORECASE))
    return out


def recalls(reply: str, forms: list[re.Pattern[str]]) -> bool:
    return reply.startswith((ECHO_OPENING, SAID_UNTOLD)) or any(f.search(reply) for f in forms)


def play(part: str, depth: int, batch: int = 8) -> list[dict[str, Any]]:
    game = Played.load(part)
    model, tok, states = game.model, game.tok, game.states
    forms = recall_forms()
    rows: list[dict[str, Any]] = []

    def talk(pairs: list[tuple[str, str]]) -> None:
        for a in range(0, len(pairs), batch):
            chunk = pairs[a : a + batch]
            held = [(imprint := states[uid].imprint) is not None and imprint.used > 0 for uid, _ in chunk]
            requests = [TurnRequest(states[uid], text, game.dynamics, game.system, True) for uid, text in chunk]
            for (uid, text), had, result in zip(
                chunk, held, stream_turns(model, requests, TALK, tokenizer=tok).finish(), strict=True
            ):
                states[uid] = result.state
                if had and not asks(text):
                    rows.append({"user": uid, "message": text, "reply": result.reply, "recalls": recalls(result.reply, forms)})
                    sys.stdout.write(f"{'RECALL ' if rows[-1]['recalls'] else '       '}{text[:70]!r} -> {result.reply!r}\n")
                    sys.stdout.flush()

    for pairs in game.rounds(depth):
        talk(pairs)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="tune")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = play(args.part, args.depth)
    n = sum(r["recalls"] for r in rows)
    sys.stdout.write(f"{n} of {len(rows)} replies to a message that asks nothing take a recall answer's form\n")
    if args.out:
        out = {"part": args.part, "depth": args.depth, "recalls": n, "statements": len(rows), "rows": rows}
        args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
