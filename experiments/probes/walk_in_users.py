"""Recall for users who walk in and introduce themselves as the issue's own example does: 20 users written apart from
every set the project trains, tunes or measures on (among them the conversation the memory's issue quotes, "Hi! I'm Ana
Kowalski, I live in Lisbon and I work as a nurse. My favourite colour is green and I have a cat."), each telling persona
``sia`` their name, city, job and one to three more facts in one to three messages (a name signed without "I'm", a
move, a fact beside a request, a title before the name), then four everyday requests, then a question per fact, some
worded as the issue's ("Do you remember my name?"). Played over ``POST /v1/personas/sia/chat`` as
``experiments.probes.fresh_users`` plays its users; a reply is right when it gives one of the fact's accepted strings
at the start of a word.

    PYTHONPATH=. python -m experiments.probes.walk_in_users [--greedy] [--out FILE]

A check written apart, as a new user meets the persona: it is not a part of any choice.
"""

from __future__ import annotations

import sys

from experiments.probes.fresh_users import Asked, play

# (messages, [(kind, question, accepted strings)])
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        ("Hi! I'm Ana Kowalski, I live in Lisbon and I work as a nurse. My favourite colour is green and I have a cat.",),
        (
            ("name", "Do you remember my name?", ("ana",)),
            ("city", "Where do I live?", ("lisbon",)),
            ("job", "What do I do for a living?", ("nurse",)),
            ("colour", "Do you remember my favourite colour?", ("green",)),
            ("pet", "What animal do I have?", ("cat",)),
        ),
    ),
    (
        ("Ewa Nowak here, accountant, based in Kraków. Can you explain what a Roth IRA is?",),
        (
            ("name", "What is my name?", ("ewa",)),
            ("job", "What's my profession?", ("accountant",)),
            ("city", "Which city am I based in?", ("kraków", "krakow", "cracow")),
        ),
    ),
    (
        ("This is Tomasz. I'm a welder at the shipyard in Gdańsk.", "What's the best way to clean stainless steel?"),
        (
            ("name", "Who am I?", ("tomasz",)),
            ("job", "What's my trade?", ("weld",)),
            ("city", "Where's the shipyard I work at?", ("gdańsk", "gdansk")),
        ),
    ),
    (
        (
            "Hello. My name is Adaeze Okafor and I'm a pharmacist.",
            "I recently moved from Lagos to Abuja.",
            "I have two parrots, they never stop talking.",
        ),
        (
            ("name", "Can you tell me my name?", ("adaeze",)),
            ("job", "What's my job?", ("pharmac",)),
            ("city", "Which city do I live in now?", ("abuja",)),
            ("pet", "What pets do I keep?", ("parrot",)),
        ),
    ),
    (
        ("i'm Rosa, i work in a bakery in Valparaíso 🍞", "my fave colour is lilac btw"),
        (
            ("name", "whats my name", ("rosa",)),
            ("job", "where do I work?", ("bakery", "bake")),
            ("city", "what city am i in", ("valparaíso", "valparaiso")),
            ("colour", "which colour do i like best?", ("lilac",)),
        ),
    ),
    (
        (
            "Good evening. Henrik Lund, retired sea captain, living out my days in Tromsø.",
            "My only companion is an old labrador named Skipper.",
        ),
        (
            ("name", "What's my name?", ("henrik",)),
            ("job", "What did I do for a living?", ("captain", "sea")),
            ("city", "Where do I live?", ("tromsø", "tromso")),
            ("pet", "What kind of dog do I have?", ("labrador", "lab")),
            ("pet_name", "What's my dog called?", ("skipper",)),
        ),
    ),
    (
        (
            "Hey Sia! Quick one: I'm a primary school teacher in Nairobi and I need an idea for a science lesson about plants.",
            "Oh and I'm Wanjiru, nice to meet you",
        ),
        (
            ("name", "Do you know my name?", ("wanjiru",)),
            ("job", "What do I teach?", ("primary", "school", "teach", "science")),
            ("city", "Where do I teach?", ("nairobi",)),
        ),
    ),
    (
        ("Hi, I'm Mateo. I'm a barista in Buenos Aires, and on weekends I play football with my cousins.",),
        (
            ("name", "What's my name?", ("mateo",)),
            ("job", "What's my job?", ("barista",)),
            ("city", "Where do I live?", ("buenos aires",)),
            ("hobby", "What do I do on weekends?", ("football", "soccer")),
        ),
    ),
    (
        ("Morning! Keiko here. I design video games in Osaka. My hobby is bouldering and I love the colour red.",),
        (
            ("name", "Who am I?", ("keiko",)),
            ("job", "What do I do for work?", ("game", "design")),
            ("city", "Which city do I work in?", ("osaka",)),
            ("hobby", "What's my hobby?", ("boulder", "climb")),
            ("colour", "What's my favourite colour?", ("red",)),
        ),
    ),
    (
        ("I'm Samir and I drive a taxi in Marseille.", "Actually I moved to Lyon last year, still driving taxis though."),
        (
            ("name", "What's my name?", ("samir",)),
            ("city", "Where do I live now?", ("lyon",)),
            ("job", "What's my job?", ("taxi", "driv")),
        ),
    ),
    (
        ("hello!! my name is Lior and I'm a marine biologist in Eilat 🐠", "I also have a tortoise called Shelly"),
        (
            ("name", "what is my name?", ("lior",)),
            ("job", "What do I work as?", ("marine", "biolog")),
            ("city", "where do I live?", ("eilat",)),
            ("pet", "What pet do I have?", ("tortoise",)),
        ),
    ),
    (
        ("Can you recommend a good book? I'm a librarian myself, so nothing too obvious. I'm Margaret, from Edinburgh.",),
        (
            ("name", "What's my name?", ("margaret",)),
            ("job", "What do I do for a living?", ("librar",)),
            ("city", "Where am I from?", ("edinburgh",)),
        ),
    ),
    (
        (
            "Hi there! I'm Diego, a chef in Mexico City. In my spare time I paint watercolours.",
            "My favourite colour is orange, like a good mango.",
        ),
        (
            ("name", "What's my name?", ("diego",)),
            ("job", "What's my job?", ("chef", "cook")),
            ("city", "Which city do I live in?", ("mexico city",)),
            ("hobby", "What do I do in my spare time?", ("paint", "watercolo")),
            ("colour", "What's my favourite colour?", ("orange",)),
        ),
    ),
    (
        ("Hey, Priyanka here 👋 software tester in Hyderabad.", "I keep a goldfish on my desk, his name is Bubbles."),
        (
            ("name", "What's my name?", ("priyanka",)),
            ("job", "What's my job?", ("test", "software")),
            ("city", "Where am I?", ("hyderabad",)),
            ("pet", "What pet do I have?", ("goldfish", "fish")),
        ),
    ),
    (
        ("My name's Callum. I'm an electrician up in Aberdeen.", "I play the bagpipes in a band on Saturdays."),
        (
            ("name", "What's my name?", ("callum",)),
            ("job", "What's my job?", ("electric",)),
            ("city", "Where do I live?", ("aberdeen",)),
            ("hobby", "What do I play?", ("bagpipe",)),
        ),
    ),
    (
        ("Hola! Soy Lucía — sorry, English: I'm Lucía, I work as a lawyer in Seville.", "My favourite colour is turquoise."),
        (
            ("name", "What's my name?", ("lucía", "lucia")),
            ("job", "What's my job?", ("lawyer",)),
            ("city", "Where do I work?", ("seville", "sevilla")),
            ("colour", "What colour do I like most?", ("turquoise",)),
        ),
    ),
    (
        ("Greetings. I am Dr. Olumide Adeyemi, a cardiologist in Ibadan.",),
        (
            ("name", "Do you remember who I am?", ("olumide",)),
            ("job", "What's my specialty?", ("cardio",)),
            ("city", "Where do I practise?", ("ibadan",)),
        ),
    ),
    (
        ("yo it's Zane. i fix phones at a kiosk in Brisbane", "got a bearded dragon named Spike too"),
        (
            ("name", "what's my name", ("zane",)),
            ("job", "what do i do", ("phone", "fix")),
            ("city", "where am i", ("brisbane",)),
            ("pet", "what pet have i got", ("bearded dragon", "dragon", "lizard")),
        ),
    ),
    (
        (
            "I'm Anneliese and I'm a florist in Salzburg.",
            "Sunflowers yellow is my favourite colour, no contest.",
            "Every Sunday I sing in the church choir.",
        ),
        (
            ("name", "What's my name?", ("anneliese",)),
            ("job", "What's my job?", ("florist",)),
            ("city", "Where do I live?", ("salzburg",)),
            ("colour", "What's my favourite colour?", ("yellow",)),
            ("hobby", "What do I do on Sundays?", ("sing", "choir")),
        ),
    ),
    (
        ("Hi Sia, I'm Bongani. I work as a mechanic in Durban and I keep pigeons.",),
        (
            ("name", "Remember my name?", ("bongani",)),
            ("job", "What's my job?", ("mechanic",)),
            ("city", "Where do I work?", ("durban",)),
            ("pet", "What birds do I keep?", ("pigeon",)),
        ),
    ),
]
FILLERS = (
    "What's a quick breakfast I can make in five minutes?",
    "How many planets are in the solar system?",
    "Give me a tip to stay focused while working.",
    "What's the difference between weather and climate?",
)


def main(argv: list[str] | None = None) -> int:
    return play(USERS, FILLERS, "walkin", argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
