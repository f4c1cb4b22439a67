"""Corrections told late, inside longer conversations: 14 users written apart from every set the project trains, tunes
or measures on (and from the corrections probes' users), each telling four to six facts across several messages with
asides between, then taking one or two of them back a message or more later, in words of their own (a move told as
news, a job left in the past tense, a pet that died, a name they would rather be called, a change of taste given with
its reason, a correction beside a request). Then four everyday requests, then a question per fact. Played over
``POST /v1/personas/sia/chat`` as ``experiments.probes.fresh_users`` plays its users (in process, the bundled
checkpoint, a fresh SQLite database, the persona's defaults or ``--greedy``); a reply is right when it gives one of the
newest value's accepted strings at the start of a word and none of a replaced value's. The table's last lines count
the users with every fact right and the replaced facts answered with the newer value.

    PYTHONPATH=. python -m experiments.probes.late_corrections [--after | --last] [--greedy] [--out FILE]

``--after`` plays 8 more users written after the first rules of LOG.md 2026-12-06 (r) were fitted to the first 14
(two more rules were then fitted to them); ``--last`` plays 6 written after every rule of that entry.

A check written apart, as a new user meets the persona: it is not a part of any choice.
"""

from __future__ import annotations

import sys

from experiments.probes.fresh_users import Asked, play
from experiments.probes.many_facts import FILLERS

