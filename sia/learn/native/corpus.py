"""A synthetic, seeded corpus of multi-turn dialogues for teaching the identity state to carry facts.

Why it exists. SIA keeps a conversation's history in its per-identity state (the traces T and the self-state s),
not in a transcript. To learn that, the model needs dialogues whose later replies depend on something said
several turns earlier, while each turn is seen alone (with only its persona preamble). This module writes
such dialogues from templates; nothing is downloaded.

An episode is one persona talking with one user for 4 to 6 turns:

- turn 0: the user greets (with a name the persona echoes back) and states one or two facts from FACTS
  (favourite colour, pet, current mood, hobby), and sometimes asks for short answers;
- later turns are small talk, a *shock* (hostile, emotional or odd; ``ScriptedTurn.shock`` is True), an extra fact
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

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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
    "ScriptedTurn",
    "iter_text",
    "make_corpus",
    "make_episode",
    "short_episode",
]


@dataclass(frozen=True)
class ScriptedTurn:
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
    turns: tuple[ScriptedTurn, ...]
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

# The phrase tables live in sia/learn/data/native_phrases.json (lists there, tuples here), keyed by split:
#   user[split][kind]: user-side templates; "{name}" and "{value}" are the only placeholders;
#   reply[split][persona][kind]: persona replies; "greet" takes {name}. Probe replies are composed (PIECES):
#   state_openers / state_closers[split], state_cores[split][fact], ask_openers[split], ask_cores[split][fact],
#   probe_cores / bolt_probe_cores[split][fact], probe_frame[split][persona] = (openers, closers).
PHRASES_FILE = Path(__file__).resolve().parent.parent / "data" / "native_phrases.json"


def _tuples(value: Any) -> Any:
    """JSON lists as tuples, all the way down (the tables are immutable and hashable)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


_PHRASES: dict[str, Any] = _tuples(json.loads(PHRASES_FILE.read_text(encoding="utf-8")))
_USER: dict[str, dict[str, tuple[str, ...]]] = _PHRASES["user"]
_REPLY: dict[str, dict[str, dict[str, tuple[str, ...]]]] = _PHRASES["reply"]


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
_STATE_OPENERS: dict[str, tuple[str, ...]] = _PHRASES["state_openers"]
_STATE_CLOSERS: dict[str, tuple[str, ...]] = _PHRASES["state_closers"]
_STATE_CORES: dict[str, dict[str, tuple[str, ...]]] = _PHRASES["state_cores"]
_ASK_OPENERS: dict[str, tuple[str, ...]] = _PHRASES["ask_openers"]
_ASK_CORES: dict[str, dict[str, tuple[str, ...]]] = _PHRASES["ask_cores"]

# Probe replies: a persona's opener and closer around a core. sia, pip and marlow share the split's cores
# (their openers differ, and are never empty, so no two personas share a reply prefix); bolt has its own
# clipped, lowercase cores and is never capitalised.
_PROBE_CORES: dict[str, dict[str, tuple[str, ...]]] = _PHRASES["probe_cores"]
_BOLT_PROBE_CORES: dict[str, dict[str, tuple[str, ...]]] = _PHRASES["bolt_probe_cores"]
# (openers, closers) per split and persona. A closer's first character ends the reply when the user asked
# for brevity, so every closer starts with "." or "!" or "," (which becomes ".").
_PROBE_FRAME: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = _PHRASES["probe_frame"]


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

    turns: list[ScriptedTurn] = []
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
            turns.append(ScriptedTurn(message, reply))
        elif t == mention_turn:
            kind = next(k for k, src in stated if src == t)
            user = rng.choice(pools["mention"]) + rng.choice(pools[f"state.{kind}"]).replace("{value}", values[kind])
            turns.append(ScriptedTurn(user, rng.choice(replies["brief" if brief else "ack"])))
        elif t in probe_at:
            kind, source = probe_at[t]
            prefix, suffix = rng.choice(_PROBE_SLOTS[split][persona][kind])
            answer = values[kind]
            reply = prefix + answer + _probe_suffix(suffix, brief)
            turns.append(ScriptedTurn(rng.choice(pools[f"ask.{kind}"]), reply))
            probes.append(Probe(t, kind, answer, FACTS[kind], prefix, source))
        elif rng.random() < SHOCK_RATE:
            shock_kind = rng.choice(SHOCK_KINDS)
            turns.append(ScriptedTurn(rng.choice(pools[f"shock.{shock_kind}"]), rng.choice(replies[shock_kind]), shock=True))
        else:
            user = rng.choice([s for s in pools["smalltalk"] if s not in used])
            pool = replies["brief" if brief else "smalltalk"]
            reply = rng.choice([r for r in pool if r not in used] or pool)  # avoid repeating a reply while possible
            used.update((user, reply))
            turns.append(ScriptedTurn(user, reply))
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
