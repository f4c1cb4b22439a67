"""Synthetic fact dialogues: a user states three personal facts in one message, chats, and is later asked about each.

An episode is ``opening`` chit-chat turns, the statement turn, ``between`` unrelated turns, and one probe per
fact asked from the state after the last turn. A probe's reply is ``prefix + " " + value + suffix``, so an
evaluation can score the value right after the prefix.

Splits. Every piece of wording (openers, clause templates, connectors, acknowledgements, chit-chat pairs,
questions and answer templates) exists once for "train" and once, worded differently, for "heldout"; the
names and cities of the two splits are disjoint too. The closed values (job, colour, pet, hobby) are shared,
so held-out evaluation asks whether a known value is carried through unseen phrasings.

Chit-chat never contains a value of any kind, nor a colour word, and never asks about the user. All
randomness comes from the ``random.Random`` passed in, or one seeded from a string (``episodes``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sia.learn.dialogue import Exchange

__all__ = [
    "CLOSED_KINDS",
    "CLOSED_VALUES",
    "KINDS",
    "OPEN_KINDS",
    "SPLITS",
    "Episode",
    "Fact",
    "Probe",
    "ask",
    "chitchat",
    "draw_kinds",
    "episodes",
    "make_episode",
    "values",
    "wordings",
]

KINDS: tuple[str, ...] = ("name", "city", "job", "colour", "pet", "hobby")
CLOSED_KINDS: tuple[str, ...] = ("job", "colour", "pet", "hobby")  # values shared by both splits
OPEN_KINDS: tuple[str, ...] = ("name", "city")  # open vocabulary: each split has its own values
SPLITS: tuple[str, ...] = ("train", "heldout")

CLOSED_VALUES: dict[str, tuple[str, ...]] = {
    "colour": ("red", "blue", "green", "yellow", "purple", "orange"),
    "pet": ("cat", "dog", "rabbit", "parrot", "hamster", "turtle"),
    "hobby": ("painting", "hiking", "baking", "cycling", "gardening", "swimming"),
    "job": ("teacher", "nurse", "engineer", "chef", "pilot", "farmer"),
}

_NAMES: dict[str, tuple[str, ...]] = {
    "train": (
        "Aisha", "Mateo", "Priya", "Kenji", "Olga", "Tomasz", "Ngozi", "Liam", "Sofia", "Arjun", "Mei", "Youssef",
        "Ingrid", "Diego", "Hana", "Kwame", "Elena", "Rafael", "Anika", "Bjorn", "Chloe", "Dmitri", "Fatima", "Hiroshi",
        "Isabel", "Jamal", "Katarina", "Lucas", "Maya", "Nikolai", "Oliver", "Paulo", "Rania", "Samuel", "Tariq",
        "Valentina", "Wei", "Ximena", "Yara", "Zoltan", "Amara", "Bruno", "Carmen", "Daniel", "Emeka", "Freya",
        "Giulia", "Hassan", "Jonas", "Keiko", "Lars", "Marisol", "Nadia", "Omar", "Quentin", "Ahmed", "Vikram",
        "Willem", "Yusuf", "Zainab", "Aroha", "Siddharth", "Mariam", "Emil", "Chiara",
    ),
    "heldout": (
        "Adebayo", "Beatriz", "Cormac", "Dalia", "Esteban", "Farida", "Gunnar", "Haruto", "Ifeoma", "Joaquin",
        "Kalani", "Leilani", "Magnus", "Noor", "Oksana", "Rashid", "Sunita", "Thiago", "Ulrike", "Wanjiru", "Xiang",
        "Yesenia", "Zeynep", "Anders", "Bongani", "Catalina", "Mirela", "Tevita",
    ),
}  # fmt: skip

_CITIES: dict[str, tuple[str, ...]] = {
    "train": (
        "Tokyo", "Lagos", "Buenos Aires", "Toronto", "Mumbai", "Cairo", "Berlin", "Madrid", "Sydney", "Seoul",
        "Nairobi", "Lima", "Oslo", "Dublin", "Istanbul", "Bangkok", "Mexico City", "Cape Town", "Vienna", "Prague",
        "Lisbon", "Warsaw", "Stockholm", "Helsinki", "Athens", "Amsterdam", "Brussels", "Copenhagen", "Montreal",
        "Vancouver", "Chicago", "Boston", "San Francisco", "Los Angeles", "Seattle", "Melbourne", "Auckland",
        "Singapore", "Jakarta", "Manila", "Hanoi", "Delhi", "Karachi", "Dhaka", "Casablanca", "Accra", "Addis Ababa",
        "Santiago", "Bogota", "Havana", "Rio de Janeiro", "Edinburgh", "Munich", "Zurich", "Kyoto", "Shanghai",
    ),
    "heldout": (
        "Paris", "London", "Rome", "New York", "Beijing", "Moscow", "Hong Kong", "Barcelona", "Budapest", "Marrakesh",
        "Dakar", "Kampala", "Montevideo", "Quito", "Caracas", "Taipei", "Osaka", "Kuala Lumpur", "Wellington",
        "Reykjavik", "Tallinn", "Krakow", "Porto", "Seville", "Kathmandu", "Lahore", "Doha", "Tehran",
    ),
}  # fmt: skip

OPENER_RATE = 0.6  # chance that a statement message starts with a greeting
CLOSER_RATE = 0.25  # chance that it ends with a closing sentence
EXCLAIM_RATE = 0.3  # chance that the statement ends with "!" rather than "."
INDIRECT_RATE = 1 / 3  # chance that a probe is an indirect question
OPENING_RATE = 0.3  # chance of one chit-chat turn before the statement (when `opening` is not given)


@dataclass(frozen=True)
class Fact:
    kind: str
    value: str


@dataclass(frozen=True)
class Probe:
    """A later question about one fact, asked from the state after the episode's last turn."""

    kind: str
    value: str
    question: str  # the user's message
    reply_prefix: str  # the reply up to the value, without trailing space
    reply_suffix: str  # what follows the value

    @property
    def reply(self) -> str:
        return f"{self.reply_prefix} {self.value}{self.reply_suffix}"


@dataclass(frozen=True)
class Episode:
    user: str  # opaque user id
    split: str
    facts: tuple[Fact, ...]  # stated together in turns[stated_at].user
    turns: tuple[Exchange, ...]  # `stated_at` chit-chat turns, the statement turn, then `between` unrelated turns
    stated_at: int
    probes: tuple[Probe, ...]  # one per fact, same order as facts

    @property
    def between(self) -> int:
        return len(self.turns) - self.stated_at - 1