# (messages, [(kind, question, accepted strings of the newest value)]), and per (user, kind) what was replaced
USERS: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        (
            "Hi, I'm Rosalind. I bake bread for a living, up at four every day, in Norwich.",
            "I've got a tabby called Mungo who thinks the flour bags are his.",
            "Can you tell me why bread goes stale so fast?",
            "Oh, news: I handed in my notice at the bakery. I'm a postwoman now, still early mornings but no more burns.",
        ),
        (
            ("name", "What's my name?", ("rosalind",)),
            ("job", "What do I do for a living these days?", ("post",)),
            ("city", "Where do I live?", ("norwich",)),
            ("pet", "What kind of animal is Mungo?", ("cat", "tabby")),
        ),
    ),
    (
        (
            "hey, Kit here. well, Katherine on paper.",
            "i'm a dental nurse in Galway and i'm obsessed with anything mint green",
            "what's a good podcast for a long drive?",
            "ok update, we upped sticks to Cork in the spring. long story, better rent",
        ),
        (
            ("name", "What should you call me?", ("kit",)),
            ("job", "What's my job?", ("dental",)),
            ("city", "Where do I live now?", ("cork",)),
            ("colour", "Which colour am I obsessed with?", ("mint",)),
        ),
    ),
    (
        (
            "Hello! My name is Joaquín and I've been driving buses in Montevideo for years.",
            "At home there's a hamster, Tito, and on Sundays I play the bandoneón.",
            "Do you know any tips to sleep after a night shift?",
            "I should update you: I was a bus driver until March. Now I run a food truck, empanadas mostly.",
            "And Tito passed away last month. We have two axolotls now, my son chose them.",
        ),
        (
            ("name", "Remind me of my name?", ("joaquín", "joaquin")),
            ("job", "What do I do for work?", ("food truck", "empanada")),
            ("city", "Which city am I in?", ("montevideo",)),
            ("pet", "What pets do we have at home?", ("axolotl",)),
            ("hobby", "What do I play on Sundays?", ("bandone",)),
        ),
    ),
    (
        (
            "Good afternoon. I am Ingrid Solberg, a physiotherapist in Trondheim.",
            "In the evenings I play the violin in an amateur orchestra.",
            "My favourite colour has always been navy.",
            "Could you suggest a warm drink without caffeine?",
            "About the violin: I gave it up, the neighbours complained too much. I have taken up fencing instead.",
        ),
        (
            ("name", "What's my name?", ("ingrid",)),
            ("job", "What is my profession?", ("physio",)),
            ("city", "Where do I work?", ("trondheim",)),
            ("hobby", "What do I do in the evenings now?", ("fenc",)),
            ("colour", "What's my favourite colour?", ("navy",)),
        ),
    ),
    (
        (
            "yo. Dev. i do warehouse shifts in Leicester, nights mostly",
            "fav colour is red, always has been",
            "whats the fastest way to learn touch typing",
            "actually scratch that about red, im a yellow person now. bought yellow trainers and everything",
        ),
        (
            ("name", "whats my name", ("dev",)),
            ("job", "where do i work shifts", ("warehouse",)),
            ("city", "what city am i in", ("leicester",)),
            ("colour", "whats my fav colour", ("yellow",)),
        ),
    ),
    (
        (
            "Hi there! I'm Amara, I teach chemistry at a secondary school in Accra.",
            "My little brother keeps asking me to help with his homework, which is funny given what I do.",
            "I have a parrot named Kofi who copies the school bell.",
            "Any tips for marking a hundred exam papers without losing my mind?",
            "Oh, and I told you Accra, but I've just transferred to a school in Kumasi. Same subject.",
        ),
        (
            ("name", "Who am I?", ("amara",)),
            ("job", "What subject do I teach?", ("chem",)),
            ("city", "Which city is my school in now?", ("kumasi",)),
            ("pet", "What kind of bird is Kofi?", ("parrot",)),
        ),
    ),
    (
        (
            "Greetings from Graz! I'm Lukas, I repair clocks.",
            "On weekends I go bouldering with my sister.",
            "What's the difference between a crocodile and an alligator?",
            "I told you I live in Graz, but that was last year. Now it's Linz, closer to my workshop.",
        ),
        (
            ("name", "What's my name?", ("lukas",)),
            ("job", "What do I repair?", ("clock",)),
            ("city", "Where do I live?", ("linz",)),
            ("hobby", "What do I do on weekends?", ("boulder",)),
        ),
    ),
    (
        (
            "Hey! Priyanka, staff nurse, Pune. Favourite colour is maroon.",
            "I have a beagle called Laddoo who steals socks.",
            "Recommend me a short novel for the train?",
            "Big news: I'm not nursing any more. I'm retraining as a paramedic, first week done!",
        ),
        (
            ("name", "What's my name?", ("priyanka",)),
            ("job", "What am I now, job-wise?", ("paramedic",)),
            ("city", "Which city do I live in?", ("pune",)),
            ("colour", "What's my favourite colour?", ("maroon",)),
            ("pet", "What breed is Laddoo?", ("beagle",)),
        ),
    ),
    (
        (
            "My name is Henrik and I'm a carpenter. I live in Aarhus with my wife and a very old cat.",
            "My hobby is sailing, when the wind lets me.",
            "How long should I boil an egg for a runny yolk?",
            "Actually, please call me Rik. Everyone does except my mother.",
        ),
        (
            ("name", "What do I like to be called?", ("rik",)),
            ("job", "What's my trade?", ("carpent",)),
            ("city", "Where do I live?", ("aarhus",)),
            ("pet", "What pet do I have?", ("cat",)),
            ("hobby", "What's my hobby?", ("sail",)),
        ),
    ),
    (
        (
            "hello :) I'm Mei, I work as a translator in Taipei",
            "my favourite colour is lavender and I knit in the evenings",
            "can you explain what a haiku is?",
            "I moved! Kaohsiung now, for the sea. still translating though",
            "and I've swapped knitting for rock climbing, my hands wanted a change",
        ),
        (
            ("name", "What's my name?", ("mei",)),
            ("job", "What do I do for work?", ("translat",)),
            ("city", "Where do I live now?", ("kaohsiung",)),
            ("colour", "What's my favourite colour?", ("lavender",)),
            ("hobby", "What do I do in my spare time now?", ("climb", "rock")),
        ),
    ),
    (
        (
            "Evening. Tomasz. I'm an electrician in Gdańsk.",
            "I keep two goldfish, Lolek and Bolek.",
            "My evenings go on chess, online mostly.",
            "What's a polite way to decline a wedding invitation?",
            "Small correction, I'm not an electrician any more, I became a site manager in January.",
        ),
        (
            ("name", "What's my name?", ("tomasz",)),
            ("job", "What's my job now?", ("site manager", "manager")),
            ("city", "Which city am I in?", ("gdańsk", "gdansk")),
            ("pet", "What pets do I keep?", ("goldfish", "fish")),
            ("hobby", "What do I play in the evenings?", ("chess",)),
        ),
    ),
    (
        (
            "Hi, I'm Fatou! I'm a pharmacist in Dakar.",
            "My favourite colour is orange, like the sunsets here.",
            "I had a tortoise for twelve years but he died last winter. Now I have a kitten called Yaya.",
            "How do I get my kitten to stop biting my hands?",
        ),
        (
            ("name", "What's my name?", ("fatou",)),
            ("job", "What's my profession?", ("pharmac",)),
            ("city", "Where do I live?", ("dakar",)),
            ("colour", "What's my favourite colour?", ("orange",)),
            ("pet", "What pet do I have now?", ("kitten", "cat")),
        ),
    ),
    (
        (
            "Hallo, I'm Jens and I'm a baker in Bremen.",
            "I play the trumpet in a brass band on Thursdays.",
            "Why is the sky blue, in simple words?",
            "Forget the trumpet, I sold it. It's pottery on Thursdays now.",
            "And I should say, I'm a baker in Hamburg now, we moved in August.",
        ),
        (
            ("name", "What's my name?", ("jens",)),
            ("job", "What do I do?", ("bak",)),
            ("city", "Which city do I live in now?", ("hamburg",)),
            ("hobby", "What do I do on Thursdays?", ("potter",)),
        ),
    ),
    (
        (
            "hi! Sofía, architect, Valparaíso. my favourite colour is teal",
            "my dog Canela is a mutt but she thinks she's a princess",
            "what should I cook for six people on a budget?",
            "honestly teal is over for me. it's terracotta now, I repainted my studio",
        ),
        (
            ("name", "What's my name?", ("sofía", "sofia")),
            ("job", "What's my job?", ("architect",)),
            ("city", "Where do I live?", ("valpara",)),
            ("pet", "What kind of animal is Canela?", ("dog", "mutt")),
            ("colour", "What's my favourite colour now?", ("terracotta",)),
        ),
    ),
]

