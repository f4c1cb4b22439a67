"""The imprint: what the user said, kept in their own words as key/value entries; the identity state's third part
beside the trace T and the self state s (docs/attention.md, "The imprint").

Notation: n_layer layers, H_kv key/value heads, N entries (config.imprint_tokens), d head width, n tokens of a message.

An entry is one token of the user's message as the base model read it: its *pre-rotation* key and its value in every
layer and key/value head. Entries come in whole spans (the clause "my name is Marisol Etxeberria", never a lone token)
chosen by token-level shock: the surprisal of each token of the message under the identity, the turn's Shock made
local. Spans are never averaged: a span that does not fit replaces the lowest-scored ones (only when it scores
higher), a span of a known kind replaces the older span of that kind, and ``forget`` drops one on request.

Keys and values are stored in int8 (``imprint_bits`` 8) or in 4 bits, two a byte (``imprint_bits`` 4), with one float16
scale per vector (absmax): 2·(d + 2) or 2·(d/2 + 2) bytes per entry, layer and head, against float16's 4·d. Read,
entry j sits at position j - N, just before the conversation's first token, rotated there
(sia.backbones.injected_attention); an empty entry's logit is closed, so an empty imprint is the base model.

Nothing here mutates an Imprint: every function returns a new one.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from sia.model.config import AnyConfig, LlamaConfig
from sia.model.language import spoken_clause
from sia.model.naming import user_names

__all__ = [
    "KINDS",
    "Imprint",
    "ImprintEntries",
    "ImprintSpan",
    "SpanChoice",
    "asides",
    "asking",
    "asks_a_fact",
    "clause_breaks",
    "corrects",
    "dequantise",
    "fitted",
    "forget_span",
    "forget_words",
    "given_up",
    "greetings",
    "imprint_spans",
    "mends",
    "message_spans",
    "quantise",
    "says_now",
    "select_spans",
    "superseded",
]

# what a span says, when something labels it (0: not known); a span of a known kind replaces the older one of its kind
KINDS = ("unknown", "name", "city", "job", "colour", "pet", "hobby", "food", "instrument", "language", "origin")
_NAME = KINDS.index("name")
# the ask head's probability at which a message asks about a kind of fact for ``ImprintEntries.untold``
UNTOLD_SURE = 0.5


def asks_a_fact(asked: Tensor) -> Tensor:
    """(B, 1) bool: the rows whose message more likely asks about one of the user's facts than about none, from the ask
    head's probabilities ``asked`` (B, len(KINDS)) or their first column, p(none) (B, 1): p(none) < 1/2. The one gate of
    the entry bias, the copy read, the recall temperature, the echo opening and the questions of two facts."""
    return asked.float()[:, :1] < 0.5


_LEVELS = {8: 127.0, 4: 7.0}  # the largest magnitude of a stored number: int8, and 4 bits stored as q + 8 in a nibble
_DTYPES = {8: torch.int8, 4: torch.uint8}


def _stored(d: int, bits: int) -> int:
    """The stored width of an entry of width d (ValueError for bits other than 8 or 4, or an odd d in 4 bits)."""
    if bits not in _DTYPES:
        raise ValueError(f"an imprint stores 8 or 4 bits a number; got {bits!r}")
    if bits == 4 and d % 2:
        raise ValueError(f"4 bits pack two numbers a byte: the last dimension must be even; got {d}")
    return d if bits == 8 else d // 2


def quantise(x: Tensor, bits: int = 8) -> tuple[Tensor, Tensor]:
    """x (..., d) float -> (stored numbers, float16 scale (...,)), x ≈ q · scale with scale = max|x| / L per vector:
    ``bits`` 8 gives int8 (..., d), L = 127; ``bits`` 4 gives uint8 (..., d / 2), two numbers a byte (q + 8, the even
    index in the low nibble), L = 7. ``dequantise`` reads either."""
    _stored(x.shape[-1], bits)  # checks bits and, in 4 bits, an even width
    top = _LEVELS[bits]
    scale = x.float().abs().amax(-1) / top  # (...,)
    scale = scale.to(torch.float16).float().clamp_min(torch.finfo(torch.float16).tiny)  # the scale as it is stored
    q = torch.round(x.float() / scale.unsqueeze(-1)).clamp(-top, top)
    if bits == 8:
        return q.to(torch.int8), scale.to(torch.float16)
    nibbles = (q + 8).to(torch.uint8)  # 1..15
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4), scale.to(torch.float16)


def dequantise(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``quantise``'s inverse: int8 (..., d) or 4-bit pairs uint8 (..., d / 2), and the scales (...,) -> (..., d)."""
    if q.dtype == torch.uint8:
        q = torch.stack(((q & 15).float() - 8, (q >> 4).float() - 8), -1).flatten(-2)
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)


@dataclass(frozen=True)
class ImprintSpan:
    """One imprinted span, as listed to its owner: where it is, what it says (when text is kept) and why."""

    index: int  # the span's number in the imprint (0 first); ``forget_span`` takes it
    first: int  # its first entry
    length: int  # entries (tokens)
    turn: int  # the turn that imprinted it (0-based)
    offset: int  # its first token's position in that turn's message
    kind: str  # one of KINDS
    score: float  # its salience when imprinted (nats of token shock)
    tokens: tuple[int, ...] | None  # the token ids, or None where the turn's text is not kept