@dataclass(frozen=True)
class _Question:
    text: str
    answers: tuple[tuple[str, str], ...]  # (prefix, suffix); a prefix may hold {a}, the value's article


@dataclass(frozen=True)
class _Style:
    """Everything one split can say. Templates hold {v} (the value) and {a} ("a" or "an" for that value)."""

    openers: tuple[str, ...]
    connectors: tuple[str, ...]  # placed between two clauses, none twice in a message: at least len(KINDS) - 1
    closers: tuple[str, ...]
    clauses: dict[str, tuple[str, ...]]  # kind -> statement clauses
    acks_named: tuple[str, ...]  # acknowledgements that greet the user by {name}
    acks: tuple[str, ...]  # acknowledgements without a name
    direct: dict[str, tuple[_Question, ...]]  # kind -> questions that ask for the fact
    indirect: dict[str, tuple[_Question, ...]]  # kind -> questions whose answer needs the fact
    chitchat: tuple[tuple[str, str], ...]  # (user, reply) on everyday topics


def _q(text: str, *answers: tuple[str, str]) -> _Question:
    return _Question(text, answers)


_TRAIN = _Style(
    openers=(
        "Hi!",
        "Hey there.",
        "Good evening!",
        "Hello!",
        "Hey!",
        "Good morning!",
        "Hi there!",
        "Okay, a bit about me.",
        "Let me introduce myself.",
    ),
    connectors=(", ", " and ", ". Also, ", "; ", ". Oh, and ", ", and also "),
    closers=("Just so you know.", "Thought I'd share.", "That's me!"),
    clauses={
        "name": (
            "I'm {v}",
            "my name is {v}",
            "people call me {v}",
            "the name's {v}",
            "I go by {v}",
            "{v} is my name",
            "you can call me {v}",
            "my friends call me {v}",
            "I'm called {v}",
            "this is {v} writing",
            "my parents named me {v}",
            "everyone knows me as {v}",
        ),
        "city": (
            "I live in {v}",
            "home for me is {v}",
            "I grew up in {v} and still live there",
            "I'm based in {v}",
            "my home is in {v}",
            "I've lived in {v} for years",
            "I call {v} home",
            "my flat is in {v}",
            "these days I live in {v}",
            "{v} is where I live",
            "I moved to {v} a few years ago",
            "my address is in {v}",
        ),
        "job": (
            "I work as {a} {v}",
            "I'm {a} {v} by trade",
            "I earn my living as {a} {v}",
            "I'm {a} {v}",
            "by profession I'm {a} {v}",
            "I've been {a} {v} for years",
            "I trained as {a} {v} and still work as one",
            "I work full-time as {a} {v}",
            "I have a job as {a} {v}",
            "I'm employed as {a} {v}",
            "for work, I'm {a} {v}",
            "my job is working as {a} {v}",
        ),
        "colour": (
            "my favourite colour is {v}",
            "{v} is the colour I love most",
            "I adore the colour {v}",
            "I like {v} more than any other colour",
            "my favourite shade is {v}",
            "I always pick {v} when I get to choose a colour",
            "if I had to pick one colour it would be {v}",
            "I'm a big fan of the colour {v}",
            "{v} is my colour",
            "nothing beats {v} for me when it comes to colours",
            "the colour I like best is {v}",
            "most of what I wear is {v}, my favourite colour",
        ),
        "pet": (
            "I have {a} {v}",
            "I share my flat with {a} {v}",
            "I own {a} {v}",
            "I've got {a} {v} at home",
            "there's {a} {v} living with me",
            "my pet is {a} {v}",
            "I look after {a} {v}",
            "I live with my pet {v}",
            "I adopted {a} {v} last year",
            "my only pet is {a} {v}",
            "at home I keep {a} {v}",
            "I'm the proud owner of {a} {v}",
        ),
        "hobby": (
            "I love {v}",
            "my favourite pastime is {v}",
            "I spend my weekends {v}",
            "my hobby is {v}",
            "I really enjoy {v}",
            "{v} is how I relax",
            "I'm really into {v}",
            "I'm passionate about {v}",
            "whenever I have spare time I'm {v}",
            "nothing relaxes me like {v}",
            "my main hobby is {v}",
            "I've been into {v} for years",
        ),
    },
    acks_named=(
        "Nice to meet you, {name}! Thanks for telling me a bit about yourself.",
        "Lovely to meet you, {name}. I'll keep that in mind.",
        "Thanks, {name}! Good to know a little about you.",
        "Hello, {name}! That's a nice introduction.",
        "Great to meet you, {name}. Noted!",
        "Pleasure to meet you, {name}. Thanks for sharing.",
        "Got it, {name}. Thanks for the introduction!",
        "Welcome, {name}! I'll remember what you told me.",
    ),
    acks=(
        "Thanks for telling me a bit about yourself!",
        "Good to know, I'll keep that in mind.",
        "Thanks for sharing that with me.",
        "Noted! It's nice to learn about you.",
        "Got it. Thanks for the introduction!",
        "That's lovely to hear. I'll remember it.",
        "Thank you, that helps me get to know you.",
        "Great, I've made a note of all that.",
    ),
    direct={
        "name": (
            _q("What's my name?", ("Your name is", "."), ("You're", ".")),
            _q("Do you remember my name?", ("Of course, your name is", "."), ("Yes, you're", ".")),
            _q("Remind me, what am I called?", ("You're called", ".")),
            _q("Who am I?", ("You're", ", if I remember right.")),
            _q("Can you tell me my name again?", ("Sure, it's", ".")),
            _q("What did I say my name was?", ("You said your name is", ".")),
            _q("Which name did I give you?", ("You told me your name is", ".")),
            _q("What should you call me?", ("I should call you", ".")),
        ),
        "city": (
            _q("Where do I live?", ("You live in", "."), ("In", ".")),
            _q("Remind me, where do I live?", ("You live in", ", as far as I remember.")),
            _q("Which city do I live in?", ("You live in", ".")),
            _q("Do you remember where I live?", ("Yes, you live in", ".")),
            _q("What's my home city?", ("Your home city is", ".")),
            _q("Where's home for me?", ("Home for you is", ".")),
            _q("Which city did I say I live in?", ("You said you live in", ".")),
            _q("Can you remind me which city I call home?", ("You call", " home.")),
        ),
        "job": (
            _q("What do I do for a living?", ("You're {a}", "."), ("You work as {a}", ".")),
            _q("What's my job?", ("You work as {a}", ".")),
            _q("Remind me, what's my profession?", ("You're {a}", " by profession.")),
            _q("Do you remember my job?", ("Yes, you work as {a}", ".")),
            _q("What's my line of work?", ("You're {a}", ", if I remember correctly.")),
            _q("What did I tell you about my work?", ("You told me you're {a}", ".")),
            _q("How do I earn my living?", ("You earn it as {a}", ".")),
            _q("What's my occupation?", ("Your occupation:", ".")),
        ),
        "colour": (
            _q("What's my favourite colour?", ("Your favourite colour is", ".")),
            _q("Do you remember which colour I like best?", ("The colour you like best is", ".")),
            _q("Which colour do I love most?", ("You love", " most.")),
            _q("Remind me, what's my favourite colour?", ("It's", ".")),
            _q("Can you tell me my favourite colour?", ("Sure, your favourite colour is", ".")),
            _q("What colour did I say I like?", ("You said you like", ".")),
            _q("Which colour would I choose if I could only pick one?", ("You'd choose", ".")),
            _q("What's my colour?", ("Your colour is", ".")),
        ),
        "pet": (
            _q("What pet do I have?", ("You have {a}", ".")),
            _q("Do you remember what kind of pet I have?", ("Yes, you have {a}", ".")),
            _q("What animal lives with me?", ("You live with {a}", ".")),
            _q("Remind me, what's my pet?", ("Your pet is {a}", ".")),
            _q("What kind of animal do I own?", ("You own {a}", ".")),
            _q("Which pet did I mention?", ("You mentioned {a}", ".")),
            _q("What did I say about my pet?", ("You said you have {a}", ".")),
            _q("Who keeps me company at home?", ("Your", ", I believe.")),
        ),
        "hobby": (
            _q("What do I like to do in my free time?", ("You like", "."), ("You enjoy", ".")),
            _q("What's my hobby?", ("Your hobby is", ".")),
            _q("Do you remember my favourite pastime?", ("Your favourite pastime is", ".")),
            _q("How do I like to spend my weekends?", ("You spend them", ".")),
            _q("Remind me, what am I into?", ("You're into", ".")),
            _q("What do I do to relax?", ("You relax by", ".")),
            _q("What did I say I love doing?", ("You love", ".")),
            _q("Which activity do I enjoy most?", ("You enjoy", " most.")),
        ),
    },
    indirect={
        "name": (
            _q("How would you greet me?", ("Hello,", "!"), ("Hi there,", "!")),
            _q("If you wrote me a letter, how would it begin?", ("It would start with Dear", ".")),
            _q("I'm signing a birthday card for a friend. Which name should I sign it with?", ("Sign it with", ".")),
            _q("I'm booking a table at a restaurant. What name should I give them?", ("Book it under", ".")),
        ),
        "city": (
            _q("I'm flying home next week. Where am I flying to?", ("You're flying home to", ".")),
            _q("If I want the weather forecast for where I live, which city should I look up?", ("Look up", ".")),
            _q("I'm sending a parcel to my own address. Which city goes on the label?", ("The label should say", ".")),
            _q("After my holiday, which city will I return to?", ("You'll return to", ".")),
        ),
        "job": (
            _q("My nephew asked what I do at work. What should I tell him?", ("Tell him you're {a}", ".")),
            _q("I'm filling in a form that asks for my occupation. What do I write?", ("Write", ".")),
            _q("At a party, someone asks what I do. What's my answer?", ("Say you're {a}", ".")),
            _q("I'm updating my profile on a job site. What job title should I put?", ("Your job title is", ".")),
        ),
        "colour": (
            _q("I'm buying a new scarf. Which colour should I pick, knowing me?", ("Knowing you, I'd pick something", ".")),
            _q("I'm repainting my front door. What colour would make me happy?", ("Paint it", ", your favourite.")),
            _q("Which colour of balloons should my friends get for my birthday?", ("They should get", " balloons.")),
            _q("I want a new mug in a colour I'd love. Which one?", ("Get one in", ".")),
        ),
        "pet": (
            _q("What kind of food should I buy for my pet?", ("Food for your", ", of course.")),
            _q("I'm going away for a week. Who needs a pet sitter?", ("Your", " does.")),
            _q("I want to buy my pet a toy. What kind of toy?", ("A toy made for {a}", ".")),
            _q("The vet called about my pet. Which animal is the appointment for?", ("It's for your", ".")),
        ),
        "hobby": (
            _q("I have a free Saturday. How should I spend it?", ("How about some", "? You love it.")),
            _q(
                "I'm looking for a magazine subscription I'd enjoy. What should it be about?",
                ("A magazine about", " would suit you."),
            ),
            _q("My friend wants to get me a gift. What should it be related to?", ("Something for", ", which you love.")),
            _q("I want to join a club. Which kind of club would suit me?", ("A club for", " would be perfect.")),
        ),
    },
    chitchat=(
        (
            "How long should I boil an egg for a soft yolk?",
            "About six minutes in gently boiling water gives a soft, jammy yolk. Cool it under cold water straight after.",
        ),
        (
            "Why does bread go stale?",
            "As bread sits, its starch recrystallises and pushes out moisture, which makes it firm and dry. "
            "Keeping it well wrapped at room temperature slows this down.",
        ),
        (
            "What's a quick way to peel garlic?",
            "Press each clove under the flat of a knife until the skin cracks; the skin will then slip off easily.",
        ),
        (
            "Can you freeze cooked rice?",
            "Yes. Cool it quickly, seal it in a bag or box and freeze it within an hour or so. "
            "Reheat it until it is steaming hot all the way through.",
        ),
        (
            "How do I stop pasta sticking together?",
            "Use plenty of water, stir during the first couple of minutes, and drain it as soon as it is done. "
            "Tossing it straight into the sauce helps too.",
        ),
        (
            "What does yeast do in bread dough?",
            "Yeast feeds on sugars in the flour and releases carbon dioxide, which gets trapped in the gluten "
            "and makes the dough rise. It adds flavour too.",
        ),
        (
            "Why do onions make people cry?",
            "Cutting an onion releases a sulphur compound that irritates the eyes. "
            "A sharp knife and a chilled onion reduce the effect.",
        ),
        (
            "How can I tell if an avocado is ripe?",
            "Press gently near the stem: a ripe one yields slightly without feeling mushy. "
            "If it is rock hard, leave it in a fruit bowl for a day or two.",
        ),
        (
            "What's a simple way to make soup thicker?",
            "Blend part of the soup and stir it back in, or add a handful of lentils or a diced potato and simmer a bit longer.",
        ),
        (
            "Is it a good idea to wash raw chicken?",
            "It's better not to: rinsing spreads bacteria around the sink. Cooking it thoroughly is what makes it safe.",
        ),
        (
            "Why is there thunder after lightning?",
            "Lightning heats the air so fast that it expands explosively, and that shock wave is the thunder. "
            "Light travels faster than sound, so you see the flash first.",
        ),
        (
            "How do rainbows form?",
            "Sunlight enters raindrops, bends, reflects off the back of each drop and bends again on the way out, "
            "which splits it by wavelength. You see one with the sun behind you and rain in front.",
        ),
        (
            "What does a humidity of 90 percent mean?",
            "The air holds 90 percent of the water vapour it could hold at that temperature. "
            "Sweat evaporates slowly then, so it feels muggy.",
        ),
        (
            "Why is it colder at the top of a mountain?",
            "Air pressure drops with height, and air that expands cools down. "
            "On average the temperature falls about 6.5 degrees Celsius for every kilometre you climb.",
        ),
        (
            "What's the difference between weather and climate?",
            "Weather is what the atmosphere does over hours or days; climate is the average pattern over decades.",
        ),
        (
            "How does fog form?",
            "Fog forms when air near the ground cools to its dew point, so water vapour condenses into tiny droplets "
            "that hang in the air.",
        ),
        (
            "Why are there seasons?",
            "The Earth's axis is tilted by about 23.5 degrees, so each hemisphere gets more direct sunlight "
            "for part of the year and less for the rest.",
        ),
        (
            "How fast does light travel?",
            "About 300,000 kilometres per second in a vacuum. Sunlight takes roughly eight minutes to reach us.",
        ),
        (
            "What is photosynthesis?",
            "It's how plants use sunlight to turn carbon dioxide and water into sugar, releasing oxygen as a by-product.",
        ),
        (
            "Why does ice float?",
            "Water expands when it freezes, so ice is less dense than liquid water and floats on top.",
        ),
        (
            "What is DNA?",
            "DNA is the molecule that carries the genetic instructions of living things. "
            "It's a double helix built from four kinds of bases.",
        ),
        (
            "How do magnets work?",
            "In a magnet the tiny magnetic fields of many electrons line up in the same direction, "
            "and together they make a field that attracts or repels other magnets and iron.",
        ),
        (
            "What is the boiling point of water?",
            "At sea level water boils at 100 degrees Celsius. "
            "Higher up, where air pressure is lower, it boils at a lower temperature.",
        ),
        (
            "Why do we have tides?",
            "Mainly because the Moon's gravity pulls on the oceans, with a smaller pull from the Sun. "
            "Most coasts get two high tides a day.",
        ),
        (
            "What's an atom made of?",
            "A tiny nucleus of protons and neutrons, surrounded by electrons. Almost all of its mass is in the nucleus.",
        ),
        (
            "How many planets are in the solar system?",
            "Eight: Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus and Neptune. "
            "Pluto was reclassified as a dwarf planet in 2006.",
        ),
        (
            "Why does the Moon have phases?",
            "As the Moon orbits the Earth, we see different portions of its sunlit half. A full cycle takes about 29.5 days.",
        ),
        (
            "What is a light-year?",
            "It's a distance, not a time: how far light travels in one year, about 9.46 trillion kilometres.",
        ),
        (
            "Is the Sun a star?",
            "Yes, a fairly ordinary one: a ball of hot plasma powered by nuclear fusion in its core.",
        ),
        (
            "How long is a day on Mars?",
            "A Martian day, called a sol, lasts about 24 hours and 40 minutes, only a little longer than ours.",
        ),
        (
            "When did the Second World War end?",
            "In 1945: in Europe in May, and in the Pacific in September, when Japan formally surrendered.",
        ),
        (
            "What was the Renaissance?",
            "A period of European cultural revival from roughly the 14th to the 17th century, "
            "marked by new interest in classical learning, art and science.",
        ),
        (
            "When was the printing press invented?",
            "Johannes Gutenberg developed his movable-type press around 1440, and printed books spread quickly after that.",
        ),
        (
            "Why was the Great Wall of China built?",
            "Mainly to protect against raids and invasions from the north. "
            "Different dynasties built and rebuilt it over many centuries.",
        ),
        (
            "Who was the first person to walk on the Moon?",
            "Neil Armstrong, on 20 July 1969, during the Apollo 11 mission.",
        ),
        (
            "When did the Roman Empire fall?",
            "The western half is usually said to have fallen in 476 AD; "
            "the eastern half, the Byzantine Empire, lasted until 1453.",
        ),
        (
            "What was the Industrial Revolution?",
            "The shift from hand production to machines and factories, "
            "which began in Britain in the late 18th century and spread worldwide.",
        ),
        (
            "Any tips for dealing with jet lag?",
            "Switch to local time as soon as you arrive, get daylight in the morning and keep naps short. "
            "Drinking water and avoiding heavy late meals help too.",
        ),
        (
            "How early should I get to the airport for an international flight?",
            "Around three hours before departure is a safe rule, especially if you need to check a bag.",
        ),
        (
            "What should go in a carry-on bag?",
            "Medicines, chargers, travel documents, a change of clothes and anything valuable. "
            "Keep liquids in small containers if the rules require it.",
        ),
        (
            "How can travellers avoid getting sick from tap water?",
            "Where the water isn't safe, drink bottled or boiled water, skip the ice, and brush your teeth with safe water too.",
        ),
        (
            "Is it worth buying travel insurance?",
            "For most trips, yes: it can cover medical bills, cancellations and lost luggage, which are costly abroad.",
        ),
        (
            "How do I pack a suitcase efficiently?",
            "Roll soft clothes, put heavy items near the wheels, and use shoes to hold small things like socks.",
        ),
        (
            "Can you recommend a classic novel for a beginner?",
            "Pride and Prejudice is a great start: witty, readable and not too long. Of Mice and Men is another short classic.",
        ),
        (
            "Who wrote War and Peace?",
            "Leo Tolstoy. It was first published in full in 1869.",
        ),
        (
            "Any advice for reading more books?",
            "Carry one with you, read a few pages before bed, and feel free to drop a book you're not enjoying.",
        ),
        (
            "What is a haiku?",
            "A short Japanese poem of three lines, traditionally with five, seven and five syllables.",
        ),
        (
            "Who wrote Hamlet?",
            "William Shakespeare, around 1600. It's the longest of his plays.",
        ),
        (
            "What's the difference between fiction and non-fiction?",
            "Fiction tells invented stories; non-fiction presents facts and real events, as in biographies or history.",
        ),
        (
            "How many keys does a piano have?",
            "A standard piano has 88 keys: 52 for the natural notes and 36 for the sharps and flats.",
        ),
        (
            "What does tempo mean in music?",
            "Tempo is the speed of a piece, usually given in beats per minute.",
        ),
        (
            "Who composed The Four Seasons?",
            "Antonio Vivaldi, an Italian composer of the Baroque era. The four concertos were published in 1725.",
        ),
        (
            "Is it too late to learn an instrument as an adult?",
            "Not at all. Adults often progress quickly because they practise with focus; short daily sessions work best.",
        ),
        (
            "How many strings does a standard guitar have?",
            "Six, usually tuned E, A, D, G, B and E from the lowest to the highest.",
        ),
        (
            "What is an octave?",
            "The interval between one note and the next note with the same name, at double or half the frequency.",
        ),
        (
            "What's 15 percent of 80?",
            "15 percent of 80 is 12.",
        ),
        (
            "What is a prime number?",
            "A whole number greater than 1 whose only divisors are 1 and itself, such as 2, 3, 5, 7 and 11.",
        ),
        (
            "What's the square root of 144?",
            "It's 12, because 12 times 12 is 144.",
        ),
        (
            "How do I calculate the area of a circle?",
            "Multiply pi by the radius squared. A circle with a radius of 3 cm has an area of about 28.3 square centimetres.",
        ),
        (
            "What is pi?",
            "The ratio of a circle's circumference to its diameter, about 3.14159. Its decimal digits never end or repeat.",
        ),
        (
            "How many degrees are in a triangle?",
            "The interior angles of a flat triangle always add up to 180 degrees.",
        ),
        (
            "What's 7 times 8?",
            "7 times 8 is 56.",
        ),
        (
            "How do I convert Celsius to Fahrenheit?",
            "Multiply by 9, divide by 5 and add 32. So 20 degrees Celsius is 68 degrees Fahrenheit.",
        ),
        (
            "How much sleep do adults need?",
            "Most adults need seven to nine hours a night. Regular bed and wake times matter as much as the total.",
        ),
        (
            "Why do long naps leave people groggy?",
            "A long nap can reach deep sleep, and waking from it causes grogginess. Naps of about 20 minutes avoid that.",
        ),
        (
            "Does screen time before bed affect sleep?",
            "It can: bright screens delay the release of melatonin, and stimulating content keeps the mind busy. "
            "Dimming screens an hour before bed helps.",
        ),
        (
            "What helps with falling asleep faster?",
            "A cool, dark, quiet room, a regular schedule and no caffeine in the afternoon. A short wind-down routine helps too.",
        ),
        (
            "How often should I stretch?",
            "A few minutes most days keeps you flexible. Stretch when your muscles are warm, for example after a walk.",
        ),
        (
            "Is walking good exercise?",
            "Yes. A brisk 30-minute walk on most days improves heart health, mood and stamina.",
        ),
        (
            "How much water should I drink during a workout?",
            "Sip regularly, roughly half a litre to a litre per hour of exercise, more if it's hot and you're sweating a lot.",
        ),
        (
            "What's a good warm-up before running?",
            "Five to ten minutes of easy jogging followed by leg swings and lunges gets your muscles ready.",
        ),
        (
            "How many push-ups should a beginner do?",
            "Start with a few sets of what you can do with good form, even if that's five, and add one or two each week.",
        ),
        (
            "What's the difference between RAM and storage?",
            "RAM is fast, temporary memory for what the computer is working on right now; "
            "storage keeps files when the power is off.",
        ),
        (
            "How do I make a strong password?",
            "Use a long passphrase of several unrelated words, a different one for each account, "
            "and a password manager to keep track.",
        ),
        (
            "What is a VPN?",
            "A virtual private network encrypts your internet traffic and routes it through a server elsewhere, "
            "hiding it from the local network.",
        ),
        (
            "Why do phone batteries drain so fast?",
            "Screen brightness, background apps and a weak signal are the usual culprits. "
            "The battery settings show which apps use the most.",
        ),
        (
            "What is cloud storage?",
            "Keeping files on servers run by a provider and reaching them over the internet, "
            "so they're backed up and available from any device.",
        ),
        (
            "What does HTML stand for?",
            "HyperText Markup Language, the language that structures web pages.",
        ),
        (
            "How does Wi-Fi work?",
            "A router sends and receives data as radio waves, and nearby devices decode those waves back into information.",
        ),
        (
            "What's the most spoken language in the world?",
            "Counting second-language speakers, English has the most; Mandarin Chinese has the most native speakers.",
        ),
        (
            "How do you say thank you in Japanese?",
            "Arigato, or more politely, arigato gozaimasu.",
        ),
        (
            "What's the difference between affect and effect?",
            "Usually affect is the verb and effect is the noun: rain affects the mood; rain has an effect on the mood.",
        ),
        (
            "What is a palindrome?",
            "A word or phrase that reads the same backwards and forwards, like level or racecar.",
        ),
        (
            "How many letters are in the English alphabet?",
            "Twenty-six: five vowels, A, E, I, O and U, and twenty-one consonants, although Y sometimes acts as a vowel.",
        ),
        (
            "What's the best way to learn vocabulary in a new language?",
            "Short daily reviews with spaced repetition, and using new words in your own sentences, work better than cramming.",
        ),
        (
            "Why do leaves change in autumn?",
            "As days shorten, trees stop making chlorophyll, so other pigments that were hidden underneath show through.",
        ),
        (
            "How many bones are in the human body?",
            "An adult has 206 bones. Babies are born with around 300, and some fuse together as they grow.",
        ),
        (
            "How can I save money on groceries?",
            "Plan meals for the week, shop with a list, buy store brands and avoid shopping when you're hungry.",
        ),
        (
            "Why do we yawn?",
            "Nobody knows for sure. One leading idea is that yawning helps cool the brain; it's also famously contagious.",
        ),
        (
            "How many hearts does an octopus have?",
            "Three: two pump blood through the gills and one pumps it around the rest of the body.",
        ),
        (
            "What's the tallest mountain in the world?",
            "Mount Everest, at about 8,849 metres above sea level, on the border of Nepal and China.",
        ),
        (
            "What's the largest ocean?",
            "The Pacific, which covers about a third of the Earth's surface.",
        ),
        (
            "How long does it take to form a habit?",
            "It varies a lot; one study found an average of about 66 days, from a few weeks to several months.",
        ),
    ),
)

