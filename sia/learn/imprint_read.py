"""Training the imprint's read: a low-rank adapter of every layer's query, value and output maps, active only in rows
whose imprint holds something, learns to answer from the user's imprinted words ("What's my name?" -> "Your name is
Marisol."). The write is not trained: spans are chosen by token shock and read by the base model, as a turn does.

An example: one message stating one to four facts (clauses, openers and connectors from
sia/learn/data/read_templates.json, values from read_values.json; hundreds of names, places and jobs) and up to
``distractors`` unrelated messages, imprinted one after another exactly as turns imprint them
(sia.identity.turn.imprint_message: the NLL of each token under a fresh identity, clauses above the threshold, the
base model's keys and values); then a question about one stated kind, whose reply is one of the kind's answers. Losses:
cross-entropy of the reply (its end-of-turn token included), and, so that the adapter costs the language nothing, the
KL divergence from the base model (no imprint) to the model (the same imprint) over an ordinary exchange's reply;
with ``rival_weight``, a cross-entropy where the reply's value begins among its first token and those the user's other
stated values would begin with there (on the natural set's tuning part it halved the answers giving another of the
user's facts but turned them into guesses: experiments/LOG.md, 2026-11-28 (k), (l); off by default). With
``doing_rate``, jobs and hobbies are also told by what the user does and answered in their own verb (read_doings.json:
"I restore old furniture for a living" -> "You told me you restore old furniture."; off by default: 2026-12-07 (k)).

The held-out measure is the natural-conversation set (sia.learn.natural), never read here.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.backbones.llama import LlamaModel
from sia.identity.imprint import KINDS, Imprint, SpanChoice
from sia.identity.state import IdentityState
from sia.identity.turn import write_imprint
from sia.learn.adapter.facts import chitchat
from sia.learn.natural import TRAIN, load_users
from sia.model.conditioning import Conditioning
from sia.model.identity_model import WordsRead

__all__ = [
    "ReadConfig",
    "ReadExample",
    "ReadPhrases",
    "imprint_of",
    "imprint_turns",
    "imprints_of",
    "lowered",
    "make_example",
    "message_inputs",
    "message_reads",
    "natural_asks",
    "natural_example",
    "natural_statements",
    "parse_args",
    "token_kinds",
    "train_kinds",
    "train_read",
]

log = logging.getLogger("sia.learn.imprint_read")
_T = TypeVar("_T")

DATA = Path(__file__).parent / "data"
NEW_TOKENS = 62  # a new imprint's entries unless told
MAIN = ("name", "city", "job", "colour", "pet", "hobby")
EXTRA = ("food", "instrument", "language", "origin")


@dataclass(frozen=True)
class ReadConfig:
    steps: int = 200
    batch: int = 8
    lr: float = 2e-3
    rank: int = 8  # the read adapter's rank; 0: none (nor read steps): the backbone reads the entries by its own attention
    # imprint entries and their precision (config.imprint_bits): 62 in int8 or 120 in 4 bits keep a stored SmolLM2
    # identity under 1 MB; None: 62 and 8 for a new imprint, the checkpoint's own with resume (else it is resized)
    tokens: int | None = None
    bits: int | None = None
    distractors: int = 3  # at most this many unrelated messages imprinted beside the statement
    distill_weight: float = 1.0
    # the weight of a cross-entropy, where the reply's value begins, among the tokens that the user's other stated
    # values would begin with there ("Your name is" -> Marisol over Lisbon, nurse): the read learns to pick the entry
    # the question asks for, not another of the user's
    rival_weight: float = 0.0
    extra_rate: float = 0.25  # chance that a statement also states a kind beyond the main six
    others_rate: float = 0.0  # chance that a statement also tells someone else's fact (the read learns to pass it)
    split_rate: float = 0.0  # chance that the facts are told over two messages, apart
    aside_rate: float = 0.0  # chance that a statement also says something of the user's that is no fact (and of each
    # unrelated message that it is such an aside, not a question): "my colleague Brigitte brought cake today"
    kinds: bool = True  # train a kind tagger too
    kinds_only: bool = False  # over a checkpoint with its imprint and read: only a fresh kind tagger (its ask head kept)
    # how often each message of the natural set's training part (sia/learn/data/natural/users_train.jsonl, written by
    # hand) is counted in the kind tagger's data beside the generated ones; 0: not read
    kinds_natural: int = 0
    # each of those messages (and, with asks_natural, each question) also counted once in lower case, as people type in
    # a chat window ("oh i'm saoirse by the way"): the layer the tagger reads sees a lower-case name otherwise
    natural_lower: bool = False
    asks_natural: bool = False  # the ask head also learns from the natural training part's questions and messages
    # the share of the read's examples drawn from the natural training part: a hand-written user's messages imprinted,
    # then one of their questions (a kind with answers in the phrase tables), answered with the newest value of its kind
    natural_rate: float = 0.0
    # the chance that a generated example's job or hobby is told and answered in the user's own verb (``make_example``)
    doing_rate: float = 0.0
    gate: bool = False  # add the imprint's per-token read gate (config.imprint_gate) and train it with the adapter
    adapter: bool = True  # train the read adapter (False: only the gate, over a checkpoint's trained adapter)
    resume: bool = False  # train on over the checkpoint's imprint and read (its tagger kept), not a fresh one
    read_shift: float | None = None  # the self slots' read shift the checkpoint is written with (None: the one before's)
    imprint_shift: float = 0.0  # the imprint's shift the checkpoint is written with (docs/attention.md §10)
    kinds_layer: int | None = None  # the layer it reads; None: the middle one (15 of SmolLM2's 30)
    # > 0: an ask head on the tagger's layer, trained after the tagger, moving the asked kind's entries by this much
    # (config.imprint_ask_bias); 0: none
    ask_bias: float = 0.0
    # the copy read's lambda the checkpoint is written with (config.imprint_copy: pointed by the query heads the
    # checkpoint names, else by every query head of the last third of the layers); None: the one before's
    copy: float | None = None
    # the read learns through the copy read (config.imprint_copy of the model trained): its imprints keep their token
    # ids, so each answer's loss is taken on the model's distribution mixed with the imprinted tokens, as a turn reads
    # them, and the copy heads' pointer at the entries learns with the rest
    through_copy: bool = False
    # the kind tagger's label threshold the checkpoint is written with (config.imprint_label_min; None: the one before's)
    label_min: float | None = None
    seed: int = 0
    log_every: int = 10

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"rank is the read adapter's rank: >= 0 (0: none); got {self.rank}")
        if not self.rank and self.gate and not self.resume:
            raise ValueError("the imprint's read gate trains with the read adapter: rank 0 has none")
        if not 0.0 <= self.doing_rate <= 1.0:
            raise ValueError(f"doing_rate is a chance: in [0, 1]; got {self.doing_rate}")
        if self.copy is not None and not (math.isfinite(self.copy) and self.copy >= 0):
            raise ValueError(f"copy is the copy read's lambda: a finite number >= 0; got {self.copy!r}")


@dataclass(frozen=True)
class ReadPhrases:
    values: dict[str, tuple[str, ...]]
    clauses: dict[str, tuple[str, ...]]
    questions: dict[str, tuple[str, ...]]
    answers: dict[str, tuple[str, ...]]
    openers: tuple[str, ...]
    closers: tuple[str, ...]
    connectors: tuple[str, ...]
    chitchat: tuple[str, ...]
    others: dict[str, tuple[str, ...]]  # by kind: clauses stating that kind of someone else's ("my husband {v}...")
    asides: tuple[str, ...]  # what a user says of themself that states none of the kinds ("the bakery on Calle Mayor closed")
    # by kind (job, hobby): what people do, told and answered in their own verb ("I restore old furniture" -> "You told
    # me you restore old furniture."), not by a noun the read would have to find ("a furniture restorer")
    doings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    doing_clauses: dict[str, tuple[str, ...]] = field(default_factory=dict)
    doing_answers: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def load(cls, data: Path = DATA) -> ReadPhrases:
        values = json.loads((data / "read_values.json").read_text())
        t = json.loads((data / "read_templates.json").read_text())
        doing = json.loads((data / "read_doings.json").read_text())
        kinds = (*MAIN, *EXTRA)
        phrases = cls(
            values={k: tuple(values[k]) for k in kinds},
            clauses={k: tuple(t["clauses"][k]) for k in kinds},
            questions={k: tuple(t["questions"][k]) for k in kinds},
            answers={k: tuple(t["answers"][k]) for k in kinds},
            openers=tuple(t["openers"]),
            closers=tuple(t["closers"]),
            connectors=tuple(t["connectors"]),
            chitchat=tuple(t["chitchat"]),
            others={k: tuple(v) for k, v in t["others"].items()},
            asides=tuple(t["asides"]),
            doings={k: tuple(v) for k, v in doing["values"].items()},
            doing_clauses={k: tuple(v) for k, v in doing["clauses"].items()},
            doing_answers={k: tuple(v) for k, v in doing["answers"].items()},
        )
        if not set(phrases.others) <= set(kinds):
            raise ValueError(f"others' kinds must be among {kinds}; got {sorted(phrases.others)}")
        for part in (phrases.doing_clauses, phrases.doing_answers):
            if set(part) != set(phrases.doings) or not set(part) <= set(kinds):
                raise ValueError(f"doings need clauses and answers of the same kinds among {kinds}; got {sorted(part)}")
            for kind, templates in part.items():
                if not templates or any(t.count("{v}") != 1 or "{av}" in t for t in templates):
                    raise ValueError(f"each {kind} doing template needs exactly one {{v}} (no {{av}}); got {templates}")
        for kind in kinds:
            for template in (*phrases.clauses[kind], *phrases.answers[kind], *phrases.others.get(kind, ())):
                if template.count("{v}") + template.count("{av}") != 1:
                    raise ValueError(f"the {kind} template {template!r} needs exactly one of {{v}}, {{av}}")
        return phrases


def _article(value: str) -> str:
    return "an" if value[:1].lower() in "aeiou" else "a"


def _fill(template: str, value: str) -> str:
    return template.replace("{av}", f"{_article(value)} {value}").replace("{v}", value)


@dataclass(frozen=True)
class ReadExample:
    messages: tuple[str, ...]  # imprinted in order; one of them states the facts
    question: str
    answer: str
    exchange: tuple[str, str]  # an ordinary (message, reply) the distillation reads with the same imprint
    facts: dict[str, str] = field(default_factory=dict)
    # by message index, (start, end, kind): the characters of that message stating each fact (the tagger's targets)
    clauses: dict[int, tuple[tuple[int, int, str], ...]] = field(default_factory=dict)
    rivals: tuple[str, ...] = ()  # the answer told with each of the user's other stated values instead (rival_weight)


def _statement(
    rng: random.Random, p: ReadPhrases, parts: list[tuple[str, str | None]], *, opener: bool
) -> tuple[str, tuple[tuple[int, int, str], ...]]:
    """One message telling ``parts`` (clause, its kind, or None for someone else's), and the user's clauses' spans."""
    message = rng.choice(p.openers) + " " if opener and rng.random() < 0.5 else ""
    spans = []
    for i, (clause, whose) in enumerate(parts):
        if i:
            message += rng.choice(p.connectors)
        if whose is not None:
            spans.append((len(message), len(message) + len(clause), whose))
        message += clause
    if rng.random() < 0.3:
        message += " " + rng.choice(p.closers)
    return message, tuple(spans)


def make_example(
    rng: random.Random,
    p: ReadPhrases,
    *,
    distractors: int,
    extra_rate: float,
    others_rate: float = 0.0,
    split_rate: float = 0.0,
    aside_rate: float = 0.0,
    doing_rate: float = 0.0,
) -> ReadExample:
    """One example; with chance ``doing_rate`` each job or hobby is one of ``p.doings``, told and answered in the
    user's own verb ("I restore old furniture for a living" -> "You told me you restore old furniture."); with chance
    ``others_rate`` the statement also tells a fact of someone else's ("my sister lives in Oslo"), which is not the
    user's and is never asked; with chance ``aside_rate`` it also holds one or two asides
    (the user's words that state no fact: "got stuck at Frankfurt airport once"), and each unrelated message is an
    aside rather than a question with that chance; with chance ``split_rate`` (two facts or more) the facts are told
    over two messages, in order, with the unrelated ones anywhere around them."""
    kinds = rng.sample(MAIN, rng.randint(1, 4))
    if rng.random() < extra_rate:
        kinds.append(rng.choice(EXTRA))
    rng.shuffle(kinds)
    facts = {kind: rng.choice(p.values[kind]) for kind in kinds}
    # no draw at rate 0: the same seed gives the data it gave before
    doing = [k for k in kinds if doing_rate and k in p.doings and rng.random() < doing_rate]
    for kind in doing:
        facts[kind] = rng.choice(p.doings[kind])
    told = {kind: p.doing_clauses[kind] if kind in doing else p.clauses[kind] for kind in kinds}
    parts: list[tuple[str, str | None]] = [(_fill(rng.choice(told[kind]), facts[kind]), kind) for kind in kinds]
    if others_rate and rng.random() < others_rate:
        kind = rng.choice(sorted(p.others))
        value = rng.choice([v for v in p.values[kind] if v != facts.get(kind)])
        parts.insert(rng.randint(0, len(parts)), (_fill(rng.choice(p.others[kind]), value), None))
    if aside_rate and rng.random() < aside_rate:  # no draw at rate 0: the same seed gives the data it gave before
        for _ in range(rng.randint(1, 2)):
            parts.insert(rng.randint(0, len(parts)), (rng.choice(p.asides), None))
    cut = len(parts)
    if split_rate and len(parts) > 1 and rng.random() < split_rate:
        cut = rng.randint(1, len(parts) - 1)
    statements = [_statement(rng, p, part, opener=i == 0) for i, part in enumerate((parts[:cut], parts[cut:])) if part]
    others = rng.sample(p.chitchat, rng.randint(0, distractors))
    if aside_rate:
        others = [rng.choice(p.asides) if rng.random() < aside_rate else m for m in others]
    if len(statements) == 1:  # drawn as before split_rate existed: with it 0, the same seed gives the same data
        slots = [rng.randint(0, len(others))]
    else:
        slots = sorted(rng.sample(range(len(others) + len(statements)), len(statements)))
    messages: list[str] = list(others)
    for at, (message, _) in zip(slots, statements, strict=True):
        messages.insert(at, message)
    clauses = {at: spans for at, (_, spans) in zip(slots, statements, strict=True)}
    asked = rng.choice(kinds)
    template = rng.choice(p.doing_answers[asked] if asked in doing else p.answers[asked])
    answer = _fill(template, facts[asked])
    exchange = rng.choice(chitchat("train"))
    question = rng.choice(p.questions[asked])
    # the answer's own article kept, so that answer and rival part where the value begins
    own = template.replace("{av}", f"{_article(facts[asked])} {{v}}")
    rivals = tuple(_fill(own, v) for v in dict.fromkeys(facts.values()) if v != facts[asked])
    return ReadExample(tuple(messages), question, answer, (exchange.user, exchange.reply), facts, clauses, rivals)


def natural_example(rng: random.Random, p: ReadPhrases, user: Any, *, distractors: int) -> ReadExample | None:
    """A read example from a natural-set user (``sia.learn.natural.NaturalUser``): their messages in order, then up
    to ``distractors`` unrelated ones, then one of their questions about a kind the phrase tables answer, answered
    with one of that kind's answers and the newest value the user gave it; None where they asked none such."""
    asked = [q for q in user.questions if q.kind in p.answers]
    if not asked:
        return None
    question = rng.choice(asked)
    facts = {f.kind: user.newest(f.kind).value for f in user.facts}
    value = facts[question.kind]
    template = rng.choice(p.answers[question.kind])
    messages = (*user.messages, *rng.sample(p.chitchat, rng.randint(0, distractors)))
    exchange = rng.choice(chitchat("train"))
    own = template.replace("{av}", f"{_article(value)} {{v}}")
    rivals = tuple(_fill(own, v) for v in dict.fromkeys(facts.values()) if v != value)
    answer = _fill(template, value)
    return ReadExample(messages, question.text, answer, (exchange.user, exchange.reply), facts, {}, rivals)


@torch.no_grad()
def message_reads(
    model: LlamaModel, prompts: Sequence[tuple[list[int], tuple[int, int]]], *, rows: int = 16
) -> list[tuple[Tensor, WordsRead]]:
    """Each turn prompt (``tok.turn_prompt``'s tokens and message bounds) read by the base model up to its message's
    end: its message tokens' NLL (n,) and ``read_words``, ``rows`` prompts a padded pass."""
    out: list[tuple[Tensor, WordsRead]] = []
    for at in range(0, len(prompts), rows):
        chunk = prompts[at : at + rows]
        lengths = [end - 1 for _, (_, end) in chunk]
        cut = [(tokens[:n], 1) for (tokens, _), n in zip(chunk, lengths, strict=True)]
        idx, _ = _batch(cut, model.tokenizer.pad_id, model.device)  # right-padded
        for (tokens, (start, end)), words in zip(chunk, model.read_rows(idx, lengths, logits=True), strict=True):
            assert words.logits is not None
            targets = torch.tensor(tokens[start : end - 1], device=model.device)[:, None]
            nll = -F.log_softmax(words.logits[start - 1 : end - 2].float(), -1).gather(-1, targets)[:, 0].cpu()
            out.append((nll, replace(words, logits=None)))
    return out


def imprint_turns(
    model: LlamaModel, system: list[int], messages: Sequence[str], *, keep_text: bool = False
) -> Iterator[tuple[Imprint, list[SpanChoice]]]:
    """After each of ``messages``, the imprint a fresh identity keeps and the spans that message added (token ids kept
    with ``keep_text``), each turn imprinting as the service's does (sia.identity.turn.write_imprint; the fresh
    identity is the base model, so each message's token NLL is the base model's)."""
    prompts = [model.tokenizer.turn_prompt(message, system) for message in messages]
    return _written(model, prompts, message_reads(model, prompts), keep_text=keep_text)


def _written(
    model: LlamaModel,
    prompts: Sequence[tuple[list[int], tuple[int, int]]],
    reads: Sequence[tuple[Tensor, WordsRead]],
    *,
    keep_text: bool = False,
) -> Iterator[tuple[Imprint, list[SpanChoice]]]:
    """One conversation's turns written in order from their prompts and reads (``imprint_turns``)."""
    imprint = Imprint.empty(model.config)
    for turn, ((tokens, (start, end)), (nll, words)) in enumerate(zip(prompts, reads, strict=True)):
        imprint, choices = write_imprint(
            model.config, model.tokenizer, imprint, tokens, nll, words, slice(start, end - 1), turn=turn, keep_text=keep_text
        )
        yield imprint, choices


def imprints_of(
    model: LlamaModel,
    systems: Sequence[list[int]],
    conversations: Sequence[Sequence[str]],
    *,
    keep_text: bool = False,
) -> list[Imprint]:
    """The imprint a fresh identity keeps after each conversation's messages under its persona prompt (``imprint_turns``'
    last; token ids kept with ``keep_text``), every message of them all read in shared padded passes."""
    prompts = [
        [model.tokenizer.turn_prompt(message, system) for message in messages]
        for system, messages in zip(systems, conversations, strict=True)
    ]
    reads = iter(message_reads(model, [p for conversation in prompts for p in conversation]))
    out = []
    for conversation in prompts:
        written = _written(model, conversation, [next(reads) for _ in conversation], keep_text=keep_text)
        last = deque(written, maxlen=1)  # only the final imprint
        out.append(last[0][0] if last else Imprint.empty(model.config))
    return out


def imprint_of(model: LlamaModel, system: list[int], messages: Sequence[str]) -> Imprint:
    """The imprint a fresh identity keeps after these messages (``imprint_turns``' last), without text."""
    return imprints_of(model, [system], [messages])[0]


def token_kinds(tok: Any, message: str, clauses: tuple[tuple[int, int, str], ...]) -> list[int]:
    """Each token of ``tok.encode(message)`` labelled with the KINDS index of the clause its characters fall in (0
    outside every clause): the kind tagger's targets."""
    label = [0] * len(message.encode())
    for a, b, kind in clauses:
        lo, hi = len(message[:a].encode()), len(message[:b].encode())
        label[lo:hi] = [KINDS.index(kind)] * (hi - lo)
    out, at = [], 0
    for t in tok.encode(message):
        n = len(tok.token_bytes(t) or b"")
        inside = [k for k in label[at : at + n] if k]
        out.append(max(set(inside), key=inside.count) if inside else 0)
        at += n
    return out


def natural_statements(users: Sequence[Any], *, lower: bool = False) -> list[tuple[str, tuple[tuple[int, int, str], ...]]]:
    """Every message of these natural-set users (``sia.learn.natural.NaturalUser``) with the character spans of the
    facts it states whose kinds the tagger knows (the fact's ``clause``, where it first occurs): ``train_kinds``'
    hand-written examples. With ``lower``, each message that has capitals is also given in lower case, its spans the
    same (``lowered``)."""
    rows = []
    for u in users:
        for i, message in enumerate(u.messages):
            spans = []
            for f in u.facts:
                if f.message == i and f.kind in KINDS[1:]:
                    at = message.index(f.clause)
                    spans.append((at, at + len(f.clause), f.kind))
            rows.append((message, tuple(spans)))
    return _and_lowered(rows) if lower else rows


def lowered(text: str) -> str:
    """``text`` in lower case, character for character (a character whose lower case is longer, "İ", stays), so that
    a span's offsets hold in both."""
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


def _and_lowered(rows: list[tuple[str, _T]]) -> list[tuple[str, _T]]:
    """``rows`` of (message, what it is labelled), then each message that has capitals again in lower case (``lowered``)
    with the same label."""
    low = [(lowered(m), label) for m, label in rows]
    return rows + [row for row, (m, _) in zip(low, rows, strict=True) if row[0] != m]


def natural_asks(users: Sequence[Any], *, lower: bool = False) -> list[tuple[str, int]]:
    """The ask head's hand-written examples from natural-set users: every question with the KINDS index of what it
    asks (0 for a kind the tagger does not know) and every message they told (0: it asks for none of their facts);
    with ``lower``, each of them that has capitals also in lower case."""
    asks = [(q.text, KINDS.index(q.kind) if q.kind in KINDS else 0) for u in users for q in u.questions]
    rows = asks + [(m, 0) for u in users for m in u.messages]
    return _and_lowered(rows) if lower else rows


@torch.no_grad()
def message_inputs(
    model: LlamaModel, prompts: Sequence[tuple[list[int], tuple[int, int]]], layer: int, *, rows: int = 16
) -> list[Tensor]:
    """Each turn prompt's message tokens as ``layer``'s attention takes them in (``LlamaModel.layer_input``, (n, C),
    the base model), the prompts read ``rows`` a padded pass in order of length (what the kind tagger reads)."""
    out: list[Tensor] = [torch.empty(0)] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: prompts[i][1][1])
    for at in range(0, len(order), rows):
        chunk = order[at : at + rows]
        idx, _ = _batch([(prompts[i][0][: prompts[i][1][1] - 1], 1) for i in chunk], model.tokenizer.pad_id, model.device)
        inputs = model.layer_inputs(idx, layer)  # right-padded and causal: each row as it would be read alone
        for row, i in enumerate(chunk):
            start, end = prompts[i][1]
            out[i] = inputs[row, start : end - 1].cpu()
    return out


