"""Recall for users who tell their facts in styles the earlier probes did not write: a fact inside a request ("I'm a
paramedic in Glasgow, any tips for sleeping after night shifts?"), a form filled in ("name: Ines / city: Porto"),
typos and no capitals, a fact said while answering something else, a fact taken back in the next sentence, a fact
in a negation ("not a teacher any more: a librarian now"), a pet named with its kind in passing. 24 users written
apart from every set the project trains, tunes or measures on, one to three messages each, then four everyday
requests of their own, then a question per fact in the users' own style. Played over ``POST
/v1/personas/sia/chat`` as ``experiments.probes.fresh_users`` plays its users (in process, the bundled checkpoint,
a fresh SQLite database, the persona's defaults or ``--greedy``); a reply is right when it gives one of the fact's
accepted strings at the start of a word (``sia.learn.natural.mentions``).

    PYTHONPATH=. python -m experiments.probes.other_styles [--greedy] [--out FILE]

A check written apart, as a new user meets the persona: it is not a part of any choice.
"""

from __future__ import annotations

import sys

from experiments.probes.fresh_users import Asked, play

# (messages, [(kind, question, accepted strings)])
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        ("I'm a paramedic in Glasgow and night shifts wreck my sleep. Any tips for sleeping in the day?",),
        (
            ("job", "What's my job?", ("paramedic",)),
            ("city", "Which city do I work in?", ("glasgow",)),
        ),
    ),
    (
        ("name: Ines Carvalho\ncity: Porto\njob: architect\nfav colour: burgundy",),
        (
            ("name", "what's my name?", ("ines",)),
            ("city", "where do I live?", ("porto",)),
            ("job", "what do I do?", ("architect",)),
            ("colour", "what's my favourite colour?", ("burgundy",)),
        ),
    ),
    (
        ("im a barista in melbourne lol the coffee snobs here are something else", "my dogs name is biscuit hes a beagle"),
        (
            ("job", "what do i do for work", ("barista",)),
            ("city", "what city am i in", ("melbourne",)),
            ("pet", "what kind of dog do i have", ("beagle",)),
        ),
    ),
    (
        ("Everyone calls me Grandpa Joe, but my actual name is Joseph Okafor. Retired postman, living in Lagos.",),
        (
            ("name", "What is my actual name?", ("joseph",)),
            ("job", "What did I do before I retired?", ("postman", "post", "mail")),
            ("city", "Where do I live?", ("lagos",)),
        ),
    ),
    (
        ("just got back from rock climbing and my arms are dead", "anyway I'm Freya, I work as a vet in Bristol"),
        (
            ("name", "What's my name?", ("freya",)),
            ("hobby", "What sport did I mention doing?", ("rock climb", "climb")),
            ("job", "What's my job?", ("vet",)),
            ("city", "Where do I work?", ("bristol",)),
        ),
    ),
    (
        ("We live in Denver. Well, actually, we moved to Boulder last week, I keep forgetting.", "My name's Carlos."),
        (
            ("name", "What's my name?", ("carlos",)),
            ("city", "Where do I live now?", ("boulder",)),
        ),
    ),
    (
        ("I'm not a teacher any more, I'm a school librarian now. Much quieter!", "I'm Helga by the way."),
        (
            ("name", "What's my name?", ("helga",)),
            ("job", "What's my job now?", ("librarian",)),
        ),
    ),
    (
        ("Could you help me name my new kitten? She's grey and tiny.", "I'm Priyanka and I live in Pune."),
        (
            ("name", "What's my name?", ("priyanka",)),
            ("city", "Which city do I live in?", ("pune",)),
            ("pet", "What pet did I just get?", ("kitten", "cat")),
        ),
    ),
    (
        ("What goes well with teal? It's my favourite colour and I'm repainting my room.", "Oh and I'm Mateus."),
        (
            ("name", "Remember my name?", ("mateus",)),
            ("colour", "Which colour do I like best?", ("teal",)),
        ),
    ),
    (
        ("Hello! My name is Aiko Tanaka. I'm a nurse from Osaka.", "In my free time I play the cello."),
        (
            ("name", "Can you tell me my name?", ("aiko",)),
            ("job", "What do I do for a living?", ("nurse",)),
            ("city", "Where am I from?", ("osaka",)),
            ("hobby", "Which instrument do I play?", ("cello",)),
        ),
    ),
    (
        ("yo it's Dmitri. electrician. Tallinn. that's me", "also i love purple, like everything i own is purple"),
        (
            ("name", "whats my name", ("dmitri",)),
            ("job", "whats my job", ("electric",)),
            ("city", "where do i live", ("tallinn",)),
            ("colour", "whats my fav colour", ("purple",)),
        ),
    ),
    (
        ("I have two parrots, Kiwi and Mango, and they never stop talking.", "My name is Rosa and I'm a chef."),
        (
            ("name", "What's my name?", ("rosa",)),
            ("job", "What do I do for work?", ("chef",)),
            ("pet", "What kind of pets do I have?", ("parrot",)),
        ),
    ),
    (
        ("Greetings. I am Dr. Samuel Adeyemi, a dentist based in Nairobi.", "My one indulgence is birdwatching."),
        (
            ("name", "What's my name?", ("samuel", "adeyemi")),
            ("job", "What's my profession?", ("dentist",)),
            ("city", "Where am I based?", ("nairobi",)),
            ("hobby", "What's my hobby?", ("bird",)),
        ),
    ),
    (
        ("can u recommend a podcast for my commute? i drive a bus in dublin so i have hours to fill",),
        (
            ("job", "what's my job?", ("bus",)),
            ("city", "where do i drive?", ("dublin",)),
        ),
    ),
    (
        ("My favourite colour used to be blue, but honestly now it's green.", "I'm Tomasz, a carpenter."),
        (
            ("name", "What's my name?", ("tomasz",)),
            ("job", "What do I do?", ("carpenter",)),
            ("colour", "What's my favourite colour now?", ("green",)),
        ),
    ),
    (
        ("Hiya, Siobhan here! I knit like it's my job, but my real job is accountant.", "We're in Cork."),
        (
            ("name", "Who am I?", ("siobhan",)),
            ("job", "What's my real job?", ("accountant",)),
            ("city", "Which city are we in?", ("cork",)),
            ("hobby", "What do I love doing?", ("knit",)),
        ),
    ),
    (
        ("My hamster Pickles escaped again last night, found him in a shoe.", "I'm Lucas btw, I study law in Lyon."),
        (
            ("name", "What's my name?", ("lucas",)),
            ("pet", "What kind of pet do I have?", ("hamster",)),
            ("city", "Where do I study?", ("lyon",)),
        ),
    ),
    (
        ("I'm Yara. I fly planes for a living, commercial pilot, based in Amman.",),
        (
            ("name", "What's my name?", ("yara",)),
            ("job", "What's my job?", ("pilot", "fly planes")),
            ("city", "Where am I based?", ("amman",)),
        ),
    ),
    (
        ("Saturday mornings I go surfing, no matter the weather.", "Name's Kai, I'm a lifeguard in Honolulu."),
        (
            ("name", "What's my name?", ("kai",)),
            ("job", "What's my job?", ("lifeguard",)),
            ("city", "Where do I live?", ("honolulu",)),
            ("hobby", "What do I do on Saturday mornings?", ("surf",)),
        ),
    ),
    (
        ("My name is Elif and I'm a software engineer in Istanbul. My favourite colour is yellow.",),
        (
            ("name", "What is my name?", ("elif",)),
            ("job", "What is my job?", ("software", "engineer")),
            ("city", "Which city do I live in?", ("istanbul",)),
            ("colour", "What is my favourite colour?", ("yellow",)),
        ),
    ),
    (
        ("Hi, I'm Bram. I'm a farmer near Utrecht and I breed goats.", "Evenings are for chess."),
        (
            ("name", "What's my name?", ("bram",)),
            ("job", "What do I do?", ("farm",)),
            ("hobby", "What do I do in the evenings?", ("chess",)),
        ),
    ),
    (
        ("ugh my turtle won't eat his lettuce today", "sorry, hi, I'm Noor, I teach maths in Doha"),
        (
            ("name", "What's my name?", ("noor",)),
            ("job", "What do I teach?", ("math",)),
            ("city", "Where do I teach?", ("doha",)),
            ("pet", "What pet do I have?", ("turtle",)),
        ),
    ),
    (
        ("I moved from Madrid to Seville for work. I'm a flamenco dancer, believe it or not.", "Call me Lola."),
        (
            ("name", "What should you call me?", ("lola",)),
            ("city", "Which city do I live in now?", ("seville",)),
            ("job", "What's my job?", ("dancer", "flamenco")),
        ),
    ),
    (
        ("My wife says I spend too much time fishing. I'm Henrik, a mechanic from Bergen.",),
        (
            ("name", "What's my name?", ("henrik",)),
            ("job", "What's my job?", ("mechanic",)),
            ("city", "Where am I from?", ("bergen",)),
            ("hobby", "What do I spend too much time doing?", ("fish",)),
        ),
    ),
]
FILLERS = (
    "What's a quick dinner I can make with eggs and spinach?",
    "How do I get a red wine stain out of a shirt?",
    "Give me a word that rhymes with orange, if there is one.",
    "What's the difference between weather and climate?",
)


def main(argv: list[str] | None = None) -> int:
    return play(USERS, FILLERS, "styles", argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
