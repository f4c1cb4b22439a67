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

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


# The phrase tables and word lists live in sia/learn/data/facts_phrases.json (lists there, tuples here):
#   closed_values[kind], names[split], cities[split];
#   styles[split]: openers, connectors, closers, acks_named, acks (lists of strings), clauses[kind] (lists of
#   strings), direct[kind] and indirect[kind] (lists of {"text": question, "answers": [[prefix, suffix], ...]}),
#   chitchat (a list of [user, reply] pairs).
PHRASES_FILE = Path(__file__).resolve().parent.parent / "data" / "facts_phrases.json"
_LISTS = ("openers", "connectors", "closers", "acks_named", "acks")
_BY_KIND = ("clauses", "direct", "indirect")


def _strings(value: Any, where: str) -> tuple[str, ...]:
    """A non-empty JSON list of strings, as a tuple."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a non-empty list of strings; got {value!r:.80}")
    return tuple(value)


def _pair(value: Any, where: str) -> tuple[str, str]:
    """A JSON list of two strings, as a tuple."""
    if not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a pair of strings; got {value!r:.80}")
    return value[0], value[1]


def _table(data: Any, name: str, keys: Sequence[str], where: str) -> dict[str, Any]:
    """``data[name]``, an object with exactly ``keys``."""
    if not isinstance(data, dict) or name not in data:
        raise ValueError(f"{where} lacks the table {name!r}")
    table = data[name]
    if not isinstance(table, dict) or set(table) != set(keys):
        got = sorted(table) if isinstance(table, dict) else type(table).__name__
        raise ValueError(f"{where}{name} must be an object with the keys {sorted(keys)}; got {got}")
    return table


def _questions(value: Any, where: str) -> tuple[_Question, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where} must be a non-empty list of questions")
    out = []
    for i, q in enumerate(value):
        if not isinstance(q, dict) or set(q) != {"text", "answers"} or not isinstance(q["text"], str):
            raise ValueError(f'{where}[{i}] must be {{"text": question, "answers": [[prefix, suffix], ...]}}')
        answers = q["answers"] if isinstance(q["answers"], list) and q["answers"] else [None]
        out.append(_Question(q["text"], tuple(_pair(a, f"{where}[{i}].answers") for a in answers)))
    return tuple(out)


def _style(data: Any, where: str) -> _Style:
    lists = {name: _strings(data.get(name) if isinstance(data, dict) else None, f"{where}.{name}") for name in _LISTS}
    if len(lists["connectors"]) < len(KINDS) - 1:
        raise ValueError(f"{where}.connectors must hold at least {len(KINDS) - 1} (none is used twice in a message)")
    clauses = _table(data, "clauses", KINDS, f"{where}.")
    direct = _table(data, "direct", KINDS, f"{where}.")
    indirect = _table(data, "indirect", KINDS, f"{where}.")
    if not isinstance(data.get("chitchat"), list) or not data["chitchat"]:
        raise ValueError(f"{where} lacks the table 'chitchat' (a non-empty list of [user, reply] pairs)")
    return _Style(
        **lists,
        clauses={kind: _strings(clauses[kind], f"{where}.clauses.{kind}") for kind in clauses},
        direct={kind: _questions(direct[kind], f"{where}.direct.{kind}") for kind in direct},
        indirect={kind: _questions(indirect[kind], f"{where}.indirect.{kind}") for kind in indirect},
        chitchat=tuple(_pair(p, f"{where}.chitchat[{i}]") for i, p in enumerate(data["chitchat"])),
    )


def read_phrases(
    path: Path = PHRASES_FILE,
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]], dict[str, tuple[str, ...]], dict[str, _Style]]:
    """The closed values, the names and the cities of each split, and each split's wordings, read from ``path`` and
    checked: a table missing or of the wrong shape is refused, named."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    where = f"{path}: "
    closed = _table(data, "closed_values", CLOSED_KINDS, where)
    names, cities = _table(data, "names", SPLITS, where), _table(data, "cities", SPLITS, where)
    styles = _table(data, "styles", SPLITS, where)
    return (
        {kind: _strings(closed[kind], f"{where}closed_values.{kind}") for kind in closed},
        {split: _strings(names[split], f"{where}names.{split}") for split in names},
        {split: _strings(cities[split], f"{where}cities.{split}") for split in cities},
        {split: _style(styles[split], f"{where}styles.{split}") for split in styles},
    )


CLOSED_VALUES, _NAMES, _CITIES, _STYLES = read_phrases()


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
