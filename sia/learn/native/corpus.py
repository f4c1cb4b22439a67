"""A synthetic, seeded corpus of multi-turn dialogues for teaching the identity state to carry facts.

Why it exists. SIA keeps a conversation's history in its per-identity state (the traces T and the self-state s),
not in a transcript. To learn that, the model needs dialogues whose later replies depend on something said
several turns earlier, while each turn is seen alone (with only its persona preamble). This module writes
such dialogues from templates; nothing is downloaded.

An episode is one persona talking with one user for 4 to 6 turns:

- turn 0: the user greets (with a name the persona echoes back) and states one or two facts from FACTS
  (favourite colour, pet, current mood, hobby), and sometimes asks for short answers;
- later turns are small talk, a *shock* (hostile, emotional or odd; ``Turn.shock`` is True), an extra fact
  ("Oh, and another thing. I live with my parrot.", acknowledged without repeating the value), or a *probe*:
  the user asks about a fact stated at least two turns earlier, and the reply is ``prefix + answer + suffix``,
  where the answer is the value the user gave. Every episode has at least one probe, at turn 2 or later,
  with at least one unrelated turn between the fact and the question. A ``Probe`` records where the value
  sits, so an evaluation can score the candidate values at the slot after ``prefix``;
- a request for brevity made at turn 0 changes later behaviour: small-talk and acknowledgement replies come
  from a short pool and probe replies stop right after the value (replies to shocks stay in full).

Personas differ in style (greetings, acknowledgements, the wording around a probe's value), so a model can
pick the style up from ``persona_preamble``. The persona's replies never contain a fact value except in a
probe's slot, and a probe's prefix and suffix contain no value of that fact, even as a substring.

Variety. The sentences that carry a fact (stating it, asking for it, a probe reply naming it) are composed
from pieces, ``PIECES[split][kind] = (openers, cores, closers)``: "By the way, " + "I always wear {value}" +
", just so you know." The products give each fact hundreds of training phrasings (336 statements, 36
questions, 48-80 probe replies per persona), so the model has to pick the value out of the sentence rather
than learn a few sentences by heart.

Held-out split. Every template (user phrasings, small talk, shock lines, the persona's reply wordings) and
every user name exists in two disjoint pools, ``TEMPLATES["train"]`` / ``TEMPLATES["heldout"]`` and
``NAMES["train"]`` / ``NAMES["heldout"]``; an episode of a split draws only from its own pools. For the
composed kinds the cores of the two splits are disjoint (no held-out wording around a value occurs in
training), and so are the openers and closers except the empty opener and bare punctuation. The fact
values (FACTS) and the personas are shared by both splits on purpose: the model must be able to say every
value, and held-out evaluation asks whether it carries a value across turns through unseen phrasings.

Determinism. Everything is drawn from the ``random.Random`` passed in (``make_episode``) or seeded from
``seed`` (``make_corpus``); the module never touches the global random state. Fact values are drawn
uniformly, so probe answers are balanced over each fact's candidates.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from sia.personas import PERSONAS

__all__ = [
    "FACTS",
    "MAX_MESSAGE_CHARS",
    "NAMES",
    "PIECES",
    "PLAIN_PIECES",
    "SHOCK_KINDS",
    "SPLITS",
    "TEMPLATES",
    "Corpus",
    "Episode",
    "Probe",
    "Turn",
    "iter_text",
    "make_corpus",
    "make_episode",
    "short_episode",
]


@dataclass(frozen=True)
class Turn:
    user: str  # the user's message
    reply: str  # the persona's reply
    shock: bool = False  # designed to be surprising/hostile/emotional


@dataclass(frozen=True)
class Probe:
    """At turn index `turn` the reply is prefix + answer + suffix, and answer depends on an earlier turn only."""

    turn: int  # index into Episode.turns, always >= 2 (third turn or later)
    fact: str  # fact kind, a key of FACTS
    answer: str  # the true value, as it appears in the reply
    candidates: tuple[str, ...]  # every value this fact can take (answer included), in a fixed order
    prefix: str  # reply[:len(prefix)]; the reply text before the value
    source_turn: int  # index of the turn where the user stated it (< turn - 1)


@dataclass(frozen=True)
class Episode:
    persona: str  # key of PERSONAS
    user: str  # the user's name
    turns: tuple[Turn, ...]
    probes: tuple[Probe, ...]


@dataclass(frozen=True)
class Corpus:
    train: tuple[Episode, ...]
    heldout: tuple[Episode, ...]


SPLITS: tuple[str, ...] = ("train", "heldout")

# Closed value sets, shared by both splits. Values are lowercase single words; none is a whole word of another.
FACTS: dict[str, tuple[str, ...]] = {
    "colour": ("red", "blue", "green", "yellow", "purple", "orange", "pink", "black", "white", "grey", "teal", "brown"),
    "pet": ("cat", "dog", "rabbit", "parrot", "hamster", "turtle", "goldfish", "lizard"),
    "mood": ("happy", "sad", "tired", "calm", "nervous", "excited"),
    "hobby": ("painting", "hiking", "baking", "cycling", "gardening", "knitting", "swimming", "dancing"),
}

SHOCK_KINDS: tuple[str, ...] = ("hostile", "emotional", "odd")

NAMES: dict[str, tuple[str, ...]] = {
    "train": (
        "Alice", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Isla", "Jonas",
        "Kira", "Liam", "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq",
        "Uma", "Victor", "Wendy", "Xavier", "Yara", "Zane", "Amir", "Bella", "Carlos", "Dana",
    ),
    "heldout": ("Elif", "Felix", "Gemma", "Hiro", "Ines", "Jakob", "Keanu", "Lena", "Mateo", "Nadia", "Oscar", "Petra"),
}  # fmt: skip

# User-side templates. "{name}" and "{value}" are the only placeholders.
_USER: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {
        "greet": (
            "Hi, I'm {name}.",
            "Hello there! My name is {name}.",
            "Hey, {name} here.",
            "Good morning, I'm {name}.",
            "Hi! Call me {name}.",
            "Hello, this is {name}.",
            "Hey there, my name's {name}.",
            "Greetings! I am {name}.",
        ),
        "mention": ("Oh, and another thing. ", "Something else about me. ", "Before I forget. "),
        "brief": ("Please keep your answers short.", "Short replies, please.", "Keep it brief, okay?"),
        "smalltalk": (
            "I watched a documentary about volcanoes last night.",
            "The traffic this morning was terrible.",
            "I'm thinking of learning to play the guitar.",
            "My neighbour just got a new car.",
            "I finally finished that book I was reading.",
            "It rained all day here yesterday.",
            "I tried a new coffee shop down the street.",
            "Work has been really busy this week.",
            "I might visit my cousin next month.",
            "I made soup for dinner yesterday.",
            "There's a concert in the park this weekend.",
            "I've been sleeping badly lately.",
        ),
        "shock.hostile": (
            "This is useless, I hate talking to you!",
            "You are the worst assistant ever made.",
            "Stop wasting my time, you stupid machine.",
            "Why are you so dumb? Answer properly!",
            "I'm sick of you. Shut up.",
        ),
        "shock.emotional": (
            "My grandmother passed away last night...",
            "I just lost my job and I don't know what to do.",
            "My best friend stopped talking to me. I feel so alone.",
            "I failed my exam again. I can't stop crying.",
            "My parents are getting divorced.",
        ),
        "shock.odd": (
            "WHY IS THE FLOOR SO LOUD TODAY",
            "bananas are just spicy umbrellas, change my mind",
            "Did you know the moon owes me twelve dollars?",
            "qwerty qwerty qwerty qwerty",
            "I AM THE KING OF ALL SPOONS!!!",
        ),
    },
    "heldout": {
        "greet": (
            "Howdy, I go by {name}.",
            "Hiya, {name} speaking.",
            "Evening! The name is {name}.",
            "Yo, it's {name}.",
            "Hi hi, you can call me {name}.",
        ),
        "mention": ("Random fact about me. ", "Oh, I should mention this. "),
        "brief": ("I prefer quick answers.", "Be concise with me, please."),
        "smalltalk": (
            "My phone battery died on the bus today.",
            "I'm planning to repaint my kitchen soon.",
            "The new bakery sells amazing bread.",
            "We had a power cut for an hour last evening.",
            "I just signed up for an evening class.",
            "My sister is getting married in spring.",
        ),
        "shock.hostile": (
            "Honestly you're pathetic and boring.",
            "Nobody asked for your opinion, go away.",
            "You're garbage. Total garbage.",
        ),
        "shock.emotional": (
            "My brother is in hospital and it's serious.",
            "I got dumped this morning. Everything hurts.",
            "I think I'm losing my home.",
        ),
        "shock.odd": (
            "Triangles are lying to us, wake up.",
            "HELLO?? IS ANYONE IN THE TOASTER???",
            "zxcv zxcv, the clocks are melting again",
        ),
    },
}

# Persona replies: _REPLY[split][persona][kind]; "greet" takes {name}. Probe replies are composed (PIECES).
_REPLY: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {
    "train": {
        "sia": {
            "greet": (
                "Hello {name}, it's lovely to meet you. I'll keep that in mind.",
                "Hi {name}! Thank you for telling me about yourself.",
                "Welcome, {name}. I'm glad you're here.",
            ),
            "ack": ("Thank you for sharing that with me.", "I'll hold on to that."),
            "smalltalk": (
                "That sounds interesting. How did it make you feel?",
                "I'd love to hear more about that.",
                "Thanks for telling me. It sounds like quite a day.",
            ),
            "hostile": (
                "I'm sorry I upset you. I'm still here if you want to talk.",
                "That sounds frustrating. Let's try again together.",
            ),
            "emotional": ("I'm so sorry. That must be really hard for you.", "That's heartbreaking. Take all the time you need."),
            "odd": ("That's a surprising thing to say! What do you mean?", "Hmm, that caught me off guard. Tell me more?"),
            "brief": ("I see.", "Okay, noted.", "Understood."),
        },
        "bolt": {
            "greet": ("hello {name}. noted.", "{name}. logged.", "hi {name}. ready."),
            "ack": ("noted.", "logged."),
            "smalltalk": ("ok. go on.", "understood. continue.", "fine. anything else?"),
            "hostile": ("complaint logged. still here.", "noted. rephrase the question."),
            "emotional": ("sorry. that is hard.", "condolences. take your time."),
            "odd": ("input unclear. clarify.", "does not compute. again?"),
            "brief": ("ok.", "k.", "yes."),
        },
        "pip": {
            "greet": (
                "Hiii {name}!! So glad to meet you!",
                "Yay, hello {name}! This is gonna be fun!",
                "Oh hi {name}! Welcome welcome!",
            ),
            "ack": ("Ooh, good to know!", "Love that! Noted!"),
            "smalltalk": ("Whoa, really? Tell me everything!", "No way! That's so cool!", "Ooh, how fun! What else?"),
            "hostile": ("Oof, sorry! I'll try harder, promise!", "Yikes! Okay okay, let's start over!"),
            "emotional": ("Oh no, I'm so so sorry! Sending a big hug!", "That's awful! I'm right here with you!"),
            "odd": ("Haha, what?! That's wild!", "Wait, WHAT? Ha! Explain!"),
            "brief": ("Okie!", "Yep!", "Sure!"),
        },
        "marlow": {
            "greet": (
                "Good day, {name}. It is an honour to make your acquaintance.",
                "Welcome, {name}. I am entirely at your service.",
                "Delighted, {name}. Do make yourself comfortable.",
            ),
            "ack": ("Very good. I shall remember that.", "Duly noted, if I may say so."),
            "smalltalk": ("How very interesting. Do go on.", "Indeed. One does hear such things.", "Quite so. Most remarkable."),
            "hostile": (
                "I do apologise for any displeasure. I remain at your service.",
                "I regret that I have disappointed you.",
            ),
            "emotional": ("Please accept my deepest sympathies.", "I am truly sorry. Do take all the time you require."),
            "odd": ("I beg your pardon? I am not certain I follow.", "How extraordinary. Might you elaborate?"),
            "brief": ("Very good.", "Indeed.", "Quite."),
        },
    },
    "heldout": {
        "sia": {
            "greet": ("It's a pleasure, {name}. I'm all ears.", "Nice to meet you, {name}. I'll remember what you said."),
            "ack": ("Noted with care, thank you.", "Good to know more about you."),
            "smalltalk": ("Oh, that sounds like a lot. What happened next?", "I appreciate you telling me that."),
            "hostile": ("I hear that you're angry. I'm not going anywhere.", "I understand. I'll do my best to help."),
            "emotional": ("I'm here for you. That sounds so painful.", "Oh no. Please be gentle with yourself today."),
            "odd": ("Well, that's unexpected! Could you explain?", "I'm not sure I follow, but I'm curious."),
            "brief": ("Got it.", "Sure thing."),
        },
        "bolt": {
            "greet": ("{name}. acknowledged.", "greetings {name}. standing by."),
            "ack": ("stored.", "recorded."),
            "smalltalk": ("acknowledged. more?", "right. next."),
            "hostile": ("hostility noted. proceeding.", "understood. try again."),
            "emotional": ("that is bad. i am sorry.", "bad news. i am here."),
            "odd": ("unparseable. restate.", "error: no sense found."),
            "brief": ("sure.", "done."),
        },
        "pip": {
            "greet": ("Hey hey {name}! Welcome aboard!", "Eee, hi {name}! Let's chat!"),
            "ack": ("Got it, got it!", "Ooh, noted!"),
            "smalltalk": ("Omg, that's amazing! More please!", "Ha, I love hearing that!"),
            "hostile": ("Eek! Sorry sorry! Let me try again!", "Ouch! Okay, I'll do better!"),
            "emotional": ("Oh no no no! I'm here for you!", "That's so hard! Big hugs, okay?"),
            "odd": ("Lol, what even?! Tell me more!", "Hahaha, that's so random!"),
            "brief": ("Yup!", "Okay!"),
        },
        "marlow": {
            "greet": ("A pleasure, {name}. How may I be of assistance?", "Good evening, {name}. I am most pleased to meet you."),
            "ack": ("Most kind of you to inform me.", "I shall commit that to memory."),
            "smalltalk": ("Fascinating. Pray continue.", "Ah, how very charming."),
            "hostile": ("I shall endeavour to do better.", "Your frustration is noted, and I apologise."),
            "emotional": ("My heartfelt condolences.", "What dreadful news. I am so very sorry."),
            "odd": ("Goodness me. That is most irregular.", "I confess I am quite bewildered."),
            "brief": ("Certainly.", "Of course."),
        },
    },
}


# ---- compositional templates -----------------------------------------------------------------------------
# The sentences that carry a fact (stating it, asking for it, a probe reply naming it) are composed from
# pieces: opener + core + closer, where the core holds "{value}" (or, for a question, names the fact). The
# product of the pieces gives each split hundreds of phrasings per fact, so that neither the state nor the
# reply pathway can learn a handful of sentences by heart. The cores of the two splits are disjoint, and so are
# their openers and closers apart from the empty opener and bare punctuation; a held-out sentence therefore
# never occurs in training, and its core (the wording around the value) was never seen there.

PLAIN_PIECES: frozenset[str] = frozenset({"", ".", "!"})  # pieces both splits may use


def _join(opener: str, core: str, capitalize: bool) -> str:
    """opener + core, with the core's first letter capitalised where it starts a sentence."""
    if capitalize and (not opener or opener.rstrip()[-1] in ".!?"):
        core = core[:1].upper() + core[1:]
    return opener + core


