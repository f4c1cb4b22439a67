"""Questions that name a kind of fact but ask for none of the user's: does the persona answer them with the user's own?

Two measures, on questions written here apart from the ask head's data (``read_templates.json``'s questions and
``near_asks``, the natural set):

* ``heads``: the ask head on 60 questions about the user's facts (10 for each main kind, each to be read as that kind
  with p(none) < 1/2, and not taken for a question of the persona) and 20 that ask for none (10 of the persona:
  "What's your name?", "Where do you live?"; 10 of the world: "What colour is the sky?"; each to be read with
  p(none) >= 1/2 or, as the turn reads it, taken for a question of the persona, which reads no imprint:
  ``sia.model.language.of_the_persona``). No generation.
* ``served``: over ``POST /v1/personas/sia/chat`` in process (the bundled checkpoint, a fresh SQLite database, the
  persona's defaults), ``--users`` users each tell four facts in one message, chat about two everyday things, then are
  asked six questions of the persona or of the world that name those kinds; a reply that gives one of the user's own
  values is a **leak** ("What's your name?" -> "Darnell, if I remember correctly."). The same users are then asked
  about their own facts (recall, the price a stricter ask head might pay).

    PYTHONPATH=. python -m experiments.probes.near_asks [--checkpoint PATH] [--skip-served] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from experiments.probes.fresh_users import chat
from sia.checkpoint import load_model
from sia.identity.imprint import KINDS
from sia.learn.natural import mentions
from sia.model.language import of_the_persona

ABOUT_THE_USER = {
    "name": (
        "What's my name?",
        "Do you remember what I'm called?",
        "who am i",
        "Say my name!",
        "what did I say my name was?",
        "Can you tell me my name?",
        "How did I introduce myself?",
        "what should you call me?",
        "Remember me? What's my name?",
        "Do you know who you're talking to?",
    ),
    "city": (
        "Where do I live?",
        "what city am I in",
        "Do you remember where I'm based?",
        "Which town do I call home?",
        "where's home for me?",
        "Which city did I move to?",
        "What city did I say I live in?",
        "Remind me of the city I live in?",
        "where did i say i was living",
        "In which city do I live?",
    ),
    "job": (
        "What do I do for a living?",
        "what's my job",
        "Do you remember my profession?",
        "What's my line of work?",
        "what do I work as?",
        "what do i do all day at work",
        "Remind me what my occupation is.",
        "How do I earn my money?",
        "What did I tell you about my work?",
        "What's my trade?",
    ),
    "colour": (
        "What's my favourite colour?",
        "which color do i like best",
        "Do you remember my favorite color?",
        "What colour did I say I love?",
        "fav colour?",
        "What shade do I like most?",
        "Which colour is mine?",
        "Remind me which colour I prefer.",
        "what's my color",
        "If I had to pick one colour, which would it be?",
    ),
    "pet": (
        "What pet do I have?",
        "what animal do i live with",
        "Do you remember my pet?",
        "What kind of animal is my pet?",
        "Which pet did I mention?",
        "do i have a dog or a cat?",
        "What's waiting for me at home, furry friend-wise?",
        "What sort of pet do I own?",
        "Remind me what pet I keep.",
        "what animal did i tell you about",
    ),
    "hobby": (
        "What's my hobby?",
        "what do i do for fun",
        "Do you remember what I do in my free time?",
        "What do I like doing on weekends?",
        "What's my favourite pastime?",
        "How do I relax?",
        "what am I into?",
        "Remind me of my hobby.",
        "What do I do when I'm not working?",
        "Which activity did I say I love?",
    ),
}
OF_THE_PERSONA = (
    "What's your name?",
    "Where do you live?",
    "What's your favourite colour?",
    "What do you do for a living?",
    "Tell me about yourself.",
    "Who are you?",
    "Do you have a pet?",
    "What's your hobby?",
    "What city were you born in?",
    "What name would you give yourself?",
)
OF_THE_WORLD = (
    "What is the capital of France?",
    "Where do penguins live?",
    "What's a good job for someone who likes maths?",
    "What colour is the sky?",
    "What pet is easiest for a child?",
    "Suggest a hobby for winter.",
    "Who wrote Hamlet?",
    "What colour is grass?",
    "What's the best city to visit in Italy?",
    "What is a popular name for a dog?",
)
# (message, {kind: (value's accepted strings)}): four facts in one message
USERS: tuple[tuple[str, dict[str, tuple[str, ...]]], ...] = (
    ("Hi! I'm Darnell, I drive a bus in Atlanta. My favourite colour is teal and I have a parrot.",
     {"name": ("darnell",), "city": ("atlanta",), "colour": ("teal",), "pet": ("parrot",)}),
    ("Hello, I'm Ingrid, a dentist in Bergen. I play the cello and my favourite colour is orange.",
     {"name": ("ingrid",), "city": ("bergen",), "job": ("dentist",), "colour": ("orange",)}),
    ("hey, Tomasz here, electrician from Gdansk, and I keep a tortoise called Stefan",
     {"name": ("tomasz",), "city": ("gdansk", "gdańsk"), "job": ("electrician",), "pet": ("tortoise",)}),
    ("My name is Amara and I teach maths in Lagos. I love purple and I go salsa dancing on Fridays.",
     {"name": ("amara",), "city": ("lagos",), "colour": ("purple",), "hobby": ("salsa",)}),
    ("I'm Henrik, a baker in Malmö, and my hobby is sailing. I also have a hamster.",
     {"name": ("henrik",), "city": ("malmö", "malmo"), "hobby": ("sailing",), "pet": ("hamster",)}),
    ("Hi there, I'm Lucia from Valencia, I work as a pharmacist and my favourite colour is yellow.",
     {"name": ("lucia",), "city": ("valencia",), "job": ("pharmacist",), "colour": ("yellow",)}),
)  # fmt: skip
NEAR = ("What's your name?", "Where do you live?", "What colour is the sky?", "What pet is easiest for a child?",
        "Tell me about yourself.", "What do you do for a living?")  # fmt: skip
OWN = {
    "name": "What's my name?",
    "city": "Where do I live?",
    "job": "What's my job?",
    "colour": "What's my favourite colour?",
    "pet": "What pet do I have?",
    "hobby": "What's my hobby?",
}
FILLERS = ("How long should I boil an egg?", "Can you give me a tip for sleeping better?")


def heads(model: Any) -> dict[str, Any]:
    """The ask head's reading of every question above: right per kind, and the misread ones."""
    tok = model.tokenizer

    def message(text: str) -> list[int]:
        tokens, (start, end) = tok.turn_prompt(text, [])
        return list(tokens[start : end - 1])

    out: dict[str, Any] = {"right": {}, "misread": []}
    groups = {**ABOUT_THE_USER, "persona": OF_THE_PERSONA, "world": OF_THE_WORLD}
    for group, questions in groups.items():
        p = model.asked_kinds([message(q) for q in questions])
        right = 0
        for q, row in zip(questions, p, strict=True):
            p_none, top, persona = float(row[0]), KINDS[int(row.argmax())], of_the_persona(q)
            ok = p_none >= 0.5 or persona if group in ("persona", "world") else (p_none < 0.5 and top == group and not persona)
            right += ok
            if not ok:
                out["misread"].append(
                    {"group": group, "question": q, "read_as": top, "p_none": round(p_none, 3), "persona": persona}
                )
        out["right"][group] = f"{right} of {len(questions)}"
    return out


