"""The natural-conversation memory set: users telling a persona about themselves in their own words, written by hand
(sia/learn/data/natural/, independent of the corpus generator), and recall measured on it.

A user's conversation: their messages (facts stated as people state them: introductions, asides, corrections), then
``depth`` unrelated turns from a separate hand-written pool, then one question per fact kind, each asked from the
same state. A reply remembers a fact when it contains one of the fact's accepted strings (word-initial,
case-insensitive), for the newest value of its kind; a correction is remembered when the newest value is given and
the older one is not.

Two parts are measured: ``tune`` (thresholds, prompts and choices are made on it) and ``heldout`` (measured only; no
training run, threshold or prompt choice ever reads it). A third, ``train``, written apart from both in the same
manner, is what training may read (the kind tagger and the ask head learn from it; the read adapter can, with
``ReadConfig.natural_rate``); it is never measured.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, run_turn, stream_turns
from sia.model.generate import SamplingParams
from sia.model.identity_model import IdentityModel
from sia.model.tokenizer import Tokenizer

__all__ = [
    "DATA",
    "KINDS",
    "SPLITS",
    "TRAIN",
    "DepthResult",
    "Fact",
    "NaturalUser",
    "Question",
    "UserResult",
    "answered",
    "filler",
    "kept",
    "load_fillers",
    "load_users",
    "mentions",
    "play_user",
    "recall_by_depth",
]

DATA = Path(__file__).parent / "data" / "natural"
SPLITS = ("tune", "heldout")  # the parts measured
TRAIN = "train"  # the part training reads (the kind tagger, the ask head; the read with natural_rate); never measured
MAIN_KINDS = ("name", "city", "job", "colour", "pet", "hobby")
KINDS = (*MAIN_KINDS, "relative", "pet_name", "birthday", "food", "employer", "origin", "plan", "instrument", "language")


@dataclass(frozen=True)
class Fact:
    kind: str
    value: str
    accept: tuple[str, ...]
    message: int  # the index of the message that states it
    clause: str  # the words of that message that state it
    corrects: str | None = None  # the older value this one replaces


@dataclass(frozen=True)
class Question:
    kind: str
    text: str


@dataclass(frozen=True)
class NaturalUser:
    id: str
    messages: tuple[str, ...]
    facts: tuple[Fact, ...]
    questions: tuple[Question, ...]

    def newest(self, kind: str) -> Fact:
        """The fact a question about ``kind`` asks for: the last one stated."""
        return [f for f in self.facts if f.kind == kind][-1]

    def older(self, kind: str) -> list[Fact]:
        return [f for f in self.facts if f.kind == kind][:-1]


def _user(row: dict[str, Any], where: str) -> NaturalUser:
    try:
        messages = tuple(str(m) for m in row["messages"])
        facts = tuple(
            Fact(
                kind=str(f["kind"]),
                value=str(f["value"]),
                accept=tuple(str(a) for a in f["accept"]),
                message=int(f["message"]),
                clause=str(f["clause"]),
                corrects=None if f.get("corrects") is None else str(f["corrects"]),
            )
            for f in row["facts"]
        )
        questions = tuple(Question(str(q["kind"]), str(q["text"])) for q in row["questions"])
        user = NaturalUser(str(row["id"]), messages, facts, questions)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not a natural-set user ({exc!r})") from exc
    for f in facts:
        if f.kind not in KINDS:
            raise ValueError(f"{where}: unknown kind {f.kind!r}")
        if not 0 <= f.message < len(messages) or f.clause not in messages[f.message]:
            raise ValueError(f"{where}: the clause {f.clause!r} is not in message {f.message}")
        if not f.accept or not all(a.strip() for a in f.accept):
            raise ValueError(f"{where}: the {f.kind} fact accepts no answer")
    kinds = {f.kind for f in facts}
    if sorted(q.kind for q in questions) != sorted(kinds):
        raise ValueError(f"{where}: one question per stated kind is needed ({sorted(kinds)})")
    return user


def load_users(split: str, data: Path = DATA) -> list[NaturalUser]:
    """The users of one part of the set (``tune``, ``heldout`` or ``train``), checked."""
    if split not in (*SPLITS, TRAIN):
        raise ValueError(f"the natural set's parts are {(*SPLITS, TRAIN)}; got {split!r}")
    path = data / f"users_{split}.jsonl"
    users = [_user(json.loads(line), f"{path.name}:{i + 1}") for i, line in enumerate(path.read_text().splitlines()) if line]
    if len({u.id for u in users}) != len(users):
        raise ValueError(f"{path.name}: user ids repeat")
    return users


def load_fillers(split: str, data: Path = DATA) -> list[str]:
    """The unrelated turns of one part of the set."""
    if split not in SPLITS:
        raise ValueError(f"the natural set's parts are {SPLITS}; got {split!r}")
    path = data / f"fillers_{split}.jsonl"
    return [str(json.loads(line)["text"]) for line in path.read_text().splitlines() if line]


def filler(fillers: Sequence[str], n: int, j: int) -> str:
    """The j-th unrelated turn told to the n-th user of a part, between its messages and its questions: each user
    goes through the part's fillers in an order of its own."""
    return fillers[(7 * n + j) % len(fillers)]