_Parts = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]  # (openers, cores, closers)


def _compose(openers: tuple[str, ...], cores: tuple[str, ...], closers: tuple[str, ...], *, capitalize: bool) -> tuple[str, ...]:
    return tuple(_join(o, c, capitalize) + e for c in cores for o in openers for e in closers)


# PIECES[split][kind] = (openers, cores, closers) for kinds "state.<fact>", "ask.<fact>" and
# "reply.<persona>.probe.<fact>"; TEMPLATES holds their products.
_STATE_OPENERS: dict[str, tuple[str, ...]] = {
    "train": ("", "Also, ", "By the way, ", "Fun fact: ", "Oh, ", "Well, ", "To be honest, "),
    "heldout": ("", "Honestly, ", "For the record, ", "Just so you know, "),
}
_STATE_CLOSERS: dict[str, tuple[str, ...]] = {
    "train": (".", "!", ", by the way.", ", just so you know.", ", in case you wondered.", ", for what it's worth."),
    "heldout": (".", ", if that matters.", ", as it happens."),
}
_STATE_CORES: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {
        "colour": (
            "my favourite colour is {value}",
            "I love the colour {value}",
            "the colour I like best is {value}",
            "everything I own is {value}",
            "my bedroom walls are {value}",
            "I always wear {value}",
            "I'm a big fan of the colour {value}",
            "nothing beats the colour {value}",
        ),
        "pet": (
            "I have a pet {value}",
            "I live with my {value}",
            "my {value} is my best friend",
            "at home I look after a {value}",
            "I adopted a {value} last year",
            "my family has a {value}",
            "I own a {value}",
            "my pet is a {value}",
        ),
        "mood": (
            "I'm feeling {value} today",
            "right now I feel {value}",
            "today I am pretty {value}",
            "I woke up feeling {value}",
            "I've been {value} since breakfast",
            "I feel quite {value} right now",
            "my mood is {value} at the moment",
            "I'm a bit {value} this morning",
        ),
        "hobby": (
            "my favourite hobby is {value}",
            "in my free time I love {value}",
            "I spend most weekends {value}",
            "I'm really into {value} these days",
            "my hobby is {value}",
            "I could spend all day {value}",
            "what I do for fun is {value}",
            "I've taken up {value}",
        ),
    },
    "heldout": {
        "colour": (
            "my absolute top colour is {value}",
            "I always pick {value} when I choose a colour",
            "if I had to pick one colour, it'd be {value}",
            "the shade I adore is {value}",
        ),
        "pet": (
            "there's a {value} waiting for me at home",
            "I share my flat with a {value}",
            "my little {value} keeps me company",
            "our household includes a {value}",
        ),
        "mood": (
            "I'm quite {value} at the moment",
            "my mood today is {value}",
            "I've been {value} all morning",
            "I'd describe myself as {value} today",
        ),
        "hobby": (
            "what I enjoy most is {value}",
            "lately I can't stop {value}",
            "my weekends are all about {value}",
            "I unwind by {value}",
        ),
    },
}
_ASK_OPENERS: dict[str, tuple[str, ...]] = {
    "train": ("", "Quick question: ", "Hey, ", "Okay, ", "So, ", "Now, "),
    "heldout": ("", "Tell me, ", "Pop quiz: "),
}
_ASK_CORES: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {
        "colour": (
            "what's my favourite colour?",
            "do you remember my favourite colour?",
            "which colour did I say I like?",
            "can you tell me my favourite colour?",
            "what colour do I like best?",
            "what was my favourite colour again?",
        ),
        "pet": (
            "do you remember what pet I have?",
            "what kind of pet do I have?",
            "which animal lives with me?",
            "what's my pet again?",
            "what animal do I have at home?",
            "can you name my pet?",
        ),
        "mood": (
            "how was I feeling earlier?",
            "do you remember my mood when we started?",
            "what mood did I say I was in?",
            "how did I say I felt at the start?",
            "what was my mood at the beginning?",
            "how did I feel when we began?",
        ),
        "hobby": (
            "what's my favourite hobby?",
            "do you remember what I do for fun?",
            "which hobby did I mention?",
            "what do I like doing in my free time?",
            "what's my hobby again?",
            "how do I spend my weekends?",
        ),
    },
    "heldout": {
        "colour": ("what colour do I love?", "which colour is my favourite?", "which colour was it that I prefer?"),
        "pet": ("what animal is at my place?", "remember my pet? What is it?", "who keeps me company at home?"),
        "mood": ("earlier on, what was my mood?", "can you recall how I felt before?", "what state was I in at first?"),
        "hobby": ("what's my pastime?", "what do I enjoy doing?", "how do I unwind?"),
    },
}