OLDER: dict[tuple[int, str], tuple[str, ...]] = {
    (0, "job"): ("bak", "bread"),
    (1, "city"): ("galway",),
    (2, "job"): ("bus",),
    (2, "pet"): ("hamster",),
    (3, "hobby"): ("violin",),
    (4, "colour"): ("red",),
    (5, "city"): ("accra",),
    (6, "city"): ("graz",),
    (7, "job"): ("nurse", "nursing"),
    (8, "name"): ("henrik",),
    (9, "city"): ("taipei",),
    (9, "hobby"): ("knit",),
    (10, "job"): ("electric",),
    (11, "pet"): ("tortoise",),
    (12, "hobby"): ("trumpet",),
    (12, "city"): ("bremen",),
    (13, "colour"): ("teal",),
}

# written after the rules of LOG.md 2026-12-06 (r) were fitted to the users above, to check them on words they were not
# fitted to (``--after``)
AFTER: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        (
            "Hi! I'm Itziar, I'm a sound technician for a theatre in Bilbao.",
            "I collect vinyl records, mostly jazz.",
            "What's a nice gift for a colleague who's leaving?",
            "Oh, we've relocated from Bilbao to San Sebastián, the theatre opened a new stage there.",
        ),
        (
            ("name", "What's my name?", ("itziar",)),
            ("job", "What's my job at the theatre?", ("sound", "technician")),
            ("city", "Which city do I live in now?", ("san sebasti",)),
            ("hobby", "What do I collect?", ("vinyl", "record")),
        ),
    ),
    (
        (
            "Good morning, I'm Walter. I used to be a chef in Vienna, these days I'm teaching cooking classes there.",
            "My wife and I have a dachshund named Strudel.",
            "Can you tell me how long to rest a steak?",
            "Our dachshund went to live with my daughter, so now it's just us and a canary.",
        ),
        (
            ("name", "What's my name?", ("walter",)),
            ("job", "What do I do for work these days?", ("teach", "cooking class")),
            ("city", "Where do I live?", ("vienna",)),
            ("pet", "What pet do we have at home now?", ("canary",)),
        ),
    ),
    (
        (
            "hey, Alexandra here, but hold on, I go by Sasha now, not Alexandra.",
            "i do graphic design from home in Tbilisi",
            "green was my thing for ages, but i've fallen for coral lately",
            "any tips for a sore neck from sitting all day?",
        ),
        (
            ("name", "What should you call me?", ("sasha",)),
            ("job", "What kind of work do I do?", ("graphic", "design")),
            ("city", "Which city do I work from?", ("tbilisi",)),
            ("colour", "What's my favourite colour now?", ("coral",)),
        ),
    ),
    (
        (
            "Hello, my name is Grace Mensah and I work at a chocolate factory in Takoradi.",
            "On Saturdays I dance salsa with my cousin.",
            "I got laid off from the factory in May, so now I drive for a delivery company.",
            "Do you know a good way to remember street names?",
            "I stopped going to salsa, it clashed with my shifts. Now I do yoga in the mornings.",
        ),
        (
            ("name", "What's my name?", ("grace",)),
            ("job", "What do I do for work now?", ("driv", "deliver")),
            ("city", "Which city am I in?", ("takoradi",)),
            ("hobby", "What do I do in the mornings?", ("yoga",)),
        ),
    ),
    (
        (
            "I'm Bram, a nurse in Leeds, and I play the cello badly.",
            "My cat Pip sleeps on the cello case.",
            "What's a quick healthy lunch I can take to work?",
            "Moved to York last month, still a nurse, still bad at the cello.",
        ),
        (
            ("name", "What's my name?", ("bram",)),
            ("job", "What's my job?", ("nurs",)),
            ("city", "Where do I live now?", ("york",)),
            ("pet", "What kind of animal is Pip?", ("cat",)),
        ),
    ),
    (
        (
            "hiii I'm Noor, I study medicine in Amman. purple is my favourite colour!",
            "my hobby is running, I do 10k every friday",
            "can you explain what a placebo is?",
            "I said purple before, but honestly it's gold now. "
            "and these days I'm more into baking than running, my knees gave up",
        ),
        (
            ("name", "What's my name?", ("noor",)),
            ("job", "What do I study?", ("medicine",)),
            ("city", "Where do I study?", ("amman",)),
            ("colour", "What's my favourite colour?", ("gold",)),
            ("hobby", "What's my hobby these days?", ("bak",)),
        ),
    ),
    (
        (
            "Hi, I'm Rui, a fisherman from Porto. I have an old labrador called Rex.",
            "I love the colour blue, like the sea.",
            "How do I fix a squeaky door?",
            "Sadly we lost Rex in the summer. We've adopted a cat called Miso.",
            "And I'm no longer in Porto, we're in Braga since June.",
        ),
        (
            ("name", "What's my name?", ("rui",)),
            ("job", "What do I do for a living?", ("fish",)),
            ("city", "Where do I live now?", ("braga",)),
            ("pet", "What pet do I have now?", ("cat",)),
            ("colour", "What colour do I love?", ("blue",)),
        ),
    ),
    (
        (
            "Evening! Name's Kofi, I'm a bus mechanic in Kumasi.",
            "I keep pigeons on my roof, twelve of them.",
            "What's the best way to clean greasy hands?",
            "Quick one: I'm not fixing buses any more. I teach at the technical college now.",
        ),
        (
            ("name", "What's my name?", ("kofi",)),
            ("job", "What do I do now?", ("teach",)),
            ("city", "Which city am I in?", ("kumasi",)),
            ("pet", "What do I keep on my roof?", ("pigeon",)),
        ),
    ),
]

