"""Recall of facts users set out as a list, as someone setting up a companion does: 12 users written apart from every
set the project trains, tunes or measures on, each telling persona ``sia`` four to six facts in one message as
fields ("Name: Leo Park"), bullets, a line per fact, or a profile in a row ("Leo, 34, baker, Busan"), then four
everyday requests, then a question per fact. Played over ``POST /v1/personas/sia/chat`` as
``experiments.probes.fresh_users`` plays its users; a reply is right when it gives one of the fact's accepted
strings at the start of a word.

    PYTHONPATH=. python -m experiments.probes.listed_facts [--greedy] [--out FILE]

A check written apart, as a new user meets the persona: it is not a part of any choice.
"""

from __future__ import annotations

import sys

from experiments.probes.fresh_users import Asked, play

NAME, CITY, JOB, COLOUR, PET, HOBBY = (
    ("name", "What's my name?"),
    ("city", "Where do I live?"),
    ("job", "What do I do for work?"),
    ("colour", "What's my favourite colour?"),
    ("pet", "What pet do I have?"),
    ("hobby", "What's my hobby?"),
)


def asked(*facts: tuple[tuple[str, str], tuple[str, ...]]) -> tuple[Asked, ...]:
    """Each fact's (kind, question) with its accepted strings."""
    return tuple((kind, question, accept) for (kind, question), accept in facts)


# (messages, [(kind, question, accepted strings)])
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        ("Some things to remember about me:\nName: Leo Park\nCity: Busan\nJob: baker\nFavourite colour: orange",),
        asked((NAME, ("leo",)), (CITY, ("busan",)), (JOB, ("baker", "bak")), (COLOUR, ("orange",))),
    ),
    (
        ("About me:\n- I'm Svetlana\n- I live in Novosibirsk\n- I'm a geologist\n- I have a husky\n- I love skiing",),
        asked((NAME, ("svetlana",)), (CITY, ("novosibirsk",)), (JOB, ("geolog",)), (PET, ("husky",)), (HOBBY, ("ski",))),
    ),
    (
        ("Quick profile so you know who you're talking to: Amara, 29, nurse, Accra. Cat person. Favourite colour yellow.",),
        asked((NAME, ("amara",)), (JOB, ("nurse",)), (CITY, ("accra",)), (PET, ("cat",)), (COLOUR, ("yellow",))),
    ),
    (
        ("name - Jonas\nhome - Aarhus\nwork - electrician\nhobby - sea kayaking",),
        asked((NAME, ("jonas",)), (CITY, ("aarhus",)), (JOB, ("electric",)), (HOBBY, ("kayak",))),
    ),
    (
        (
            "Let me introduce myself properly. 1) My name is Priscila. 2) I'm from Belo Horizonte. 3) I work as a "
            "physiotherapist. 4) My favourite colour is turquoise.",
        ),
        asked((NAME, ("priscila",)), (CITY, ("belo horizonte",)), (JOB, ("physio",)), (COLOUR, ("turquoise",))),
    ),
    (
        ("Facts about me: I'm Wiremu. Auckland. Builder. Two kunekune pigs. Play rugby on weekends.",),
        asked((NAME, ("wiremu",)), (CITY, ("auckland",)), (JOB, ("build",)), (PET, ("pig", "kunekune")), (HOBBY, ("rugby",))),
    ),
    (
        ("Hi! My details: Chiara Bianchi / Bologna / architect / favourite colour: sage green",),
        asked((NAME, ("chiara",)), (CITY, ("bologna",)), (JOB, ("architect",)), (COLOUR, ("sage", "green"))),
    ),
    (
        ("For your memory:\n• name: Omar\n• city: Casablanca\n• job: taxi driver\n• pet: a parrot called Zizou",),
        asked((NAME, ("omar",)), (CITY, ("casablanca",)), (JOB, ("taxi", "driv")), (PET, ("parrot",))),
    ),
    (
        ("Ok so: I'm Haruto, I'm an engineer, I live in Nagoya, I have a shiba inu, and I do judo.",),
        asked((NAME, ("haruto",)), (JOB, ("engineer",)), (CITY, ("nagoya",)), (PET, ("shiba",)), (HOBBY, ("judo",))),
    ),
    (
        ("Remember these please. Name: Fionnuala. Lives: Galway. Works: vet. Likes: sea swimming, the colour navy.",),
        asked((NAME, ("fionnuala",)), (CITY, ("galway",)), (JOB, ("vet",)), (HOBBY, ("swim",)), (COLOUR, ("navy",))),
    ),
    (
        ("me in five words: Tariq, pilot, Doha, falcons, chess",),
        asked((NAME, ("tariq",)), (JOB, ("pilot",)), (CITY, ("doha",)), (PET, ("falcon",)), (HOBBY, ("chess",))),
    ),
    (
        ("Name's Beatriz. Job: lawyer. City: Valencia. Fave colour: red. Pet: a rabbit. Hobby: salsa dancing.",),
        asked(
            (NAME, ("beatriz",)),
            (JOB, ("lawyer",)),
            (CITY, ("valencia",)),
            (COLOUR, ("red",)),
            (PET, ("rabbit",)),
            (HOBBY, ("salsa", "danc")),
        ),
    ),
]
FILLERS = (
    "What's the tallest mountain in Africa?",
    "Suggest a name for a book club.",
    "How do I keep basil alive indoors?",
    "Why do cats purr?",
)


def main(argv: list[str] | None = None) -> int:
    return play(USERS, FILLERS, "listed", argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
