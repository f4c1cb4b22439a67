"""Recall of every fact of users who tell five or six of them across several messages, with asides between, as the
natural set's users do (the earlier probes' users tell at most five, without asides): 14 users written apart from
every set the project trains, tunes or measures on, in voices of their own (a long introduction, chat in fragments,
a fact told inside a story, a fact beside a request, a relative or a pet named in passing), then four everyday
requests, then a question per fact in the user's own style. Played over ``POST /v1/personas/sia/chat`` as
``experiments.probes.fresh_users`` plays its users (in process, the bundled checkpoint, a fresh SQLite database, the
persona's defaults or ``--greedy``); a reply is right when it gives one of the fact's accepted strings at the start
of a word (``sia.learn.natural.mentions``). The table's last line counts the users with every fact right.

    PYTHONPATH=. python -m experiments.probes.many_facts [--greedy] [--out FILE]

A check written apart, as a new user meets the persona: it is not a part of any choice.
"""

from __future__ import annotations

import sys

from experiments.probes.fresh_users import Asked, play

# (messages, [(kind, question, accepted strings)])
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        (
            "Hi! I'm Dagny Holm. I've just started as a ferry pilot out of Bergen, which mostly means I'm damp.",
            "Sorry, rainy mood. The good news: my partner bought me a sourdough starter, so I bake on my days off now.",
            "Oh and my cat Smørbukk says hello. He's orange, like everything I own.",
        ),
        (
            ("name", "Can you tell me my name?", ("dagny",)),
            ("job", "What's my job on the water?", ("ferry", "pilot")),
            ("city", "Which city do I sail out of?", ("bergen",)),
            ("hobby", "What do I do on my days off?", ("bak", "sourdough", "bread")),
            ("pet", "What kind of animal is Smørbukk?", ("cat",)),
            ("colour", "What colour is everything I own?", ("orange",)),
        ),
    ),
    (
        (
            "ok so quick intro since my therapist says I should talk more lol",
            "I'm Luis, I do night security at a hospital in Valencia",
            "no pets, my flat is tiny, but I play bass in a punk band on weekends",
            "fave colour? black, obviously",
        ),
        (
            ("name", "whats my name", ("luis",)),
            ("job", "what do i do at the hospital", ("security", "guard")),
            ("city", "what city is the hospital in", ("valencia",)),
            ("hobby", "what do i do on weekends", ("bass", "band", "punk")),
            ("colour", "what colour do i like", ("black",)),
        ),
    ),
    (
        (
            "Good evening. My name is Harriet Osei-Bonsu, and I have been a magistrate in Kumasi for eleven years.",
            "My grandson insists I tell you that I keep bees. Four hives at the bottom of the garden.",
            "He also says I should mention my parrot, Captain, who is rude to visitors.",
        ),
        (
            ("name", "What is my surname?", ("osei",)),
            ("job", "What is my position in the courts?", ("magistrate",)),
            ("city", "In which city do I sit as a magistrate?", ("kumasi",)),
            ("hobby", "What do I keep at the bottom of my garden?", ("bee", "hive")),
            ("pet", "What sort of bird is Captain?", ("parrot",)),
        ),
    ),
    (
        (
            "Been a long week of tiling bathrooms, my knees are done. Mateus, by the way.",
            "I'm in Curitiba, in the south of Brazil. Cold here, people don't believe me.",
            "Weekends it's futsal with my cousins, and then my two dogs drag me round the park.",
        ),
        (
            ("name", "What's my name?", ("mateus",)),
            ("job", "What was I doing all week?", ("til",)),
            ("city", "Remind me which city I'm in?", ("curitiba",)),
            ("hobby", "What sport do I play with my cousins?", ("futsal",)),
            ("pet", "What pets drag me round the park?", ("dog",)),
        ),
    ),
    (
        (
            "Hello hello. Ngaio here. I'm a vet nurse in Dunedin and yes, I have too many animals.",
            "Two ferrets and an old greyhound, to be exact.",
            "Tangent, but what's the best way to get glitter out of a carpet? Asking for a friend. The friend is me.",
            "When I'm not at the clinic I'm knitting. Usually something in teal.",
        ),
        (
            ("name", "What did I say my name was?", ("ngaio",)),
            ("job", "What do I do at the clinic?", ("vet", "nurse")),
            ("city", "Which town do I live in?", ("dunedin",)),
            ("pet", "Which animals did I say I have?", ("ferret", "greyhound")),
            ("hobby", "What am I doing when I'm not at the clinic?", ("knit",)),
            ("colour", "What colour do I usually knit with?", ("teal",)),
        ),
    ),
    (
        (
            "My name is Oleksandr but everyone says Sasha. I drive trams in Lviv.",
            "My daughter just started school, so mornings are chaos now.",
            "I relax by fishing on the river, and my favourite colour is dark blue.",
        ),
        (
            ("name", "What do people call me?", ("sasha", "oleksandr")),
            ("job", "What vehicle do I drive for work?", ("tram",)),
            ("city", "What city do I work in?", ("lviv",)),
            ("hobby", "How do I relax?", ("fish",)),
            ("colour", "What's my favourite colour?", ("blue", "dark blue")),
        ),
    ),
    (
        (
            "hiya!! I'm Bronwyn, I teach piano to kids in Hobart",
            "one of them played chopsticks for 40 minutes today and I'm still recovering",
            "my rabbit Pudding is chewing a cable as we speak",
            "in my free time I climb. indoor walls mostly, the cliffs scare me",
        ),
        (
            ("name", "do u remember my name", ("bronwyn",)),
            ("job", "what do i teach?", ("piano",)),
            ("city", "where do i live", ("hobart",)),
            ("pet", "what animal is pudding", ("rabbit",)),
            ("hobby", "what do i do in my free time", ("climb",)),
        ),
    ),
    (
        (
            "Greetings from Tromsø, where the sun has not risen for six weeks.",
            "I'm Eirik. I repair fishing boat engines, which is oily work but honest.",
            "At home there's my husky, Luna, and my collection of vinyl records, mostly jazz.",
        ),
        (
            ("city", "Where am I writing to you from?", ("tromsø", "tromso")),
            ("name", "What's my name?", ("eirik",)),
            ("job", "What do I repair?", ("engine", "boat")),
            ("pet", "What breed is Luna?", ("husky",)),
            ("hobby", "What do I collect?", ("vinyl", "record", "jazz")),
        ),
    ),
    (
        (
            "Salaam! Yasmin speaking. I'm a pharmacist and I just moved from Cairo to Alexandria for a new job.",
            "I love the sea here already. My favourite colour has always been turquoise, so it fits.",
            "I do calligraphy in the evenings to unwind.",
        ),
        (
            ("name", "Who am I?", ("yasmin",)),
            ("job", "What is my profession?", ("pharmac",)),
            ("city", "Which city do I live in now?", ("alexandria",)),
            ("colour", "Which colour did I say is my favourite?", ("turquoise",)),
            ("hobby", "What do I do in the evenings?", ("calligraph",)),
        ),
    ),
    (
        (
            "So I was walking my tortoise (yes, walking, he's fast for a tortoise) and thought I'd say hi.",
            "I'm Fionnuala, a postwoman in Galway. Sixteen years on the same round.",
            "My sister keeps telling me to try salsa dancing. I tried it. I love it. Don't tell her.",
        ),
        (
            ("pet", "What was I walking earlier?", ("tortoise",)),
            ("name", "What's my first name?", ("fionnuala",)),
            ("job", "What's my job?", ("post", "mail")),
            ("city", "Where do I deliver letters?", ("galway",)),
            ("hobby", "What dancing did I try?", ("salsa",)),
        ),
    ),
    (
        (
            "Hey. I code payment systems for a bank in Singapore. Name's Wei Jie.",
            "Weekend plans: badminton, then hawker food, then sleep.",
            "Favourite colour is lime green, which my wardrobe does not reflect at all.",
        ),
        (
            ("job", "What do I do at the bank?", ("code", "program", "software", "developer", "engineer", "payment")),
            ("city", "Which city do I work in?", ("singapore",)),
            ("name", "What's my name?", ("wei",)),
            ("hobby", "Which sport do I play on weekends?", ("badminton",)),
            ("colour", "What colour do I love?", ("lime", "green")),
        ),
    ),
    (
        (
            "Morning! Quick one before my shift: I'm Aroha and I'm a midwife at the hospital in Rotorua.",
            "My kids bought me a budgie for my birthday, he's called Kiwi, which is confusing.",
            "Anyway, I'm trying to get back into swimming. Any tips for a slow swimmer?",
        ),
        (
            ("name", "What's my name again?", ("aroha",)),
            ("job", "What do I do at the hospital?", ("midwife",)),
            ("city", "Where is my hospital?", ("rotorua",)),
            ("pet", "What kind of bird is Kiwi?", ("budgie",)),
            ("hobby", "What am I getting back into?", ("swim",)),
        ),
    ),
    (
        (
            "I'm Pavel, a sound engineer in Prague.",
            "Sorry, not Prague any more: I moved to Brno in the spring. Old habits.",
            "My goldfish survived the move, which is more than I can say for my plants.",
            "I brew my own beer as a hobby, it's a very Czech thing to do.",
        ),
        (
            ("name", "What's my name?", ("pavel",)),
            ("job", "What kind of engineer am I?", ("sound",)),
            ("city", "Where do I live now?", ("brno",)),
            ("pet", "Which pet survived the move?", ("goldfish", "fish")),
            ("hobby", "What do I make at home as a hobby?", ("beer", "brew")),
        ),
    ),
    (
        (
            "Hello, I'm Marguerite. I run a little bookshop in Lyon, right by the river.",
            "Between customers I paint watercolours, badly.",
            "Violet is my colour, the shop door is painted violet too.",
            "Do you have a good recipe for a rainy-day soup?",
        ),
        (
            ("name", "What's my name?", ("marguerite",)),
            ("job", "What kind of shop do I run?", ("book",)),
            ("city", "Which city is my shop in?", ("lyon",)),
            ("hobby", "What do I do between customers?", ("paint", "watercolour")),
            ("colour", "What colour is my shop door?", ("violet",)),
        ),
    ),
]

# four everyday requests, none about the user
FILLERS = (
    "What's a quick breakfast I can make in five minutes?",
    "How do I stop my glasses from fogging up?",
    "Give me an idea for a short walk in the rain.",
    "Why do onions make people cry?",
)


def main(argv: list[str] | None = None) -> int:
    return play(USERS, FILLERS, "many", argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
