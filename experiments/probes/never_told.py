"""Questions about a fact the user never told: what the read answers, and what could tell them from the questions it
can answer. The natural set's tuning part is played as ``sia eval --natural tune --modes state`` plays it (the user's
messages, ``--depth`` unrelated turns); then every user is asked their own questions (told) and, for each of the six
counted kinds they never stated, another user's question of that kind (never told). For every question: the ask
head's probabilities, the kinds of the spans the imprint holds (the write's tagger), and the greedy reply (right or
not for a told one).

    PYTHONPATH=. python -m experiments.probes.never_told [--part tune] [--depth 4] [--out FILE]

Writes every row; ``--rules`` then reads such a file and prints what a rule "the asked kind is sure and no held span
is labelled with it" would turn into "not told" at each threshold, and how many replies say the user did not tell
(``sia.model.language.untold_reply``, for the kinds the checkpoint's ``imprint_untold`` names).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from experiments.probes.natural_play import Played
from sia.identity import imprint
from sia.identity.state import IdentityState
from sia.identity.turn import TurnRequest, stream_turns, turn_prompt
from sia.learn.natural import ASK, MAIN_KINDS, TALK, answered, filler

SAID_UNTOLD = "I don't think you've told me"  # sia.model.language.untold_reply's opening


def play(part: str, depth: int, batch: int = 8) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Every question's row, and per user the spans their imprint holds with the tagger's probabilities (``_tagged``)."""
    game = Played.load(part)
    model, tok, system, dynamics = game.model, game.tok, game.system, game.dynamics
    users, fillers, states = game.users, game.fillers, game.states

    def turns(pairs: list[tuple[str, str]], params: Any) -> list[tuple[str, IdentityState]]:
        out: list[tuple[str, IdentityState]] = []
        for a in range(0, len(pairs), batch):
            requests = [TurnRequest(states[uid], text, dynamics, system, True) for uid, text in pairs[a : a + batch]]
            out.extend((r.reply, r.state) for r in stream_turns(model, requests, params, tokenizer=tok).finish())
        return out

    def talk(pairs: list[tuple[str, str]]) -> None:
        for (uid, _), (_, state) in zip(pairs, turns(pairs, TALK), strict=True):
            states[uid] = state

    for pairs in game.rounds(depth):
        talk(pairs)
    said = {u.id: [*u.messages, *(filler(fillers, n, j) for j in range(depth))] for n, u in enumerate(users)}
    tagged = {u.id: _tagged(model, system, states[u.id], said[u.id]) for u in users}
    asked_of = {k: [q.text for u in users for q in u.questions if q.kind == k] for k in MAIN_KINDS}
    rows: list[dict[str, Any]] = []
    for n, u in enumerate(users):
        for q in u.questions:
            rows.append({"user": u.id, "kind": q.kind, "told": True, "text": q.text})
        stated = {f.kind for f in u.facts}
        for k in MAIN_KINDS:
            if k not in stated:
                rows.append({"user": u.id, "kind": k, "told": False, "text": asked_of[k][n % len(asked_of[k])]})
    replies = turns([(r["user"], r["text"]) for r in rows], ASK)
    by_id = {u.id: u for u in users}
    for row, (reply, _) in zip(rows, replies, strict=True):
        state = states[row["user"]]
        message = turn_prompt(tok, TurnRequest(state, row["text"], dynamics, system, True)).message
        with torch.no_grad():
            p = model.asked_kinds([message])[0]
        held = state.imprint.spans() if state.imprint is not None else []
        row["reply"] = reply
        row["asked"] = {k: round(float(v), 4) for k, v in zip(imprint.KINDS, p, strict=True)}
        row["held"] = [s.kind for s in held]
        row["right"] = answered(reply, by_id[row["user"]], row["kind"]) if row["told"] else None
        sys.stdout.write(f"{'told ' if row['told'] else 'never'} {row['kind']:7s} {row['text']} -> {reply}\n")
        sys.stdout.flush()
    return rows, tagged


@torch.no_grad()
def _tagged(model: Any, system: tuple[int, ...], state: IdentityState, said: list[str]) -> list[dict[str, Any]]:
    """Per held span: the tagger's mean and largest probability of each kind over its tokens, as the write read them."""
    tok, layer, tagger = model.tokenizer, model.config.imprint_kinds_layer, model.imprint_kind
    out = []
    for s in state.imprint.spans() if state.imprint is not None else []:
        tokens, (start, end) = tok.turn_prompt(said[s.turn], list(system))
        h = model.layer_input(torch.tensor([tokens[: end - 1]], device=model.device), layer)[start:]
        probs = torch.softmax(tagger(h[s.offset : s.offset + s.length].to(next(tagger.parameters()).dtype)).float(), -1)
        out.append(
            {
                "kind": s.kind,
                "text": tok.decode(list(s.tokens or ())),
                "mean": [round(float(v), 4) for v in probs.mean(0)],
                "max": [round(float(v), 4) for v in probs.max(0).values],
            }
        )
    return out


def rules(rows: list[dict[str, Any]]) -> None:
    """Per threshold t: a question whose asked kind k has p_k >= t and no held span labelled k is "not told"."""
    counted = [r for r in rows if r["kind"] in MAIN_KINDS]
    told = [r for r in counted if r["told"]]
    never = [r for r in counted if not r["told"]]
    sys.stdout.write(f"told {len(told)} ({sum(r['right'] for r in told)} right), never told {len(never)}\n")
    said = [r for r in counted if r["reply"].startswith(SAID_UNTOLD)]
    sys.stdout.write(
        f"replies saying it was not told: {sum(not r['told'] for r in said)} of {len(never)} never told, "
        f"{sum(r['told'] for r in said)} of {len(told)} told\n"
    )
    sys.stdout.write(
        "| p_k at least | never told caught | told: right lost | told: wrong caught | by kind (caught/never, lost) |\n"
    )
    sys.stdout.write("|---|---|---|---|---|\n")
    for t in (0.3, 0.5, 0.7, 0.8, 0.9):

        def fires(r: dict[str, Any], t: float = t) -> bool:
            return r["asked"][r["kind"]] >= t and r["kind"] not in r["held"]

        kinds = []
        for k in MAIN_KINDS:
            nk = [r for r in never if r["kind"] == k]
            tk = [r for r in told if r["kind"] == k]
            kinds.append(f"{k} {sum(map(fires, nk))}/{len(nk)}, {sum(fires(r) and r['right'] for r in tk)}")
        caught = sum(map(fires, never))
        lost = sum(fires(r) and r["right"] for r in told)
        wrong = sum(fires(r) and not r["right"] for r in told)
        sys.stdout.write(f"| {t} | {caught} of {len(never)} | {lost} | {wrong} | {'; '.join(kinds)} |\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="tune")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rules", type=Path, default=None, help="read this file's rows instead of playing")
    args = ap.parse_args(argv)
    if args.rules:
        rules(json.loads(args.rules.read_text())["rows"])
        return 0
    rows, tagged = play(args.part, args.depth)
    if args.out:
        out = {"part": args.part, "depth": args.depth, "rows": rows, "tagged": tagged}
        args.out.write_text(json.dumps(out, ensure_ascii=False) + "\n")
    rules(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