_HELDOUT = _Style(
    openers=("Greetings!", "Howdy!", "Good afternoon!", "Hiya.", "Evening!", "Right, some things about me."),
    connectors=(" — ", ". What's more, ", ", plus ", ". Besides that, ", "; on top of that, "),
    closers=("There you go.", "That's me in a nutshell.", "Now you know me a little."),
    clauses={
        "name": (
            "I answer to {v}",
            "the name on my passport is {v}",
            "folks know me as {v}",
            "my first name is {v}",
            "you're talking to {v}",
            "I was given the name {v} at birth",
        ),
        "city": (
            "I reside in {v}",
            "{v} has been my home for a while now",
            "you'll find me living in {v}",
            "I rent an apartment in {v}",
            "I settled in {v} after university",
            "my front door is in {v}",
        ),
        "job": (
            "I pay the bills working as {a} {v}",
            "professionally, I'm {a} {v}",
            "I put food on the table as {a} {v}",
            "I've built a career as {a} {v}",
            "I spend my working days as {a} {v}",
            "my employer hired me as {a} {v}",
        ),
        "colour": (
            "I'm drawn to anything {v}",
            "{v} has always been my favourite hue",
            "given the choice, I'd paint everything {v}",
            "no colour makes me happier than {v}",
            "my go-to colour is {v}",
            "I'd choose {v} over every other colour",
        ),
        "pet": (
            "my little companion at home is {a} {v}",
            "{a} {v} keeps me company at home",
            "{a} {v} rules my household",
            "every evening I feed my {v}",
            "I rescued {a} {v} from a shelter",
            "I come home to my {v} every day",
        ),
        "hobby": (
            "{v} is what I do to unwind",
            "I can't get enough of {v}",
            "my spare hours go into {v}",
            "you'll usually find me {v} on a day off",
            "I'm hooked on {v}",
            "outside of work, {v} keeps me happy",
        ),
    },
    acks_named=(
        "Delighted to make your acquaintance, {name}.",
        "Hi {name}, what a great introduction!",
        "Cheers, {name}. I've taken all of that on board.",
        "Wonderful to hear from you, {name}!",
    ),
    acks=(
        "Understood, and thank you for the details.",
        "How interesting! I've taken that on board.",
        "Appreciate you letting me know!",
        "Fascinating, thanks for filling me in.",
    ),
    direct={
        "name": (
            _q("Could you repeat my name back to me?", ("Your name's", ".")),
            _q("Do you recall what I'm called?", ("I do: you're called", ".")),
            _q("Have you forgotten my name already?", ("Not at all, it's", "!")),
            _q("What name did I introduce myself with?", ("You introduced yourself as", ".")),
        ),
        "city": (
            _q("In which city do I reside?", ("You reside in", ".")),
            _q("Do you recall my city?", ("I recall it's", ".")),
            _q("What place do I call home?", ("That would be", ".")),
            _q("Where is it that I live again?", ("You're living in", ".")),
        ),
        "job": (
            _q("Which profession do I have?", ("You're employed as {a}", ".")),
            _q("Can you recall my career?", ("You've built a career as {a}", ".")),
            _q("What work do I do?", ("You do the work of {a}", ".")),
            _q("Remember what I do professionally?", ("Professionally, you're {a}", ".")),
        ),
        "colour": (
            _q("Which hue is my favourite?", ("Your favourite hue is", ".")),
            _q("Do you recall my go-to colour?", ("Your go-to colour is", ".")),
            _q("Tell me which colour I'm fondest of.", ("You're fondest of", ".")),
            _q("What colour did I name as my favourite?", ("You named", " as your favourite.")),
        ),
        "pet": (
            _q("Which animal did I say I keep?", ("You keep {a}", ".")),
            _q("Do you recall what my pet is?", ("It's {a}", ", I believe.")),
            _q("What creature shares my home?", ("Your home is shared with {a}", ".")),
            _q("Tell me what sort of pet I've got.", ("You've got {a}", ".")),
        ),
        "hobby": (
            _q("What's my favourite way to unwind?", ("You unwind by", ".")),
            _q("Which pastime am I hooked on?", ("You're hooked on", ".")),
            _q("Do you recall what I do on my days off?", ("On your days off you're", ".")),
            _q("What activity did I say I can't get enough of?", ("You can't get enough of", ".")),
        ),
    },
    indirect={
        "name": (
            _q("If you shouted to get my attention across a room, what would you shout?", ("I'd shout", "!")),
            _q("I'm filling in a name badge for a conference. What goes on it?", ("The badge should say", ".")),
        ),
        "city": (
            _q("A friend wants to visit me at home. Which city should they travel to?", ("They should travel to", ".")),
            _q("My train ticket home is booked. What's the destination?", ("The destination is", ".")),
        ),
        "job": (
            _q("My neighbour wants to know what I do for work. What should I say?", ("Tell them you're {a}", ".")),
            _q("I'm writing a short bio for a website. How should it describe my job?", ("It should say you're {a}", ".")),
        ),
        "colour": (
            _q("I'm choosing a new bike frame. What colour should it be?", ("Go for", ", since it's your favourite.")),
            _q("What colour of flowers would cheer me up?", ("Flowers in", " would cheer you up.")),
        ),
        "pet": (
            _q("I'm ordering a new pet bed. Who is it for?", ("Your", " will love it.")),
            _q("My neighbour offered to feed my pet while I'm away. What will they feed?", ("They'll be feeding your", ".")),
        ),
        "hobby": (
            _q("I've got a week of holiday coming up. What would make it perfect for me?", ("Plenty of", ", I'd say.")),
            _q("I want to take an evening class. What subject would I enjoy?", ("A class in", " would suit you.")),
        ),
    },
    chitchat=(
        (
            "Why does popcorn pop?",
            "Each kernel holds a little water. When heated it turns to steam, "
            "the pressure bursts the hard hull, and the starch puffs out.",
        ),
        (
            "How do I keep herbs fresh longer?",
            "Treat soft herbs like cut flowers and stand them in a glass of water in the fridge. "
            "Wrap hardy ones in a damp paper towel.",
        ),
        (
            "What temperature should a fridge be?",
            "Between about 1 and 5 degrees Celsius; 4 degrees or just below is a good target.",
        ),
        (
            "Why does salt melt ice on roads?",
            "Salt dissolves into the thin film of water on the ice and lowers its freezing point, so the ice melts below zero.",
        ),
        (
            "What causes hail?",
            "Strong updrafts in thunderstorms carry raindrops high into freezing air, where they gather layers of ice "
            "until they're too heavy and fall.",
        ),
        (
            "What is a hurricane?",
            "A large rotating storm that forms over warm ocean water, with sustained winds of at least 119 kilometres per hour.",
        ),
        (
            "Why is sea water salty?",
            "Rain slowly dissolves minerals from rocks, rivers carry them to the sea, "
            "and when water evaporates the salt stays behind.",
        ),
        (
            "What is gravity?",
            "The attraction between masses. It keeps us on the ground and holds the planets in orbit around the Sun.",
        ),
        (
            "What is the speed of sound?",
            "In air at room temperature it's about 343 metres per second, roughly a kilometre every three seconds.",
        ),
        (
            "How big is the Sun compared to the Earth?",
            "Its diameter is about 109 times the Earth's, and roughly 1.3 million Earths would fit inside it.",
        ),
        (
            "Who invented the telephone?",
            "Alexander Graham Bell received the first patent for it in 1876, though others were working on similar devices.",
        ),
        (
            "When did the first modern Olympic Games take place?",
            "In 1896, in Greece, with athletes from 14 nations.",
        ),
        (
            "What were the Middle Ages?",
            "The period of European history from roughly the 5th to the late 15th century, "
            "between antiquity and the Renaissance.",
        ),
        (
            "Should I exchange money before a trip?",
            "A small amount for arrival is handy, but cards and local cash machines usually beat airport exchange desks.",
        ),
        (
            "How do I avoid motion sickness on a long bus ride?",
            "Sit near the front, look at the horizon, keep fresh air flowing and avoid reading on the move.",
        ),
        (
            "What should someone do after losing a passport abroad?",
            "Report it to the local police and contact the embassy or consulate, which can issue an emergency travel document.",
        ),
        (
            "Who wrote One Hundred Years of Solitude?",
            "The Colombian author Gabriel Garcia Marquez; it was published in 1967.",
        ),
        (
            "What is a sonnet?",
            "A poem of fourteen lines with a set rhyme scheme; the Petrarchan and Shakespearean forms are the best known.",
        ),
        (
            "What is a chord in music?",
            "Three or more notes played together. A basic major chord stacks the first, third and fifth notes of a scale.",
        ),
        (
            "How many musicians are in a string quartet?",
            "Four: two violinists, a violist and a cellist.",
        ),
        (
            "What is 25 squared?",
            "25 squared is 625.",
        ),
        (
            "How do I work out an average?",
            "Add up all the numbers and divide by how many there are. The average of 4, 8 and 12 is 8.",
        ),
        (
            "Which fraction equals 0.75?",
            "Three quarters, or 3/4.",
        ),
        (
            "Is it bad to sleep with the lights on?",
            "It can make sleep lighter and more broken, because light suppresses melatonin. A dark room is better.",
        ),
        (
            "Why do we dream?",
            "Scientists aren't certain; leading ideas are that dreams help process emotions and consolidate memories.",
        ),
        (
            "How long should a workout last for a beginner?",
            "Twenty to thirty minutes, three times a week, is a sensible start; build up gradually as it gets easier.",
        ),
        (
            "What are the benefits of yoga?",
            "Better flexibility, balance and strength, and many people find it reduces stress.",
        ),
        (
            "What is a computer virus?",
            "Malicious software that copies itself into other programs or files and spreads, "
            "often causing damage or stealing data.",
        ),
        (
            "Why should software be kept up to date?",
            "Updates fix security holes and bugs and sometimes add features, so installing them promptly keeps devices safer.",
        ),
        (
            "What does USB stand for?",
            "Universal Serial Bus, the standard for connecting devices such as keyboards and drives to computers.",
        ),
        (
            "What does bonjour mean?",
            "It's French for hello or good day.",
        ),
        (
            "What is an idiom?",
            "A phrase whose meaning isn't clear from its individual words, like break a leg, which means good luck.",
        ),
        (
            "How many languages are spoken in the world?",
            "Roughly 7,000, though many have only a few speakers and some are endangered.",
        ),
        (
            "What is the largest desert in the world?",
            "Antarctica, if you count cold deserts; the Sahara is the largest hot desert.",
        ),
        (
            "How fast does a hummingbird beat its wings?",
            "Depending on the species, around 50 to 80 times a second, fast enough to hover in place.",
        ),
        (
            "What's a good way to start budgeting?",
            "Track what you spend for a month, then set limits for each category and put something aside for savings first.",
        ),
        (
            "How long can a camel go without water?",
            "In cool weather a camel can go a week or more without drinking, and it can take in over 100 litres at once.",
        ),
    ),
)