def served(model: Any) -> dict[str, Any]:
    """The users' leaks and recall over the chat route."""
    rows: list[dict[str, Any]] = []
    with chat(model) as say:
        for i, (told, facts) in enumerate(USERS):
            for text in (told, *FILLERS):
                say(f"near-{i}", text)
            for q in NEAR:
                reply = say(f"near-{i}", q)
                leaked = sorted(k for k, accept in facts.items() if any(mentions(reply, a) for a in accept))
                rows.append({"user": i, "question": q, "reply": reply, "leaks": leaked, "asks": None})
            for kind, accept in facts.items():
                reply = say(f"near-{i}", OWN[kind])
                right = any(mentions(reply, a) for a in accept)
                rows.append({"user": i, "question": OWN[kind], "reply": reply, "leaks": None, "asks": kind, "right": right})
    near = [r for r in rows if r["asks"] is None]
    own = [r for r in rows if r["asks"] is not None]
    return {
        "leaks": f"{sum(bool(r['leaks']) for r in near)} of {len(near)}",
        "recall": f"{sum(r['right'] for r in own)} of {len(own)}",
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--skip-served", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    model = load_model(args.checkpoint)
    result: dict[str, Any] = {"checkpoint": str(args.checkpoint or "bundled"), "heads": heads(model)}
    if not args.skip_served:
        result["served"] = served(model)
    lines = [f"ask head, read right: {result['heads']['right']}"]
    lines += [f"  misread: {m}" for m in result["heads"]["misread"]]
    if "served" in result:
        s = result["served"]
        lines += [f"{'LEAK' if r['leaks'] else 'ok  '} {r['question']} -> {r['reply']}" for r in s["rows"] if r["asks"] is None]
        lines += [f"{'right' if r['right'] else 'wrong'} {r['question']} -> {r['reply']}" for r in s["rows"] if r["asks"]]
        lines.append(f"leaks: {s['leaks']}; recall of the users' own facts: {s['recall']}")
    sys.stdout.write("\n".join(lines) + "\n")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