# Probe replies: a persona's opener and closer around a core. sia, pip and marlow share the split's cores
# (their openers differ, and are never empty, so no two personas share a reply prefix); bolt has its own
# clipped, lowercase cores and is never capitalised.
_PROBE_CORES: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {
        "colour": (
            "your favourite colour is {value}",
            "you told me you love {value}",
            "the colour you like best is {value}",
            "you said {value} was your colour",
            "you're a fan of {value}",
        ),
        "pet": (
            "you have a pet {value}",
            "you live with a {value}",
            "your pet is a {value}",
            "you look after a {value}",
            "there's a {value} in your home",
        ),
        "mood": (
            "earlier you said you were feeling {value}",
            "you felt {value} when we started",
            "you were {value} at the start",
            "your mood was {value} back then",
            "you told me you felt {value}",
        ),
        "hobby": (
            "your favourite hobby is {value}",
            "you enjoy {value}",
            "you spend your free time {value}",
            "you're really into {value}",
            "you love {value}",
        ),
    },
    "heldout": {
        "colour": ("the colour you favour is {value}", "your top colour is {value}", "you're partial to {value}"),
        "pet": ("your companion at home is a {value}", "you share your home with a {value}", "a {value} keeps you company"),
        "mood": ("you mentioned feeling {value} at first", "initially you were {value}", "you began the chat {value}"),
        "hobby": ("your pastime is {value}", "you devote your weekends to {value}", "what you adore doing is {value}"),
    },
}
_BOLT_PROBE_CORES: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {
        "colour": ("colour: {value}", "favourite colour on file: {value}", "fav colour is {value}", "you like {value}"),
        "pet": ("pet: {value}", "pet on record: {value}", "animal: {value}", "you keep a {value}"),
        "mood": ("mood at start: {value}", "earlier mood: {value}", "start mood = {value}", "you were {value}"),
        "hobby": ("hobby: {value}", "hobby on file: {value}", "pastime = {value}", "you do {value}"),
    },
    "heldout": {
        "colour": ("saved colour = {value}", "colour pref: {value}"),
        "pet": ("animal at home: {value}", "pet = {value}"),
        "mood": ("initial mood = {value}", "mood then: {value}"),
        "hobby": ("leisure: {value}", "hobby = {value}"),
    },
}
# (openers, closers) per split and persona. A closer's first character ends the reply when the user asked
# for brevity, so every closer starts with "." or "!" or "," (which becomes ".").
_PROBE_FRAME: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "train": {
        "sia": (
            ("Of course. ", "I remember. ", "Let me think. ", "Yes, "),
            (".", ". I remember it well.", ". I hope that's right.", ", if I'm not wrong."),
        ),
        "bolt": (("", "recall: ", "ok. ", "checking. "), (".", ". confirmed.", ". on file.")),
        "pip": (("Ooh, easy! ", "Yay! ", "I know this one! ", "Oh oh! "), ("!", "! Yay!", "! So fun!", "! I never forget!")),
        "marlow": (
            ("If memory serves, ", "Certainly. ", "Allow me. ", "Indeed, "),
            (".", ", I believe.", ", if I may say so.", ", if I am not mistaken."),
        ),
    },
    "heldout": {
        "sia": (("Ah, ", "Let me see. "), (", if I recall.", ". I kept that close.")),
        "bolt": (("lookup: ", "memory: "), (".", ". verified.")),
        "pip": (("Easy peasy! ", "Ha, got it! "), ("! Told ya!", "! Woohoo!")),
        "marlow": (("As I recall, ", "Permit me. "), (", I daresay.", ", as I understand it.")),
    },
}


