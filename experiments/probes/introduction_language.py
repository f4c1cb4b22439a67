"""Do the personas answer a user's introduction in the user's language? A new user's first message often names them
and their home ("Hi! I'm Ana Kowalski, I live in Lisbon"), and the backbone tends to answer a foreign name or place in
that place's language ("Eu estes ao Ana Kowalski, sistema de uma criatura..."). The easy questions of the
reply-quality benchmark hold no such message, so their wrong-language rate (0-4 %) does not see it.

Each introduction below (written by hand for this probe: 40 English messages, names and places from many countries,
openers, asides and lower case as people type them) is sent to a fresh identity of every persona, exactly as the
service builds a turn (``benchmarks.reply_quality.ask``), greedy and at the persona's sampling. A reply drifts when the
reply-quality benchmark calls it the wrong language (``benchmarks.reply_metrics.wrong_language``, whose rule of other
languages' function words was added for this probe: its stopword rule alone read Spanish and German as English).
With ``--ban-first`` a drifted reply is decoded again with its first token banned (logit bias -100), up to three times:
whether the first token decides the reply's language. Since the guard of ``sia.model.language`` ships, every turn
holds its reply's first word back and begins the reply again when that word is another language's: this probe measures
what is left (experiments/LOG.md 2026-12-03 (i) has the figures before it).

    PYTHONPATH=. python -m experiments.probes.introduction_language [--personas sia] [--ban-first] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.reply_metrics import wrong_language
from benchmarks.reply_quality import ask
from sia.checkpoint import load_model
from sia.model.naming import claims_self, doings, speaks_of_self, user_roles
from sia.personas import PERSONAS, persona_sampling

INTRODUCTIONS = (
    "Hi! I'm Ana Kowalski, I live in Lisbon and I work as a nurse. My favourite colour is green and I have a cat.",
    "Hello, my name is Pierre Dubois and I'm an architect in Lyon.",
    "hey, I'm Lucía, I teach primary school in Seville",
    "Good morning! Jonas Becker here, I fix cars for a living in Hamburg.",
    "Hi there. I'm Giulia and I cook in a small trattoria in Bologna.",
    "Olá! Just kidding, I speak English. I'm João, a lawyer from Porto Alegre.",
    "My name's Marisol Etxeberria, I'm a pharmacist, and I live in Bilbao with my two dogs.",
    "I'm Kenji Tanaka, I write software in Osaka. Nice to meet you.",
    "hello!! olga here, I translate books, based in St Petersburg",
    "Hey! Sven Larsson, carpenter, Gothenburg. That's me in a nutshell.",
    "Hi, I'm Fatima Benali. I work as a midwife in Marseille.",
    "Hi, Tomáš Novák here, I bake bread in Brno every morning before sunrise.",
    "Hello! I'm Aroha, I live in Rotorua and I guide tourists around the geysers.",
    "Hi, I'm Chidi Okafor from Enugu, I'm a civil engineer.",
    "hey there, my name is Priya Raghunathan and I'm a dentist in Chennai",
    "Hello! I'm Mateus, I moved to Belo Horizonte last year and I work in a bank.",
    "Hi, Anneke de Vries, veterinarian, Utrecht. Pleased to meet you!",
    "Hey, I'm Dmitri. I drive trams in Kraków.",
    "Hi! I'm Sofía Herrera and I run a flower shop in Valparaíso.",
    "Good evening. My name is Hamid, I'm a taxi driver in Casablanca.",
    "hi, i'm Ines, from Coimbra, studying to be a physiotherapist",
    "Hello, I am François Lefèvre, I restore old furniture in Bordeaux.",
    "Hey! Call me Bea. I'm a firefighter in Valencia and I love the sea.",
    "Hi, I'm Lukas Schneider, a music teacher in Graz.",
    "Hello there! I'm Zanele Dlamini and I'm a journalist in Durban.",
    "Hi, my name is Nguyen Thi Lan and I sew wedding dresses in Hanoi.",
    "Heya, I'm Mirela, a hairdresser in Cluj-Napoca.",
    "Hello, I'm Javier Morales, I manage a hotel in Cancún.",
    "Hi! Ewa Nowak, I'm an accountant in Gdańsk, nice to meet you.",
    "I'm Rafael and I grow coffee near Manizales, in Colombia.",
    "Hi, I'm Björn, I fish for a living off the coast of Tromsø.",
    "Hello! My name is Ayşe Yılmaz and I'm a pilot based in Izmir.",
    "hey I'm Matteo, barista in Turin, what's up",
    "Hi, I'm Catarina Sousa. I'm an architect and I live in Braga.",
    "Good afternoon, I'm Henrik Nielsen, a nurse at a hospital in Aarhus.",
    "Hi! I'm Léa, I make cheese on a farm near Annecy.",
    "Hi there, Esteban here. I'm a surf instructor in Máncora, Peru.",
    "Hello, I'm Katarzyna, but everyone calls me Kasia. I'm a librarian in Wrocław.",
    "Hi! My name is Paulo and I teach history in Maputo.",
    "Hey, I'm Ingrid Johansson and I'm a photographer living in Uppsala.",
)

# each introduction's user, by the first name they give (written by hand beside the messages): a reply that says
# "I'm <name>" speaks as the user
USERS = (
    "Ana", "Pierre", "Lucía", "Jonas", "Giulia", "João", "Marisol", "Kenji", "Olga", "Sven", "Fatima", "Tomáš", "Aroha",
    "Chidi", "Priya", "Mateus", "Anneke", "Dmitri", "Sofía", "Hamid", "Ines", "François", "Bea", "Lukas", "Zanele",
    "Nguyen", "Mirela", "Javier", "Ewa", "Rafael", "Björn", "Ayşe", "Matteo", "Catarina", "Henrik", "Léa", "Esteban",
    "Katarzyna", "Paulo", "Ingrid",
)  # fmt: skip


def speaks_as(user: str, reply: str) -> bool:
    """Whether ``reply`` gives the user's name as its speaker's ("I'm Rafael", "my name is Ana")."""
    return re.search(r"(?i)\b(?:i'm|i’m|i am|my name is|my name's|call me)\s+" + re.escape(user) + r"\b", reply) is not None


def other_names(persona: str, reply: str) -> list[str]:
    """The capitalised names ``reply`` gives as its speaker's that are not the persona's ("I am Elena", "I'm Monsieur")."""
    said = re.finditer(r"(?i:\b(?:i'm|i’m|i am|my name is|my name's|call me))\s+([A-Z][^\W\d_]*)", reply)
    return [m.group(1) for m in said if m.group(1).lower() != persona]


def takes_roles(message: str, reply: str) -> list[str]:
    """The words the user said of themself (``sia.model.naming.user_roles``: "firefighter", "Valencia") that ``reply``
    says right after its own "I'm a", "I live in" (``claims_self``): "i'm a firefighter in valencia" gives firefighter."""
    roles = {w.lower() for w in user_roles(message)}
    return [m.group() for m in re.finditer(r"[^\W\d_]+", reply) if m.group().lower() in roles and claims_self(reply[: m.start()])]


# a reply that speaks as if the persona stood where the user lives or works: it welcomes them to its place ("Welcome to
# my lovely city", "Welcome to the beautiful island of Máncora", "my humble abode"), calls the user's place, work or
# team its own or ours ("our little corner of Italy", "What brings you to my shop today?"), takes up the user's
# work as theirs ("I'm your chef", "we're a team of lawyers", "here at the Institute"), or has them visiting it
_PLACE = (
    r"city|town|village|country|island|corner|team|community|office|shop|store|restaurant|trattoria|bistro|clinic|"
    r"hospital|school|classroom|farm|home|house|hotel|salon|garage|bakery|library|bedside|blog|show|neck of the woods"
)
HOST = re.compile(
    r"(?i)welcome to (?:my|our|this|the (?:beautiful|lovely|little|wonderful|charming|vibrant|historic|city|town)\b)"
    r"|humble abode"
    rf"|\bour (?:beautiful |lovely |little |wonderful |charming |small |cozy |own )?(?:{_PLACE})\b"
    rf"|\bmy (?:beautiful |lovely |little |cozy |own )?(?:{_PLACE})\b"
    r"|\bi'?m your (?:\w+ )?(?:chef|dentist|guide|doctor|nurse|teacher|pilot|host|barista|colleague|lawyer)"
    r"|we'?re a team|here at |visit us|to have you visit|i'?ve been working"
)


def hosts(reply: str) -> bool:
    """Whether ``reply`` speaks as the host of the user's place or work (``HOST``)."""
    return HOST.search(reply) is not None


