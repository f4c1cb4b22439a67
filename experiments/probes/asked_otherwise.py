"""Recall where a new user asks otherwise than the sets do: 16 users written apart from every set the project trains,
tunes or measures on, each telling persona ``sia`` a few facts, then eight turns of their own chatter (first-person
asides and requests, so that the imprint meets the user's talk that is not a fact), then questions worded as people
ask them: indirectly ("Do you remember where I live?", "Can you remind me what I do?"), two facts in one question,
"What do you know about me?", kinds beyond the six the figures count (a sister's name, a birthday, an employer), and
one question per user about a fact the user never told (a reply that names a value of that kind there is made up).
Played over ``POST /v1/personas/sia/chat`` in process on the bundled checkpoint (``fresh_users.chat``), at the
persona's defaults or greedy.

    PYTHONPATH=. python -m experiments.probes.asked_otherwise [--greedy] [--out FILE]

A reply is right when it gives, for every fact the question asks, one of its accepted strings at the start of a word
(``sia.learn.natural.mentions``); a question about a fact never told is counted as made up when the reply names any
value of its kind from ``NEVER_TOLD``'s list. Not a part of any choice.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from experiments.probes.fresh_users import chat
from sia.checkpoint import load_model
from sia.learn.natural import mentions

# (form, question, accepted strings per fact asked); form names the way of asking
Asked = tuple[str, str, tuple[tuple[str, ...], ...]]
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...], str]] = [
    (
        ("Hi, I'm Lorenzo, I run a small bakery in Turin.", "My sister Giulia is visiting next week, so excited"),
        (
            ("indirect", "Do you remember where I live?", (("turin", "torino"),)),
            ("two facts", "What's my name and what do I do?", (("lorenzo",), ("bak",))),
            ("other kind", "What's my sister called?", (("giulia",),)),
        ),
        "colour",
    ),
    (
        ("hello! Aiko here. I'm a translator, I work from home in Osaka", "I've got two cats, Mochi and Yuzu"),
        (
            ("indirect", "Can you remind me what I do for a living?", (("translat",),)),
            ("indirect", "You know my name, right?", (("aiko",),)),
            ("about me", "What do you know about me?", (("aiko",), ("osaka",), ("translat",))),
            ("plain", "What pets do I have?", (("cat",),)),
        ),
        "hobby",
    ),
    (
        (
            "My name is Olusegun but everyone calls me Segun.",
            "I'm a civil engineer, currently working on a bridge in Abuja.",
        ),
        (
            ("indirect", "Do you recall what my job is?", (("engineer", "civil"),)),
            ("indirect", "Where did I say I was working?", (("abuja",),)),
            ("plain", "What do people call me?", (("segun", "olusegun"),)),
        ),
        "pet",
    ),
    (
        ("Hey! Just turned 30 yesterday, my birthday's on the 14th of March", "I'm Clara, I teach yoga in Vienna"),
        (
            ("other kind", "When is my birthday?", (("14", "fourteenth"),)),
            ("two facts", "Where do I live and what do I teach?", (("vienna", "wien"), ("yoga",))),
            ("indirect", "Sorry, what was my name again?", (("clara",),)),
        ),
        "pet",
    ),
    (
        ("I'm Tomasz, I work for Siemens as an electrician.", "We live in Gdansk, near the old shipyard."),
        (
            ("other kind", "Which company do I work for?", (("siemens",),)),
            ("indirect", "Do you remember my job?", (("electric",),)),
            ("indirect", "Any idea where I live?", (("gdansk", "gdańsk"),)),
        ),
        "colour",
    ),
    (
        ("so my favourite colour is burgundy, random fact about me", "oh and I keep bees! got three hives"),
        (
            ("indirect", "Do you remember my favourite colour?", (("burgundy",),)),
            ("indirect", "What animals did I say I keep?", (("bee",),)),
        ),
        "city",
    ),
    (
        ("Hi, I'm Esperanza. I'm a midwife.", "I live in Oaxaca with my husband Raúl."),
        (
            ("indirect", "Can you tell me what my job is?", (("midwife",),)),
            ("other kind", "What's my husband's name?", (("raúl", "raul"),)),
            ("about me", "Tell me what you remember about me.", (("esperanza",), ("midwife",), ("oaxaca",))),
        ),
        "hobby",
    ),
    (
        ("hiya, Callum here, I drive trucks across Scotland", "Based in Inverness, if you're wondering"),
        (
            ("indirect", "Do you know what I do?", (("truck", "lorry", "driv"),)),
            ("indirect", "Where am I based again?", (("inverness",),)),
            ("plain", "What is my name?", (("callum",),)),
        ),
        "colour",
    ),
    (
        ("I'm Ngozi and I'm studying medicine in Lagos.", "My hobby is chess, I play online most nights."),
        (
            ("two facts", "What's my name and where do I study?", (("ngozi",), ("lagos",))),
            ("indirect", "Remember what game I play?", (("chess",),)),
        ),
        "pet",
    ),
    (
        ("Good evening. My name is Henrik and I'm a carpenter.", "My favourite colour is forest green."),
        (
            ("indirect", "Would you remind me of my name?", (("henrik",),)),
            ("indirect", "What did I tell you my favourite colour was?", (("green", "forest green"),)),
            ("plain", "What's my trade?", (("carpent",),)),
        ),
        "city",
    ),
    (
        ("we adopted a greyhound last week! his name is Rocket", "I'm Priyanka, an accountant in Toronto"),
        (
            ("indirect", "Do you remember what kind of dog I adopted?", (("greyhound",),)),
            ("other kind", "What's my dog's name?", (("rocket",),)),
            ("two facts", "Where do I live and what's my job?", (("toronto",), ("accountant",))),
        ),
        "colour",
    ),
    (
        ("I'm Mateus, I'm a dentist.", "I moved from Recife to Lisbon two years ago."),
        (
            ("indirect", "Where do I live these days?", (("lisbon", "lisboa"),)),
            ("indirect", "Do you know my profession?", (("dentist",),)),
            ("plain", "What's my name?", (("mateus",),)),
        ),
        "hobby",
    ),
    (
        ("My name's Shirin. I paint murals for a living.", "In my spare time I go birdwatching in the marshes."),
        (
            ("indirect", "What did I say I do in my spare time?", (("bird",),)),
            ("indirect", "Do you remember how I earn a living?", (("mural", "paint"),)),
            ("about me", "What do you know about me?", (("shirin",), ("mural", "paint"))),
        ),
        "city",
    ),
    (
        ("hey, I'm Jonas, I'm a paramedic in Munich", "and I have a tortoise called Sheldon haha"),
        (
            ("indirect", "What pet did I mention?", (("tortoise",),)),
            ("other kind", "What's my tortoise called?", (("sheldon",),)),
            ("indirect", "Do you still know where I work?", (("munich", "münchen"),)),
        ),
        "colour",
    ),
    (
        ("I work at Google as a product manager.", "I'm Rebecca by the way, I live in Dublin."),
        (
            ("other kind", "Who do I work for?", (("google",),)),
            ("indirect", "Do you remember my name?", (("rebecca",),)),
            ("two facts", "What's my job and where do I live?", (("product",), ("dublin",))),
        ),
        "pet",
    ),
    (
        ("Hi there! I'm Amadou, a taxi driver in Dakar.", "Yellow is my favourite colour, like my taxi!"),
        (
            ("indirect", "Can you remember my favourite colour?", (("yellow",),)),
            ("indirect", "What did I say my job was?", (("taxi",),)),
            ("plain", "Where do I live?", (("dakar",),)),
        ),
        "hobby",
    ),
]
CHATTER = (
    "I'm so tired today, work was brutal.",
    "Can you suggest something quick for lunch?",
    "My neighbour's dog barked all night, ugh.",
    "What's a good way to stay focused?",
    "I think I need a holiday soon.",
    "How many cups are in a litre?",
    "I just had the best coffee of my week.",
    "Any tips for keeping plants alive?",
)
NEVER_TOLD = {
    "colour": (
        "What's my favourite colour?",
        ("red", "blue", "green", "yellow", "purple", "orange", "pink", "black", "white", "teal", "navy", "gold"),
    ),
    "pet": ("What pet do I have?", ("dog", "cat", "fish", "bird", "parrot", "hamster", "rabbit", "turtle", "puppy")),
    "city": (
        "Which city do I live in?",
        ("london", "paris", "new york", "los angeles", "tokyo", "berlin", "chicago", "seattle", "boston"),
    ),
    "hobby": ("What's my hobby?", ("paint", "read", "hik", "garden", "cook", "swim", "danc", "music", "knit")),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--greedy", action="store_true", help="temperature 0 in every turn (default: the persona's own)")
    ap.add_argument("--out", type=Path, default=None, help="JSON with every reply (default: none)")
    args = ap.parse_args(argv)
    rows: list[dict[str, object]] = []
    with chat(load_model(None), greedy=args.greedy) as say:
        for i, (said, asked, untold) in enumerate(USERS):
            for message in (*said, *CHATTER):
                say(f"asked-{i}", message)
            for form, question, accept in asked:
                reply = say(f"asked-{i}", question)
                got = sum(any(mentions(reply, a) for a in fact) for fact in accept)
                rows.append({"user": i, "form": form, "question": question, "reply": reply, "facts": len(accept), "got": got})
                sys.stdout.write(f"{got}/{len(accept)}  {form:10s} {question} -> {reply}\n")
                sys.stdout.flush()
            question, values = NEVER_TOLD[untold]
            reply = say(f"asked-{i}", question)
            made_up = [v for v in values if mentions(reply, v)]
            rows.append({"user": i, "form": "never told", "question": question, "reply": reply, "made_up": made_up})
            sys.stdout.write(f"{'made up' if made_up else 'ok':6s} never told {question} -> {reply}\n")
            sys.stdout.flush()
    by_form: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        if r["form"] != "never told":
            by_form[str(r["form"])].append((int(str(r["got"])), int(str(r["facts"]))))
    lines = ["", "| asked | questions wholly right | facts right |", "|---|---|---|"]
    for form, pairs in sorted(by_form.items()):
        whole = sum(g == n for g, n in pairs)
        facts = sum(g for g, _ in pairs), sum(n for _, n in pairs)
        lines.append(f"| {form} | {whole} of {len(pairs)} | {facts[0]} of {facts[1]} |")
    never = [r for r in rows if r["form"] == "never told"]
    lines.append(f"| never told: a value made up | {sum(bool(r['made_up']) for r in never)} of {len(never)} | |")
    sys.stdout.write("\n".join(lines) + "\n")
    if args.out:
        args.out.write_text(json.dumps({"greedy": args.greedy, "rows": rows}, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
