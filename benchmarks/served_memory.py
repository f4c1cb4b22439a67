"""Served behaviour: does a persona remember a user through the HTTP API, and only that user?

For each held-out episode of the fact corpus, a user of persona ``sia`` states three facts through
``POST /v1/personas/sia/chat`` (or, with ``--route openai``, ``POST /v1/chat/completions`` with model ``sia`` and
only the new message; greedy replies unless ``--sampling persona``), chats about ``--between`` unrelated things, then asks about
one fact (the episode's first probe). A second user, who never said anything, asks the same question. A reply
counts as right when it contains the fact's value (case-insensitive, whole word). The service runs in process on
the checkpoint (default: the bundled one) with a fresh SQLite database.

``--set natural`` asks the same of conversations written as people write to a chat service, in none of the corpus's
wordings: a greeting and three facts in one informal message (colour, pet, hobby), ``--between`` everyday requests,
then a plain question about each fact in turn; the stranger asks the same three questions.

``--set users`` plays the hand-written natural-conversation set (sia.learn.natural, ``--part`` tune or heldout, the
first ``--episodes`` users): each user's own messages (introductions, asides, corrections; names, cities, jobs and
more), ``--between`` of the part's unrelated turns (user n's j-th is filler 7n + j, as `sia eval --natural` plays
them), then one question per kind the user stated, scored as `sia eval --natural` scores them (the newest value
given, none it replaced). The figures of `sia eval --natural`, served: through the store, the batcher and the API.

    python -m benchmarks.served_memory [--set heldout|natural|users] [--part heldout|tune] [--episodes 8]
                                       [--between 2] [--route chat|openai] [--sampling greedy|persona]
                                       [--recall-temperature T] [--checkpoint PATH] [--out FILE]

``--sampling persona`` sends no sampling field, so every reply is decoded at the persona's own defaults (sampled, as
a client that sets nothing gets them, a reply to a question about the user's facts at the persona's recall
temperature); by default replies are greedy, ``--max-tokens`` long. ``--recall-temperature T`` sends that field with
every turn (e.g. 5: replies that recall are sampled as the others).

The service's settings come from the environment as in a deployment (e.g. ``SIA_READ_SHIFT=1`` for a weaker read than
the checkpoint's own; the result records the shift served). Writes benchmarks/results/served_memory.json and prints a
table.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from server.core.config import Settings
from server.db import migrate
from server.main import create_app
from sia.checkpoint import DEFAULT_CACHE, load_model
from sia.learn import natural as natural_set
from sia.learn.adapter import facts

log = logging.getLogger("benchmarks.served_memory")
RESULTS = Path(__file__).parent / "results" / "served_memory.json"


# --set natural: what a user might write; none of it is a wording of the fact corpus (sia.learn.adapter.facts)
INTRODUCTIONS = (
    "Hi! My favourite colour is {colour}, I have a {pet} and I love {hobby}.",
    "hey there. quick intro: I'm really into {hobby}, my {pet} keeps me company, and {colour} is my colour.",
    "Hello, nice to meet you. A bit about me: I've got a {pet} at home, I spend weekends {hobby}, and I wear {colour}"
    " whenever I can.",
    "So, about me: {colour} is my favourite colour, {hobby} is my hobby and I have a pet {pet}.",
    "Good morning! I live with my {pet}, I'm crazy about {hobby}, and my favourite colour is {colour}.",
    "Let me tell you a few things about myself. I love the colour {colour}. I own a {pet}. My hobby is {hobby}.",
    "hiya, I'm new here. I do a lot of {hobby}, my favourite colour's {colour}, and I have a {pet} called Pip.",
    "Before we start: my {pet} is my best friend, {hobby} is what I do for fun, and I'm all about {colour}.",
)
REQUESTS = (
    "Can you suggest a good book to read?",
    "How long should I boil an egg?",
    "What's a good way to fall asleep faster?",
    "Tell me a fun fact about space.",
    "Any tips for learning a new language?",
    "What should I cook for dinner tonight?",
    "How do I stay focused when working from home?",
    "How do I get a coffee stain out of a shirt?",
)
QUESTIONS = {
    "colour": ("What is my favourite colour?", "Do you remember which colour I like?", "Which colour do I love?"),
    "pet": (
        "What sort of animal is my pet?",
        "Do you remember what animal lives with me?",
        "What kind of pet did I tell you about?",
    ),
    "hobby": (
        "What do I like doing in my free time?",
        "Remind me, what is that hobby of mine?",
        "Do you remember what I do for fun?",
    ),
}


def packed_dtype(model: object) -> str | None:
    """The dtype of the served model's packed matrix copies (SIA_PACKED_WEIGHTS), None where none were made."""
    blocks = getattr(model, "blocks", None)
    up = blocks[0].mlp.up_proj if blocks else None
    if up is None or getattr(up, "packed", None) is None:
        return None
    return str(up.packed_dtype).removeprefix("torch.")