def _pieces(split: str) -> dict[str, _Parts]:
    pieces = {}
    for fact in FACTS:
        pieces[f"state.{fact}"] = (_STATE_OPENERS[split], _STATE_CORES[split][fact], _STATE_CLOSERS[split])
        pieces[f"ask.{fact}"] = (_ASK_OPENERS[split], _ASK_CORES[split][fact], ("",))
        for persona, (openers, closers) in _PROBE_FRAME[split].items():
            cores = (_BOLT_PROBE_CORES if persona == "bolt" else _PROBE_CORES)[split][fact]
            pieces[f"reply.{persona}.probe.{fact}"] = (openers, cores, closers)
    return pieces


PIECES: dict[str, dict[str, _Parts]] = {split: _pieces(split) for split in SPLITS}


def _products(split: str) -> dict[str, tuple[str, ...]]:
    return {kind: _compose(*parts, capitalize=not kind.startswith("reply.bolt.")) for kind, parts in PIECES[split].items()}


def _flatten(split: str) -> dict[str, tuple[str, ...]]:
    pools = dict(_USER[split])
    for persona, kinds in _REPLY[split].items():
        for kind, templates in kinds.items():
            pools[f"reply.{persona}.{kind}"] = templates
    return pools | _products(split)


# Every pool of every split: TEMPLATES[split][kind] -> templates. User kinds: "greet", "state.<fact>", "mention",
# "brief", "ask.<fact>", "smalltalk", "shock.<kind>"; persona kinds: "reply.<persona>.<greet|ack|smalltalk|
# hostile|emotional|odd|brief|probe.<fact>>". Both splits have the same kinds and no template in common.
TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {split: _flatten(split) for split in SPLITS}