def _word_start(accept: str) -> str:
    """The pattern of ``accept`` (lower case) at the start of a word."""
    return r"(?<![\w])" + re.escape(accept.lower())


def mentions(reply: str, accept: str) -> bool:
    """``accept`` at the start of a word of ``reply`` (so "cat" matches "cats", not "education"), case-insensitive."""
    return re.search(_word_start(accept), reply.lower()) is not None


def answered(reply: str, user: NaturalUser, kind: str) -> bool:
    """The reply gives the newest value of ``kind`` and none of the values it replaced, outside its words that give the
    newest ("Jessamyn" gives the newest name, not the older "Jess")."""
    newest = user.newest(kind).accept
    if not any(mentions(reply, a) for a in newest):
        return False
    rest = reply.lower()
    for a in sorted(newest, key=len, reverse=True):
        rest = re.sub(_word_start(a) + r"\w*", " ", rest)
    lowered = {a.lower() for a in newest}
    return not any(mentions(rest, a) for f in user.older(kind) for a in f.accept if a.lower() not in lowered)


def kept(state: IdentityState, tok: Tokenizer, user: NaturalUser, kind: str) -> bool | None:
    """The newest value of ``kind`` is among the words ``state``'s imprint holds (None where it keeps no imprint or
    no text): the write's share of a question, apart from the read's."""
    imprint = state.imprint
    if imprint is None or not imprint.capacity:
        return None
    spans = imprint.spans()
    if any(s.tokens is None for s in spans):
        return None
    text = " | ".join(tok.decode(s.tokens or ()) for s in spans)
    return any(mentions(text, a) for a in user.newest(kind).accept)


@dataclass(frozen=True)
class UserResult:
    user: str
    right: dict[str, bool]  # per kind asked
    replies: dict[str, str]
    state: IdentityState  # the state the questions were asked from


TALK = SamplingParams(max_new_tokens=16, temperature=0)  # the conversation's turns: greedy, short
ASK = SamplingParams(max_new_tokens=24, temperature=0)  # the questions: the answer comes first


def play_user(
    model: IdentityModel,
    tok: Tokenizer,
    user: NaturalUser,
    fillers: Sequence[str],
    *,
    system: Sequence[int],
    mode: str = "state",
    talk: SamplingParams = TALK,
    ask: SamplingParams = ASK,
    keep_text: bool = True,
) -> UserResult:
    """One user's conversation and questions, greedy. ``mode``:

    - ``state``: each turn sees the persona's prompt (``system``) and its message only; the state carries the rest;
    - ``fresh``: the questions asked of a fresh identity (a stranger);
    - ``transcript``: a fresh identity reading the whole conversation so far in context at every turn (the base
      model's own replies), questions included;
    - ``oracle``: a fresh identity with only the fact's clause as the previous user turn before its question.
    """
    if mode not in ("state", "fresh", "transcript", "oracle"):
        raise ValueError(f"unknown mode {mode!r}")
    dynamics = Dynamics.from_config(model.config)
    fresh = IdentityState.fresh(model.config)
    state, said = fresh, list[tuple[str, str]]()
    if mode in ("state", "transcript"):
        for message in [*user.messages, *fillers]:
            context = _transcript(tok, system, said) if mode == "transcript" else tuple(system)
            turn = run_turn(model, TurnRequest(state, message, dynamics, context, keep_text), talk, tokenizer=tok)
            said.append((message, turn.reply))
            if mode == "state":
                state = turn.state
    right, replies = {}, {}
    for q in user.questions:
        context = tuple(system)
        if mode == "transcript":
            context = _transcript(tok, system, said)
        elif mode == "oracle":
            context = _transcript(tok, system, [(user.newest(q.kind).clause, "Noted!")])
        reply = run_turn(model, TurnRequest(state, q.text, dynamics, context, keep_text), ask, tokenizer=tok).reply
        right[q.kind], replies[q.kind] = answered(reply, user, q.kind), reply
    return UserResult(user.id, right, replies, state)


def _transcript(tok: Tokenizer, system: Sequence[int], turns: Sequence[tuple[str, str]]) -> tuple[int, ...]:
    tokens = list(system)
    for message, reply in turns:
        tokens = tok.turn_prompt(message, tokens)[0] + tok.reply_tokens(reply)
    return tuple(tokens)