@dataclass(frozen=True)
class Imprint:
    """N entries per layer and key/value head; entries 0..used-1 are filled, in spans of consecutive entries."""

    keys: Tensor  # (n_layer, H_kv, N, d) int8, or (n_layer, H_kv, N, d / 2) uint8 in 4 bits; pre-rotation
    key_scale: Tensor  # (n_layer, H_kv, N) float16
    values: Tensor  # as keys
    value_scale: Tensor  # (n_layer, H_kv, N) float16
    span: Tensor  # (N,) int32: the span an entry belongs to (0, 1, ... in entry order); -1 empty
    token: Tensor  # (N,) int32: its token id; -1 where the text is not kept (and for empty entries)
    turn: Tensor  # (N,) int32: the turn that imprinted it
    offset: Tensor  # (N,) int32: its position in that turn's message
    kind: Tensor  # (N,) int32: an index into KINDS, the same over a span
    score: Tensor  # (N,) float32: the span's salience, the same over a span

    @classmethod
    def empty(cls, config: AnyConfig) -> Imprint:
        return cls.blank(*config.imprint_shape, bits=config.imprint_bits)

    @classmethod
    def blank(cls, n_layer: int, heads: int, N: int, d: int, *, bits: int = 8) -> Imprint:
        """No entry filled, room for N of width d in n_layer layers of ``heads`` key/value heads, ``bits`` a number."""
        minus = torch.full((N,), -1, dtype=torch.int32)
        stored = _stored(d, bits)
        return cls(
            keys=torch.zeros(n_layer, heads, N, stored, dtype=_DTYPES[bits]),
            key_scale=torch.zeros(n_layer, heads, N, dtype=torch.float16),
            values=torch.zeros(n_layer, heads, N, stored, dtype=_DTYPES[bits]),
            value_scale=torch.zeros(n_layer, heads, N, dtype=torch.float16),
            span=minus,
            token=minus.clone(),
            turn=torch.zeros(N, dtype=torch.int32),
            offset=torch.zeros(N, dtype=torch.int32),
            kind=torch.zeros(N, dtype=torch.int32),
            score=torch.zeros(N, dtype=torch.float32),
        )

    @property
    def capacity(self) -> int:
        return int(self.span.shape[0])

    @property
    def bits(self) -> int:
        """8 (int8 entries) or 4 (two a byte)."""
        return 4 if self.keys.dtype == torch.uint8 else 8

    @property
    def width(self) -> int:
        """d: an entry's width once read."""
        return int(self.keys.shape[-1]) * (2 if self.bits == 4 else 1)

    @property
    def used(self) -> int:
        return int((self.span >= 0).sum())

    def tensors(self) -> dict[str, Tensor]:
        """Every field by name (what the state's file stores under ``imprint.<name>``)."""
        return {name: getattr(self, name) for name in _FIELDS}

    def spans(self) -> list[ImprintSpan]:
        out: list[ImprintSpan] = []
        for index in range(int(self.span.max()) + 1 if self.used else 0):
            at = (self.span == index).nonzero().squeeze(-1)
            first, length = int(at[0]), int(at.shape[0])
            tokens = self.token[first : first + length]
            out.append(
                ImprintSpan(
                    index=index,
                    first=first,
                    length=length,
                    turn=int(self.turn[first]),
                    offset=int(self.offset[first]),
                    kind=KINDS[int(self.kind[first])],
                    score=float(self.score[first]),
                    tokens=None if bool((tokens < 0).any()) else tuple(int(t) for t in tokens),
                )
            )
        return out

    def recollection(self, decode: Callable[[list[int]], str], kinds: Collection[str] | None = None) -> list[str]:
        """What the user told of their facts, in their own words: the text (``decode`` of the token ids) of every span
        the kind tagger labelled with a kind of fact (of ``kinds`` where given, and then [] unless each of them has
        one), in the order it was said, each as a reply quotes it (``sia.model.language.spoken_clause``), none twice;
        [] where the text is not kept (privacy: only positions, kinds and scores are stored) or nothing labelled is
        held."""
        told = sorted(
            (s.turn, s.offset, s.tokens, s.kind)
            for s in self.spans()
            if s.kind != "unknown" and s.tokens is not None and (kinds is None or s.kind in kinds)
        )
        out: list[str] = []
        said: set[str] = set()
        for _, _, tokens, kind in told:
            clause = spoken_clause(decode(list(tokens)))
            if clause and clause.lower() not in (c.lower() for c in out):
                out.append(clause)
                said.add(kind)
        return out if kinds is None or said >= set(kinds) else []

    def entries(self, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
        """Dequantised keys and values (n_layer, H_kv, N, d) and which entries are filled (N,) bool."""
        return dequantise(self.keys, self.key_scale, dtype), dequantise(self.values, self.value_scale, dtype), self.span >= 0

    def validate(self, config: AnyConfig) -> None:
        """ValueError (the state's StateFormatError) unless shapes, dtypes and the span layout are consistent."""
        from sia.identity.state import StateFormatError, _check_tensor  # the state's own checks; it imports this module

        n_layer, heads, N, d = config.imprint_shape
        stored, numbers = _stored(d, config.imprint_bits), _DTYPES[config.imprint_bits]
        for name, shape, dtype in (
            ("keys", (n_layer, heads, N, stored), numbers),
            ("values", (n_layer, heads, N, stored), numbers),
            ("key_scale", (n_layer, heads, N), torch.float16),
            ("value_scale", (n_layer, heads, N), torch.float16),
            ("span", (N,), torch.int32),
            ("token", (N,), torch.int32),
            ("turn", (N,), torch.int32),
            ("offset", (N,), torch.int32),
            ("kind", (N,), torch.int32),
            ("score", (N,), torch.float32),
        ):
            _check_tensor(f"imprint.{name}", getattr(self, name), shape, dtype)
        used = self.used
        if N and not bool((self.span[:used] >= 0).all()):
            raise StateFormatError("imprint entries must be filled from the first one on, with no gap")
        if N and used:
            spans = self.span[:used]
            steps = spans[1:] - spans[:-1]
            if int(spans[0]) != 0 or not bool(((steps == 0) | (steps == 1)).all()):
                raise StateFormatError("imprint spans must be numbered 0, 1, ... over consecutive entries")
            for name in ("turn", "kind", "score"):
                values = getattr(self, name)[:used]
                if not bool((values == values[torch.searchsorted(spans, spans, right=False)]).all()):
                    raise StateFormatError(f"imprint.{name} must be the same over a span")
        if bool((self.kind < 0).any()) or bool((self.kind >= len(KINDS)).any()):
            raise StateFormatError(f"imprint.kind must index {KINDS}")
        if bool((self.turn < 0).any()) or bool((self.offset < 0).any()) or bool((self.token < -1).any()):
            raise StateFormatError("imprint turns and offsets must be >= 0 and token ids >= -1")
        vocab = getattr(config, "vocab_size", None)
        if vocab is not None and bool((self.token >= vocab).any()):
            raise StateFormatError(f"imprint.token ids must be below the vocabulary's {vocab}")
        if bool((self.key_scale.float() < 0).any()) or bool((self.value_scale.float() < 0).any()):
            raise StateFormatError("imprint scales must be >= 0")


@dataclass(frozen=True)
class ImprintEntries:
    """The imprints of a batch's rows as the read takes them: dequantised, pre-rotation."""

    keys: Tensor  # (B, n_layer, H_kv, N, d)
    values: Tensor  # (B, n_layer, H_kv, N, d)
    filled: Tensor  # (B, N) bool
    kind: Tensor  # (B, N) int64: each entry's kind, an index into KINDS (0: unknown, and for empty entries)
    token: Tensor  # (B, N) int64: each entry's token id; -1 where the text is not kept (and for empty entries)
    span: Tensor  # (B, N) int64: the span each entry belongs to (consecutive entries of one span); -1 empty

    @classmethod
    def stack(cls, imprints: Sequence[Imprint | None], shape: tuple[int, int, int, int], dtype: torch.dtype) -> ImprintEntries:
        """One row per imprint (None: an empty one of ``shape``, (n_layer, H_kv, N, d))."""
        held = [imprint or Imprint.blank(*shape) for imprint in imprints]
        keys, values, filled = (torch.stack(parts) for parts in zip(*(i.entries(dtype) for i in held), strict=True))
        kinds, tokens, spans = (torch.stack([getattr(i, name).long() for i in held]) for name in ("kind", "token", "span"))
        return cls(keys, values, filled, kinds, tokens, spans)

    def to(self, device: torch.device | str) -> ImprintEntries:
        return ImprintEntries(*(getattr(self, f.name).to(device) for f in fields(self)))

    def untold(self, asked: Tensor, kinds: Collection[str]) -> list[str]:
        """Per row, the kind of fact its message asks about when the user never told it: one of ``kinds``, the ask
        head's likeliest fact kind at ``UNTOLD_SURE`` or more (``asked`` (B, len(KINDS)), KINDS[0]: none), in a row
        whose imprint holds entries and none labelled with that kind; "" in every other row (an empty imprint included:
        a fresh identity is the base model)."""
        p, likeliest = self._likeliest(asked)
        filled, kind = self.filled.cpu(), self.kind.cpu()
        out = []
        for b, k in enumerate(likeliest):
            sure = float(p[b, k]) >= UNTOLD_SURE and KINDS[k] in kinds
            held = bool(filled[b].any()) and not bool((kind[b][filled[b]] == k).any())
            out.append(KINDS[k] if sure and held else "")
        return out

    def echoed(self, asked: Tensor, kinds: Collection[str]) -> list[str]:
        """Per row, the kind of fact its message asks about when its reply should say back the user's own words: one of
        ``kinds``, the ask head's likeliest fact kind in a row whose message more likely asks about a fact than about
        none (p(none) < 1/2, the recall's gate) and whose imprint holds entries; "" in every other row (an empty imprint
        included: a fresh identity is the base model). No entry of that kind is needed: the tagger leaves most clauses
        of a job or a hobby unlabelled ("I restore pipe organs"), and those are the ones the opening gives back."""
        _, likeliest = self._likeliest(asked)
        filled, facts = self.filled.cpu(), asks_a_fact(asked.cpu())[:, 0]
        out = []
        for b, k in enumerate(likeliest):
            out.append(KINDS[k] if bool(facts[b]) and KINDS[k] in kinds and bool(filled[b].any()) else "")
        return out

    def _likeliest(self, asked: Tensor) -> tuple[Tensor, list[int]]:
        """The ask head's probabilities ``asked`` (B, len(KINDS)) on the CPU, and each row's likeliest fact kind (an
        index into KINDS, never 0: none); ValueError for another shape."""
        if asked.shape != (self.kind.shape[0], len(KINDS)):
            raise ValueError(f"asked must be ({self.kind.shape[0]}, {len(KINDS)}); got {tuple(asked.shape)}")
        p = asked.float().cpu()
        return p, [int(k) + 1 for k in p[:, 1:].argmax(-1)]


_FIELDS = ("keys", "key_scale", "values", "value_scale", "span", "token", "turn", "offset", "kind", "score")


@dataclass(frozen=True)
class SpanChoice:
    """A span of a message chosen for the imprint: tokens ``start`` to ``end`` - 1 of the message."""

    start: int
    end: int
    score: float  # its salience: the largest token shock in it (nats)
    kind: int = 0  # an index into KINDS (0: unknown)
    replaces: bool = True  # a span of known kind replaces the older spans of its kind (its label is sure enough)


_CONJUNCTIONS = frozenset({"and", "but", "so", "because", "while", "although", "though", "since", "plus", "also"})
_SENTENCE_ENDS = frozenset(".!?;\n")
_PAUSES = frozenset(",:()[]\u2014\u2013")  # the dashes too: "I need to correct myself \u2014 I moved to Split"


def _pictograph(ch: str) -> bool:
    """An emoji or another pictographic symbol ("🌼", "😵", "☀"): in a chat message it closes a thought as a comma
    does ("good morning from the night shift 😵 im a security guard in cebu")."""
    return ord(ch) >= 0x2190 and unicodedata.category(ch) == "So"


def _word_starts(before: str, piece: str) -> bool:
    """Whether ``piece``, the token text after ``before``, begins a word: it opens with a space, or ``before`` ends
    in one or in a mark ("," then "and")."""
    return piece[:1].isspace() or not before[-1:].isalnum()


def _whole_word(pieces: Sequence[str], i: int) -> bool:
    """Whether token text ``i`` is a word of its own: it begins one and the next token begins another (" and" in
    "I paint and I sing", not " and" + "or" + "ra" in "Andorra" nor "and" in "Alexandria")."""
    starts = i == 0 or _word_starts(pieces[i - 1], pieces[i])
    return starts and (i + 1 == len(pieces) or _word_starts(pieces[i], pieces[i + 1]))


# a clause that says what the user changed from ("I moved from Lagos", "we relocated here from Pune", "I switched from
# nursing"): it ends before the "to" that says what they changed to
_MOVED_FROM = r"(?:moved|relocated|transferred|switched|changed)(?: here| over| back| jobs| careers)? from"
_CHANGED_FROM = re.compile(rf"\b{_MOVED_FROM} \S")


def _first_person_after(pieces: Sequence[str], i: int) -> bool:
    """Whether the word that token text ``i`` begins is the writer's "I", "I'm", "my" or "we" ("I'm Grace and I'm a
    midwife": the name's clause ends before "and", however short)."""
    if i >= len(pieces) or not _word_starts(pieces[i - 1], pieces[i]):
        return False
    word = pieces[i].strip()
    j = i + 1
    while j < len(pieces) and not _word_starts(pieces[j - 1], pieces[j]):
        word += pieces[j]
        j += 1
    return _FIRST_PERSON.fullmatch(_plain([word])) is not None


# a place said after what the user is or does ("I'm a dentist | here in Owerri", "dentist | in Hue city"): a clause of
# its own, unless what came before it says where the user lives or comes from ("I live in Lisbon", "born in Kano"), what
# was ("my shop was in Bo", "I used to teach in Leeds"), or speaks of someone else ("my sister works in Oslo")
_PLACE_OPENING = frozenset({"in", "near", "outside", "from"})
_SAYS_WHERE = re.compile(
    r"\b(?:live[ds]?|living|based|moved?|moving|relocated|born|raised|grew|stay(?:ing)?|reside[ds]?|settled|home|"
    r"was|were|used|had|did|been|"
    r"from|visit(?:ing|ed)?|trip|holiday|travel(?:l?ing|l?ed)?|went|going|go|here|there|weekend|years?|months?|weeks?|"
    r"days?|sister|brother|mum|mom|dad|father|mother|parents|family|friends?|son|daughter|wife|husband|partner)\b"
)

# a place said with a time is where something happened, not where the user is ("dinner at a restaurant in Rome last
# night"): no clause of its own
_WHEN = re.compile(
    r"\b(?:last|ago|yesterday|today|tonight|tomorrow|next|once|when|during|until|since|trip|holiday|vacation|visit|"
    r"conference|wedding|concert|festival|semester|summer|winter|spring|autumn|weekend|\d{4})\b"
)


def _place_follows(pieces: Sequence[str], i: int, length: int) -> bool:
    """Whether a clause of ``length`` tokens ending at token text ``i`` ends before a place said beside it: the next
    word is "in", "near", "outside" or "from" (or "here in") followed by a capitalised word, and the clause so far
    holds a word of three letters or more that is not "I'm", does not itself say where (``_SAYS_WHERE``), and the rest of
    the sentence says no time (``_WHEN``)."""
    j = i + 1
    if j + 1 >= len(pieces) or not _whole_word(pieces, j):
        return False
    word = pieces[j].strip().lower()
    if word == "here" and pieces[j + 1].strip().lower() == "in" and _whole_word(pieces, j + 1):
        j += 1
        word = "in"
    if word not in _PLACE_OPENING or j + 1 >= len(pieces) or not pieces[j + 1].strip()[:1].isupper():
        return False
    so_far = _plain(pieces[i + 1 - length : i + 1])
    words = [w for w in _WORDS.findall(so_far) if len(w) >= 3 and w not in ("i'm", "im")]
    rest = _plain(pieces[j + 1 :])
    rest = rest[: next((k for k, ch in enumerate(rest) if ch in _SENTENCE_ENDS), len(rest))]
    return bool(words) and _SAYS_WHERE.search(so_far) is None and _WHEN.search(rest) is None


def clause_breaks(pieces: Sequence[str], *, min_tokens: int = 4) -> Tensor:
    """(n,) bool for a message's token texts: True where a token ends a clause. A sentence ends at a full stop, an
    exclamation or question mark, a semicolon or a line break; within a sentence a clause ends at a comma, a colon, a
    bracket or an emoji (``_pictograph``), before a place said beside what the user is or does ("I'm a dentist | here
    in Owerri": ``_place_follows``), or before a conjunction ("and I live in Lisbon"; a word of its own, not the
    "and" of "Alexandria" nor the "so" of "Valparaíso"), once it holds ``min_tokens`` tokens (so "Ana here, Ana
    Kowalski." and "I build and repair violins" stay whole). The token texts are best each token's
    completed characters (``sia.model.tokenizer.completed_texts``), so that an emoji is seen whole."""
    return _breaks(pieces, min_tokens)[0]


def _breaks(pieces: Sequence[str], min_tokens: int = 4) -> tuple[Tensor, Tensor]:
    """``clause_breaks``, and (n,) bool: True at the first token of a clause that is a place said beside the one
    before it, with no mark between them ("here in Owerri")."""
    n = len(pieces)
    breaks = torch.zeros(n, dtype=torch.bool)
    beside = torch.zeros(n, dtype=torch.bool)
    length = 0
    for i, piece in enumerate(pieces):
        length += 1
        ends = any(ch in _SENTENCE_ENDS for ch in piece)
        pause = (
            any(ch in _PAUSES or _pictograph(ch) for ch in piece)
            or piece == " -"  # a spaced hyphen is a dash; one inside a word ("Saint-Louis") is not
            or (i + 1 < n and pieces[i + 1].strip().lower() in _CONJUNCTIONS and _whole_word(pieces, i + 1))
        )
        # "I moved from Lagos | to Abuja": what was before "to" is over (``superseded``), what follows is so now
        changed = i + 1 < n and pieces[i + 1].strip().lower() == "to" and _whole_word(pieces, i + 1)
        changed = changed and _CHANGED_FROM.search(_plain(pieces[i + 1 - length : i + 1])) is not None
        placed = _place_follows(pieces, i, length)
        paused = pause and (length >= min_tokens or (length >= 2 and _first_person_after(pieces, i + 2)))
        if ends or changed or placed or paused:
            breaks[i] = True
            if placed and not (ends or pause):  # a word follows
                beside[i + 1] = True
            length = 0
    return breaks, beside


# a sentence opening with one of these asks the persona something or asks it to do something ("what's 18% of 250",
# "tell me a joke about penguins"), with or without a question mark: it states nothing about the user
_ASKING = frozenset({
    "what", "what's", "whats", "why", "how", "how's", "which", "who", "who's", "whom", "whose", "where's", "when's", "can",
    "could", "would", "should", "is", "are", "do", "does", "did", "tell", "explain", "give", "recommend", "suggest",
    "describe", "list", "show", "teach", "write", "any", "wat", "convert", "translate", "define", "summarise", "summarize",
    "calculate", "compute", "rewrite", "proofread", "compare", "spell", "settle", "pick", "choose", "rank", "brainstorm",
    "draft",
})  # fmt: skip
# a word by which a sentence speaks of its writer ("i", "my", "we're"): in a message that asks something, a sentence
# with none is an aside (``asides``)
_FIRST_PERSON = re.compile(r"(?<![\w'])(?:i|i'm|im|i've|ive|i'd|i'll|me|my|mine|myself|we|we're|we've|our|ours|us)(?![\w'])")
# "when" and "where" ask only before a verb that asks ("when was the first email sent"; not "when I'm off work, I paint")
_ASKING_THEN = frozenset({"was", "is", "are", "were", "do", "does", "did", "can", "should", "will", "would"})
_OPENING = re.compile(r"[^a-z]*([a-z]+(?:'[a-z]+)?)(?:[^a-z]+([a-z]+))?")


def _plain(pieces: Sequence[str]) -> str:
    """Token texts joined, lowercased, with typographic apostrophes plain: what the lexicon rules read."""
    return "".join(pieces).lower().replace("\u2019", "'")


def _clauses(breaks: Tensor) -> list[tuple[int, int]]:
    """The [start, end) token ranges of the clauses that ``breaks`` (n,) cuts a message into (the last one ends at n)."""
    n = breaks.shape[0]
    ends = [i + 1 for i in range(n) if bool(breaks[i])]
    if not ends or ends[-1] != n:
        ends.append(n)
    clauses, start = [], 0
    for end in ends:
        if end > start:
            clauses.append((start, end))
        start = end
    return clauses


def asking(pieces: Sequence[str]) -> Tensor:
    """(n,) bool for a message's token texts: True on a token holding a question mark, and on every token of a
    sentence (or of a part of one up to a colon) that opens with a question word or a request, with or without a
    question mark ("what's 18% of 250", "Quick question: which is heavier", "tell me a joke"). A clause holding such a
    token asks the persona something; it states nothing about the user and is never imprinted."""
    n = len(pieces)
    out = torch.tensor([("?" in piece) for piece in pieces], dtype=torch.bool)
    start = 0
    for i, piece in enumerate(pieces):
        if i + 1 < n and not any(ch in _SENTENCE_ENDS or ch == ":" for ch in piece):
            continue
        opening = _OPENING.match(_greeted(_plain(pieces[start : i + 1])))
        if opening is not None:
            first, then = opening.groups()
            if first in _ASKING or (first in ("when", "where") and then in _ASKING_THEN):
                out[start : i + 1] = True
        start = i + 1
    return out


def _greeted(sentence: str) -> str:
    """A lowercased sentence after the greetings it opens with ("hii can u help me plan a trip": "can u help me plan a
    trip"), so that a request after a greeting is read as one; the sentence itself where it is all greeting."""
    rest = sentence
    while (word := _OPENING.match(rest)) is not None and word.group(2):
        first = word.group(1)
        if first in _ASKING or _collapsed(first) not in _GREETING_WORDS:
            break
        rest = rest[word.end(1) :]
    return rest if _OPENING.match(rest) else sentence


def asides(pieces: Sequence[str], questions: Tensor | None = None) -> Tensor:
    """(n,) bool for a message's token texts: True on every token of a sentence that does not speak of its writer (no
    "I", "my", "we"... outside the words that ask) in a message that asks the persona something (``questions``, by
    default ``asking``, holds a token): "Any tips to stop procrastinating? Asking for basically everyone on earth."
    A sentence that speaks of its writer ("Can I just complain? I'm a dentist here in Owerri."), and every sentence of
    a message that asks nothing ("Zainab here, living in Lahore"), is not an aside. An aside's spans go first when the
    imprint is full (``config.imprint_aside_weight``)."""
    n = len(pieces)
    out = torch.zeros(n, dtype=torch.bool)
    asks = asking(pieces) if questions is None else questions
    if not bool(asks.any()):
        return out
    start = 0
    for i, piece in enumerate(pieces):
        if i + 1 < n and not any(ch in _SENTENCE_ENDS for ch in piece):
            continue
        # the words that ask are not the writer's own ("give me your cheesiest one"): the rest of the sentence speaks
        said = [piece for piece, asked in zip(pieces[start : i + 1], asks[start : i + 1].tolist(), strict=True) if not asked]
        if _FIRST_PERSON.search(_plain(said)) is None:
            out[start : i + 1] = True
        start = i + 1
    return out


# a clause holding one of these says what is no longer so ("i'm not in cusco anymore", "roller derby used to be my
# thing"): it is never imprinted, so the older value it names does not come back beside the newer one
_SUPERSEDED = re.compile(
    r"\b(?:any ?more|no longer|no more|used to|old (?:info|news)|outdated|(?<!from )scratch|take (?:it |that )?back"
    r"|(?:i|we) (?:left|quit|stopped|gave up)|moved (?:out of|away from)|(?:is|are|was|'s) over(?= for\b| now\b|\W*$)|ended"
    rf"|{_MOVED_FROM}"
    r"|(?:i've|i have|we've|we have) gone off|(?:is|are|'s|'re) gone\b(?! to)|re-?homed|gave (?:[\w']+ ){0,3}away"
    r"|passed away|died|on (?:pause|hold)|got boring|retired from|(?:i|we) sold)\b"
)
# a clause opening with one of these dismisses what it names ("Forget the trumpet", "never mind Lyon", "ignore what I
# said about chess"): it says what is no longer so, as a clause of ``_SUPERSEDED`` does
_DISMISSING = re.compile(
    r"[^\w']*(?:(?:oh|ok|okay|so|and|but|also|well|just|please)\W+)?(?:forget|ignore|never ?mind|disregard)\b"
)
# a clause holding one of these says what is so now ("I'm a producer now", "these days it's bouldering"): where the
# kind tagger labels it (from the stored-label threshold), it replaces the older spans of its kind, as a sure label does
_NOW = re.compile(
    r"\b(?:now|nowadays|these days|currently|as of|since (?:last|this|january|february|march|april|may"
    r"|june|july|august|september|october|november|december|the spring|the summer|the autumn|the fall|the winter))\b"
)
# after "sorry", a "no" that takes something back stands alone or before the words that mend ("sorry, no, it's 21 May",
# "sorry no I meant Lyon"); one that opens what it names does not ("Sorry, no intro!")
_NO_PAUSE = r"(?=\W*$|\s*[,.!;:\u2014\u2013-]|\s+(?:wait|i|i'm|i've|it|it's|its|my|we|we're|that|the|actually)\b)"
# a message holding one of these corrects or updates what the user said before ("Correction: was an actuary", "we
# moved to Nadi", "wait, ..."): each clause it labels replaces the older spans of its kind, even where the label is not
# sure enough to replace them in another message
_CORRECTING = re.compile(
    r"\b(?:correction|correct myself|update|(?<!from )scratch|i lied|i lie|i was wrong|said it wrong|any ?more|no longer"
    r"|moved|switched|instead|take (?:it |that )?back|old (?:info|news)|outdated|wait|actually|no,? sorry|sorry,? no"
    + _NO_PAUSE
    + r"|make that|or rather|relocat(?:ed|ing)|(?:has|have|'s|'ve) changed|changed (?:my mind|jobs?|careers?|cities|countries"
    r"|to)|forget (?:what|that|about)|ignore (?:what|that|the)|mis-?spoke|typo|my bad|i meant|meant to say|got (?:that|it)"
    r" wrong|correct (?:that|this)|(?:fix|correct|change) what i (?:said|wrote|told you)|what am i saying|(?:i )?keep"
    r" (?:doing|mixing|getting) (?:this|that|it|them|these)|oops|silly me|rephrase|turns out|after all|hold on|rather than"
    r"|(?:i'm|i am) now"
    r"|new (?:city|town|job|home|place|favou?rite))\b"
)
# a clause opening with one of these takes back the clause before it in the same message, as people mend what they
# say while saying it ("fave colour's yellow. nah scratch that, it's teal", "doing audits for KPMG... wait no, I
# switched to EY"): that clause is never imprinted
_RETRACTING = re.compile(
    r"[^\w']*(?:(?:ah|oh|hmm|nah|no|um|uh|er)\W+)*(?:scratch that|wait\W+no|no\W+wait|no\W+sorry|sorry\W+no"
    + _NO_PAUSE
    + r"|make that|or rather)\b"
)
# a clause opening with one of these says that the clause before it is over ("I told you I live in Graz, but that was
# last year", "I had a tortoise for twelve years but he died"): that clause is never imprinted, nor this one where it
# names nothing else
_OVER_BEFORE = re.compile(
    r"[^\w']*(?:but\W+)?(?:that(?:\W+was|'s)\W+(?:last year|years ago|ages ago|a while ago|long ago|before|back then"
    r"|in the past)|(?:he|she|it|they)\W+(?:died|passed(?: away)?|ran away|(?:is|was|are|were|'s) gone))\b"
)


# a clause that denies something ("technically not Lyon", "it is NOT a chinchilla"), or in a message that corrects, one
# that opens with what was ("Correction: was an actuary"): the first word after its "not" (or "was") that names
# something is what it gives up, and the clause is superseded where an earlier turn's span held that word
_DENIAL = re.compile(r"\b(?:not|(?:do|does|did|is|are|was|were)n't)\b")
_WAS = re.compile(r"(?:^|:)\W*(?:i\s+)?(?:was|used to be)\b")
# in a message that corrects, a clause opening with what something was ("ochre was the old me", "my shop was in Bo"):
# it speaks of what the message corrects, and gives up the thing it names first
_WAS_THEN = re.compile(
    r"(?:^|[,:;\u2014\u2013])[^\w']*(?:(?:my|the|our|his|her|their)\s+)?[^\W\d_]+(?:[\s'-]+[^\W\d_]+)?\s+(?:was|were)\b"
)
_WORDS = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")
# words of a superseded clause that name no value: they never take a span away (``given_up``)
_PLAIN_WORDS = frozenset({
    "a", "an", "the", "my", "your", "his", "her", "our", "their", "its", "it", "it's", "this", "that", "that's", "these",
    "those", "i", "i'm", "i've", "i'd", "me", "we", "we're", "you", "he", "she", "they", "is", "are", "was", "were",
    "be", "been", "being", "am", "do", "does", "did", "have", "has", "had", "not", "no", "in", "on", "at", "of", "to",
    "for", "from", "with", "by", "as", "about", "into", "over", "after", "before", "and", "or", "but", "so", "if",
    "then", "than", "any", "anymore", "more", "longer", "used", "use", "take", "back", "scratch", "old", "info", "news",
    "outdated", "thing", "things", "stuff", "really", "actually", "technically", "exactly", "just", "well", "even",
    "still", "very", "quite", "all", "anything", "something", "nothing", "one", "now", "there", "here", "what",
    "which", "who", "too", "also", "much", "many", "some", "anyway", "though", "totally", "sure", "true", "right",
    "correct", "kind", "sort", "bit", "lot", "way", "time", "day", "days", "today", "year", "years", "week", "weeks",
    "since", "ago", "yet", "ever", "never", "always", "like", "get", "got", "going", "go", "went", "say", "says",
    "said", "tell", "will", "would", "could", "should", "can", "let", "let's", "please", "ok", "okay", "yes", "yeah",
    "fine", "honest", "honestly", "oh", "hmm", "wait", "fan", "big", "huge", "person", "people", "only", "mine", "left",
    "quit", "stopped", "gave", "up", "ended", "wrong", "lied", "lie", "correction", "update", "sorry", "mistake", "meant",
    "lol", "lmao", "haha", "hahaha", "omg", "ugh", "ah", "uh", "um", "hm", "xd", "jk",
    "mean", "gone", "off", "rehomed", "homed", "re", "away", "passed", "died", "pause", "hold", "boring", "retired", "sold",
})  # fmt: skip


def _collapsed(word: str) -> str:
    """A word with each run of one letter written once ("hiii": "hi", "hello": "helo")."""
    return re.sub(r"(.)\1+", r"\1", word)


# words that greet, exclaim or address and say nothing of the user, compared with each run of one letter written once
# (``_collapsed``: "hiii", "holaaa"): a clause naming nothing else ("Servus.", "Well hello there.", "Good afternoon.",
# "Assalomu alaykum!") is never imprinted (``greetings``)
_GREETING_WORDS = frozenset(_collapsed(w) for w in (
    "hi", "hey", "hello", "hiya", "heya", "howdy", "yo", "sup", "wassup", "whatsup", "greetings", "welcome", "good",
    "morning", "afternoon", "evening", "night", "gday", "g'day", "mornin", "evenin", "hola", "ola", "olá", "oi", "servus",
    "ciao", "salut", "bonjour", "bonsoir", "coucou", "hallo", "moin", "gruezi", "grüezi", "grüß", "gott", "hej", "hei",
    "hoi", "tere", "sveiki", "labas", "ahoj", "čau", "czesc", "cześć", "dobry", "dobrý", "den", "dzien", "dzień", "zdravo",
    "bok", "szia", "privet", "zdravstvuyte", "salve", "namaste", "namaskar", "namaskaram", "vanakkam", "salam", "salaam",
    "asalam", "assalamu", "asalamu", "assalomu", "alaikum", "alaykum", "aleikum", "shalom", "marhaba", "merhaba", "selam",
    "selamat", "pagi", "siang", "malam", "jambo", "habari", "hujambo", "mambo", "sawubona", "dumela", "molo", "howzit",
    "sannu", "bawo", "kedu", "ndewo", "akwaaba", "kia", "ora", "aloha", "talofa", "bula", "mabuhay", "kumusta",
    "sawasdee", "sawadee", "xin", "chao", "chào", "konnichiwa", "konbanwa", "ohayo", "annyeong", "nihao", "ni", "hao",
    "shwmae", "dia", "duit", "kaixo", "buenas", "buenos", "dias", "días", "tardes", "noches", "tudo", "bem", "goeiedag",
    "goedemorgen", "mingalaba", "mingalabar", "there", "everyone", "everybody", "folks", "friend",
    "friends", "guys", "yall", "y'all", "again", "nice", "meet", "pleasure", "great", "thanks", "thank", "cheers", "ahoy",
    "eish", "phew", "whew", "wow", "yay", "alright", "alrighty", "anyway", "anyways", "right", "hmm", "huh", "yikes", "aww",
))  # fmt: skip


def greetings(pieces: Sequence[str], breaks: Tensor | None = None) -> Tensor:
    """(n,) bool for a message's token texts: True on every token of a clause (cut at ``breaks``, by default
    ``clause_breaks``) that names nothing but greetings, exclamations and the one addressed ("Servus.", "hiii 🌸",
    "Good afternoon.", "Well hello there.", "Assalomu alaykum!"): it says nothing of the user and is never imprinted,
    where its surprise would keep it over what they said of themself. A clause that names anything else ("hiii
    aigerim here", "Hello, I'm Ana"), speaks of its writer or signs with "here" is not one: a name can be a greeting's
    word too ("I'm Kia.", "Dia here")."""
    out = torch.zeros(len(pieces), dtype=torch.bool)
    for a, b in _clauses(clause_breaks(pieces) if breaks is None else breaks):
        text = _plain(pieces[a:b])
        words = _WORDS.findall(text)
        if _FIRST_PERSON.search(text) or "here" in words:
            continue
        named = [w for w in words if w not in _PLAIN_WORDS]
        if named and all(_collapsed(w) in _GREETING_WORDS for w in named):
            out[a:b] = True
    return out


# a clause that gives someone else's name: "his name is Bubbles", "she's called Luna", "my dog's name is Rex", "a
# labrador named Skipper", "I named him Hadrian" ("Aroha's the name" and "I'm named after my gran" give the writer's)
_OTHERS_NAME = re.compile(
    r"\b(?:his|her|their|its)\s+(?:\w+\s+)?name\b"
    r"|\b(?!my\b)[^\W\d_]+'s\s+(?!the\b|my\b)(?:\w+\s+)?name\b"
    r"|\b(?:named|called)\b(?!\s+(?:me|myself)\b)"
)
_GIVING_A_NAME = frozenset({"name", "names", "name's", "call", "calls"})
_SELF_NAMED = re.compile(r"\b(?:i'm|im|i\s+am|i\s+was|i've\s+been|i\s+get|i\s+got)\s+(?:\w+\s+)?$")


def own_name_only(clause: str) -> bool:
    """Whether a clause (its text as written) gives the writer's name and says nothing more than greetings and the
    words that give it ("Hi, I'm Sam", "hey there, Lerato here", "my name is Ana Kowalski"; not "I'm Grace and I'm a
    midwife", which says more; a capitalised word counts as the name's, "Ewa Nowak here"): such a clause states a name,
    where the tagger does not know the word ("Sam", "Grace")."""
    names = user_names(clause)
    if not names:
        return False
    said = {w.lower() for w in _WORDS.findall(" ".join(names))} | {w.lower() for w in _WORDS.findall(clause) if w[0].isupper()}
    return all(
        w in said or w in _PLAIN_WORDS or _collapsed(w) in _GREETING_WORDS or w in _GIVING_A_NAME
        for w in _WORDS.findall(_plain([clause]))
    )


def others_names(pieces: Sequence[str], breaks: Tensor | None = None) -> Tensor:
    """(n,) bool for a message's token texts: True on every token of a clause (cut at ``breaks``, by default
    ``clause_breaks``) that gives someone else's name ("I keep a goldfish, his name is Bubbles", "a labrador named
    Skipper", "my son's name is Tamati"): a span of it is never the user's name, whatever the kind tagger says, and
    so never replaces the one they gave ("named" or "called" after "I'm" or "I was" is the writer's: "I'm called
    Ana", "I was named after my gran"; "named me" too)."""
    out = torch.zeros(len(pieces), dtype=torch.bool)
    for a, b in _clauses(clause_breaks(pieces) if breaks is None else breaks):
        text = _plain(pieces[a:b])
        if any(
            not m.group().endswith(("named", "called")) or not _SELF_NAMED.search(text[: m.start()])
            for m in _OTHERS_NAME.finditer(text)
        ):
            out[a:b] = True
    return out


def superseded(pieces: Sequence[str], breaks: Tensor | None = None, denied: Collection[str] = ()) -> Tensor:
    """(n,) bool for a message's token texts: True on every token of a clause (cut at ``breaks``, by default
    ``clause_breaks``) that says what is no longer so ("i'm not in cusco anymore", "bouldering used to be my thing"),
    or that denies one of the words ``denied`` (its ``given_up`` word: "technically not Lyon" where an earlier turn's
    span named Lyon, ``forget_words``); in a message that corrects, also a clause opening with what something was
    ("ochre was the old me", "wait, my shop was in Bo") and one that names nothing but words of ``denied`` ("I said
    Vela Luka"); and a clause that the next one takes back ("fave colour's yellow. nah scratch that, it's teal"). Such a
    clause is never imprinted: the older value it names would compete with the newer one. (A denial of something the
    user never said, "when I'm not chasing poachers off I go fly fishing", is imprinted as any clause.)"""
    out = torch.zeros(len(pieces), dtype=torch.bool)
    updates = corrects(pieces)
    correcting = bool(denied) and updates
    clauses = _clauses(clause_breaks(pieces) if breaks is None else breaks)
    texts = [_plain(pieces[a:b]) for a, b in clauses]
    for i, ((a, b), text) in enumerate(zip(clauses, texts, strict=True)):
        names = _names(text)
        if (
            _no_longer(_mended(text))
            or (denied and _denial_word(text, correcting) in denied)
            or (correcting and names and all(w in denied for w in names))
            or (updates and _WAS_THEN.search(text))
        ):
            out[a:b] = True
        over = _OVER_BEFORE.match(text)
        if over is not None and not _names(text[over.end() :]):  # "but that was last year": nothing else said
            out[a:b] = True
        if _RETRACTING.match(text) or over is not None:  # the nearest clause before it with a word ("KPMG... wait no")
            back = next((j for j in reversed(range(i)) if _WORDS.search(texts[j])), None)
            if back is not None:
                out[clauses[back][0] : clauses[back][1]] = True
    return out


def says_now(pieces: Sequence[str], breaks: Tensor | None = None) -> Tensor:
    """(n,) bool for a message's token texts: True on every token of a clause (cut at ``breaks``, by default
    ``clause_breaks``) that says what is so now ("I'm a producer now", "these days it's bouldering", "since March I
    rent in Braga"), unless it also says what is no longer so (``superseded`` leaves such a clause out)."""
    out = torch.zeros(len(pieces), dtype=torch.bool)
    for a, b in _clauses(clause_breaks(pieces) if breaks is None else breaks):
        text = _mended(_plain(pieces[a:b]))
        if _NOW.search(text) and not _no_longer(text):
            out[a:b] = True
    return out


def _no_longer(clause: str) -> bool:
    """Whether a clause (plain text) says what is no longer so (``_SUPERSEDED``) or dismisses what it names
    (``_DISMISSING``)."""
    return _SUPERSEDED.search(clause) is not None or _DISMISSING.match(clause) is not None


def _mended(clause: str) -> str:
    """A clause (plain text) without the words that take back the clause before it, where it says something in its
    place ("Scratch that, my cat is called Felix" says "my cat is called Felix", which is not what is over); a clause
    that only takes back ("nah scratch that,") as it is."""
    taking_back = _RETRACTING.match(clause)
    rest = "" if taking_back is None else clause[taking_back.end() :]
    return rest if _names(rest) else clause


def _names(clause: str) -> list[str]:
    """The words of a clause (plain text) that name something."""
    return [w for w in _WORDS.findall(clause) if w not in _PLAIN_WORDS]


def _denial_word(clause: str, correcting: bool) -> str | None:
    """The first word that names something after a clause's denial (its "not"; in a message that corrects, an opening
    "was" or one after a colon), or None."""
    denial = _DENIAL.search(clause) or (_WAS.search(clause) if correcting else None)
    if denial is None:
        return None
    return next((w for w in _WORDS.findall(clause[denial.end() :]) if w not in _PLAIN_WORDS), None)


# in a message that corrects, a clause naming at most this many things, all of which the user said before, speaks of
# what it corrects
_RESTATED = 3
# unless it says the thing is still so ("Moved to York, still a nurse")
_STILL = re.compile(r"\b(?:still|same|as before|as ever)\b")


def given_up(pieces: Sequence[str]) -> list[tuple[str, ...]]:
    """The words (lower case) a message's token texts may give up, in groups that count only as a whole: of each
    clause that denies, the first word after its "not" that names something ("not Lyon", "NOT a chinchilla": (lyon,),
    (chinchilla,); in a message that corrects, after an opening "was": "Correction: was an actuary": (actuary,)); of
    each clause saying what is no longer so, every word that names something ("roller derby used to be my thing":
    (roller,), (derby,)); in a message that corrects, of a clause opening with what something was, each word naming
    that thing ("ochre was the old me": (ochre,)), and of another clause that names at most ``_RESTATED`` things, those
    words together ("I said Vela Luka": (vela, luka)), given up only where the user said all of them before.
    ``forget_words`` takes the groups an earlier turn imprinted out of the imprint."""
    groups: list[tuple[str, ...]] = []
    correcting = corrects(pieces)
    for a, b in _clauses(clause_breaks(pieces)):
        text = _mended(_plain(pieces[a:b]))
        denied = _denial_word(text, correcting)
        if denied is not None:
            groups.append((denied,))
        elif _no_longer(text):
            dismissing = _DISMISSING.match(text)  # "forget the trumpet": what it dismisses, not "forget"
            groups += [(w,) for w in _names(text if dismissing is None else text[dismissing.end() :])]
        elif correcting and (said := _WAS_THEN.search(text)):
            groups += [(w,) for w in _names(said.group())]
        elif correcting and 0 < len(names := _names(text)) <= _RESTATED and not _STILL.search(text):
            groups.append(tuple(dict.fromkeys(names)))
    return list(dict.fromkeys(groups))


def forget_words(
    imprint: Imprint, groups: Sequence[Sequence[str]], decode: Callable[[list[int]], str], turn: int
) -> tuple[Imprint, list[str]]:
    """``imprint`` without the spans that turns before ``turn`` imprinted whose text (``decode`` of their token ids)
    holds a word of a group of ``groups`` (``given_up``: what a message gives up) of which every word is held so by
    such a span (as a word, an s after it allowed: "cats" for "cat"), but for the words before it of a span whose fact
    is not a place (``_cut_before``: "a sound engineer in Prague" keeps "a sound engineer"), or else a place said after
    it (``_cut_after``: "an electrician in Gdańsk" keeps "in Gdańsk"); and the words found (what the
    message denies of what the user said: ``superseded``). A span kept without its text stays: in privacy mode nothing
    is matched."""
    if not groups:  # most messages give nothing up: no span is unpacked or decoded
        return imprint, []
    words = {w for g in groups for w in g}
    patterns = {w: re.compile(r"(?<!\w)" + re.escape(w) + r"s?(?!\w)") for w in words}
    spans = _unpack(imprint)
    # per span, its text as the words are matched (only the earlier turns' spans with their text) and the words it holds
    texts = [_plain([decode(s.token.tolist())]) if s.turn < turn and s.token is not None else "" for s in spans]
    held = [{w for w, p in patterns.items() if text and p.search(text)} for text in texts]
    anywhere = set().union(*held)
    found = list(dict.fromkeys(w for g in groups if all(x in anywhere for x in g) for w in g))
    gone = set(found)
    kept: list[_Held] = []
    for s, h, text in zip(spans, held, texts, strict=True):
        if not h & gone:
            kept.append(s)
            continue
        matches = [m for w in h & gone if (m := patterns[w].search(text)) is not None]
        first, last = min(m.start() for m in matches), max(m.end() for m in matches)
        cut = _cut_before(s, text[:first], decode) or _cut_after(s, text, last, decode)
        if cut is not None:
            kept.append(cut)
    changed = len(kept) != len(spans) or any(a is not b for a, b in zip(kept, spans, strict=True))
    return (_pack(imprint, kept) if changed else imprint), found


# what a word is said after ("a nurse in Lisbon", "a vet with a cat"): a span cut before the word is cut before these
_BESIDE = r"(?:in|from|near|at|to|with|and|of|on|for|the|a|an|my|our|outside|around)"
_LEADING = re.compile(r"(?:(?<![^\W\d_])" + _BESIDE + r"\W*)*$")
# what a place is said after, opening what follows a word ("an electrician in Gdańsk": "in Gdańsk" is said beside it)
_PLACE_WORD = r"(?:in|from|near|outside|around)(?![^\W\d_])"
_PLACE_FOLLOWING = re.compile(r"\W*" + _PLACE_WORD)
_PLACE_SAID = re.compile(r"(?<![^\W\d_])" + _PLACE_WORD)
_PLACE_KINDS = frozenset(KINDS.index(k) for k in ("city", "origin"))


def _cut_before(span: _Held, head: str, decode: Callable[[list[int]], str]) -> _Held | None:
    """``span`` (its text kept) with only its words before the one that follows ``head`` (its text up to that word, as
    ``forget_words`` matches it: lower case, plain apostrophes), less the words that word is said after ("a sound
    engineer in Prague" cut at "Prague" keeps "a sound engineer"), where the span is not labelled a place (city,
    origin: the word cut was said beside its fact) and the rest still names something in two tokens or more; else None.
    An unlabelled span, as most clauses of a job are, keeps its rest where that names two things or more ("i restore
    old textiles for a museum in cusco" keeps "i restore old textiles for a museum"; "we stay in Prague" goes whole).
    The rest keeps its kind."""
    assert span.token is not None
    if span.kind in _PLACE_KINDS:
        return None
    match = _LEADING.search(head)
    end = len(head) if match is None else match.start()
    if len(_names(head[:end])) < (1 if span.kind else 2):
        return None
    n = _fitting(span.token.tolist(), end, decode)
    if n < 2:
        return None
    return _entries(span, slice(0, n))


def _cut_after(span: _Held, text: str, end: int, decode: Callable[[list[int]], str]) -> _Held | None:
    """``span`` (its text kept) with only its words after the one that ends at ``end`` of its ``text`` (as
    ``forget_words`` matches it), where the rest is a place said beside that word ("an electrician in Gdańsk" cut at
    "electrician" keeps "in Gdańsk"): it opens with "in", "from", "near", "outside" or "around" and names
    something in two tokens or more; else None. The rest keeps the span's kind where that is a place (city, origin),
    and is labelled with no kind otherwise (its words are not what the span was labelled for)."""
    assert span.token is not None
    rest = text[end:]
    if not _PLACE_FOLLOWING.match(rest) or not _names(rest):
        return None
    ids = span.token.tolist()
    n = next((j for j in range(1, len(ids) + 1) if len(decode(ids[:j])) >= end), len(ids))
    if len(ids) - n < 2:
        return None
    return _entries(span, slice(n, len(ids)), kind=span.kind if span.kind in _PLACE_KINDS else 0)


def _says_a_place(text: str) -> bool:
    """Whether a span's text says a place ("in", "from", "near", "outside" or "around" before something named)."""
    plain = _plain([text])
    return any(_names(plain[m.end() :]) for m in _PLACE_SAID.finditer(plain))


def _place_said(span: _Held, decode: Callable[[list[int]], str]) -> _Held | None:
    """The place a span (its text kept) says beside its fact: its words from the first "in", "from", "near", "outside"
    or "around" that something named follows, with no kind ("I'm a bus mechanic in Kumasi": " in Kumasi."), where
    that is two tokens or more and not the whole span; else None."""
    if span.token is None:
        return None
    ids = span.token.tolist()
    text = _plain([decode(ids)])
    at = next((m.start() for m in _PLACE_SAID.finditer(text) if _names(text[m.end() :])), None)
    if at is None:
        return None
    n = _fitting(ids, at, decode)
    if n == 0 or len(ids) - n < 2:
        return None
    return _entries(span, slice(n, len(ids)), kind=0)


def _fitting(ids: list[int], chars: int, decode: Callable[[list[int]], str]) -> int:
    """How many of the tokens ``ids``, from the first, fit decoded within ``chars`` characters (fewer than all)."""
    return max(j for j in range(len(ids)) if len(decode(ids[:j])) <= chars)


def _entries(span: _Held, cut: slice, *, kind: int | None = None) -> _Held:
    """``span``'s entries ``cut`` (a run of them: their keys, values and tokens as they are, their offsets with them),
    labelled ``kind`` where given."""
    assert span.token is not None and cut.start is not None
    return replace(
        span,
        keys=span.keys[:, :, cut],
        key_scale=span.key_scale[:, :, cut],
        values=span.values[:, :, cut],
        value_scale=span.value_scale[:, :, cut],
        token=span.token[cut],
        offset=span.offset + cut.start,
        kind=span.kind if kind is None else kind,
    )


# words that correct softly or say only what is over ("oops, English", "I actually love it", "no longer"): they make a
# message correcting (``corrects``) but point at no clause carrying a correction (``mends``)
_SOFT = frozenset({
    "oops", "silly me", "my bad", "actually", "after all", "turns out", "hold on", "instead", "rather than", "anymore",
    "any more", "no longer", "outdated", "old info", "old news",
})  # fmt: skip


def mends(
    pieces: Sequence[str], breaks: Tensor | None = None, left_out: Tensor | None = None, sure: Tensor | None = None
) -> Tensor:
    """(n,) bool for a message's token texts: True on every token of a clause (cut at ``breaks``, by default
    ``clause_breaks``) that carries a correction. In a message that corrects (``corrects``), for each clause holding
    words that correct (not softly nor only saying what is over, ``_SOFT``: "oops", "actually", "anymore"): that clause
    where it names something after those words ("wait no, I switched to EY", "update: I just accepted the offer from
    UST"), else the next clause of its sentence that names something ("ah no sorry, 21 May", "Oh, scratch Usedom, my
    wife just told me she rebooked for Rügen") or, where its sentence names nothing more, of the next sentence ("take
    back the turquoise thing. since I repainted my kitchen burnt orange..."). Never a clause holding a token of
    ``left_out`` (questions, what is no longer so); none where that clause's label is not sure and the clause right
    after it in its sentence has a sure one (``sure`` (n,) bool: "no wait, I just looked around my room and literally
    everything is cobalt blue": the labelled clause carries the correction and already replaces). A newer value often
    surprises the identity little (it was just told the older one), yet it is what the user wants kept:
    ``select_spans`` chooses such a clause first."""
    out = torch.zeros(len(pieces), dtype=torch.bool)
    if not corrects(pieces):
        return out
    clauses = _clauses(clause_breaks(pieces) if breaks is None else breaks)
    texts = [_plain(pieces[a:b]) for a, b in clauses]
    skip = [left_out is not None and bool(left_out[a:b].any()) for a, b in clauses]
    labelled = [sure is not None and bool(sure[a:b].any()) for a, b in clauses]
    # the clause ends its sentence: its last token ends one, as ``clause_breaks`` reads it (a line break included)
    ends = [any(ch in _SENTENCE_ENDS for ch in pieces[b - 1]) for _, b in clauses]
    for i, text in enumerate(texts):
        marker = next((m for m in _CORRECTING.finditer(text) if m.group() not in _SOFT), None)
        if marker is None:
            continue
        at = None
        if not skip[i] and _names(text[marker.end() :]):
            at = i
        else:  # the next clause naming something, in its sentence or, where that names nothing more, the next one
            crossed = 0
            for j in range(i + 1, len(clauses)):
                crossed += ends[j - 1]
                if crossed > 1:
                    break
                if not skip[j] and _names(texts[j]):
                    at = j
                    break
        if at is None or (not labelled[at] and at + 1 < len(clauses) and not ends[at] and labelled[at + 1]):
            continue
        out[clauses[at][0] : clauses[at][1]] = True
    return out


def corrects(pieces: Sequence[str]) -> bool:
    """Whether a message corrects or updates what the user said before ("Correction: ...", "we moved to ...",
    "wait, ..."): its labelled clauses then replace the older spans of their kind (``message_spans``)."""
    return _CORRECTING.search(_plain(pieces)) is not None


def _peak_window(surprisal: Tensor, start: int, end: int, width: int) -> tuple[int, int]:
    """The ``width`` tokens of [start, end) around the clause's most surprising token, reaching back first: a fact's
    cue ("my name is", "I live in") comes before the word that surprises."""
    if end - start <= width:
        return start, end
    peak = start + int(surprisal[start:end].argmax())
    first = max(start, min(peak - (width * 2) // 3, end - width))
    return first, first + width


def select_spans(
    surprisal: Tensor,
    breaks: Tensor,
    *,
    budget: int,
    max_span: int,
    min_score: float,
    kinds: Tensor | None = None,
    min_kind: float = 0.5,
    min_label: float | None = None,
    questions: Tensor | None = None,
    current: Tensor | None = None,
    mending: Tensor | None = None,
    mend_bonus: float = 0.0,
    beside: Tensor | None = None,
) -> list[SpanChoice]:
    """The spans of one message worth imprinting: the message cut into clauses at ``breaks``, each scored by its
    most surprising token (token shock, nats) and, with ``kinds``, labelled with the kind its tokens state on
    average when that reaches ``min_label`` (``min_kind`` when None); the clauses whose label reaches ``min_kind`` first
    (they also replace older spans of their kind: ``SpanChoice.replaces``), then the others scoring at least
    ``min_score``, best first (longer ones trimmed to ``max_span`` tokens around their peak) while they fit in
    ``budget`` tokens; returned in message order.

    surprisal (n,) each token's NLL under the identity; breaks (n,) bool, the token ends a clause (``clause_breaks``);
    kinds (n, len(KINDS)) each token's probabilities of stating each kind (the model's kind tagger), or None;
    questions (n,) bool, the token is part of a question (``asking``): a clause holding one is never imprinted;
    current (n,) bool, the token is part of a clause that says what is so now (``says_now``): its label is sure from
    ``min_label``; mending (n,) bool, the token is part of a clause that carries a correction (``mends``): it is chosen
    first, whatever its shock, and its score is raised by ``mend_bonus`` nats, so that it outlasts chatter; beside (n,)
    bool, the token opens a clause said beside the one before it (a place: ``_breaks``), which scores at least as that
    clause's most surprising token does ("in Klaipeda" after "I operate one of the big container cranes at the port")."""
    n = surprisal.shape[0]
    if breaks.shape != (n,):
        raise ValueError(f"breaks must be ({n},) like the surprisal; got {tuple(breaks.shape)}")
    for name, mask in (("questions", questions), ("current", current), ("mending", mending), ("beside", beside)):
        if mask is not None and mask.shape != (n,):
            raise ValueError(f"{name} must be ({n},) like the surprisal; got {tuple(mask.shape)}")
    if kinds is not None and kinds.shape != (n, len(KINDS)):
        raise ValueError(f"kinds must be ({n}, {len(KINDS)}); got {tuple(kinds.shape)}")
    if budget < 0 or max_span < 1:
        raise ValueError(f"need budget >= 0 and max_span >= 1; got {budget}, {max_span}")
    if not bool(torch.isfinite(surprisal).all()):
        raise ValueError("surprisal must be finite")
    clauses = _clauses(breaks)
    peaks = {b: float(surprisal[a:b].max()) for a, b in clauses}  # each clause's most surprising token, by its end
    scored = []
    if questions is not None:
        clauses = [(a, b) for a, b in clauses if not bool(questions[a:b].any())]
    label = min_kind if min_label is None else min_label
    for a, b in clauses:
        start = a
        kind, sure = _label(kinds, a, b, label, min_kind, current)
        mended = mending is not None and bool(mending[a:b].any())
        a, b = _peak_window(surprisal, a, b, max_span)
        score = float(surprisal[a:b].max()) + (mend_bonus if mended else 0.0)
        if beside is not None and bool(beside[start]):
            score = max(score, peaks.get(start, score))
        scored.append((sure, mended, score, a, b, kind))
    chosen, room = [], budget
    for known, mended, score, a, b, kind in sorted(scored, key=lambda c: (c[0] or c[1], c[2], c[3]), reverse=True):
        if (not (known or mended) and score < min_score) or b - a > room:
            continue
        chosen.append(SpanChoice(a, b, score, kind, known))
        room -= b - a
    return sorted(chosen, key=lambda c: c.start)


def _label(kinds: Tensor | None, a: int, b: int, label: float, sure: float, current: Tensor | None) -> tuple[int, bool]:
    """The kind a clause [a, b) states (an index into KINDS: where its tokens' mean probability reaches ``label``, else 0)
    and whether that label is sure (it reaches ``sure``, or ``label`` in a clause that says what is so now, ``current``)."""
    if kinds is None:
        return 0, False
    mean = kinds[a:b, 1:].float().mean(0)  # (len(KINDS) - 1,)
    top = float(mean.max())
    kind = int(mean.argmax()) + 1 if top >= label else 0
    return kind, kind > 0 and top >= (label if current is not None and bool(current[a:b].any()) else sure)


def message_spans(
    surprisal: Tensor,
    pieces: Sequence[str],
    kinds: Tensor | None,
    *,
    budget: int,
    max_span: int,
    min_score: float,
    min_label: float | None = None,
    denied: Collection[str] = (),
    aside_weight: float = 1.0,
    mend_bonus: float = 0.0,
) -> list[SpanChoice]:
    """``select_spans`` for a message's token texts ``pieces``: cut into clauses (``clause_breaks``), its questions
    and requests left out (``asking``) and the clauses saying what is no longer so or denying one of the words
    ``denied`` (``superseded``); in a message that corrects what the user said before (``corrects``), every labelled
    clause is sure: it goes first and replaces the older spans of its kind, and so is a labelled clause that says what
    is so now (``says_now``: "I'm a producer now"); with ``mend_bonus`` above 0, the clause that carries each correction
    (``mends``) is chosen first and scores that many nats more. A span chosen in an aside (``asides``) has
    its score multiplied by ``aside_weight`` and a label that is not sure is dropped (chosen as before; ranked lower against
    other messages' spans when the imprint is full)."""
    breaks, placed = _breaks(pieces)
    questions = asking(pieces)
    left_out = questions | superseded(pieces, breaks, denied) | greetings(pieces, breaks)
    label = 0.5 if min_label is None else min_label
    min_kind = min(label, 0.5) if corrects(pieces) else 0.5
    current = says_now(pieces, breaks)
    mending = None
    if mend_bonus > 0:
        sure = torch.zeros(len(pieces), dtype=torch.bool)
        for a, b in _clauses(breaks):
            sure[a:b] = _label(kinds, a, b, label, min_kind, current)[1]
        mending = mends(pieces, breaks, left_out, sure)
    choices = select_spans(
        surprisal,
        breaks,
        budget=budget,
        max_span=max_span,
        min_score=min_score,
        kinds=kinds,
        min_kind=min_kind,
        min_label=min_label,
        questions=left_out,
        current=current,
        mending=mending,
        mend_bonus=mend_bonus,
        beside=placed,
    )
    if choices:  # someone else's name is no span of the user's; a clause that only gives theirs is one
        others = others_names(pieces, breaks)
        choices = [
            replace(c, kind=0, replaces=False)
            if c.kind == _NAME and bool(others[c.start])
            else replace(c, kind=_NAME, replaces=True)
            if c.kind == 0 and not bool(others[c.start]) and own_name_only("".join(pieces[c.start : c.end]))
            else c
            for c in choices
        ]
    if aside_weight == 1.0 or not choices:
        return choices
    beside = asides(pieces, questions)
    # an aside's span keeps a kind only where its label is sure: a weak label ("the windows are rattling": a city)
    # would rank its chatter above the user's own words
    return [
        replace(c, score=c.score * aside_weight, kind=c.kind if c.replaces else 0) if bool(beside[c.start]) else c
        for c in choices
    ]


@dataclass(frozen=True)
class _Held:
    """One span's entries while an imprint is rebuilt."""

    keys: Tensor  # (n_layer, H_kv, n, d) int8, or d / 2 uint8 in 4 bits
    key_scale: Tensor  # (n_layer, H_kv, n) float16
    values: Tensor
    value_scale: Tensor
    token: Tensor | None  # (n,) int32, or None where no text is kept
    turn: int
    offset: int
    kind: int
    score: float

    @property
    def length(self) -> int:
        return int(self.keys.shape[2])


def imprint_spans(
    imprint: Imprint,
    keys: Tensor,
    values: Tensor,
    choices: list[SpanChoice],
    *,
    turn: int,
    tokens: Tensor | None,
    decode: Callable[[list[int]], str] | None = None,
) -> Imprint:
    """``imprint`` with the chosen spans of one message added: keys and values (n_layer, H_kv, n, d), pre-rotation,
    of the message's n tokens; ``tokens`` (n,) their ids, or None to keep no text.

    A span of a known kind first replaces the spans of its kind that earlier turns imprinted; with ``decode`` (the
    tokenizer's), a replaced span of a kind that is not a place keeps the place it says beside its fact where the new
    span names none (``_place_said``: "I'm a bus mechanic in Kumasi", then "I teach at the college now": " in Kumasi."
    stays). Then, while the new span does not fit, the weakest span goes (a span of unknown kind before any known one,
    then the lowest score), as long as it is weaker than the new one; where the spans weaker than the new one do not
    make room for it, none goes and the new span is dropped."""
    n = keys.shape[2]
    if values.shape != keys.shape or keys.shape[:2] != imprint.keys.shape[:2] or keys.shape[3] != imprint.width:
        raise ValueError(f"keys and values must be (n_layer, H_kv, n, d) for this imprint; got {tuple(keys.shape)}")
    if tokens is not None and tokens.shape != (n,):
        raise ValueError(f"tokens must be ({n},); got {tuple(tokens.shape)}")
    spans = _unpack(imprint)
    for choice in choices:
        if not 0 <= choice.start < choice.end <= n:
            raise ValueError(f"span [{choice.start}, {choice.end}) is outside the message's {n} tokens")
        length = choice.end - choice.start
        if length > imprint.capacity:
            continue
        # a sure restatement replaces what earlier turns said of its kind, not its own message's other spans
        if choice.kind and choice.replaces:
            # where the new span is of a fact that is no place and says no place, a replaced span keeps the place it says
            keeps_place = (
                decode is not None
                and tokens is not None
                and choice.kind not in _PLACE_KINDS
                and not _says_a_place(decode(tokens[choice.start : choice.end].tolist()))
            )
            place = decode if keeps_place else None
            rest = [s if s.kind != choice.kind or s.turn == turn else _place_said(s, place) if place else None for s in spans]
            spans = [s for s in rest if s is not None]
        strength = _strength(choice.kind, choice.score)
        kept = list(spans)  # the weakest go while the new span does not fit, only if all of them are weaker than it
        while sum(s.length for s in kept) + length > imprint.capacity:
            weakest = _weakest(kept)
            if _strength(kept[weakest].kind, kept[weakest].score) >= strength:
                break
            kept.pop(weakest)
        if sum(s.length for s in kept) + length > imprint.capacity:
            continue
        spans = kept
        at = slice(choice.start, choice.end)
        k, ks = quantise(keys[:, :, at], imprint.bits)
        v, vs = quantise(values[:, :, at], imprint.bits)
        ids = None if tokens is None else tokens[at].to(torch.int32)
        spans.append(_Held(k, ks, v, vs, ids, turn, choice.start, choice.kind, choice.score))
    return _pack(imprint, spans)


# when the imprint is full a span of known kind counts this many nats more than its score: far more than a token's shock
# (the natural set's clauses score about 2 to 20 nats), so a span of unknown kind goes before any known one, unless it carries a
# correction (``mends``) and its score was raised by as much (``imprint_mend_bonus``)
KNOWN_NATS = 64.0


def _strength(kind: int, score: float) -> float:
    """How strongly a span holds its place when the imprint is full: its score, plus ``KNOWN_NATS`` for a known kind."""
    return score + (KNOWN_NATS if kind > 0 else 0.0)


def _weakest(spans: list[_Held]) -> int:
    """The span to drop first: the least ``_strength`` (one of unknown kind before any known one, then the lowest
    score)."""
    return min(range(len(spans)), key=lambda i: _strength(spans[i].kind, spans[i].score))


def forget_span(imprint: Imprint, index: int) -> Imprint:
    """``imprint`` without span ``index`` (ImprintSpan.index); the spans after it move up. ValueError if absent."""
    spans = _unpack(imprint)
    if not 0 <= index < len(spans):
        raise ValueError(f"the imprint has {len(spans)} spans (0 to {len(spans) - 1}); there is no span {index}")
    del spans[index]
    return _pack(imprint, spans)


def fitted(imprint: Imprint, config: AnyConfig) -> Imprint:
    """``imprint`` in ``config``'s layout: itself where it has the config's entries and bits (or another backbone's
    shape, which ``Imprint.validate`` then refuses); an identity stored under another imprint size or precision of
    the same backbone is checked in its own layout, then its spans are requantised to the config's bits and packed,
    in order, the weakest dropped while they do not fit (a span of unknown kind before a known one, then the lowest
    score), as a turn's write would drop them."""
    n_layer, heads, N, d = config.imprint_shape
    stored = imprint.keys
    if not N or not isinstance(config, LlamaConfig) or imprint.span.dim() != 1 or stored.dim() != 4:
        return imprint
    if tuple(stored.shape[:2]) != (n_layer, heads):
        return imprint
    if imprint.width != d or (imprint.capacity, imprint.bits) == (N, config.imprint_bits):
        return imprint
    imprint.validate(replace(config, imprint_tokens=imprint.capacity, imprint_bits=imprint.bits))
    spans = _unpack(imprint)
    while sum(s.length for s in spans) > N:
        spans.pop(_weakest(spans))
    bits = config.imprint_bits
    requantised = []
    for s in spans:
        k, ks = quantise(dequantise(s.keys, s.key_scale), bits)
        v, vs = quantise(dequantise(s.values, s.value_scale), bits)
        requantised.append(replace(s, keys=k, key_scale=ks, values=v, value_scale=vs))
    return _pack(Imprint.empty(config), requantised)


def _unpack(imprint: Imprint) -> list[_Held]:
    out = []
    for s in imprint.spans():
        at = slice(s.first, s.first + s.length)
        token = None if s.tokens is None else imprint.token[at]
        keys, key_scale = imprint.keys[:, :, at], imprint.key_scale[:, :, at]
        values, value_scale = imprint.values[:, :, at], imprint.value_scale[:, :, at]
        out.append(_Held(keys, key_scale, values, value_scale, token, s.turn, s.offset, KINDS.index(s.kind), s.score))
    return out


def _pack(like: Imprint, spans: list[_Held]) -> Imprint:
    """An imprint of ``like``'s size holding ``spans`` in order from entry 0."""
    n_layer, heads, N, _ = like.keys.shape
    fresh = Imprint.blank(n_layer, heads, N, like.width, bits=like.bits).tensors()
    at = 0
    for index, s in enumerate(spans):
        n = s.length
        sl = slice(at, at + n)
        for name in ("keys", "key_scale", "values", "value_scale"):
            fresh[name][:, :, sl] = getattr(s, name)
        fresh["span"][sl] = index
        fresh["token"][sl] = -1 if s.token is None else s.token
        fresh["turn"][sl] = s.turn
        fresh["offset"][sl] = torch.arange(n, dtype=torch.int32) + s.offset
        fresh["kind"][sl] = s.kind
        fresh["score"][sl] = s.score
        at += n
    return Imprint(**fresh)