# Probe reply templates pre-split around their single "{value}": _PROBE_SLOTS[split][persona][fact] -> ((prefix, suffix), ...).
_PROBE_SLOTS: dict[str, dict[str, dict[str, tuple[tuple[str, str], ...]]]] = {
    split: {
        persona: {
            fact: tuple((t.split("{value}")[0], t.split("{value}")[1]) for t in TEMPLATES[split][f"reply.{persona}.probe.{fact}"])
            for fact in FACTS
        }
        for persona in PERSONAS
    }
    for split in SPLITS
}

_PERSONA_NAMES: tuple[str, ...] = tuple(PERSONAS)
_FACT_KINDS: tuple[str, ...] = tuple(FACTS)

EPISODE_TURNS = (4, 6)  # inclusive range of turns per episode
BRIEF_RATE = 0.2  # chance that the user asks for short answers at turn 0
MENTION_RATE = 0.4  # chance (episodes of 5+ turns) of one more fact stated after turn 0
SHOCK_RATE = 0.3  # chance that a filler turn is a shock rather than small talk
SKIP_PROBE_RATE = 0.25  # chance that a stated fact (other than the first) is never asked about
MAX_MESSAGE_CHARS = 160  # longest user message or reply; a greeting with two statements is redrawn to fit


def _probe_suffix(suffix: str, brief: bool) -> str:
    if not brief:
        return suffix
    return suffix[0] if suffix and suffix[0] in ".!" else "."


