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

Held-out split. Every template (user phrasings, small talk, shock lines, the persona's reply wordings) and
every user name exists in two disjoint pools, ``TEMPLATES["train"]`` / ``TEMPLATES["heldout"]`` and
``NAMES["train"]`` / ``NAMES["heldout"]``; an episode of a split draws only from its own pools. The fact
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

__all__ = [
    "FACTS",
    "NAMES",
    "PERSONAS",
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
    "persona_preamble",
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

PERSONAS: dict[str, str] = {
    "sia": "a warm, attentive companion who answers in gentle full sentences",
    "bolt": "a terse assistant that answers in clipped lowercase fragments",
    "pip": "a bubbly, excitable friend who loves exclamation marks",
    "marlow": "a formal, old-fashioned butler who speaks with elaborate courtesy",
}

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
        "state.colour": (
            "My favourite colour is {value}.",
            "I love the colour {value}.",
            "The colour I like best is {value}.",
            "Everything I own is {value}.",
        ),
        "state.pet": (
            "I have a pet {value}.",
            "I live with my {value}.",
            "My {value} is my best friend.",
            "At home I look after a {value}.",
        ),
        "state.mood": (
            "I'm feeling {value} today.",
            "Right now I feel {value}.",
            "Today I am pretty {value}.",
            "I woke up feeling {value}.",
        ),
        "state.hobby": (
            "My favourite hobby is {value}.",
            "In my free time I love {value}.",
            "I spend most weekends {value}.",
            "I'm really into {value} these days.",
        ),
        "mention": ("Oh, and another thing. ", "Something else about me. ", "Before I forget. "),
        "brief": ("Please keep your answers short.", "Short replies, please.", "Keep it brief, okay?"),
        "ask.colour": (
            "What's my favourite colour?",
            "Do you remember my favourite colour?",
            "Which colour did I say I like?",
            "Can you tell me my favourite colour?",
        ),
        "ask.pet": (
            "Do you remember what pet I have?",
            "What kind of pet do I have?",
            "Which animal lives with me?",
            "What's my pet again?",
        ),
        "ask.mood": (
            "How was I feeling earlier?",
            "Do you remember my mood when we started?",
            "What mood did I say I was in?",
            "How did I say I felt at the start?",
        ),
        "ask.hobby": (
            "What's my favourite hobby?",
            "Do you remember what I do for fun?",
            "Which hobby did I mention?",
            "What do I like doing in my free time?",
        ),
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
        "state.colour": (
            "My absolute top colour is {value}.",
            "I always pick {value} when I choose a colour.",
            "If I had to pick one colour, it'd be {value}.",
        ),
        "state.pet": (
            "There's a {value} waiting for me at home.",
            "I share my flat with a {value}.",
            "My little {value} keeps me company.",
        ),
        "state.mood": (
            "Honestly, I'm quite {value} at the moment.",
            "My mood today is {value}.",
            "I've been {value} all morning.",
        ),
        "state.hobby": (
            "What I enjoy most is {value}.",
            "Lately I can't stop {value}.",
            "My weekends are all about {value}.",
        ),
        "mention": ("Random fact about me. ", "Oh, I should mention this. "),
        "brief": ("I prefer quick answers.", "Be concise with me, please."),
        "ask.colour": ("Quick test: what colour do I love?", "Remind me, which colour is my favourite?"),
        "ask.pet": ("Quiz time: what animal is at my place?", "Remember my pet? What is it?"),
        "ask.mood": ("Earlier on, what was my mood?", "Can you recall how I felt before?"),
        "ask.hobby": ("Test your memory: what's my pastime?", "Remind me what I enjoy doing?"),
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

# Persona replies: _REPLY[split][persona][kind]. "greet" takes {name}; "probe.<fact>" has exactly one {value}.
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
            "probe.colour": ("Your favourite colour is {value}. I remember it well.", "You told me you love {value}, of course."),
            "probe.pet": ("You have a pet {value}. I hope they're doing well.", "Of course, you live with a {value}."),
            "probe.mood": ("Earlier you said you were feeling {value}.", "When we started, you felt {value}."),
            "probe.hobby": ("Your favourite hobby is {value}. It sounds lovely.", "You told me you enjoy {value}."),
        },
        "bolt": {
            "greet": ("hello {name}. noted.", "{name}. logged.", "hi {name}. ready."),
            "ack": ("noted.", "logged."),
            "smalltalk": ("ok. go on.", "understood. continue.", "fine. anything else?"),
            "hostile": ("complaint logged. still here.", "noted. rephrase the question."),
            "emotional": ("sorry. that is hard.", "condolences. take your time."),
            "odd": ("input unclear. clarify.", "does not compute. again?"),
            "brief": ("ok.", "k.", "yes."),
            "probe.colour": ("colour: {value}.", "favourite colour on file: {value}."),
            "probe.pet": ("pet: {value}.", "pet on record: {value}."),
            "probe.mood": ("mood at start: {value}.", "earlier mood: {value}."),
            "probe.hobby": ("hobby: {value}.", "hobby on file: {value}."),
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
            "probe.colour": ("Ooh, easy! Your favourite colour is {value}!", "It's {value}! Such a great colour!"),
            "probe.pet": ("You have a {value}! So cute!", "Your pet is a {value}! Give it a pat from me!"),
            "probe.mood": ("You said you were {value} earlier!", "Ooh, you were feeling {value} at the start!"),
            "probe.hobby": ("You love {value}! So fun!", "Your hobby is {value}! Yay!"),
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
            "probe.colour": ("If memory serves, your favourite colour is {value}.", "Your chosen colour is {value}, I believe."),
            "probe.pet": ("You keep a {value}, if I recall correctly.", "Your household includes a {value}."),
            "probe.mood": ("At the outset you were feeling {value}.", "You said you felt {value} when we began."),
            "probe.hobby": ("You are fond of {value}, if I am not mistaken.", "Your chosen pastime is {value}."),
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
            "probe.colour": ("I believe your favourite colour is {value}.", "That would be {value}, the colour you love most."),
            "probe.pet": ("I remember: your pet is a {value}.", "Your companion at home is a {value}."),
            "probe.mood": ("You mentioned feeling {value} at the start.", "At first you told me you were {value}."),
            "probe.hobby": ("You love {value}, if I recall.", "Your hobby is {value}, I believe."),
        },
        "bolt": {
            "greet": ("{name}. acknowledged.", "greetings {name}. standing by."),
            "ack": ("stored.", "recorded."),
            "smalltalk": ("acknowledged. more?", "right. next."),
            "hostile": ("hostility noted. proceeding.", "understood. try again."),
            "emotional": ("that is bad. i am sorry.", "bad news. i am here."),
            "odd": ("unparseable. restate.", "error: no sense found."),
            "brief": ("sure.", "done."),
            "probe.colour": ("saved colour = {value}.", "colour pref: {value}."),
            "probe.pet": ("animal at home: {value}.", "pet = {value}."),
            "probe.mood": ("initial mood = {value}.", "mood then: {value}."),
            "probe.hobby": ("pastime: {value}.", "hobby = {value}."),
        },
        "pip": {
            "greet": ("Hey hey {name}! Welcome aboard!", "Eee, hi {name}! Let's chat!"),
            "ack": ("Got it, got it!", "Ooh, noted!"),
            "smalltalk": ("Omg, that's amazing! More please!", "Ha, I love hearing that!"),
            "hostile": ("Eek! Sorry sorry! Let me try again!", "Ouch! Okay, I'll do better!"),
            "emotional": ("Oh no no no! I'm here for you!", "That's so hard! Big hugs, okay?"),
            "odd": ("Lol, what even?! Tell me more!", "Hahaha, that's so random!"),
            "brief": ("Yup!", "Okay!"),
            "probe.colour": ("Easy peasy! It's {value}!", "Your top colour? {value}, of course!"),
            "probe.pet": ("Your cutie at home is a {value}!", "A {value}! You told me!"),
            "probe.mood": ("At the start you felt {value}!", "Earlier? You were {value}!"),
            "probe.hobby": ("It's {value}! You love it!", "Your favourite pastime is {value}!"),
        },
        "marlow": {
            "greet": ("A pleasure, {name}. How may I be of assistance?", "Good evening, {name}. I am most pleased to meet you."),
            "ack": ("Most kind of you to inform me.", "I shall commit that to memory."),
            "smalltalk": ("Fascinating. Pray continue.", "Ah, how very charming."),
            "hostile": ("I shall endeavour to do better.", "Your frustration is noted, and I apologise."),
            "emotional": ("My heartfelt condolences.", "What dreadful news. I am so very sorry."),
            "odd": ("Goodness me. That is most irregular.", "I confess I am quite bewildered."),
            "brief": ("Certainly.", "Of course."),
            "probe.colour": ("The colour you favour is {value}, as I recall.", "You are partial to {value}, I believe."),
            "probe.pet": ("You share your home with a {value}.", "In your household there is a {value}."),
            "probe.mood": ("When we began, you were {value}.", "Your initial disposition was {value}."),
            "probe.hobby": ("Your leisure pursuit is {value}.", "You devote your leisure to {value}, I understand."),
        },
    },
}