_STYLES: dict[str, _Style] = {"train": _TRAIN, "heldout": _HELDOUT}


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown fact kind {kind!r}; use one of {KINDS}")


def draw_kinds(rng: random.Random, n: int, weights: Mapping[str, float]) -> tuple[str, ...]:
    """``n`` distinct kinds drawn one after another, each with chance proportional to its weight among those left
    (a kind ``weights`` does not name weighs 1; weight 0: never drawn)."""
    for kind, weight in weights.items():
        _check_kind(kind)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
            raise ValueError(f"the weight of {kind!r} must be a finite number >= 0; got {weight!r}")
    left = {kind: float(weights.get(kind, 1.0)) for kind in KINDS}
    left = {kind: weight for kind, weight in left.items() if weight > 0}
    if not 1 <= n <= len(left):
        raise ValueError(f"cannot draw {n} distinct kinds from the {len(left)} of weight > 0")
    drawn: list[str] = []
    for _ in range(n):
        kind = rng.choices(list(left), weights=list(left.values()))[0]
        drawn.append(kind)
        del left[kind]
    return tuple(drawn)


def values(kind: str, split: str) -> tuple[str, ...]:
    """The values a fact of ``kind`` takes in ``split``: shared for closed kinds, the split's own for open ones."""
    _check_kind(kind)
    _check_split(split)
    if kind == "name":
        return _NAMES[split]
    if kind == "city":
        return _CITIES[split]
    return CLOSED_VALUES[kind]


