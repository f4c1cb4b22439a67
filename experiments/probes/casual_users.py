"""Recall for users who write as people type in a chat window: lower case throughout, little punctuation, greetings
stretched ("hiii", "heyyy"), a name given as "x here" or "its x", a city as slang or an abbreviation-free nickname of
a street, a job told in passing inside a complaint, a pet by what it does, emoji. 24 users written apart from every set
the project trains, tunes or measures on, one to three messages each, then four everyday requests of their own, then
a question per fact in the users' own style. Played over ``POST /v1/personas/sia/chat`` as
``experiments.probes.fresh_users`` plays its users (in process, the bundled checkpoint, a fresh SQLite database, the
persona's defaults or ``--greedy``); a reply is right when it gives one of the fact's accepted strings at the start of
a word (``sia.learn.natural.mentions``).

    PYTHONPATH=. python -m experiments.probes.casual_users [--greedy] [--out FILE]

A check written apart, as a new user meets the persona: it is not a part of any choice.
"""

from __future__ import annotations

import sys

from experiments.probes.fresh_users import Asked, play

# (messages, [(kind, question, accepted strings)])
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        ("hiii 🌼 tove here", "im a dental nurse in malmö and honestly my feet hurt"),
        (
            ("name", "whats my name", ("tove",)),
            ("job", "what do i do again", ("dental", "nurse")),
            ("city", "where do i live", ("malmö", "malmo")),
        ),
    ),
    (
        ("heyyy its dario", "i do bouldering like 4 times a week its my whole life tbh"),
        (
            ("name", "who am i", ("dario",)),
            ("hobby", "what sport am i obsessed with", ("boulder", "climb")),
        ),
    ),
    (
        ("yo. name's kwabena, call me kb", "i drive trucks between tema and kumasi, long hauls"),
        (
            ("name", "what should you call me", ("kb", "kwabena")),
            ("job", "whats my job", ("truck", "driv")),
        ),
    ),
    (
        ("hello!! i'm ngaio and i live in whanganui with my cat pōhutu 🐈",),
        (
            ("name", "what's my name?", ("ngaio",)),
            ("city", "which town do i live in?", ("whanganui",)),
            ("pet", "what animal do i have?", ("cat",)),
        ),
    ),
    (
        ("ok so quick intro: ingrid, 34, vet tech, tromsø", "fav colour is mustard yellow if that matters lol"),
        (
            ("name", "what's my name", ("ingrid",)),
            ("job", "what's my job", ("vet",)),
            ("city", "where am i", ("tromsø", "tromso")),
            ("colour", "what's my favourite colour", ("mustard",)),
        ),
    ),
    (
        ("sup i'm javi from valparaíso", "i teach guitar to kids after school, its chaotic but fun"),
        (
            ("name", "what's my name", ("javi",)),
            ("city", "where am i from", ("valpara",)),
            ("job", "what do i do for work", ("guitar", "teach")),
        ),
    ),
    (
        ("good morning from the night shift 😵 im a security guard at a mall in cebu",),
        (
            ("job", "what's my job", ("security", "guard")),
            ("city", "what city do i work in", ("cebu",)),
        ),
    ),
    (
        ("hi, my names priya btw", "my parrot keeps screaming at the neighbours cat lmao"),
        (
            ("name", "what's my name?", ("priya",)),
            ("pet", "what pet do i have?", ("parrot",)),
        ),
    ),
    (
        ("heya, tomás here 👋 i just moved to rosario for uni",),
        (
            ("name", "what's my name", ("tomás", "tomas")),
            ("city", "which city did i move to", ("rosario",)),
        ),
    ),
    (
        ("my favourite colour is teal and i will die on this hill", "also i'm zainab"),
        (
            ("name", "what's my name", ("zainab",)),
            ("colour", "what colour do i love", ("teal",)),
        ),
    ),
    (
        ("evening! wiremu here. i fix boat engines down at the marina in tauranga",),
        (
            ("name", "who am i", ("wiremu",)),
            ("job", "what do i fix for a living", ("boat", "engine", "mechanic")),
            ("city", "which town's marina do i work at", ("tauranga",)),
        ),
    ),
    (
        ("i knit. a lot. like scarves for everyone i've ever met 🧶", "oh and im lucía, from zaragoza"),
        (
            ("name", "what's my name?", ("lucía", "lucia")),
            ("city", "where am i from?", ("zaragoza",)),
            ("hobby", "what's my hobby?", ("knit",)),
        ),
    ),
    (
        ("hey there. i'm an electrician in leeds, name's callum",),
        (
            ("name", "what's my name", ("callum",)),
            ("job", "what do i do", ("electrician",)),
            ("city", "where do i work", ("leeds",)),
        ),
    ),
    (
        ("hola! its valentina, i have the laziest bulldog in all of montevideo",),
        (
            ("name", "what's my name", ("valentina",)),
            ("pet", "what kind of dog do i have", ("bulldog",)),
            ("city", "what city do i live in", ("montevideo",)),
        ),
    ),
    (
        ("hru? im okay just tired from work, i'm a line cook", "btw the name is oluwaseun, seun for short"),
        (
            ("name", "what's my name", ("seun", "oluwaseun")),
            ("job", "what's my job", ("cook",)),
        ),
    ),
    (
        ("heyy!! so i'm maja and i play handball on weekends 🤾", "i live in gdańsk"),
        (
            ("name", "what's my name", ("maja",)),
            ("hobby", "what do i play on weekends", ("handball",)),
            ("city", "where do i live", ("gdańsk", "gdansk")),
        ),
    ),
    (
        ("hi im arjun, i'm a software tester in pune",),
        (
            ("name", "what's my name", ("arjun",)),
            ("job", "what do i do", ("tester", "software")),
            ("city", "which city am i in", ("pune",)),
        ),
    ),
    (
        ("so my hamster escaped again 😭 anyway hi, i'm emeka",),
        (
            ("name", "what's my name", ("emeka",)),
            ("pet", "which pet escaped", ("hamster",)),
        ),
    ),
    (
        ("hii can u help me plan a trip", "oh i'm saoirse by the way, i'm a florist in galway"),
        (
            ("name", "what's my name", ("saoirse",)),
            ("job", "what's my job", ("florist",)),
            ("city", "where do i live", ("galway",)),
        ),
    ),
    (
        ("i love lilac, everything i own is lilac lol", "im a hairdresser too so my salon is lilac"),
        (
            ("colour", "what's my favourite colour", ("lilac",)),
            ("job", "what's my job", ("hairdress", "hair")),
        ),
    ),
    (
        ("morning! farida here, pharmacist, living in alexandria", "my weekend thing is swimming in the sea"),
        (
            ("name", "what's my name", ("farida",)),
            ("job", "what do i do", ("pharmacist",)),
            ("city", "where do i live", ("alexandria",)),
            ("hobby", "what do i do on weekends", ("swim",)),
        ),
    ),
    (
        ("helloo, this is kenji. i'm a pastry chef in osaka and i breed goldfish on the side 🐟",),
        (
            ("name", "what's my name", ("kenji",)),
            ("job", "what's my job", ("pastry", "chef")),
            ("city", "which city", ("osaka",)),
            ("pet", "what do i breed", ("goldfish",)),
        ),
    ),
    (
        ("ugh monday. i'm a bank teller in durban and the queue is already out the door",),
        (
            ("job", "what's my job", ("teller", "bank")),
            ("city", "where do i work", ("durban",)),
        ),
    ),
    (
        ("hey! im astrid, i do pottery every thursday night", "my favourite colour is forest green"),
        (
            ("name", "what's my name", ("astrid",)),
            ("hobby", "what do i do on thursday nights", ("potter",)),
            ("colour", "what's my favourite colour", ("forest green", "green")),
        ),
    ),
]
FILLERS = (
    "whats a good snack thats not chips",
    "how long should i boil an egg for a runny yolk",
    "give me a fun fact about octopuses",
    "any tips for falling asleep faster",
)


def main(argv: list[str] | None = None) -> int:
    return play(USERS, FILLERS, "casual", argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
