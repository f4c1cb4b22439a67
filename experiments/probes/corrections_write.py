"""Where the write leaves a correction: for every fact of the natural set that corrects an older value ("wait, we moved
to Split"), whether the imprint holds the newer value and whether it still holds the older one, once the user's
messages are told (as ``sia eval --natural`` tells them: the persona ``sia``, each turn's prompt and message only,
greedy replies of 16 tokens, the text kept). The spans holding either are listed with their kind and turn.

    PYTHONPATH=. python -m experiments.probes.corrections_write [--part train | --users FILE] [--ask]
        [--checkpoint DIR] [--out FILE]

A correction the write gets right holds the newer value and not the older; the read's figure for the same users is
``kind_match --part train --corrected``. ``--users``: a file of users written as the natural set's (e.g.
``experiments/data/corrections_probe.jsonl``) instead of a part; ``--ask``: each corrected kind's question is then asked
after four of the tuning part's unrelated turns (greedy, as ``sia eval --natural``), the reply kept and judged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sia.checkpoint import load_model
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, stream_turns
from sia.learn.natural import ASK, SPLITS, TALK, TRAIN, _user, answered, filler, load_fillers, load_users, mentions
from sia.personas import PERSONAS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=(*SPLITS, TRAIN), default=TRAIN)
    ap.add_argument("--users", type=Path, default=None, help="a users file in the natural set's form, instead of --part")
    ap.add_argument("--ask", action="store_true", help="ask each corrected kind's question after 4 unrelated turns")
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    model = load_model(args.checkpoint)
    tok = model.tokenizer
    system = tuple(tok.system_prompt(PERSONAS["sia"].system_prompt))
    if args.users is not None:
        lines = args.users.read_text().splitlines()
        everyone = [_user(json.loads(line), f"{args.users.name}:{i + 1}") for i, line in enumerate(lines) if line]
    else:
        everyone = load_users(args.part)
    users = [u for u in everyone if any(f.corrects is not None for f in u.facts)]
    dynamics = Dynamics.from_config(model.config)
    states = {u.id: IdentityState.fresh(model.config) for u in users}

    def tell(messages: dict[str, str]) -> None:
        order = [u for u in users if u.id in messages]
        for a in range(0, len(order), args.batch):
            part = order[a : a + args.batch]
            requests = [TurnRequest(states[u.id], messages[u.id], dynamics, system, True) for u in part]
            for u, r in zip(part, stream_turns(model, requests, TALK, tokenizer=tok).finish(), strict=True):
                states[u.id] = r.state

    for i in range(max((len(u.messages) for u in users), default=0)):
        tell({u.id: u.messages[i] for u in users if i < len(u.messages)})
    rows: list[dict[str, Any]] = []
    for u in users:
        imprint = states[u.id].imprint
        spans = [] if imprint is None else imprint.spans()
        held = [(s.kind, s.turn, tok.decode(list(s.tokens or ()))) for s in spans]
        for f in u.facts:
            if f.corrects is None:
                continue
            older = [a for o in u.older(f.kind) for a in o.accept]
            new = [h for h in held if any(mentions(h[2], a) for a in f.accept)]
            old = [h for h in held if h not in new and any(mentions(h[2], a) for a in older)]
            rows.append(
                {"user": u.id, "kind": f.kind, "older": f.corrects, "newer": f.value, "newer_held": new, "older_held": old}
            )
    if args.ask:
        fillers = load_fillers("tune")
        for j in range(4):
            tell({u.id: filler(fillers, n, j) for n, u in enumerate(users)})
        by_user = {u.id: u for u in users}
        for r in rows:
            user = by_user[r["user"]]
            text = next(q.text for q in user.questions if q.kind == r["kind"])
            request = TurnRequest(states[user.id], text, dynamics, system, True)
            reply = stream_turns(model, [request], ASK, tokenizer=tok).finish()[0].reply
            older = [a for o in user.older(r["kind"]) for a in o.accept]
            r["reply"], r["right"] = reply, answered(reply, user, r["kind"])
            r["gave_older"] = any(mentions(reply, a) for a in older)
    right = sum(bool(r["newer_held"]) and not r["older_held"] for r in rows)
    summary = {
        "part": str(args.users) if args.users is not None else args.part,
        "corrections": len(rows),
        "newer_held": sum(bool(r["newer_held"]) for r in rows),
        "older_held": sum(bool(r["older_held"]) for r in rows),
        "newer_and_not_older": right,
    }
    if args.ask:
        summary["asked_right"] = sum(bool(r["right"]) for r in rows)
        summary["asked_gave_older"] = sum(bool(r["gave_older"]) for r in rows)
    sys.stdout.write(json.dumps(summary) + "\n")
    if args.out is not None:
        args.out.write_text(json.dumps({**summary, "rows": rows}, ensure_ascii=False, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