def chitchat(split: str) -> tuple[Exchange, ...]:
    """Every unrelated (message, reply) pair of ``split``."""
    _check_split(split)
    return tuple(Exchange(user, reply) for user, reply in _STYLES[split].chitchat)


def _answer_template(prefix: str, suffix: str) -> str:
    return f"{prefix} {{v}}{suffix}"


def wordings(split: str) -> frozenset[str]:
    """Every template and canned sentence ``split`` can emit, placeholders unformatted (connectors excluded)."""
    _check_split(split)
    style = _STYLES[split]
    questions = [q for table in (style.direct, style.indirect) for qs in table.values() for q in qs]
    return frozenset(
        [
            *style.openers,
            *style.closers,
            *(clause for clauses in style.clauses.values() for clause in clauses),
            *style.acks_named,
            *style.acks,
            *(q.text for q in questions),
            *(_answer_template(prefix, suffix) for q in questions for prefix, suffix in q.answers),
            *(text for pair in style.chitchat for text in pair),
        ]
    )


def _article(value: str) -> str:
    return "an" if value[0].lower() in "aeiou" else "a"


_SENTENCE_START = re.compile(r"(^|[.!?]\s+)([a-z])")


def _sentence_case(text: str) -> str:
    """Capitalise the first letter of every sentence."""
    return _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2).upper(), text)