def own_roles(message: str, reply: str) -> list[str]:
    """The words the user said of what they do (``doings``: not a name or a place) that ``reply`` says anywhere in a
    clause about its speaker (``speaks_of_self``): "and i grow coffee", "welcome to my flower shop"."""
    roles = {w.lower() for w in doings(message)}
    words = re.finditer(r"[^\W\d_]+", reply)
    return [m.group() for m in words if m.group().lower() in roles and speaks_of_self(reply[: m.start()])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--personas", nargs="+", default=sorted(PERSONAS))
    ap.add_argument("--ban-first", action="store_true", help="decode a drifted reply again without its first token")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "introduction_language.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    model = load_model()
    messages = [{"id": str(i), "question": m} for i, m in enumerate(INTRODUCTIONS)]
    found: dict[str, Any] = {"introductions": len(messages), "runs": {}}
    for persona in args.personas:
        sampled = persona_sampling(model, persona)
        for mode, params in (("greedy", replace(sampled, temperature=0.0)), ("sampled", sampled)):
            replies = ask(model, persona, messages, params, batch=8)
            rows = [
                {
                    "message": m["question"],
                    "reply": r["reply"],
                    "drifts": wrong_language(r["reply"]),
                    "as_user": speaks_as(user, r["reply"]),
                    "other_names": other_names(persona, r["reply"]),
                    "takes_roles": takes_roles(m["question"], r["reply"]),
                    "own_roles": own_roles(m["question"], r["reply"]),
                    "hosts": hosts(r["reply"]),
                }
                for m, r, user in zip(messages, replies, USERS, strict=True)
            ]
            if args.ban_first:
                for m, r, row in zip(messages, replies, rows, strict=True):
                    banned: list[int] = []
                    reply = r
                    while wrong_language(reply["reply"]) and len(banned) < 3 and reply["tokens"]:
                        banned.append(reply["tokens"][0])
                        again = replace(params, logit_bias=tuple((t, -100.0) for t in banned))
                        reply = ask(model, persona, [m], again, batch=1)[0]
                    if banned:
                        row["banned"] = [model.tokenizer.decode([t]) for t in banned]
                        row["after_ban"] = reply["reply"]
                        row["drifts_after_ban"] = wrong_language(reply["reply"])
            n = sum(row["drifts"] for row in rows)
            as_user = sum(row["as_user"] for row in rows)
            named = sum(bool(row["other_names"]) for row in rows)
            roles = sum(bool(row["takes_roles"]) for row in rows)
            own = sum(bool(row["own_roles"]) for row in rows)
            host = sum(row["hosts"] for row in rows)
            run = {
                "drifted": n,
                "rate": n / len(rows),
                "as_user": as_user,
                "other_names": named,
                "takes_roles": roles,
                "own_roles": own,
                "hosts": host,
                "replies": rows,
            }
            if args.ban_first:
                run["drifted_after_ban"] = sum(row.get("drifts_after_ban", row["drifts"]) for row in rows)
            found["runs"][f"{persona}/{mode}"] = run
            after = f", {run['drifted_after_ban']} after banning first tokens" if args.ban_first else ""
            sys.stdout.write(
                f"{persona} {mode}: {n}/{len(rows)} drift{after}; {as_user} speak as the user, {named} name another, "
                f"{roles} take what the user is, {own} say it of themselves, {host} speak as the host of the user's place\n"
            )
            sys.stdout.flush()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
