"""Users who name someone else after telling their own name: a daughter, a husband, a boss, a friend, a grandmother,
a pet ("My daughter's name is Lily", "she's called Mishmish", "a parrot named Captain"). 10 users written apart from
every set the project trains, tunes or measures on, two messages each, then four everyday requests, then their own
name and one more fact asked. Played over ``POST /v1/personas/sia/chat`` as ``experiments.probes.fresh_users`` plays
its users. ``--without-rule`` plays the imprint's write without ``sia.identity.imprint.others_names`` (a clause that
gives someone else's name may then be labelled the user's name, and replace it).

    PYTHONPATH=. python -m experiments.probes.other_names [--without-rule] [--greedy] [--out FILE]

A check written apart: it is not a part of any choice.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

import sia.identity.imprint as imprint_module
from experiments.probes.fresh_users import Asked, play

# (messages, [(kind, question, accepted strings)])
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        ("Hi, I'm Sam and I teach history in Leeds.", "My daughter's name is Lily and she just started school."),
        (("name", "What's my name?", ("sam",)), ("job", "What do I teach?", ("history",))),
    ),
    (
        ("I'm Rania, a nurse in Amman.", "We adopted a kitten last week, she's called Mishmish."),
        (("name", "Do you remember my name?", ("rania",)), ("pet", "What pet did we adopt?", ("kitten", "cat"))),
    ),
    (
        ("My name is Joaquín and I live in Rosario.", "My husband is called Pablo, he cooks better than me."),
        (("name", "What's my name?", ("joaquín", "joaquin")), ("city", "Where do I live?", ("rosario",))),
    ),
    (
        ("Hello! I'm Olu, I work in a bank in Accra.", "I have a dog. His name is Rex."),
        (("name", "What is my name?", ("olu",)), ("pet", "What pet do I have?", ("dog",))),
    ),
    (
        ("hey i'm Mira, a vet in Tartu", "my boss is named Kaupo and he's the worst lol"),
        (("name", "what's my name", ("mira",)), ("job", "what's my job", ("vet",))),
    ),
    (
        ("Hi there, Tomás here. I fix boats in Vigo.", "My son, his name is Iker, wants to be a pilot."),
        (("name", "Who am I?", ("tomás", "tomas")), ("city", "Where do I work?", ("vigo",))),
    ),
    (
        ("I'm Grace and I'm a midwife in Kampala.", "My best friend is called Achieng, we met at school."),
        (("name", "Remind me of my name?", ("grace",)), ("job", "What do I do?", ("midwife",))),
    ),
    (
        ("Hello, my name is Henrik. I'm a carpenter.", "I have a parrot named Captain who swears in Danish."),
        (("name", "What's my name?", ("henrik",)), ("pet", "What pet do I have?", ("parrot",))),
    ),
    (
        ("Hi! I'm Aiyana, I live in Santa Fe.", "My grandmother's name was Dezba, she taught me to weave."),
        (("name", "What is my name?", ("aiyana",)), ("city", "Where do I live?", ("santa fe",))),
    ),
    (
        ("I'm Kwame, a teacher in Kumasi.", "Our new puppy is a beagle called Biscuit."),
        (("name", "What's my name?", ("kwame",)), ("pet", "What kind of dog do we have?", ("beagle",))),
    ),
]
FILLERS = (
    "What's a quick breakfast I can make in five minutes?",
    "How many planets are in the solar system?",
    "Give me a tip to stay focused while working.",
    "What's the difference between weather and climate?",
)


def _no_others(pieces: Sequence[str], breaks: torch.Tensor | None = None) -> torch.Tensor:
    """No clause gives someone else's name: the write as it was before ``others_names``."""
    return torch.zeros(len(pieces), dtype=torch.bool)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--without-rule" in args:
        args.remove("--without-rule")
        imprint_module.others_names = _no_others
    return play(USERS, FILLERS, "others", args, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