def _flatten(split: str) -> dict[str, tuple[str, ...]]:
    pools = dict(_USER[split])
    for persona, kinds in _REPLY[split].items():
        for kind, templates in kinds.items():
            pools[f"reply.{persona}.{kind}"] = templates
    return pools


# Every pool of every split: TEMPLATES[split][kind] -> templates. User kinds: "greet", "state.<fact>", "mention",
# "brief", "ask.<fact>", "smalltalk", "shock.<kind>"; persona kinds: "reply.<persona>.<greet|ack|smalltalk|
# hostile|emotional|odd|brief|probe.<fact>>". Both splits have the same kinds and no template in common.
TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {split: _flatten(split) for split in SPLITS}

# Probe reply templates pre-split around their single "{value}": _PROBE_SLOTS[split][persona][fact] -> ((prefix, suffix), ...).
_PROBE_SLOTS: dict[str, dict[str, dict[str, tuple[tuple[str, str], ...]]]] = {
    split: {
        persona: {fact: tuple((t.split("{value}")[0], t.split("{value}")[1]) for t in kinds[f"probe.{fact}"]) for fact in FACTS}
        for persona, kinds in _REPLY[split].items()
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


def persona_preamble(persona: str) -> str:
    """The short text put before every turn of `persona`, e.g. "[sia]"."""
    if persona not in PERSONAS:
        raise ValueError(f"unknown persona {persona!r}; expected one of {sorted(PERSONAS)}")
    return f"[{persona}]"


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
            parts = [rng.choice(pools["greet"]).replace("{name}", name)]
            parts += [rng.choice(pools[f"state.{kind}"]).replace("{value}", values[kind]) for kind, src in stated if src == 0]
            if brief:
                parts.append(rng.choice(pools["brief"]))
            reply = rng.choice(replies["greet"]).replace("{name}", name)
            turns.append(Turn(" ".join(parts), reply))
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