def train_kinds(
    model: LlamaModel,
    systems: list[list[int]],
    phrases: ReadPhrases,
    *,
    messages: int = 1200,
    steps: int = 300,
    seed: int = 0,
    others_rate: float = 0.0,
    natural: Sequence[tuple[str, tuple[tuple[int, int, str], ...]]] = (),
    natural_repeat: int = 1,
    doing_rate: float = 0.0,
) -> dict[str, float]:
    """Fit the kind tagger (``model.imprint_kind``, a linear map of one layer's normalised input) on generated
    statements (with chance ``others_rate`` one of them about someone else, labelled as no kind) and unrelated
    messages (with chance ``doing_rate`` a job or hobby told by what the user does, ``make_example``), and on ``natural``
    messages written by hand with their facts' spans (``natural_statements``; counted ``natural_repeat`` times), the
    base model frozen; returns its token accuracy on 200 more generated examples."""
    if model.imprint_kind is None or model.config.imprint_kinds_layer is None:
        raise ValueError("the model has no kind tagger: add_imprint(..., kinds_layer=L) first")
    if natural_repeat < 1:
        raise ValueError(f"natural_repeat must be >= 1; got {natural_repeat}")
    layer, tok, rng = model.config.imprint_kinds_layer, model.tokenizer, random.Random(seed)

    def features(n: int) -> tuple[Tensor, Tensor]:
        said, ys = [], []
        for _ in range(n):
            ex = make_example(rng, phrases, distractors=1, extra_rate=0.3, others_rate=others_rate, doing_rate=doing_rate)
            system = rng.choice(systems)
            for i, message in enumerate(ex.messages):
                said.append(tok.turn_prompt(message, system))
                ys.append(torch.tensor(token_kinds(tok, message, ex.clauses.get(i, ()))))
        return torch.cat(message_inputs(model, said, layer)), torch.cat(ys)

    x, y = features(messages)
    if natural:  # their own stream of persona prompts: the generated examples stay those of a run without them
        pick = random.Random(seed + 1)
        own = message_inputs(model, [tok.turn_prompt(m, pick.choice(systems)) for m, _ in natural], layer)
        labels = [torch.tensor(token_kinds(tok, m, spans)) for m, spans in natural]
        x = torch.cat([x, *(h for h in own for _ in range(natural_repeat))])
        y = torch.cat([y, *(t for t in labels for _ in range(natural_repeat))])
    held_x, held_y = features(200)
    tagger = model.imprint_kind
    opt = torch.optim.AdamW(tagger.parameters(), lr=1e-2, weight_decay=1e-4)
    x, y = x.to(tagger.weight.device), y.to(tagger.weight.device)
    for _ in range(steps):
        loss = F.cross_entropy(tagger(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    with torch.no_grad():
        loss = F.cross_entropy(tagger(x), y)
        predicted = tagger(held_x.to(tagger.weight.device)).argmax(-1).cpu()
    fact = held_y > 0
    return {
        "tokens": float(x.shape[0]),
        "loss": loss.item(),
        "accuracy": float((predicted == held_y).float().mean()),
        "fact_token_recall": float((predicted[fact] == held_y[fact]).float().mean()),
        "false_fact_rate": float((predicted[~fact] > 0).float().mean()),
    }


def ask_messages(rng: random.Random, p: ReadPhrases, n: int) -> list[tuple[str, int]]:
    """``n`` messages for the ask head, each with the KINDS index of what it asks about (0: none): a question about
    one of the user's kinds, sometimes lowercased, without its question mark or after a remark; or a message that
    asks for none (small talk, a question about the world, an aside, a statement of the user's facts)."""
    kinds = (*MAIN, *EXTRA)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            kind = rng.choice(kinds)
            text = rng.choice(p.questions[kind])
            if rng.random() < 0.25:
                text = text.lower()
            if rng.random() < 0.25:
                text = text.rstrip("?")
            if rng.random() < 0.2:
                text = f"{rng.choice(p.asides)} {text}"
            out.append((text, KINDS.index(kind)))
        else:
            pick = rng.random()
            if pick < 0.4:
                text = rng.choice(p.chitchat)
            elif pick < 0.6:
                text = rng.choice(p.asides)
            else:
                text = rng.choice(make_example(rng, p, distractors=0, extra_rate=0.3).messages)
            out.append((text, 0))
    return out


def _split(p: ReadPhrases, held: float, seed: int) -> tuple[ReadPhrases, ReadPhrases]:
    """The phrases' questions, small talk and asides cut in two: ``held`` of each kind's wordings apart."""
    rng = random.Random(seed)

    def cut(items: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        shuffled = list(items)
        rng.shuffle(shuffled)
        k = max(1, round(held * len(shuffled)))
        return tuple(shuffled[k:]), tuple(shuffled[:k])

    questions = {k: cut(v) for k, v in p.questions.items()}
    chat, asides = cut(p.chitchat), cut(p.asides)
    return (
        replace(p, questions={k: v[0] for k, v in questions.items()}, chitchat=chat[0], asides=asides[0]),
        replace(p, questions={k: v[1] for k, v in questions.items()}, chitchat=chat[1], asides=asides[1]),
    )


def message_tokens(tok: Any, message: str) -> list[int]:
    """A message's own tokens, as a turn's prompt holds them (``TurnPrompt.message``, whatever the context)."""
    tokens, (start, end) = tok.turn_prompt(message, [])
    return list(tokens[start : end - 1])


def ask_features(model: LlamaModel, messages: Sequence[str], *, rows: int = 32) -> Tensor:
    """What the ask head reads of each message (len(messages), C): ``LlamaModel.message_means`` of its tokens as a
    turn's prompt holds them (``TurnPrompt.message``)."""
    tokens = [message_tokens(model.tokenizer, m) for m in messages]
    return torch.cat([model.message_means(tokens[a : a + rows]).cpu() for a in range(0, len(tokens), rows)])


def train_asks(
    model: LlamaModel,
    phrases: ReadPhrases,
    *,
    messages: int = 1600,
    steps: int = 300,
    held: float = 0.2,
    seed: int = 0,
    natural: Sequence[tuple[str, int]] = (),
) -> dict[str, float]:
    """Fit the ask head (``model.imprint_ask``, a linear map of the mean of the tagger's layer's input over a message)
    on generated messages (``ask_messages``) and the ``natural`` ones written by hand (``natural_asks``), the base
    model frozen. First fitted without ``held`` of each kind's generated question wordings (and of the small talk and
    asides) and measured on messages made from those alone; then fitted again on all of them (what is kept). Returns
    the held-out accuracy, the asked kind's recall and the false asks."""
    if model.imprint_ask is None:
        raise ValueError("the model has no ask head: add_ask_head(bias) first")
    head, rng = model.imprint_ask, random.Random(seed)
    train, apart = _split(phrases, held, seed)

    def fit(p: ReadPhrases) -> float:
        data = ask_messages(rng, p, messages) + list(natural)
        x = ask_features(model, [m for m, _ in data]).to(head.weight.device)
        y = torch.tensor([k for _, k in data], device=head.weight.device)
        with torch.no_grad():
            head.weight.zero_()
            head.bias.zero_()
        opt = torch.optim.AdamW(head.parameters(), lr=1e-2, weight_decay=1e-4)
        for _ in range(steps):
            loss = F.cross_entropy(head(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
        return float(loss.item())

    fit(train)
    test = ask_messages(rng, apart, 400)
    with torch.no_grad():
        guess = head(ask_features(model, [m for m, _ in test]).to(head.weight.device)).argmax(-1).cpu()
    truth = torch.tensor([k for _, k in test])
    asks = truth > 0
    figures = {
        "held_out_accuracy": float((guess == truth).float().mean()),
        "asked_kind_recall": float((guess[asks] == truth[asks]).float().mean()),
        "false_asks": float((guess[~asks] > 0).float().mean()),
    }
    figures["loss"] = fit(phrases)
    return figures


def _batch(rows: list[tuple[list[int], int]], pad: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Right-padded (B, L) tokens and the (B, L - 1) mask of the targets that count: each row's tokens from its
    ``first`` counted index on (the reply)."""
    L = max(len(t) for t, _ in rows)
    idx = torch.full((len(rows), L), pad, dtype=torch.long)
    counted = torch.zeros(len(rows), L - 1, dtype=torch.bool)
    for b, (tokens, first) in enumerate(rows):
        idx[b, : len(tokens)] = torch.tensor(tokens)
        counted[b, first - 1 : len(tokens) - 1] = True  # logits at j predict token j + 1
    return idx.to(device), counted.to(device)


def _rival_choices(
    tok: Any, rows: Sequence[tuple[list[int], int]], rivals: Sequence[Sequence[str]]
) -> list[tuple[int, int, Tensor]]:
    """Where each answer row (prompt and reply tokens, the reply's first index) and its rival answers first part: (its
    row, the logits position before that token, the distinct tokens there, the answer's own first)."""
    parting: dict[tuple[int, int], list[int]] = {}
    for b, ((row, first), texts) in enumerate(zip(rows, rivals, strict=True)):
        for text in texts:
            other = row[:first] + tok.reply_tokens(text)
            at = next((i for i, (x, y) in enumerate(zip(row, other, strict=False)) if x != y), None)
            if at is not None:
                ids = parting.setdefault((b, at - 1), [row[at]])
                if other[at] not in ids:
                    ids.append(other[at])
    return [(b, at, torch.tensor(ids)) for (b, at), ids in parting.items()]


def _conditioned(
    model: LlamaModel, imprints: list[Imprint | None], reads_from: list[int], messages: Sequence[str] | None = None
) -> Conditioning:
    """Fresh identities holding these imprints, read from ``reads_from`` on; where the model has an ask head, each
    row's entries moved by what its message (one of ``messages``) asks, as a turn moves them."""
    fresh = IdentityState.fresh(model.config)
    asking = None
    if messages is not None and model.imprint_ask is not None:
        asking = [message_tokens(model.tokenizer, m) for m in messages]
    return model.condition_states([replace(fresh, imprint=imprint) for imprint in imprints], reads_from, asking)


def train_read(
    model: LlamaModel,
    systems: list[list[int]],
    config: ReadConfig,
    phrases: ReadPhrases,
    *,
    natural: Sequence[Any] = (),
) -> list[dict[str, float]]:
    """Train the read adapter of ``model`` in place (``model.add_imprint`` first), each example under one of the
    persona prompts ``systems`` (tokens); with ``config.natural_rate``, that share of the examples from the ``natural``
    users (``natural_example``). Where the model has an ask head, the entries are moved by what each message asks, as
    in a turn. Returns the log."""
    if not model.config.imprint_read_rank:
        raise ValueError("the model has no read adapter: call add_imprint(tokens, read_rank) first")
    if config.through_copy and not model.config.imprint_copy:
        raise ValueError("through_copy trains through the copy read: the model has none (config.imprint_copy is 0)")
    if not 0.0 <= config.natural_rate <= 1.0:
        raise ValueError(f"natural_rate is a share of the examples: in [0, 1]; got {config.natural_rate}")
    if config.natural_rate and not natural:
        raise ValueError("natural_rate needs the natural users to draw from")
    tok = model.tokenizer
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    if config.gate and not model.config.imprint_gate:
        model.add_imprint_gate()
    trainable = [p for n, p in model.named_parameters() if ("imprint_read" in n and config.adapter) or "imprint_gate" in n]
    if not trainable:
        raise ValueError("nothing to train: the read adapter is off (adapter=False) and the model has no imprint gate")
    for p in model.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, config.steps) / config.steps))
    )
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    for step in range(1, config.steps + 1):
        examples = []
        for _ in range(config.batch):
            ex = None
            if config.natural_rate and rng.random() < config.natural_rate:  # no draw at 0: the data of a run before it
                ex = natural_example(rng, phrases, rng.choice(natural), distractors=config.distractors)
            if ex is None:
                ex = make_example(
                    rng,
                    phrases,
                    distractors=config.distractors,
                    extra_rate=config.extra_rate,
                    others_rate=config.others_rate,
                    split_rate=config.split_rate,
                    aside_rate=config.aside_rate,
                    doing_rate=config.doing_rate,
                )
            examples.append(ex)
        model.eval()
        system = [rng.choice(systems) for _ in examples]
        starts = [len(s) for s in system]
        imprints: list[Imprint | None] = list(
            imprints_of(model, system, [ex.messages for ex in examples], keep_text=config.through_copy)
        )
        asked = [(tok.turn_prompt(ex.question, s)[0], ex.answer) for s, ex in zip(system, examples, strict=True)]
        rows = [(prompt + tok.reply_tokens(answer), len(prompt)) for prompt, answer in asked]
        idx, counted = _batch(rows, tok.pad_id, model.device)
        conditioning = _conditioned(model, imprints, starts, [ex.question for ex in examples])
        logits = model(idx, conditioning).logits[:, :-1]  # (B, L - 1, V)
        answer = F.cross_entropy(logits[counted], idx[:, 1:][counted])
        loss = answer
        rival = torch.zeros(())
        if config.rival_weight:
            choices = _rival_choices(tok, rows, [ex.rivals for ex in examples])
            if choices:
                rival = torch.stack(
                    [
                        F.cross_entropy(logits[b, at, ids.to(logits.device)], ids.new_zeros(()).to(logits.device))
                        for b, at, ids in choices
                    ]
                ).mean()
                loss = loss + config.rival_weight * rival
        kl = torch.zeros(())
        if config.distill_weight:
            said = [tok.turn_prompt(ex.exchange[0], s)[0] for s, ex in zip(system, examples, strict=True)]
            rows = [(prompt + tok.reply_tokens(ex.exchange[1]), len(prompt)) for prompt, ex in zip(said, examples, strict=True)]
            idx, counted = _batch(rows, tok.pad_id, model.device)
            with torch.no_grad():
                teacher = model(idx, _conditioned(model, [None] * len(rows), starts)).logits[:, :-1][counted]
            student = model(idx, _conditioned(model, imprints, starts, [ex.exchange[0] for ex in examples])).logits[:, :-1]
            student = student[counted]
            kl = F.kl_div(
                F.log_softmax(student.float(), -1), F.log_softmax(teacher.float(), -1), log_target=True, reduction="batchmean"
            )
            loss = loss + config.distill_weight * kl
        if loss.requires_grad:  # else no example imprinted anything: the adapter played no part
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
        schedule.step()
        imprinted = sum(1 for imprint in imprints if imprint is not None and imprint.used)
        record = {
            "step": step,
            "answer": answer.item(),
            "kl": kl.item(),
            "rival": rival.item(),
            "imprinted": imprinted,
            "seconds": round(time.perf_counter() - started, 1),
        }
        if model.config.imprint_gate:  # where the gate has moved: its mean bias and weight norm over the layers
            gates = [a.imprint_gate for a in model.attentions if a.imprint_gated]
            record["gate_bias"] = float(torch.stack([g.bias.detach().float().mean() for g in gates]).mean())
            record["gate_weight"] = float(torch.stack([g.weight.detach().float().norm() for g in gates]).mean())
        history.append(record)
        if step % config.log_every == 0 or step == 1:
            log.info("step %d: answer %.3f, kl %.4f (%.0f s)", step, record["answer"], record["kl"], record["seconds"])
    for p in trainable:
        p.requires_grad_(False)
    return history


def train_checkpoint(
    checkpoint: Path,
    out: Path,
    config: ReadConfig,
    *,
    cache_dir: Path | None = None,
) -> Path:
    """A SIA checkpoint of a pretrained backbone given an imprint, a read adapter and a kind tagger trained here, in
    that order (the read learns from spans chosen by token shock alone), written to ``out`` (config.json, base.json,
    identity.safetensors; ``read_history.json`` the training log). With ``config.kinds_only`` the checkpoint already has its
    imprint and read adapter, and only the kind tagger is added and trained; with ``config.resume`` it has its tagger
    too, which stays as it is, and the read trains on from where it is (``config.adapter``: the adapter;
    ``config.gate``: the imprint's read gate, added at zero if the checkpoint has none). With ``config.ask_bias`` an
    ask head is trained last, fresh (with ``resume`` and neither adapter nor gate: only it, over the checkpoint)."""
    if config.kinds_only and config.resume:
        raise ValueError("kinds_only and resume train different parts: choose one")
    if config.kinds_natural < 0:
        raise ValueError(f"kinds_natural counts the natural training part's messages: >= 0; got {config.kinds_natural}")
    # the natural training part
    hand_written = load_users(TRAIN) if config.kinds_natural or config.asks_natural or config.natural_rate else []
    asks_only = config.resume and not config.adapter and not config.gate
    if asks_only and not config.ask_bias:
        raise ValueError("resume with neither the adapter nor the gate leaves nothing to train but an ask head: give ask_bias")
    from sia.checkpoint import DEFAULT_CACHE, BaseRef, load_llama_checkpoint, save_llama_checkpoint
    from sia.personas import PERSONAS, persona_prompt

    model = load_llama_checkpoint(checkpoint, DEFAULT_CACHE if cache_dir is None else cache_dir)
    layer = None
    if config.kinds:
        layer = model.config.n_layer // 2 if config.kinds_layer is None else config.kinds_layer
    systems = [model.tokenizer.system_prompt(persona_prompt(model, name)) for name in sorted(PERSONAS)]
    phrases = ReadPhrases.load()
    history: list[dict[str, float]] = []
    tagger: dict[str, float] = {}
    if asks_only:
        if model.config.imprint_kinds_layer is None:
            raise ValueError(f"{checkpoint} has no kind tagger, whose layer the ask head reads: train it first")
    elif config.resume:
        if not model.config.imprint_read_rank:
            raise ValueError(f"{checkpoint} has no read adapter to train on: train the read first")
        tokens = model.config.imprint_tokens if config.tokens is None else config.tokens
        bits = model.config.imprint_bits if config.bits is None else config.bits
        copy = model.config.imprint_copy if config.copy is None else config.copy  # the read trains under the one it ships
        model.config = replace(model.config, imprint_tokens=tokens, imprint_bits=bits, imprint_copy=copy)
        history = train_read(model, systems, config, phrases, natural=hand_written)
    else:
        if not config.kinds_only:
            model.add_imprint(NEW_TOKENS if config.tokens is None else config.tokens, config.rank, seed=config.seed)
            model.config = replace(model.config, imprint_bits=8 if config.bits is None else config.bits)
            if config.rank:
                history = train_read(model, systems, config, phrases, natural=hand_written)
        model.add_kind_tagger(layer)
        # the tagger learns from single statements of the user's own facts: someone else's facts in its data lowered
        # the share of natural facts it labels (experiments/LOG.md, 2026-11-28)
        natural = natural_statements(hand_written, lower=config.natural_lower) if config.kinds_natural else ()
        tagger = {}
        if layer is not None:
            tagger = train_kinds(
                model,
                systems,
                phrases,
                seed=config.seed,
                natural=natural,
                natural_repeat=max(config.kinds_natural, 1),
                doing_rate=config.doing_rate,
            )
        log.info("kind tagger: %s", tagger)
    asks: dict[str, float] = {}
    if config.ask_bias and (asks_only or not config.resume or model.imprint_ask is None):
        model.add_ask_head(config.ask_bias)
        natural_ask = natural_asks(hand_written, lower=config.natural_lower) if config.asks_natural else ()
        asks = train_asks(model, phrases, seed=config.seed, natural=natural_ask)
        log.info("ask head: %s", asks)
    elif config.ask_bias:  # the checkpoint's head kept, its bias as given
        model.config = replace(model.config, imprint_ask_bias=config.ask_bias)
    shift = model.config.read_shift if config.read_shift is None else config.read_shift
    label = model.config.imprint_label_min if config.label_min is None else config.label_min
    copy = model.config.imprint_copy if config.copy is None else config.copy
    model.config = replace(
        model.config, read_shift=shift, imprint_shift=config.imprint_shift, imprint_label_min=label, imprint_copy=copy
    )
    save_llama_checkpoint(model, out, BaseRef.of(checkpoint))
    log_file = out / "read_history.json"
    log_file.write_text(json.dumps({"config": vars(config), "kinds": tagger, "asks": asks, "history": history}, indent=1) + "\n")
    return out


def parse_args(argv: Sequence[str] | None = None) -> tuple[Path, Path, ReadConfig, int | None]:
    """The command line's checkpoint, output directory, training settings and thread count."""
    import argparse

    from sia.checkpoint import DEFAULT_CHECKPOINT

    parser = argparse.ArgumentParser(description="train the imprint's read adapter over a SIA checkpoint")
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=ReadConfig.steps)
    parser.add_argument("--batch", type=int, default=ReadConfig.batch)
    parser.add_argument("--lr", type=float, default=ReadConfig.lr)
    parser.add_argument("--rank", type=int, default=ReadConfig.rank, help="the read adapter's rank (0: none, no read steps)")
    parser.add_argument("--copy", type=float, default=None, help="the copy read's lambda (default: the checkpoint's)")
    parser.add_argument(
        "--tokens", type=int, default=None, help=f"imprint entries (default {NEW_TOKENS}; with --resume the checkpoint's)"
    )
    parser.add_argument(
        "--bits", type=int, choices=(8, 4), default=None, help="entries' precision (default 8; with --resume the checkpoint's)"
    )
    parser.add_argument(
        "--distractors", type=int, default=ReadConfig.distractors, help="at most this many unrelated messages an example"
    )
    parser.add_argument("--distill", type=float, default=ReadConfig.distill_weight)
    parser.add_argument(
        "--rival-weight", type=float, default=ReadConfig.rival_weight, help="rank the asked value over the user's others"
    )
    parser.add_argument("--seed", type=int, default=ReadConfig.seed)
    parser.add_argument("--others-rate", type=float, default=ReadConfig.others_rate, help="statements with someone else's fact")
    parser.add_argument("--split-rate", type=float, default=ReadConfig.split_rate, help="facts told over two messages")
    parser.add_argument(
        "--aside-rate", type=float, default=ReadConfig.aside_rate, help="statements and unrelated messages with asides"
    )
    parser.add_argument(
        "--kinds-layer", type=int, default=None, help="the layer the kind tagger reads (default: the middle); -1: none"
    )
    parser.add_argument("--kinds-only", action="store_true", help="add and train only the kind tagger")
    parser.add_argument("--asks-natural", action="store_true", help="the ask head learns from the natural training part")
    parser.add_argument(
        "--kinds-natural", type=int, default=ReadConfig.kinds_natural, help="count the natural training part this often"
    )
    parser.add_argument(
        "--natural-lower",
        action="store_true",
        help="the natural training part's messages (and with --asks-natural its questions) also in lower case",
    )
    parser.add_argument(
        "--ask-bias", type=float, default=ReadConfig.ask_bias, help="train an ask head moving the asked kind's entries"
    )
    parser.add_argument(
        "--label-min", type=float, default=None, help="the kind tagger's label threshold (default: the checkpoint's)"
    )
    parser.add_argument(
        "--asks-only", action="store_true", help="with --ask-bias: add and train only the ask head over the checkpoint"
    )
    parser.add_argument("--gate", action="store_true", help="add the imprint's per-token read gate, trained with the read")
    parser.add_argument(
        "--resume", action="store_true", help="train the checkpoint's read on (its tagger kept); with --gate, the gate too"
    )
    parser.add_argument(
        "--gate-only", action="store_true", help="with --resume: train only the imprint's read gate, the adapter as it is"
    )
    parser.add_argument(
        "--natural-rate",
        type=float,
        default=ReadConfig.natural_rate,
        help="share of read examples from the natural training part",
    )
    parser.add_argument(
        "--doing-rate", type=float, default=ReadConfig.doing_rate, help="jobs and hobbies told by what the user does"
    )
    parser.add_argument(
        "--through-copy", action="store_true", help="the answer's loss taken through the copy read (imprints keep token ids)"
    )
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    config = ReadConfig(
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        rank=args.rank,
        tokens=args.tokens,
        bits=args.bits,
        distractors=args.distractors,
        distill_weight=args.distill,
        rival_weight=args.rival_weight,
        seed=args.seed,
        others_rate=args.others_rate,
        split_rate=args.split_rate,
        aside_rate=args.aside_rate,
        gate=args.gate or args.gate_only,
        adapter=not args.gate_only and not args.asks_only,
        resume=args.resume or args.asks_only,
        ask_bias=args.ask_bias,
        label_min=args.label_min,
        kinds=args.kinds_layer != -1,
        kinds_layer=None if args.kinds_layer == -1 else args.kinds_layer,
        kinds_only=args.kinds_only,
        kinds_natural=args.kinds_natural,
        natural_lower=args.natural_lower,
        asks_natural=args.asks_natural,
        natural_rate=args.natural_rate,
        doing_rate=args.doing_rate,
        copy=args.copy,
        through_copy=args.through_copy,
    )
    if args.gate_only and not args.resume:
        parser.error("--gate-only trains over a checkpoint's read: add --resume")
    return args.checkpoint, args.out, config, args.threads


def main() -> None:
    checkpoint, out, config, threads = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if threads:
        torch.set_num_threads(threads)
    train_checkpoint(checkpoint, out, config)


if __name__ == "__main__":
    main()