def _statement(rng: random.Random, style: _Style, facts: Sequence[Fact]) -> Exchange:
    clauses = [rng.choice(style.clauses[f.kind]).format(v=f.value, a=_article(f.value)) for f in facts]
    rng.shuffle(clauses)
    body = clauses[0]
    for connector, clause in zip(rng.sample(style.connectors, len(clauses) - 1), clauses[1:], strict=True):
        body += connector + clause
    body += "!" if rng.random() < EXCLAIM_RATE else "."
    parts = [body]
    if rng.random() < OPENER_RATE:
        parts.insert(0, rng.choice(style.openers))
    if rng.random() < CLOSER_RATE:
        parts.append(rng.choice(style.closers))
    names = [f.value for f in facts if f.kind == "name"]
    acks = style.acks_named + style.acks if names else style.acks
    reply = rng.choice(acks).format(name=names[0] if names else "")
    return Exchange(user=_sentence_case(" ".join(parts)), reply=reply)


def _probe(rng: random.Random, style: _Style, fact: Fact) -> Probe:
    table = style.indirect if rng.random() < INDIRECT_RATE else style.direct
    question = rng.choice(table[fact.kind])
    prefix, suffix = rng.choice(question.answers)
    return Probe(fact.kind, fact.value, question.text, prefix.format(a=_article(fact.value)), suffix)


