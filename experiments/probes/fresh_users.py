"""Recall as a new user meets it: 22 users written apart from every set the project trains, tunes or measures on
(the natural set's parts, the corpus generator), each telling persona ``sia`` about themselves in one to three
messages of their own kind (an introduction, a fact beside a request, lowercase chat, a fact corrected in its own
sentence, a pet named in passing), then four everyday requests, then a plain question about each fact. Played over
``POST /v1/personas/sia/chat`` in process on the bundled checkpoint with a fresh SQLite database, at the persona's own
defaults (no sampling field, as a client that sets nothing; ``--greedy`` sends temperature 0). A reply is right when
it gives one of the fact's accepted strings at the start of a word (``sia.learn.natural.mentions``).

    PYTHONPATH=. python -m experiments.probes.fresh_users [--greedy] [--out FILE]

A check of what the natural set's figures say, on conversations simpler than its own (no asides between facts, at
most five facts a user): it is not a part of any choice.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi.testclient import TestClient

from server.core.config import Settings
from server.db import migrate
from server.main import create_app
from sia.checkpoint import load_model
from sia.learn.natural import mentions
from sia.model.identity_model import IdentityModel

# (messages, [(kind, question, accepted strings)])
Asked = tuple[str, str, tuple[str, ...]]
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        ("hey there! name's Tobias Brandt, I'm a plumber from Hamburg.", "also I keep two guinea pigs, they're chaos"),
        (
            ("name", "What's my name?", ("tobias",)),
            ("job", "what do I do for a living?", ("plumb",)),
            ("city", "which city am I from?", ("hamburg",)),
            ("pet", "What pets do I have?", ("guinea",)),
        ),
    ),
    (
        (
            "Good morning. I am Priya Raman and I teach chemistry at a high school in Leicester.",
            "Orange is my colour, always has been.",
        ),
        (
            ("name", "Do you know my name?", ("priya",)),
            ("job", "What's my job?", ("chemistry", "teach")),
            ("city", "Where do I live?", ("leicester",)),
            ("colour", "What's my favourite colour?", ("orange",)),
        ),
    ),
    (
        ("so I finally moved to Montreal last month! still unpacking lol", "I'm Kenji btw. I fix bikes for a living"),
        (
            ("city", "where did I move?", ("montreal",)),
            ("name", "what's my name again?", ("kenji",)),
            ("job", "What is my work?", ("bike", "bicycle")),
        ),
    ),
    (
        (
            "Hello! My name is Fatima Zahra. I'm an architect.",
            "On Sundays I go rock climbing with friends.",
            "I live in Casablanca.",
        ),
        (
            ("name", "What is my name?", ("fatima",)),
            ("hobby", "What do I do on Sundays?", ("climb", "rock climb")),
            ("city", "What city do I live in?", ("casablanca",)),
            ("job", "What is my profession?", ("architect",)),
        ),
    ),
    (
        ("hi, I'm Oskar. my dog Biscuit just chewed my shoe", "I like purple more than any other colour"),
        (
            ("name", "What's my name?", ("oskar",)),
            ("pet", "What kind of pet do I have?", ("dog",)),
            ("colour", "What colour do I like?", ("purple",)),
        ),
    ),
    (
        ("Hi there, Marguerite here, retired librarian living in Dijon.", "I spend most afternoons knitting these days."),
        (
            ("name", "Who am I?", ("marguerite",)),
            ("job", "What was my job?", ("librarian",)),
            ("city", "Where do I live?", ("dijon",)),
            ("hobby", "What do I do in the afternoons?", ("knit",)),
        ),
    ),
    (
        ("yo. Darnell. I drive a bus in Atlanta", "fav colour? teal for sure", "I've got a parrot named Kiwi"),
        (
            ("name", "What's my name?", ("darnell",)),
            ("job", "What do I do for work?", ("bus driver", "drive a bus", "drive the bus", "driving a bus")),
            ("colour", "what's my favourite colour?", ("teal",)),
            ("pet", "what pet do I have?", ("parrot",)),
        ),
    ),
    (
        ("My name is Ingrid Solberg and I work as a dentist in Bergen.", "In my free time I play the cello."),
        (
            ("name", "What's my name?", ("ingrid",)),
            ("job", "What's my job?", ("dentist",)),
            ("city", "Which city do I work in?", ("bergen",)),
            ("hobby", "What instrument do I play?", ("cello",)),
        ),
    ),
    (
        ("Hello, I'm Rahul, a software engineer in Pune.", "Actually I just relocated to Bangalore for a new job."),
        (
            ("name", "What's my name?", ("rahul",)),
            ("city", "Where do I live now?", ("bangalore", "bengaluru")),
            ("job", "What do I work as?", ("software", "engineer")),
        ),
    ),
    (
        ("Hi! I'm Chloé, I'm a baker and I love the colour yellow.", "My cat Pistache sleeps on the flour bags lol"),
        (
            ("name", "Remind me what my name is?", ("chloé", "chloe")),
            ("job", "What's my job?", ("baker", "bake")),
            ("colour", "What's my favourite colour?", ("yellow",)),
            ("pet", "What pet do I have?", ("cat",)),
        ),
    ),
    (
        ("Evening! Gustavo here. I'm a firefighter in Porto Alegre.", "I surf whenever I get the chance."),
        (
            ("name", "What's my name?", ("gustavo",)),
            ("job", "What do I do?", ("firefight",)),
            ("city", "Where am I based?", ("porto alegre",)),
            ("hobby", "What's my hobby?", ("surf",)),
        ),
    ),
    (
        ("I'm Hannah, I'm a vet nurse living in Cardiff, and I have a rabbit called Toffee.", "Green is my favourite colour."),
        (
            ("name", "What is my name?", ("hannah",)),
            ("job", "What's my job?", ("vet nurse", "veterinary nurse")),
            ("city", "Where do I live?", ("cardiff",)),
            ("pet", "What pet do I have?", ("rabbit",)),
            ("colour", "What's my favourite colour?", ("green",)),
        ),
    ),
    (
        ("im jake from denver lol i work at a car wash",),
        (
            ("name", "what's my name", ("jake",)),
            ("city", "where am I from again?", ("denver",)),
            ("job", "what's my job", ("car wash",)),
        ),
    ),
    (
        ("I'm a nurse in Leeds and I need a quick recipe for dinner tonight, any ideas?",),
        (("job", "What do I do for work?", ("nurse",)), ("city", "Where do I live?", ("leeds",))),
    ),
    (
        ("Can you help me write a birthday card for my sister? I'm Noor by the way.",),
        (("name", "Do you remember my name?", ("noor",)),),
    ),
    (
        ("ugh long day at the hospital. being a radiologist in Glasgow is exhausting", "my name? oh it's Fiona"),
        (
            ("name", "What's my name?", ("fiona",)),
            ("job", "What's my job?", ("radiolog",)),
            ("city", "Which city am I in?", ("glasgow",)),
        ),
    ),
    (
        ("Quick question: how do I keep my hamster cool in summer? Her name is Pebbles.", "I'm Lucas, I study law in Madrid."),
        (
            ("pet", "What pet do I have?", ("hamster",)),
            ("pet_name", "What's my pet's name?", ("pebbles",)),
            ("name", "What's my name?", ("lucas",)),
            ("city", "Where do I study?", ("madrid",)),
        ),
    ),
    (
        ("My favourite colour used to be red but these days it's definitely navy.", "I'm Abebe and I'm a pilot."),
        (
            ("colour", "What's my favourite colour?", ("navy",)),
            ("name", "What's my name?", ("abebe",)),
            ("job", "What's my job?", ("pilot",)),
        ),
    ),
    (
        (
            "Hey, I'm Sofia. Been painting watercolours every evening lately, it's so relaxing.",
            "I live in Valparaíso, by the sea.",
        ),
        (
            ("name", "What is my name?", ("sofia",)),
            ("hobby", "What's my hobby?", ("paint", "watercolo")),
            ("city", "Where do I live?", ("valparaíso", "valparaiso")),
        ),
    ),
    (
        ("I work nights as a security guard at a museum in Philadelphia.", "My name is Desmond, Des for short."),
        (
            ("name", "What's my name?", ("desmond", "des")),
            ("job", "What do I do for work?", ("security",)),
            ("city", "What city do I work in?", ("philadelphia",)),
        ),
    ),
    (
        ("We just got a puppy! A beagle named Waffles.", "I'm Mei, I'm an accountant in Singapore."),
        (
            ("pet", "What kind of dog do I have?", ("beagle",)),
            ("pet_name", "What's my dog called?", ("waffles",)),
            ("name", "What's my name?", ("mei",)),
            ("job", "What's my job?", ("accountant",)),
            ("city", "Where do I live?", ("singapore",)),
        ),
    ),
    (
        ("Honestly my favourite thing is gardening, I grow tomatoes and herbs.", "Name's Bridget, I'm from Cork."),
        (
            ("hobby", "What's my hobby?", ("garden",)),
            ("name", "What's my name?", ("bridget",)),
            ("city", "Where am I from?", ("cork",)),
        ),
    ),
]
FILLERS = (
    "Can you give me a tip for sleeping better?",
    "What's a good name for a houseplant?",
    "How long should I boil an egg?",
    "Tell me a fun fact about octopuses.",
)


@contextmanager
def chat(model: IdentityModel, *, greedy: bool = False) -> Iterator[Callable[[str, str], str]]:
    """``POST /v1/personas/sia/chat`` in process on ``model`` with a fresh SQLite database: say(user, message) -> the
    reply, at the persona's defaults (seed 0), or greedy."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), log_json=False)
        migrate.upgrade(settings)
        with TestClient(create_app(settings, model=model)) as client:

            def say(user: str, message: str) -> str:
                body: dict[str, object] = {"user": user, "message": message, "seed": 0}
                if greedy:
                    body["temperature"] = 0
                response = client.post("/v1/personas/sia/chat", json=body)
                response.raise_for_status()
                return str(response.json()["reply"])

            yield say