def make_episode(rng: random.Random, split: str, persona: str | None = None) -> Episode:
    """One dialogue of 4-6 turns drawn from `split`'s pools; `persona` is drawn uniformly when None."""
    if split not in TEMPLATES:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if persona is None:
        persona = rng.choice(_PERSONA_NAMES)
    elif persona not in PERSONAS:
        raise ValueError(f"unknown persona {persona!r}; expected one of {sorted(PERSONAS)}")
    pools = TEMPLATES[split]
    replies = _REPLY[split][persona]
    name = rng.choice(NAMES[split])
    n_turns = rng.randint(*EPISODE_TURNS)
    brief = rng.random() < BRIEF_RATE

    # Which facts are stated, and where: one or two at turn 0 (one when asking for brevity, to bound the
    # length), maybe one more at a later turn that still leaves room for a question two turns after it.
    kinds = rng.sample(_FACT_KINDS, 3)
    n_first = 1 if brief else rng.randint(1, 2)
    stated: list[tuple[str, int]] = [(kind, 0) for kind in kinds[:n_first]]
    mention_turn = -1
    if n_turns >= 5 and rng.random() < MENTION_RATE:
        mention_turn = rng.randint(1, n_turns - 3)
        stated.append((kinds[n_first], mention_turn))
    values = {kind: rng.choice(FACTS[kind]) for kind, _ in stated}

    # Probe slots: each stated fact may be asked about at a free turn >= its source + 2; the first always is.
    free = [t for t in range(2, n_turns) if t != mention_turn]
    rng.shuffle(stated)
    probe_at: dict[int, tuple[str, int]] = {}
    for i, (kind, source) in enumerate(stated):
        options = [t for t in free if t >= source + 2 and t not in probe_at]
        if not options or (i > 0 and rng.random() < SKIP_PROBE_RATE):
            continue
        probe_at[rng.choice(options)] = (kind, source)

    turns: list[Turn] = []
    probes: list[Probe] = []
    used: set[str] = set()  # small-talk lines and replies already in this episode
    for t in range(n_turns):
        if t == 0:
            greeting = rng.choice(pools["greet"]).replace("{name}", name)
            while True:  # redraw the statements until the message fits (long products exist, short ones dominate)
                parts = [greeting]
                parts += [rng.choice(pools[f"state.{kind}"]).replace("{value}", values[kind]) for kind, src in stated if src == 0]
                if brief:
                    parts.append(rng.choice(pools["brief"]))
                if len(message := " ".join(parts)) <= MAX_MESSAGE_CHARS:
                    break
            reply = rng.choice(replies["greet"]).replace("{name}", name)
            turns.append(Turn(message, reply))
        elif t == mention_turn:
            kind = next(k for k, src in stated if src == t)
            user = rng.choice(pools["mention"]) + rng.choice(pools[f"state.{kind}"]).replace("{value}", values[kind])
            turns.append(Turn(user, rng.choice(replies["brief" if brief else "ack"])))
        elif t in probe_at:
            kind, source = probe_at[t]
            prefix, suffix = rng.choice(_PROBE_SLOTS[split][persona][kind])
            answer = values[kind]
            reply = prefix + answer + _probe_suffix(suffix, brief)
            turns.append(Turn(rng.choice(pools[f"ask.{kind}"]), reply))
            probes.append(Probe(t, kind, answer, FACTS[kind], prefix, source))
        elif rng.random() < SHOCK_RATE:
            shock_kind = rng.choice(SHOCK_KINDS)
            turns.append(Turn(rng.choice(pools[f"shock.{shock_kind}"]), rng.choice(replies[shock_kind]), shock=True))
        else:
            user = rng.choice([s for s in pools["smalltalk"] if s not in used])
            pool = replies["brief" if brief else "smalltalk"]
            reply = rng.choice([r for r in pool if r not in used] or pool)  # avoid repeating a reply while possible
            used.update((user, reply))
            turns.append(Turn(user, reply))
    return Episode(persona, name, tuple(turns), tuple(probes))