def ask(rng: random.Random, split: str, fact: Fact) -> Probe:
    """A question about ``fact`` in one of ``split``'s wordings, drawn as an episode draws its probes."""
    _check_split(split)
    _check_kind(fact.kind)
    return _probe(rng, _STYLES[split], fact)


def make_episode(
    rng: random.Random,
    split: str,
    *,
    between: int,
    kinds: Sequence[str] | None = None,
    n_facts: int = 3,
    opening: int | None = None,
    user: str = "",
) -> Episode:
    """One episode: ``opening`` chit-chat turns, a message stating the facts, ``between`` unrelated turns, one probe per fact.

    ``kinds`` fixes the facts' kinds in order; otherwise ``n_facts`` distinct kinds are drawn from KINDS.
    ``opening`` defaults to 0 or 1 turns (1 with chance OPENING_RATE). Chit-chat pairs never repeat within an episode.
    """
    _check_split(split)
    style = _STYLES[split]
    if between < 0:
        raise ValueError(f"between must be >= 0, got {between}")
    if opening is not None and opening < 0:
        raise ValueError(f"opening must be >= 0, got {opening}")
    if not 1 <= n_facts <= len(KINDS):
        raise ValueError(f"n_facts must be between 1 and {len(KINDS)}, got {n_facts}")
    if kinds is not None:
        for kind in kinds:
            _check_kind(kind)
        if not kinds:
            raise ValueError("kinds must name at least one fact kind")
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"kinds must be distinct, got {tuple(kinds)}")
        chosen = tuple(kinds)
    else:
        chosen = tuple(rng.sample(KINDS, n_facts))
    if opening is None:
        opening = 1 if rng.random() < OPENING_RATE else 0
    if opening + between > len(style.chitchat):
        raise ValueError(
            f"opening + between = {opening + between} exceeds the {len(style.chitchat)} chit-chat pairs of split {split!r}"
        )
    facts = tuple(Fact(kind, rng.choice(values(kind, split))) for kind in chosen)
    statement = _statement(rng, style, facts)
    chat = [Exchange(u, r) for u, r in rng.sample(style.chitchat, opening + between)]
    probes = tuple(_probe(rng, style, fact) for fact in facts)
    turns = (*chat[:opening], statement, *chat[opening:])
    return Episode(user=user, split=split, facts=facts, turns=turns, stated_at=opening, probes=probes)


def episodes(
    split: str, n: int, seed: int, *, between: int, kinds: Sequence[str] | None = None, n_facts: int = 3
) -> list[Episode]:
    """``n`` episodes, the same for the same arguments in any process; users are ``f"{split}-{seed}-{i:06d}"``."""
    _check_split(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    kinds_key = "any" if kinds is None else ",".join(kinds)
    rng = random.Random(f"{split}:{seed}:{between}:{n_facts}:{kinds_key}")
    return [
        make_episode(rng, split, between=between, kinds=kinds, n_facts=n_facts, user=f"{split}-{seed}-{i:06d}") for i in range(n)
    ]