def play(
    users: list[tuple[tuple[str, ...], tuple[Asked, ...]]],
    fillers: tuple[str, ...],
    name: str,
    argv: list[str] | None,
    description: str,
    older: dict[tuple[int, str], tuple[str, ...]] | None = None,
) -> int:
    """Tell each user (``name``-i) their messages, then ``fillers``, then ask each question; print every reply and the
    table per kind, and write every reply to ``--out``. The command line (``description``) of this probe and of those
    that play their own users. ``older``: per (user, kind), the accepted strings of values the user replaced; a reply
    that gives one of them is wrong (counted apart as "older")."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--greedy", action="store_true", help="temperature 0 in every turn (default: the persona's own)")
    ap.add_argument("--out", type=Path, default=None, help="JSON with every reply (default: none)")
    ap.add_argument("--checkpoint", type=Path, default=None, help="the model served (default: the bundled one)")
    args = ap.parse_args(argv)
    rows: list[dict[str, object]] = []
    with chat(load_model(args.checkpoint), greedy=args.greedy) as say:
        for i, (said, asked) in enumerate(users):
            for message in (*said, *fillers):
                say(f"{name}-{i}", message)
            for kind, question, accept in asked:
                reply = say(f"{name}-{i}", question)
                stale = any(mentions(reply, a) for a in (older or {}).get((i, kind), ()))
                right = any(mentions(reply, a) for a in accept) and not stale
                rows.append({"user": i, "kind": kind, "question": question, "reply": reply, "right": right, "older": stale})
                verdict = "older" if stale else "right" if right else "wrong"
                sys.stdout.write(f"{verdict:5s}  {kind:8s} {question} -> {reply}\n")
                sys.stdout.flush()
    by_kind: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        by_kind[str(r["kind"])].append(bool(r["right"]))
    lines = ["", "| kind | right |", "|---|---|"]
    for kind, oks in sorted(by_kind.items()):
        lines.append(f"| {kind} | {sum(oks)} of {len(oks)} ({100 * sum(oks) / len(oks):.0f} %) |")
    total = [bool(r["right"]) for r in rows]
    lines.append(f"| all | {sum(total)} of {len(total)} ({100 * sum(total) / len(total):.1f} %) |")
    every = [all(bool(r["right"]) for r in rows if r["user"] == i) for i in range(len(users))]
    lines.append(f"| every fact of a user | {sum(every)} of {len(every)} users |")
    if older:
        newer = [r for r in rows if (int(str(r["user"])), str(r["kind"])) in older]
        lines.append(
            f"| the newer value, where one was replaced | {sum(bool(r['right']) for r in newer)} of {len(newer)} "
            f"({sum(bool(r['older']) for r in newer)} gave an older one) |"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    if args.out:
        args.out.write_text(json.dumps({"greedy": args.greedy, "rows": rows}, indent=1, ensure_ascii=False) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return play(USERS, FILLERS, "fresh", argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