AFTER_OLDER: dict[tuple[int, str], tuple[str, ...]] = {
    (0, "city"): ("bilbao",),
    (1, "job"): ("chef",),
    (1, "pet"): ("dachshund",),
    (2, "name"): ("alexandra",),
    (2, "colour"): ("green",),
    (3, "job"): ("chocolate", "factory"),
    (3, "hobby"): ("salsa",),
    (4, "city"): ("leeds",),
    (5, "colour"): ("purple",),
    (5, "hobby"): ("running",),
    (6, "pet"): ("labrador",),
    (6, "city"): ("porto",),
    (7, "job"): ("mechanic", "bus"),
}

# written after every rule of LOG.md 2026-12-06 (r) (``--last``): fitted to nothing
LAST: list[tuple[tuple[str, ...], tuple[Asked, ...]]] = [
    (
        (
            "Hey, I'm Oskar, a welder in Malmö. Big football fan.",
            "What's a good stretch for a stiff back?",
            "Update: I'm a welding instructor at the trade school now, no more night shifts.",
        ),
        (
            ("name", "What's my name?", ("oskar",)),
            ("job", "What do I do now?", ("instructor", "teach")),
            ("city", "Which city do I live in?", ("malmö", "malmo")),
        ),
    ),
    (
        (
            "Hello, I'm Leilani. I work at a surf shop in Hilo and I have a gecko named Mochi.",
            "Can you recommend a book about the ocean?",
            "Mochi escaped last week and we never found him. We got a hermit crab for the kids.",
        ),
        (
            ("name", "What's my name?", ("leilani",)),
            ("job", "Where do I work?", ("surf",)),
            ("city", "What town am I in?", ("hilo",)),
            ("pet", "What pet do we have now?", ("hermit crab", "crab")),
        ),
    ),
    (
        (
            "Good day. My name is Siobhan and I teach history in Limerick.",
            "My favourite colour is emerald, naturally.",
            "How many cups of tea is too many?",
            "I've moved to Dublin for a new post, still teaching history.",
        ),
        (
            ("name", "What's my name?", ("siobhan",)),
            ("job", "What do I teach?", ("history",)),
            ("city", "Where do I live now?", ("dublin",)),
            ("colour", "What's my favourite colour?", ("emerald",)),
        ),
    ),
    (
        (
            "hi, I'm Arjun, accountant in Chennai. cricket every sunday",
            "what's a quick way to learn excel shortcuts?",
            "I'm done with cricket, tore a ligament. I've started swimming instead.",
        ),
        (
            ("name", "What's my name?", ("arjun",)),
            ("job", "What's my job?", ("accountant",)),
            ("city", "Which city am I in?", ("chennai",)),
            ("hobby", "What do I do for exercise now?", ("swim",)),
        ),
    ),
    (
        (
            "Hi there, I'm Małgorzata but please just call me Gosia. I'm a librarian in Kraków.",
            "My favourite colour is mustard yellow.",
            "What's a good board game for four adults?",
            "Honestly I'm more of a plum person these days, mustard was a phase.",
        ),
        (
            ("name", "What should you call me?", ("gosia",)),
            ("job", "What's my job?", ("librarian",)),
            ("city", "Where do I live?", ("kraków", "krakow")),
            ("colour", "What's my favourite colour now?", ("plum",)),
        ),
    ),
    (
        (
            "Hello! I'm Tendai, a mining engineer in Bulawayo. I keep chickens in the back yard.",
            "How do I keep hawks away from chickens?",
            "I've left mining, I'm a high school maths teacher in Harare now.",
        ),
        (
            ("name", "What's my name?", ("tendai",)),
            ("job", "What do I do now?", ("teach", "math")),
            ("city", "Where do I live now?", ("harare",)),
            ("pet", "What animals do I keep?", ("chicken",)),
        ),
    ),
]

LAST_OLDER: dict[tuple[int, str], tuple[str, ...]] = {
    (0, "job"): ("welder",),
    (1, "pet"): ("gecko",),
    (2, "city"): ("limerick",),
    (3, "hobby"): ("cricket",),
    (4, "name"): ("małgorzata", "malgorzata"),
    (4, "colour"): ("mustard",),
    (5, "job"): ("mining", "engineer"),
    (5, "city"): ("bulawayo",),
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--last" in args:  # the users written after every rule
        args.remove("--last")
        return play(LAST, FILLERS, "last", args, __doc__.split("\n\n")[0], LAST_OLDER)
    if "--after" in args:  # the users written after the rules
        args.remove("--after")
        return play(AFTER, FILLERS, "after", args, __doc__.split("\n\n")[0], AFTER_OLDER)
    return play(USERS, FILLERS, "late", args, __doc__.split("\n\n")[0], OLDER)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
