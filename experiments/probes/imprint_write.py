"""Where the imprint's write loses a fact: for every fact of the natural set's tuning users, whether its value was ever
chosen into the imprint (its turn's spans), and whether it is still there after the user's messages and ``depth``
unrelated turns; a lost value is counted as never chosen, cut (its clause chosen, the value's tokens outside the span)
or gone (chosen, then replaced or evicted). Also the kind tagger's share: the facts whose value's span was chosen
under the fact's own kind, and the labelled spans whose message states no fact of that kind.

The write as a turn does it (sia.learn.imprint_read.imprint_turns: token NLL under a fresh identity, the kind tagger, the
checkpoint's selection settings), with the text kept. Nothing is generated.

    python -m experiments.probes.imprint_write [--split tune] [--users 60] [--depth 4] [--tokens N] [--aside W]
        [--aside-rule sentence] [--out PATH]

``--split train`` plays the training part's users (the unrelated turns are the tuning part's: the training part has
none). ``--aside-rule message`` weighs every span of a message that asks something or never speaks of its writer (the
rule before the per-sentence one).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

import sia.identity.imprint as imprint_module
from sia.checkpoint import DEFAULT_CACHE, DEFAULT_CHECKPOINT, load_llama_checkpoint
from sia.identity.imprint import KINDS, Imprint
from sia.learn.imprint_read import imprint_turns
from sia.learn.natural import TRAIN, filler, load_fillers, load_users, mentions
from sia.personas import PERSONAS


def _message_asides(pieces: Sequence[str], questions: Tensor | None = None) -> Tensor:
    """The earlier rule: every token of a message that asks something or never speaks of its writer is an aside."""
    asks = imprint_module.asking(pieces) if questions is None else questions
    whole = bool(asks.any()) or imprint_module._FIRST_PERSON.search(imprint_module._plain(pieces)) is None
    return torch.full((len(pieces),), whole, dtype=torch.bool)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--users", type=int, default=60)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=None, help="imprint entries (default: the checkpoint's)")
    parser.add_argument("--per-turn", type=int, default=None)
    parser.add_argument("--span", type=int, default=None)
    parser.add_argument("--aside", type=float, default=None, help="imprint_aside_weight (default: the checkpoint's)")
    parser.add_argument("--aside-rule", choices=("sentence", "message"), default="sentence")
    parser.add_argument("--split", choices=("tune", TRAIN), default="tune")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.aside_rule == "message":
        imprint_module.asides = _message_asides
    model = load_llama_checkpoint(args.checkpoint, DEFAULT_CACHE)
    c = model.config
    changes = {
        "imprint_tokens": args.tokens,
        "imprint_per_turn": args.per_turn,
        "imprint_span": args.span,
        "imprint_aside_weight": args.aside,
    }
    c = replace(c, **{k: v for k, v in changes.items() if v is not None})
    model.config = c
    tok = model.tokenizer
    system = tok.system_prompt(PERSONAS["sia"].system_prompt)
    users = load_users(args.split)[: args.users]
    fillers = load_fillers("tune")
    verdicts: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = {}
    examples: list[dict[str, object]] = []
    labels: Counter[str] = Counter()
    filler_labels: list[tuple[str, str, str]] = []
    for n, user in enumerate(users):
        messages = [*user.messages, *(filler(fillers, n, j) for j in range(args.depth))]
        imprint, chosen = Imprint.empty(c), []
        for turn, (after, choices) in enumerate(imprint_turns(model, system, messages, keep_text=True)):
            imprint = after
            tokens, (start, end) = tok.turn_prompt(messages[turn], system)
            body = tokens[start : end - 1]
            chosen += [(turn, tok.decode(body[ch.start : ch.end]), KINDS[ch.kind], round(ch.score, 1)) for ch in choices]
        held = [tok.decode(s.tokens or ()) for s in imprint.spans()]
        for t, text, k, _ in chosen:  # a span labelled with a kind its message does not state
            stated = {f.kind for f in user.facts if f.message == t} if t < len(user.messages) else set()
            labels["labelled"] += k != "unknown"
            labels["false"] += k != "unknown" and k not in stated
            if t >= len(user.messages) and k != "unknown":  # an unrelated turn's span labelled with a kind
                filler_labels.append((user.id, text, k))
        for kind in {q.kind for q in user.questions}:
            fact = user.newest(kind)
            accepts = fact.accept

            def has(text: str, accepts: tuple[str, ...] = accepts) -> bool:
                return any(mentions(text, a) for a in accepts)

            if any(has(text) for text in held):
                verdict = "kept"
            elif any(t == fact.message and has(text) for t, text, _, _ in chosen):
                verdict = "gone"
            elif any(t == fact.message and has(fact.clause) for t, text, _, _ in chosen if text.strip() in fact.clause):
                verdict = "cut"
            else:
                verdict = "never"
            verdicts[verdict] += 1
            by_kind.setdefault(kind, Counter())[verdict] += 1
            if kind in KINDS:  # the kind tagger's share: the value's span chosen under its own kind
                labels["facts"] += 1
                labels["right"] += any(t == fact.message and has(text) and k == kind for t, text, k, _ in chosen)
            if verdict != "kept" and len(examples) < 60:
                examples.append(
                    {
                        "user": user.id,
                        "kind": kind,
                        "value": fact.value,
                        "verdict": verdict,
                        "message": user.messages[fact.message],
                        "chosen": [x for x in chosen if x[0] == fact.message],
                        "held": held,
                    }
                )
    total = sum(verdicts.values())
    result = {
        "settings": {
            "tokens": c.imprint_tokens,
            "per_turn": c.imprint_per_turn,
            "span": c.imprint_span,
            "depth": args.depth,
            "aside_weight": c.imprint_aside_weight,
            "aside_rule": args.aside_rule,
            "split": args.split,
        },
        "facts": total,
        "verdicts": {k: v / total for k, v in verdicts.items()},
        "by_kind": {k: {v: n / sum(cs.values()) for v, n in cs.items()} for k, cs in sorted(by_kind.items())},
        "tagger": {
            "facts_labelled_right": labels["right"] / max(1, labels["facts"]),
            "false_labels": labels["false"] / max(1, labels["labelled"]),
            "facts": labels["facts"],
            "labelled_spans": labels["labelled"],
        },
        "unrelated_labelled": filler_labels,
        "examples": examples,
    }
    sys.stdout.write(json.dumps({k: v for k, v in result.items() if k != "examples"}, indent=1) + "\n")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
