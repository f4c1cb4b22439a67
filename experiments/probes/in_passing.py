"""Recall of facts that users mention in passing: 16 users written apart from every set the project trains, tunes or
measures on, none of whom introduces themself; each fact comes up inside a request, a complaint or a story ("Can you
help me word an email to the other nurses on my ward?", "Our cat Pudding knocked my coffee over again"), a name only
where a message is signed or someone calls them by it, then four everyday requests, then a question per fact in
everyday words. Played over ``POST /v1/personas/sia/chat`` as ``experiments.probes.fresh_users`` plays its users; a
reply is right when it gives one of the fact's accepted strings at the start of a word.

    PYTHONPATH=. python -m experiments.probes.in_passing [--greedy] [--out FILE]

A check written apart, as a new user meets the persona: it is not a part of any choice.
"""

from __future__ import annotations

import sys

from experiments.probes.fresh_users import Asked, play

# (messages, [(kind, question, accepted strings)])
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        (
            "Can you help me word an email to the other nurses on my ward? I want to swap a night shift.",
            "Thanks! Sign it off from Magdalena please.",
        ),
        (
            ("job", "What do I do for work?", ("nurse",)),
            ("name", "What name did I sign the email with?", ("magdalena",)),
        ),
    ),
    (
        (
            "Our cat Pudding knocked my coffee over the keyboard again. How do I dry out a laptop?",
            "It's the third time this month, living in a tiny flat in Glasgow doesn't help.",
        ),
        (
            ("pet", "What kind of animal do I have?", ("cat",)),
            ("city", "Which city is my flat in?", ("glasgow",)),
        ),
    ),
    (
        (
            "Long day at the garage, I swapped four clutches as a mechanic today and my back is done.",
            "Any stretches for the lower back?",
            "By the way everyone at the garage calls me Big Tunde.",
        ),
        (
            ("job", "What's my job?", ("mechanic",)),
            ("name", "What do people call me?", ("tunde",)),
        ),
    ),
    (
        (
            "I'm repainting my bedroom and I want it teal, teal is my absolute favourite. What finish should I pick?",
            "Also the landlord in Leipzig has to approve it, how do I ask nicely?",
        ),
        (
            ("colour", "What colour do I love most?", ("teal",)),
            ("city", "Where is my flat?", ("leipzig",)),
        ),
    ),
    (
        (
            "My tortoise Gregor hasn't eaten in two days, should I worry?",
            "I teach chemistry at a secondary school so I'm out all day and can't watch him.",
        ),
        (
            ("pet", "What pet do I have?", ("tortoise",)),
            ("job", "What do I teach?", ("chemistry",)),
        ),
    ),
    (
        (
            "Writing a cover letter for a barista job in Porto, can you make it sound less stiff?",
            "Sign it Inês Carvalho.",
        ),
        (
            ("name", "What's my name?", ("inês", "ines")),
            ("city", "In which city am I applying?", ("porto",)),
            ("job", "What job am I applying for?", ("barista",)),
        ),
    ),
    (
        (
            "After climbing at the bouldering gym my forearms burn for days. Normal?",
            "I go four times a week, it's basically my whole social life here in Calgary.",
        ),
        (
            ("hobby", "What sport do I do?", ("boulder", "climb")),
            ("city", "Where do I live?", ("calgary",)),
        ),
    ),
    (
        (
            "My kids say my orange wall is ugly but orange has been my favourite colour since I was six.",
            "How do I tell them politely to mind their own business? Haha",
        ),
        (("colour", "What's my favourite colour?", ("orange",)),),
    ),
    (
        (
            "The hens laid nine eggs today! I keep six chickens behind the house.",
            "What can I bake with a lot of eggs?",
        ),
        (("pet", "What animals do I keep?", ("chicken", "hen")),),
    ),
    (
        (
            "As a bus driver in Nairobi I spend ten hours a day sitting. How can I keep fit?",
            "My friends call me Wanjiru, by the way.",
        ),
        (
            ("job", "What do I do for a living?", ("bus", "driv")),
            ("city", "Which city do I drive in?", ("nairobi",)),
            ("name", "What's my name?", ("wanjiru",)),
        ),
    ),
    (
        (
            "I've got a pottery class tonight and I always make lopsided bowls. Tips for centring clay?",
            "It's the best part of my week honestly.",
        ),
        (("hobby", "What class do I take?", ("pottery",)),),
    ),
    (
        ("Can you check my grammar? 'Dear team, as the new accountant I wish to introduce myself. Kind regards, Farid'",),
        (
            ("job", "What's my job?", ("accountant",)),
            ("name", "What's my name?", ("farid",)),
        ),
    ),
    (
        (
            "Our beagle keeps howling when I leave for work. Any ideas?",
            "The neighbours in our building in Montréal have started complaining.",
        ),
        (
            ("pet", "What dog do I have?", ("beagle",)),
            ("city", "What city do I live in?", ("montréal", "montreal")),
        ),
    ),
    (
        (
            "I play the cello in a community orchestra and my spike keeps slipping on the stage. Any fix?",
            "Concert's on Friday, wish me luck!",
        ),
        (("hobby", "What instrument do I play?", ("cello",)),),
    ),
    (
        (
            "Need a quick dinner idea, I get home late from the pharmacy where I work as a pharmacist.",
            "Something with purple veg maybe, purple is my favourite colour lol",
        ),
        (
            ("job", "What's my profession?", ("pharmacist",)),
            ("colour", "What's my favourite colour?", ("purple",)),
        ),
    ),
    (
        (
            "Hi, Dmitri again. I knit socks for the whole family every winter and I ran out of wool.",
            "What's a good yarn for warm socks?",
        ),
        (
            ("name", "What's my name?", ("dmitri",)),
            ("hobby", "What do I make every winter?", ("sock", "knit")),
        ),
    ),
]
FILLERS = (
    "How long should I boil an egg for a soft yolk?",
    "What's a good name for a houseplant?",
    "Explain what a leap year is in one sentence.",
    "Give me a fun fact about octopuses.",
)


def main(argv: list[str] | None = None) -> int:
    return play(USERS, FILLERS, "passing", argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