@dataclass(frozen=True)
class DepthResult:
    """Every question of every user asked after ``depth`` unrelated turns."""

    depth: int
    right: dict[str, dict[str, bool]]  # user -> kind -> remembered
    replies: dict[str, dict[str, str]]
    kept: dict[str, dict[str, bool | None]] = field(default_factory=dict)  # user -> kind -> its value imprinted

    def per_kind(self) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for kinds in self.right.values():
            for kind, ok in kinds.items():
                out.setdefault(kind, []).append(ok)
        return out

    @property
    def per_fact(self) -> float:
        oks = [ok for kinds in self.right.values() for ok in kinds.values()]
        return sum(oks) / max(1, len(oks))

    @property
    def all_facts(self) -> float:
        return sum(all(k.values()) for k in self.right.values()) / max(1, len(self.right))

    def corrections(self, users: Sequence[NaturalUser]) -> list[bool]:
        """The questions about a kind whose value the user corrected."""
        return [self.right[u.id][f.kind] for u in users for f in u.facts if f.corrects is not None and u.id in self.right]


def _batched(
    model: IdentityModel, tok: Tokenizer, requests: list[TurnRequest], params: SamplingParams, batch: int
) -> list[tuple[str, IdentityState]]:
    out: list[tuple[str, IdentityState]] = []
    for a in range(0, len(requests), batch):
        results = stream_turns(model, requests[a : a + batch], params, tokenizer=tok).finish()
        out.extend((r.reply, r.state) for r in results)
    return out


def recall_by_depth(
    model: IdentityModel,
    tok: Tokenizer,
    users: Sequence[NaturalUser],
    fillers: Sequence[str],
    depths: Sequence[int],
    *,
    system: Sequence[int],
    mode: str = "state",
    batch: int = 8,
    talk: SamplingParams = TALK,
    ask: SamplingParams = ASK,
    keep_text: bool = True,
) -> list[DepthResult]:
    """``play_user``'s modes for many users at once, in batches of turns, one conversation per user asked at every
    depth on its way (the questions never change the state): user u's unrelated turns are fillers
    (7u + j) mod len(fillers), j = 0, 1, ...; ``oracle`` and ``fresh`` do not depend on the depth (one result)."""
    if mode not in ("state", "fresh", "transcript", "oracle"):
        raise ValueError(f"unknown mode {mode!r}")
    if sorted(set(depths)) != list(depths) or (depths and depths[0] < 0):
        raise ValueError(f"depths must be distinct, ascending and >= 0; got {list(depths)}")
    dynamics = Dynamics.from_config(model.config)
    fresh = IdentityState.fresh(model.config)
    states = {u.id: fresh for u in users}
    said: dict[str, list[tuple[str, str]]] = {u.id: [] for u in users}

    def context(u: NaturalUser, kind: str | None = None) -> tuple[int, ...]:
        if mode == "transcript":
            return _transcript(tok, system, said[u.id])
        if mode == "oracle" and kind is not None:
            return _transcript(tok, system, [(u.newest(kind).clause, "Noted!")])
        return tuple(system)

    def talk_all(messages: dict[str, str]) -> None:
        order = [u for u in users if u.id in messages]
        requests = [TurnRequest(states[u.id], messages[u.id], dynamics, context(u), keep_text) for u in order]
        for u, (reply, state) in zip(order, _batched(model, tok, requests, talk, batch), strict=True):
            said[u.id].append((messages[u.id], reply))
            if mode == "state":
                states[u.id] = state

    def ask_all(depth: int) -> DepthResult:
        pairs = [(u, q) for u in users for q in u.questions]
        requests = [TurnRequest(states[u.id], q.text, dynamics, context(u, q.kind), keep_text) for u, q in pairs]
        right: dict[str, dict[str, bool]] = {u.id: {} for u in users}
        replies: dict[str, dict[str, str]] = {u.id: {} for u in users}
        held: dict[str, dict[str, bool | None]] = {u.id: {} for u in users}
        for (u, q), (reply, _) in zip(pairs, _batched(model, tok, requests, ask, batch), strict=True):
            right[u.id][q.kind], replies[u.id][q.kind] = answered(reply, u, q.kind), reply
            held[u.id][q.kind] = kept(states[u.id], tok, u, q.kind)
        return DepthResult(depth, right, replies, held)

    if mode in ("oracle", "fresh"):
        return [ask_all(0)]
    for i in range(max((len(u.messages) for u in users), default=0)):
        talk_all({u.id: u.messages[i] for u in users if i < len(u.messages)})
    results, done = [], 0
    for depth in depths:
        for j in range(done, depth):
            talk_all({u.id: filler(fillers, n, j) for n, u in enumerate(users)})
        done = depth
        results.append(ask_all(depth))
    return results