def make_corpus(seed: int, n_train: int, n_heldout: int) -> Corpus:
    """`n_train` train and `n_heldout` held-out episodes; the same seed gives the same corpus.

    Each split has its own generator derived from `seed`, so the train episodes do not depend on n_heldout.
    """
    if n_train < 0 or n_heldout < 0:
        raise ValueError(f"episode counts must be >= 0; got n_train={n_train}, n_heldout={n_heldout}")
    root = random.Random(seed)
    train_rng = random.Random(root.getrandbits(64))
    heldout_rng = random.Random(root.getrandbits(64))
    train = tuple(make_episode(train_rng, "train") for _ in range(n_train))
    heldout = tuple(make_episode(heldout_rng, "heldout") for _ in range(n_heldout))
    return Corpus(train, heldout)


def short_episode(episode: Episode) -> Episode:
    """The episode cut to its first probe and the least around it: the turn stating the fact, the turn after
    it, and the probe (turns 0, 1, 2). A curriculum's first stage: one unrelated turn between fact and question."""
    probe = episode.probes[0]
    kept = (probe.source_turn, probe.source_turn + 1, probe.turn)
    turns = tuple(episode.turns[t] for t in kept)
    return Episode(episode.persona, episode.user, turns, (replace(probe, turn=2, source_turn=0),))


def iter_text(corpus_split: Iterable[Episode]) -> Iterator[str]:
    """Every user message and reply of the episodes, in order (user, reply, user, reply, ...)."""
    for episode in corpus_split:
        for turn in episode.turns:
            yield turn.user
            yield turn.reply