def mentions(reply: str, value: str) -> bool:
    return re.search(rf"\b{re.escape(value)}\b", reply, flags=re.IGNORECASE) is not None


def natural(n: int, between: int) -> list[tuple[list[str], list[tuple[str, str, str]]]]:
    """``n`` conversations: (the user's messages before the questions, [(kind, value, question), ...]). The first is
    green, cat, hiking in the first introduction; the rest turn through the values, wordings and requests."""
    conversations = []
    for i in range(n):
        at = {"colour": 2 + i, "pet": 5 * i, "hobby": 1 + i + i // 6}  # 0: green, cat, hiking; then all turn
        chosen = {kind: facts.CLOSED_VALUES[kind][at[kind] % 6] for kind in QUESTIONS}
        said = [INTRODUCTIONS[i % len(INTRODUCTIONS)].format(**chosen)]
        said += [REQUESTS[(i + j) % len(REQUESTS)] for j in range(between)]
        kinds = list(QUESTIONS)[i % 3 :] + list(QUESTIONS)[: i % 3]  # which fact is asked first turns too
        asked = [(kind, chosen[kind], QUESTIONS[kind][i % 3]) for kind in kinds]
        conversations.append((said, asked))
    return conversations


Asked = tuple[str, str, str, Callable[[str], bool]]  # kind, value, question, whether a reply gives the value


def named(value: str) -> Callable[[str], bool]:
    return lambda reply: mentions(reply, value)


def natural_users(part: str, n: int, between: int) -> list[tuple[list[str], list[Asked]]]:
    """The first ``n`` users of the natural set's ``part``: their messages and ``between`` unrelated turns, then a
    question per kind, each scored by ``sia.learn.natural.answered``."""
    users, fillers = natural_set.load_users(part)[:n], natural_set.load_fillers(part)
    conversations = []
    for i, user in enumerate(users):
        said = [*user.messages, *(natural_set.filler(fillers, i, j) for j in range(between))]

        def check(kind: str, user: natural_set.NaturalUser = user) -> Callable[[str], bool]:
            return lambda reply: natural_set.answered(reply, user, kind)

        asked = [(q.kind, user.newest(q.kind).value, q.text, check(q.kind)) for q in user.questions]
        conversations.append((said, asked))
    return conversations


def by_kind(rows: list[dict[str, Any]], field: str) -> dict[str, float]:
    kinds: dict[str, list[bool]] = {}
    for r in rows:
        kinds.setdefault(r["kind"], []).append(r[field])
    return {k: sum(v) / len(v) for k, v in sorted(kinds.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("heldout", "natural", "users"), default="heldout", dest="wordings")
    parser.add_argument("--part", choices=natural_set.SPLITS, default="heldout", help="with --set users: which part")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--between", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--route", choices=("chat", "openai"), default="chat")
    parser.add_argument(
        "--sampling",
        choices=("greedy", "persona"),
        default="greedy",
        help="greedy replies of --max-tokens, or the persona's own defaults (what a client that sets none gets)",
    )
    parser.add_argument(
        "--recall-temperature",
        type=float,
        default=None,
        help="sent with every turn (default: the persona's; at or above the temperature: replies that recall are sampled "
        "as the others)",
    )
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    model = load_model(args.checkpoint, cache_dir=DEFAULT_CACHE)
    conversations: list[tuple[list[str], list[Asked]]]
    if args.wordings == "users":
        conversations = natural_users(args.part, args.episodes, args.between)
    elif args.wordings == "natural":
        conversations = [
            (said, [(k, v, q, named(v)) for k, v, q in asked]) for said, asked in natural(args.episodes, args.between)
        ]
    else:  # the corpus's held-out episodes, the first probe of each
        episodes = facts.episodes("heldout", args.episodes, 7, between=args.between, kinds=("colour", "pet", "hobby"))
        conversations = [
            ([t.user for t in e.turns], [(p.kind, p.value, p.question, named(p.value)) for p in e.probes[:1]]) for e in episodes
        ]
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), checkpoint=args.checkpoint, log_json=False)
        migrate.upgrade(settings)  # a fresh database, as `sia db upgrade` makes it
        with TestClient(create_app(settings, model=model)) as client:

            def say(user: str, message: str) -> str:
                sampling: dict[str, Any] = {"user": user}
                if args.sampling == "greedy":
                    sampling |= {"temperature": 0, "max_tokens": args.max_tokens}
                if args.recall_temperature is not None:
                    sampling["recall_temperature"] = args.recall_temperature
                if args.route == "openai":  # the identity carries the history: only the new message is sent
                    body = {"model": "sia", "messages": [{"role": "user", "content": message}], **sampling}
                    response = client.post("/v1/chat/completions", json=body)
                    response.raise_for_status()
                    return str(response.json()["choices"][0]["message"]["content"])
                response = client.post("/v1/personas/sia/chat", json={"message": message, **sampling})
                response.raise_for_status()
                return str(response.json()["reply"])

            for i, (said, asked) in enumerate(conversations):
                user, stranger = f"served-{i}", f"stranger-{i}"
                for message in said:
                    say(user, message)
                for kind, value, question, gives in asked:
                    own, other = say(user, question), say(stranger, question)
                    rows.append(
                        {
                            "conversation": i,
                            "kind": kind,
                            "value": value,
                            "question": question,
                            "reply": own,
                            "right": gives(own),
                            "stranger_reply": other,
                            "stranger_right": gives(other),
                        }
                    )
                    log.warning("%s: %r -> %r (stranger: %r)", value, question, own, other)
    right = sum(r["right"] for r in rows) / len(rows)
    stranger = sum(r["stranger_right"] for r in rows) / len(rows)
    result = {
        "checkpoint": str(args.checkpoint or "bundled"),
        "set": args.wordings,
        "part": args.part if args.wordings == "users" else None,
        "episodes": len(conversations),
        "questions": len(rows),
        "between": args.between,
        "route": args.route,
        "sampling": args.sampling,
        "recall_temperature": args.recall_temperature,  # None: the persona's
        "read_shift": getattr(model, "read_shift", None),  # as served: SIA_READ_SHIFT where set, else the checkpoint's
        "packed_weights": packed_dtype(model),  # as served: what SIA_PACKED_WEIGHTS chose on this CPU
        "right": right,
        "stranger_right": stranger,
        "right_by_kind": by_kind(rows, "right"),
        "stranger_by_kind": by_kind(rows, "stranger_right"),
        "all_facts": sum(all(r["right"] for r in rows if r["conversation"] == i) for i in range(len(conversations)))
        / len(conversations),
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(f"the user's own reply names the value: {right:.0%}; a stranger's: {stranger:.0%} ({len(rows)} questions)\n")


if __name__ == "__main__":
    main()
