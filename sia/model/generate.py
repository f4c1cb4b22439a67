"""Decoding: greedy, temperature, top-k, top-p, repetition controls, stop strings, streaming, batched rows with their
own states.

Notation: B rows, L prompt length after left padding, V vocabulary.

Rows of different lengths are left-padded; a boolean mask then hides padding keys (the self slot at key 0
is always visible). Each row samples from its own torch.Generator seeded with ``seed``, so a row's output
does not depend on which other rows share its batch.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import islice
from typing import Generic, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.model.conditioning import Conditioning
from sia.model.identity_model import IdentityModel
from sia.model.kv_cache import KVCache
from sia.model.language import (
    ECHO_OPENING,
    OPEN_WORDS,
    OPENING_WORDS,
    UNTOLD,
    english,
    english_opener,
    foreign_opening,
    message_words,
    recollection_reply,
    untold_reply,
)
from sia.model.naming import (
    GREETING_SENTENCES,
    claims_self,
    completions,
    continuations,
    doings,
    gives_name,
    greeting,
    name_starts,
    names_self,
    off_own_name,
    other_names,
    own_name,
    role_starts,
    speaks_of_self,
    user_names,
    user_roles,
)
from sia.model.summary_sums import SummarySums
from sia.model.tokenizer import IncrementalDecoder, Tokenizer
from sia.model.unsaid import UnsaidWords, goes_on_a_stem, said_stems, unsaid_words, word_start, word_written

__all__ = [
    "Generation",
    "ReplyDecoder",
    "Sampling",
    "SamplingParams",
    "Stream",
    "StreamEvent",
    "check_room",
    "exclaimed",
    "exclamation_pairs",
    "forget_newest",
    "generate",
    "left_padded",
    "likeliest",
    "logit_bias_pairs",
    "lowered",
    "nucleus",
    "nucleus_reference",
    "padded_inputs",
    "penalize",
    "repeated_ngram_bans",
    "reply_events",
    "row_params",
    "sample_next",
    "sentence_closers",
    "sentences_end",
    "stream",
]


MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # tokens a logit_bias may name (OpenAI's limit)
MAX_ADDRESS = 40  # characters of a form of address
MAX_SPEAKER = 64  # characters of a persona's name
MAX_RECOLLECTION = 4096  # characters of the user's clauses a recollection quotes (an imprint's few dozen tokens' text)
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters
FIRST_WORD_RETRIES = 5  # first tokens a reply may lose to its first word (another language, the speaker's name) then it is let be
FIRST_WORD_TOKENS = 6  # tokens a reply's first word is waited for at most: then the letters so far are judged
OPENING_TOKENS = 12  # tokens a reply's opening (its first OPENING_WORDS words) is waited for at most: then its whole words
TAKEN_BACK_COLUMNS = FIRST_WORD_RETRIES * OPENING_TOKENS  # cache columns the replies taken back may take in a batch
END_PULL = 2.0  # nats a reply's end gains for each word past ``max_words`` - 1
WIND_PULL = 0.5  # nats a reply's end gains for each token into its last ``wind_down`` tokens
WIND_SHARE = 4  # the wind-down takes at most this part of a reply's token limit (a quarter: 32 of 128, 3 of 12)


# how far the first token after the echo's opening leans to the user's own words after "I" (a logit added; chosen on
# the natural set's tuning part: 4, and every echoed kind, lost more answers than they gained; experiments/LOG.md,
# 2026-12-06 (p))
ECHO_LEAN = 2.0


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 means greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0  # report this many most likely tokens (with log-probabilities) at every step
    # repetition controls over the row's own reply so far (``penalize``), applied before any of the above
    repetition_penalty: float = 1.0  # > 1 pushes down every token the reply already holds; 1 is off
    no_repeat_ngram: int = 0  # n > 0 bans a token that would repeat an n-gram of the reply; 0 is off
    # OpenAI's additive rules: a token's logit less frequency_penalty times its count in the reply so far, less
    # presence_penalty once if it is there at all (each in [-2, 2]; 0 is off)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # (token id, bias) pairs added to those tokens' logits at every step (each bias in [-100, 100]; OpenAI's logit_bias)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # each pair's bias holds only until the reply holds its token: a word the persona should say once ("sir") is
    # raised until said, then left to the model (a bias at every step makes it say the word again and again)
    logit_bias_once: bool = False
    # the persona's form, kept by the decoding itself (a small backbone does not keep it from its prompt alone)
    # the reply's text is written in lower case, character by character (``lowered``); off, a reply that opens with a
    # word in lower case has its first letter written as a capital (``capitalised``)
    lowercase: bool = False
    # n > 0 ends the reply after its n-th sentence (``sentences_end``); 0 is off. A persona's greeting of a user who
    # introduces themself ends at its second sentence at the latest (``sia.model.naming.GREETING_SENTENCES``)
    max_sentences: int = 0
    exclaim: bool = False  # a full stop after a word is written "!" until the reply holds one (``exclaimed``)
    # a form of address (", sir") written before the reply's first sentence end after a word, unless the reply already
    # says its words (``ReplyDecoder.sample``); "" is off
    address: str = ""
    # n > 0: once the reply holds n words, its end is pulled nearer at every further word (``ReplyDecoder.sample``):
    # where the model would begin a new word, a sentence's closing marks gain END_PULL nats for each word past n - 1,
    # and after a closing mark the end token does, so the reply ends at a point of the model's choosing soon after n
    # words (a soft limit: no word is cut); 0 is off
    max_words: int = 0
    # n > 0: in the last n tokens the reply may take (at most a quarter of max_new_tokens, WIND_SHARE: a short limit
    # keeps most of its tokens free), its end is pulled nearer as ``max_words`` pulls it, by WIND_PULL nats for each
    # token into them, so a reply the token limit would cut in a sentence ends at a sentence's end first, where the
    # model gives one (``ReplyDecoder.sample``); 0 is off
    wind_down: int = 0
    # a reply to a message that asks about the user, with an imprint to answer from (the conditioning's ``recalls``), is
    # decoded at min(temperature, recall_temperature): a fact is recalled as the model reads it best (0: greedy); None
    # is off
    recall_temperature: float | None = None
    # the user's message this replies to ("": none; a turn sets it, sia.identity.turn). A reply to an English message
    # keeps to English: its first word is read once whole, and where that is no common English word its opening
    # (``OPENING_WORDS`` words) once the word after it begins (``sia.model.language.foreign_opening``); where either is
    # another language's the reply is taken back and begun again without its first token, at most FIRST_WORD_RETRIES
    # times. And the reply never gives a name the user gave as their own as its speaker's ("I'm Rafael":
    # ``sia.model.naming``)
    reply_to: str = ""
    # the persona's own name ("": none; a persona's turn sets it). A reply never opens by calling its speaker by name:
    # a first word that is this name followed by a comma ("Sia, I'm glad you're here", where the small backbone echoes
    # its prompt's "You are Sia, ...") is taken back as a foreign first word is, and begun again without its first token.
    # Nor does a persona's reply write profanity or a slur the user did not (``sia.model.unsaid``)
    speaker: str = ""
    # the kind of fact the message asks about that the user never told ("": none; the conditioning sets it per row,
    # ``Conditioning.untold``): the reply is ``sia.model.language.untold_reply`` in this reply's form, then it ends
    untold: str = ""
    # the kind of fact whose recall reply says back the user's words ("": none; the conditioning sets it per row,
    # ``Conditioning.echo``): the reply opens with ``sia.model.language.ECHO_OPENING`` and the model goes on from there
    echo: str = ""
    # where the reply opens so, the tokens that go on from "I" in the user's imprinted clauses ("I build violins": "
    # build"), as the reply says them after "you" (the conditioning sets them per row, ``Conditioning.echo_words``):
    # the first token after the opening leans to them by ECHO_LEAN
    echo_words: tuple[int, ...] = ()
    # the user's own clauses, one a line, that answer a message asking what the persona knows of them ("": none; the
    # conditioning sets it per row, ``Conditioning.recollection``): the reply is
    # ``sia.model.language.recollection_reply`` in this reply's form, then it ends
    recollection: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer; got {self.max_new_tokens!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy); got {self.temperature}")
        recall = self.recall_temperature
        if recall is not None and (isinstance(recall, bool) or not isinstance(recall, int | float) or not recall >= 0.0):
            raise ValueError(f"recall_temperature must be a number >= 0 (0 is greedy) or None (off); got {recall!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1; got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")
        if not isinstance(self.address, str) or len(self.address) > MAX_ADDRESS or not self.address.isprintable():
            raise ValueError(f"address must be printable text of at most {MAX_ADDRESS} characters; got {self.address!r}")
        if self.address and not _WORD.search(self.address):
            raise ValueError(f"address must hold a word (it is written until the reply says it); got {self.address!r}")
        if not isinstance(self.reply_to, str):
            raise ValueError(f"reply_to must be the user's message (a string); got {type(self.reply_to).__name__}")
        if not isinstance(self.speaker, str) or len(self.speaker) > MAX_SPEAKER or not self.speaker.isprintable():
            raise ValueError(f"speaker must be a name of at most {MAX_SPEAKER} printable characters; got {self.speaker!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        if self.untold and self.untold not in UNTOLD:
            raise ValueError(f"untold must be one of {sorted(UNTOLD)} or empty; got {self.untold!r}")
        if self.echo and self.echo not in UNTOLD:
            raise ValueError(f"echo must be one of {sorted(UNTOLD)} or empty; got {self.echo!r}")
        words = self.echo_words
        if not isinstance(words, tuple) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in words):
            raise ValueError(f"echo_words must be a tuple of token ids; got {words!r:.80}")
        recollection = self.recollection
        if not isinstance(recollection, str) or len(recollection) > MAX_RECOLLECTION:
            raise ValueError(f"recollection must be text of at most {MAX_RECOLLECTION} characters; got {recollection!r:.80}")
        if recollection and not all(line and line.isprintable() for line in recollection.split("\n")):
            raise ValueError(f"recollection must be printable clauses, one a line; got {recollection!r:.80}")
        if not isinstance(self.top_logprobs, int) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]; got {self.top_logprobs!r}")
        penalty = self.repetition_penalty
        if isinstance(penalty, bool) or not isinstance(penalty, int | float) or not (math.isfinite(penalty) and penalty >= 1.0):
            raise ValueError(f"repetition_penalty must be a finite number >= 1 (1 is off); got {penalty!r}")
        for name in ("no_repeat_ngram", "max_sentences", "max_words", "wind_down"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0 is off); got {n!r}")
        for name in ("lowercase", "logit_bias_once", "exclaim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false; got {getattr(self, name)!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int | float) or not -2.0 <= x <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2] (0 is off); got {x!r}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens; got {len(self.logit_bias)}")
        for pair in self.logit_bias:
            token, bias = pair if isinstance(pair, tuple) and len(pair) == 2 else (None, None)
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias must map token ids (integers >= 0) to biases; got {pair!r}")
            if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100.0 <= bias <= 100.0:
                raise ValueError(f"a logit_bias must be a number in [-100, 100]; got {bias!r} for token {token}")

    @property
    def repeats_controlled(self) -> bool:
        """Whether ``penalize`` changes anything: a repetition control or a logit bias is set."""
        return (
            self.repetition_penalty != 1.0
            or self.no_repeat_ngram > 0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or bool(self.logit_bias)
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def recalling(self) -> SamplingParams:
        """These settings for a reply that recalls the user's facts: the temperature capped at ``recall_temperature``."""
        if self.recall_temperature is None or self.temperature <= self.recall_temperature:
            return self
        return replace(self, temperature=float(self.recall_temperature))


def row_params(params: Sequence[SamplingParams], cond: Conditioning) -> list[SamplingParams]:
    """Each row's decoding under ``cond``: a row that recalls (``recalls``) at its recall temperature, a row asking what
    the user never told (``untold``) answered so, a row whose reply says back the user's words (``echo``) opened so, a
    row asking what the persona knows of the user (``recollection``) answered with their clauses."""
    out = list(params)
    if cond.recalls is not None:
        out = [p.recalling() if flag else p for p, flag in zip(out, cond.recalls.tolist(), strict=True)]
    for name in ("untold", "echo", "echo_words", "recollection"):
        kinds = getattr(cond, name)
        if kinds is not None:
            out = [replace(p, **{name: kind}) if kind else p for p, kind in zip(out, kinds, strict=True)]
    return out


def logit_bias_pairs(value: object) -> tuple[tuple[int, float], ...]:
    """A logit bias as JSON writes it (token id as a decimal string -> bias; None: none) as SamplingParams takes it:
    (token id, bias) pairs. ValueError for anything else (the biases' range is SamplingParams's to check)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ValueError(f"logit_bias must be an object of token id -> bias; got {type(value).__name__}")
    pairs = []
    for key, bias in value.items():
        if not isinstance(key, str) or not key.isascii() or not key.isdecimal():
            raise ValueError(f"logit_bias keys are token ids (non-negative integers); got {key!r}")
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise ValueError(f"logit_bias values must be numbers; got {bias!r} for token {key}")
        pairs.append((int(key), float(bias)))
    return tuple(pairs)


@dataclass(frozen=True)
class Sampling:
    """Decoding choices a caller may make for one turn; None leaves the choice to the defaults (a persona's).

    The fields given are checked when it is made (ValueError), before any identity is held."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0  # report this many alternatives with every generated token
    repetition_penalty: float | None = None
    no_repeat_ngram: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] | None = None
    logit_bias_once: bool | None = None
    lowercase: bool | None = None
    max_sentences: int | None = None
    max_words: int | None = None
    wind_down: int | None = None
    exclaim: bool | None = None
    address: str | None = None
    recall_temperature: float | None = None

    def __post_init__(self) -> None:
        self.over(SamplingParams())

    def over(self, defaults: SamplingParams) -> SamplingParams:
        """These choices, ``defaults`` where none is made."""
        return SamplingParams(
            max_new_tokens=defaults.max_new_tokens if self.max_tokens is None else self.max_tokens,
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            seed=self.seed,
            stop=tuple(self.stop),
            top_logprobs=self.top_logprobs,
            repetition_penalty=defaults.repetition_penalty if self.repetition_penalty is None else self.repetition_penalty,
            no_repeat_ngram=defaults.no_repeat_ngram if self.no_repeat_ngram is None else self.no_repeat_ngram,
            frequency_penalty=defaults.frequency_penalty if self.frequency_penalty is None else self.frequency_penalty,
            presence_penalty=defaults.presence_penalty if self.presence_penalty is None else self.presence_penalty,
            logit_bias=defaults.logit_bias if self.logit_bias is None else self.logit_bias,
            logit_bias_once=defaults.logit_bias_once if self.logit_bias_once is None else self.logit_bias_once,
            lowercase=defaults.lowercase if self.lowercase is None else self.lowercase,
            max_sentences=defaults.max_sentences if self.max_sentences is None else self.max_sentences,
            max_words=defaults.max_words if self.max_words is None else self.max_words,
            wind_down=defaults.wind_down if self.wind_down is None else self.wind_down,
            exclaim=defaults.exclaim if self.exclaim is None else self.exclaim,
            address=defaults.address if self.address is None else self.address,
            recall_temperature=defaults.recall_temperature if self.recall_temperature is None else self.recall_temperature,
            speaker=defaults.speaker,
        )


@dataclass
class StreamEvent:
    """One step of one row: the sampled token and the text it makes visible (held back near stop strings)."""

    row: int
    token: int
    text: str
    logprob: float = 0.0  # log-probability of ``token`` under the model (temperature 1, before any filtering)
    top_logprobs: tuple[tuple[int, float], ...] = ()  # the params.top_logprobs most likely tokens, best first


R = TypeVar("R")


class Stream(Generic[R]):
    """A streamed computation: iterate it (once) for its StreamEvents as they come; ``result`` once they end.

    Nothing runs until the first event is asked for; ``close()`` abandons the computation (its ``finally``
    clauses run), and ``finish()`` reads the remaining events and returns the result.
    """

    def __init__(self, run: Generator[StreamEvent, None, R]) -> None:
        self._run = run
        self._done = False
        self._result: R | None = None

    def __iter__(self) -> Iterator[StreamEvent]:
        return self

    def __next__(self) -> StreamEvent:
        try:
            return next(self._run)
        except StopIteration as end:
            self._done, self._result = True, end.value
            raise

    @property
    def result(self) -> R:
        if not self._done:
            raise RuntimeError("the stream has not ended: read its events (or call finish()) first")
        return self._result  # type: ignore[return-value]

    def finish(self) -> R:
        for _ in self:
            pass
        return self.result

    def close(self) -> None:
        self._run.close()


@dataclass
class Generation:
    tokens: list[int]  # generated ids, the closing end token included when produced
    text: str  # decoded reply, cut before any stop string
    finish_reason: str  # "stop" (end token or stop string) or "length"
    prompt_nll: Tensor  # (prompt_len - 1,) NLL of each prompt token after the first, under the state (NaN: not scored)
    stats: SummarySums = field(repr=False)  # sums over counted prompt tokens and every generated token fed back


def likeliest(logits: Tensor) -> Tensor:
    """The index of the largest logit along the last dimension, the first where several tie, as ``argmax``; through
    ``max``, which a CPU computes several times faster (a (8, 1, 49 152) float32 row set: 84 against 245 µs, bfloat16 135
    against 625 µs, on a 2-core AVX-512 Xeon)."""
    return logits.max(-1).indices


def sample_next(logits: Tensor, params: SamplingParams, generator: torch.Generator | None, generated: Sequence[int] = ()) -> int:
    """Pick one token from (V,) logits: the repetition controls over ``generated`` (this row's reply so far), then
    greedy, or temperature then top-k then top-p filtering."""
    if params.repeats_controlled:
        logits = penalize(logits, generated, params)
    if params.greedy:
        return int(likeliest(logits))
    # float64, and shifted so the best logit is 0 before dividing: any positive temperature, however tiny, then
    # sends the others to -inf (a one-hot distribution) instead of overflowing to inf - inf = NaN
    logits = logits.double()
    logits = (logits - logits.max()) / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        logits = nucleus(logits, params.top_p)
    return draw(logits, generator)


def penalize(logits: Tensor, generated: Sequence[int], params: SamplingParams) -> Tensor:
    """(V,) logits with the repetition controls applied over ``generated``, the tokens this row has generated so far.

    ``repetition_penalty`` r (CTRL, Keskar et al. 2019; Hugging Face's rule): the logit z of every token present in
    ``generated`` becomes z / r if positive, z * r if not. ``no_repeat_ngram`` n: a token that would complete an
    n-gram already present in ``generated`` is banned (-inf). Only the reply counts, never the prompt: the persona's
    prompt and the user's message hold the very words an answer must use (the question's subject, its names).
    ``frequency_penalty`` and ``presence_penalty`` (OpenAI's rule): z - c·frequency_penalty - [c > 0]·presence_penalty
    for a token generated c times; ``logit_bias`` adds each pair's bias to its token's logit (a token id outside the
    vocabulary is a ValueError), with ``logit_bias_once`` only while ``generated`` does not hold that token.
    Greedy decoding applies them too; they depend on the row alone, so a batched row stays its solo self."""
    pairs = params.logit_bias
    if pairs and params.logit_bias_once and generated:
        said = set(generated)
        pairs = tuple(pair for pair in pairs if pair[0] not in said)
    if pairs:
        ids, biases = zip(*pairs, strict=True)
        if max(ids) >= logits.shape[-1]:
            raise ValueError(f"logit_bias names token {max(ids)}; the vocabulary has {logits.shape[-1]}")
        index = torch.tensor(ids, dtype=torch.long, device=logits.device)
        logits = logits.index_add(0, index, torch.tensor(biases, dtype=logits.dtype, device=logits.device))
    if (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0) and generated:
        counts = Counter(generated)
        seen = torch.tensor(list(counts), dtype=torch.long, device=logits.device)
        c = torch.tensor(list(counts.values()), dtype=logits.dtype, device=logits.device)
        logits = logits.index_add(0, seen, -(c * params.frequency_penalty + params.presence_penalty))
    if params.repetition_penalty != 1.0 and generated:
        seen = torch.tensor(sorted(set(generated)), dtype=torch.long, device=logits.device)
        z = logits[seen]
        r = params.repetition_penalty
        logits = logits.index_copy(0, seen, torch.where(z > 0, z / r, z * r))
    bans = repeated_ngram_bans(generated, params.no_repeat_ngram)
    if bans:
        logits = logits.index_fill(0, torch.tensor(bans, dtype=torch.long, device=logits.device), float("-inf"))
    return logits


def repeated_ngram_bans(generated: Sequence[int], n: int) -> list[int]:
    """The tokens that would complete an n-gram already in ``generated`` (n = 0: none; n = 1: every token in it):
    those that followed an earlier occurrence of its last n - 1 tokens."""
    if n < 1 or len(generated) < n:
        return []
    tokens = list(generated)
    tail = tokens[len(tokens) - n + 1 :] if n > 1 else []
    return sorted({tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tokens[i : i + n - 1] == tail})


# a sentence's end: its closing marks (and any quote or bracket that closes with them) before white space
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s)")


def lowered(text: str, lowercase: bool = True) -> str:
    """``text`` in lower case character by character (with ``lowercase``; else as it is), so that a reply streamed in
    pieces reads as the whole reply does (``str.lower`` of a whole text writes a Greek final sigma by context)."""
    return "".join(c.lower() for c in text) if lowercase else text


def capitalised(text: str) -> str:
    """``text`` with its first letter a capital where it opens with a word all in lower case: a reply that is not
    written in lower case opens so ("green, I'd guess — it's your favourite" reads "Green, I'd guess — ...", the
    user's own lower-case word said back first); "iPhone", a digit or a quote first stay as they are."""
    first = _WORD.match(text)
    if first is None or not first.group().islower() or len(text[0].upper()) != 1:
        return text
    return text[0].upper() + text[1:]


def sentences_end(text: str, n: int) -> int | None:
    """Where the n-th sentence of ``text`` ends (just after its closing marks), once the white space after them has
    come; None while ``text`` holds fewer than n finished sentences. A full stop after an abbreviation ("Mr. Lee")
    counts as an end: the rule is for a persona's short replies, not for prose."""
    for i, match in enumerate(_SENTENCE_END.finditer(text), start=1):
        if i == n:
            return match.end()
    return None


# the pieces that close a sentence with a full stop, and their twins with an exclamation mark
_FULL_STOPS = (".", '."', ".)", ".'", ".”", ".’")
_ELLIPSES = ("...", "…")
_SENTENCE_CLOSERS = (*_FULL_STOPS, *(p.replace(".", mark) for p in _FULL_STOPS for mark in "!?"), *_ELLIPSES)


def sentence_closers(tok: Tokenizer, ellipses: bool = True) -> frozenset[int]:
    """The tokens of ``tok`` that are one piece of ``_SENTENCE_CLOSERS`` (".", "!", "?", '."', "...", ...); without
    ``ellipses``, not "..." nor "…"."""
    pieces = _SENTENCE_CLOSERS if ellipses else [p for p in _SENTENCE_CLOSERS if p not in _ELLIPSES]
    return frozenset(ids[0] for piece in pieces if len(ids := tok.encode(piece)) == 1)


def exclamation_pairs(tok: Tokenizer) -> tuple[tuple[int, int], ...]:
    """(full stop, exclamation) token pairs of ``tok``: each piece of ``_FULL_STOPS`` it writes as one token whose twin
    with "!" for "." is one token too."""
    pairs = []
    for piece in _FULL_STOPS:
        stop, bang = tok.encode(piece), tok.encode(piece.replace(".", "!"))
        if len(stop) == 1 and len(bang) == 1:
            pairs.append((stop[0], bang[0]))
    return tuple(pairs)


def exclaimed(logits: Tensor, pairs: Sequence[tuple[int, int]]) -> Tensor:
    """(V,) logits with each full stop's probability moved onto its exclamation twin (``exclamation_pairs``): the
    sentence ends where the model would end it, with "!" (the twin's logit becomes log(p_stop + p_bang), the stop's
    -inf)."""
    if not pairs:
        return logits
    stops = torch.tensor([a for a, _ in pairs], dtype=torch.long, device=logits.device)
    bangs = torch.tensor([b for _, b in pairs], dtype=torch.long, device=logits.device)
    merged = torch.logaddexp(logits[stops], logits[bangs])
    return logits.index_copy(0, bangs, merged).index_fill(0, stops, float("-inf"))


def draw(logits: Tensor, generator: torch.Generator | None) -> int:
    """One token from the softmax of (V,) filtered logits (-inf: dropped), drawn among the kept tokens only: their
    probabilities are the same, and a draw over the whole vocabulary (``draw_over_vocabulary``) costs a random
    number per token, 1.1 ms of a 1.9 ms sampled token on the 2-core machine."""
    kept = torch.isfinite(logits).nonzero().squeeze(-1)
    probs = torch.softmax(logits[kept], dim=-1)
    return int(kept[torch.multinomial(probs, 1, generator=generator)])


def draw_over_vocabulary(logits: Tensor, generator: torch.Generator | None) -> int:
    """``draw`` as it was before: one multinomial over the whole vocabulary (the same distribution, other tokens
    for a given seed). Kept for ``benchmarks.sampling``."""
    return int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))


NUCLEUS_FIRST = 64  # the most likely tokens nucleus() looks among first (8x as many each time they fall short)


def nucleus(logits: Tensor, top_p: float) -> Tensor:
    """(V,) logits with -inf outside the nucleus: the most likely tokens, in order, up to the first whose preceding
    mass already reaches ``top_p``; the most likely token always stays. The same set as ``nucleus_reference``.

    Sorting a whole vocabulary costs milliseconds a token (49 152 logits in float64), paid by every row of every
    decode step; the nucleus of the sharp distributions chat sampling uses lies among a few dozen tokens. So the
    ``NUCLEUS_FIRST`` most likely are taken in order (top-k), their probabilities against the whole vocabulary's
    sum, and the search widens only while none of them is dropped yet."""
    V = logits.shape[-1]
    peak = logits.max()
    total = torch.exp(logits - peak).sum()
    k = min(NUCLEUS_FIRST, V)
    while True:
        top, order = torch.topk(logits, k)  # descending
        probs = torch.exp(top - peak) / total
        drop = (probs.cumsum(-1) - probs) >= top_p  # the mass before a token already reaches top_p
        drop[0] = False  # even when top_p is below the precision of the sum
        if k == V or bool(drop[-1]):  # every token past these has at least as much mass before it: dropped too
            break
        k = min(V, k * 8)
    keep = torch.zeros(V, dtype=torch.bool, device=logits.device)
    keep[order[~drop]] = True
    return logits.masked_fill(~keep, float("-inf"))


def nucleus_reference(logits: Tensor, top_p: float) -> Tensor:
    """``nucleus`` written plainly, the whole vocabulary sorted: the test oracle."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop = (probs.cumsum(-1) - probs) >= top_p
    drop[0] = False
    return logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))


def left_padded(rows: Sequence[Sequence[int]], fill: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(B, L) rows right-aligned in ``fill`` (L the longest row), and the (B, L) mask of their real entries."""
    L = max(len(r) for r in rows)
    idx = torch.full((len(rows), L), fill, dtype=torch.long, device=device)
    valid = torch.zeros(len(rows), L, dtype=torch.bool, device=device)
    for b, r in enumerate(rows):
        idx[b, L - len(r) :] = torch.tensor(list(r), dtype=torch.long)
        valid[b, L - len(r) :] = True
    return idx, valid


def forget_newest(key_valid: Tensor, cache: KVCache | None, b: int, n: int, prefix_len: int) -> int:
    """Left-padded row b forgets its n newest tokens (a reply taken back): its earlier columns move n to the right over
    them in the cache (``KVCache.forget_newest``), and key_valid (B, prefix + columns) shows it n columns later; the
    column of its first token after the prefix before the move."""
    at = int(key_valid[b, prefix_len:].int().argmax())
    key_valid[b, prefix_len + at : prefix_len + at + n] = False
    if cache is not None:
        cache.forget_newest(b, n, prefix_len + at)
    return at


def closed_up(key_valid: Tensor, cache: KVCache, prefix_len: int) -> Tensor:
    """Left-padded rows whose replies stopped before the newest column (the columns of the steps since are empty) with
    their columns moved right over those empty ones (``KVCache.forget_newest``), so that each row's tokens are again
    one run of columns ending at the newest and it attends alone (``row_starts``); the new key_valid (B, prefix +
    columns). Positions follow the tokens, not the columns: nothing read before changes."""
    key_valid = key_valid.clone()
    tokens = key_valid[:, prefix_len:]
    for b in range(key_valid.shape[0]):
        if not bool(tokens[b].any()):
            continue
        trailing = int(tokens[b].flip(0).int().argmax())  # empty columns after the row's newest token
        if trailing:
            at = forget_newest(key_valid, cache, b, trailing, prefix_len)
            key_valid[b, prefix_len + at + trailing :] = True
    return key_valid


def padded_inputs(key_valid: Tensor, n: int, prefix_len: int, n_memory: int = 0) -> tuple[Tensor, Tensor]:
    """Positions (B, n) of the newest n tokens of left-padded rows and the boolean (B, 1, n + n_memory, Lk + n_memory)
    mask of the keys each query sees (causal, padding hidden); key_valid (B, Lk) covers the prefix and every token so
    far, these n included; the n_memory memory tokens, when read, follow them."""
    B = key_valid.shape[0]
    positions = (key_valid[:, prefix_len:].long().cumsum(1) - 1).clamp_min(0)[:, -n:]  # (B, n)
    keys = torch.cat([key_valid, key_valid.new_ones(B, n_memory)], dim=1)
    n_q, Lk = n + n_memory, keys.shape[1]
    causal = torch.ones(n_q, Lk, dtype=torch.bool, device=key_valid.device).tril(diagonal=Lk - n_q)  # (n_q, Lk)
    return positions, (causal & keys[:, None, :]).unsqueeze(1)


def _visible_text(text: str, stops: Sequence[str]) -> int:
    """Length of the prefix of ``text`` that cannot turn into a stop string with more text."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                hold = max(hold, n)
                break
    return len(text) - hold


class ReplyDecoder:
    """One row's reply as it is decoded: its tokens and text, stop strings, finish reason and sampling generator. The
    text begins at its first character that is not white space (a reply whose first token is " Lisbon" reads
    "Lisbon"); the tokens are the model's, as sampled.

    With ``reply_to`` an English message or a ``speaker``, the reply's first word is held back until it is whole, and
    with an English message, where that word is no common English opener (``english_opener``) nor one the user wrote in
    lower case, its opening (``OPENING_WORDS`` words) until the word after it begins (each of its words is judged once
    the next has begun); when the first word is another language's or the speaker's name before a comma, or a word of
    the opening is another language's (``sia.model.language.foreign_opening``), the reply is taken back:
    ``taken_back`` then counts its tokens the model has already read, which the caller forgets before the row samples
    its first token again, that token now banned (``reply_events``)."""

    def __init__(self, params: SamplingParams, device: torch.device, tok: Tokenizer) -> None:
        self.tok = tok
        self.stops = [lowered(stop, params.lowercase) for stop in params.stop]  # a lowercase reply is matched in lower case
        self.exclamations = exclamation_pairs(tok) if params.exclaim else ()
        self.address = tuple(tok.encode(params.address)) if params.address else ()
        self.address_words = [w.lower() for w in _WORD.findall(params.address)]
        self.closers = sentence_closers(tok) if self.address else frozenset()
        # the closers a word limit pulls: a sentence's end, not an ellipsis (a reply cut short would trail off "...")
        pulls = bool(params.max_words or params.wind_down)
        self.enders = sentence_closers(tok, ellipses=False) if pulls else frozenset()
        self.pulled: tuple[Tensor, Tensor] | None = None  # the enders' and the end tokens' ids, with a word limit
        if pulls:
            enders, ends = (torch.tensor(sorted(ids), dtype=torch.long, device=device) for ids in (self.enders, tok.end_ids))
            self.pulled = (enders, ends)
        self.speaker = params.speaker.lower()  # the persona's name: never the reply's first word before a comma
        # the words the user wrote (a reply may echo them), when the reply keeps to the message's English; else None
        self.user_words = message_words(params.reply_to) if params.reply_to and english(params.reply_to) else None
        # the words the user wrote in lower case ("bees" of "How do bees make honey?"): a reply that opens with one
        # ("Bees make honey...") opens in the message's English, as one opening with a common English word does
        self.user_plain = frozenset(w for w in _WORD.findall(params.reply_to) if w.islower())
        # the names the user gave as their own: never right after "I'm", nor any other than the persona's own where it
        # has a name (``sia.model.naming``); the tokens that begin them are found when the reply first names itself
        self.user_names = user_names(params.reply_to) if params.reply_to else []
        self.named_speaker = params.speaker
        self.not_names: Tensor | None = None
        # what the user says of themself (their job, their city): never right after a persona's "I'm a" or "I live in",
        # nor anywhere in a clause where the persona says what it is, does or has ("and i grow ", "welcome to my ")
        self.user_roles = user_roles(params.reply_to) if params.reply_to and params.speaker else []
        # the words of them that say what the user does, not their name or city (``sia.model.naming.doings``)
        self.plain_roles = doings(params.reply_to) if self.user_roles else []
        self.not_roles: tuple[Tensor, ...] | None = None  # the banned tokens: of every word; of the plain ones; spaced
        self.going_on_ids: dict[tuple[str, ...], Tensor | None] = {}  # per word written and the words it may not go on to
        # a persona's reply never writes a word of profanity or a slur the user did not (``sia.model.unsaid``); the
        # tokens banned per word being written: "" after a space or a prefix of a stem, or None for any other word
        self.unsaid: UnsaidWords | None = unsaid_words(tok) if params.speaker else None
        self.user_stems = said_stems(params.reply_to)
        self.unsaid_ids: dict[str | None, Tensor | None] = {}
        self.banned_first: list[int] = []  # first tokens whose reply was taken back
        self.taken_back: int | None = None  # set by push: the reply was taken back, and this many of its tokens were read
        # the whole reply and its end, where the message asks what the persona knows of the user (their clauses quoted)
        # or what the user never told (saying so); else none
        self.whole: list[int] = []
        said = ""
        if params.recollection:
            clauses = params.recollection.split("\n")
            said = recollection_reply(clauses, address=params.address, exclaim=params.exclaim)
        elif params.untold:
            said = untold_reply(params.untold, params.reply_to, address=params.address, exclaim=params.exclaim)
        if said:
            self.whole = [*tok.encode(said), *tok.reply_tokens("")[:1]]
        # the reply's opening (the model goes on from it): where it says back the user's words, "You told me you"; where a
        # persona answers a user who introduces themself by name, its greeting of them (``sia.model.naming.greeting``)
        greets = "" if params.echo or self.whole or not (params.speaker and params.reply_to) else greeting(params.reply_to)
        opening = ECHO_OPENING if params.echo else greets
        self.opening = tok.encode(opening) if opening and not self.whole else []
        # a greeting's reply ends with the question it begins (its second sentence), or sooner where the persona's do
        limit = params.max_sentences
        self.max_sentences = min(limit or GREETING_SENTENCES, GREETING_SENTENCES) if greets else limit
        self.lean: Tensor | None = None  # the tokens the first one after the opening leans to
        if self.opening and params.echo_words:
            self.lean = torch.tensor(sorted(set(params.echo_words)), dtype=torch.long, device=device)
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            else:
                self.generator.seed()
        self._begin()

    def _begin(self) -> None:
        """An empty reply."""
        self.tokens: list[int] = []
        self.text = ""
        self.emitted = 0
        self.decoder = IncrementalDecoder(self.tok.token_bytes)
        self.finish_reason: str | None = None
        # tokens written before the model's next one (the address's rest, then its pick; a whole reply; an opening)
        self.queued: list[int] = [*self.whole, *self.opening]
        self.named = False  # the persona's name was just queued after "my name is": the word ends with it
        self.held: list[StreamEvent] = []  # events of the opening, until it is judged
        judged = (self.user_words is not None or bool(self.speaker)) and not self.queued
        self.judging = judged and len(self.banned_first) < FIRST_WORD_RETRIES
        self.first_passed = False  # the first word is judged and kept
        self.held_on = False  # and it is no common English word nor the user's: the opening's other words are waited for

    def sample(self, logits: Tensor, params: SamplingParams) -> int:
        """The row's next token from its (V,) logits: with ``exclaim``, a full stop right after a word is an exclamation
        mark until the reply holds one ("3.5" and "1." stay as they are); then ``sample_next`` over the reply so far.
        With ``address``, a sentence's end picked right after a word, while the reply does not say the address's words,
        is put off: the address's tokens come first, then that end ("Tokyo." becomes "Tokyo, sir."). A reply begun
        again never begins with a token whose reply was taken back, and where the reply names its speaker ("I'm"), the
        user's name cannot come, nor, for a persona with a name, any name but its own; where it says "my name is", a
        persona's name comes whole, and no token goes on its last word; where a persona's reply says what it is or where
        it lives ("I'm a", "I live in"), no word the user said of themself can come, nor, anywhere in a clause about
        itself ("and i grow "), one the user wrote in lower case; where it begins its own name after "I'm", the name
        comes. A persona's reply writes no profanity or slur the user did not (``sia.model.unsaid``)."""
        if self.queued:
            return self.queued.pop(0)
        if self.named_speaker and gives_name(self.text):
            name = own_name(self.named_speaker)
            self.queued = self.tok.encode(name if self.text[-1:].isspace() else " " + name)
            self.named = True
            return self.queued.pop(0)
        if self.named:  # the name just written ends there ("Pip, and", not "Pipa")
            self.named = False
            ids = sorted(continuations(self.tok))
            logits = logits.index_fill(0, torch.tensor(ids, dtype=torch.long, device=logits.device), float("-inf"))
        if not self.tokens and self.banned_first:
            logits = logits.index_fill(0, torch.tensor(self.banned_first, device=logits.device), float("-inf"))
        if self.lean is not None and len(self.tokens) == len(self.opening):
            lean = self.lean.to(logits.device)
            logits = logits.index_add(0, lean, torch.full(lean.shape, ECHO_LEAN, dtype=logits.dtype, device=logits.device))
        if (self.user_names or self.named_speaker) and names_self(self.text):
            logits = logits.index_fill(0, self._not_names(logits.device), float("-inf"))
        if self.user_roles and ((claims := claims_self(self.text)) or speaks_of_self(self.text)):
            logits = logits.index_fill(0, self._not_roles(logits.device, claims), float("-inf"))
        going_on = self._not_going_on(logits.device) if self.user_names or self.user_roles or self.named_speaker else None
        if going_on is not None:
            logits = logits.index_fill(0, going_on, float("-inf"))
        unsaid = self._unsaid(logits.device)
        if unsaid is not None:
            logits = logits.index_fill(0, unsaid, float("-inf"))
        after_word = self.text[-1:].isalpha()
        if self.pulled is not None:
            logits = self._ended_sooner(logits, params)
        if self.exclamations and after_word and "!" not in self.text:
            logits = exclaimed(logits, self.exclamations)
        token = sample_next(logits, params, self.generator, self.tokens)
        if self.address and after_word and token in self.closers and not self._addressed():
            self.queued = [*self.address[1:], token]
            return self.address[0]
        return token

    def _not_going_on(self, device: torch.device) -> Tensor | None:
        """Where the word the reply is writing comes right after "I'm" (or another way of naming or saying what its
        speaker is) and begins one of the user's names or words, the tokens that would take it further into that
        word (``sia.model.naming.completions``): the tokenizer spells " catarina" as " catar" + "ina" and as " cat" +
        "ar" + "ina"; and where it is a capitalised start of the persona's own name there ("I'm Mar"), those that would
        take it anywhere but on along that name (``off_own_name``); None where there are none."""
        n = word_start(self.text)
        written, before = self.text[n:], self.text[:n]
        word = written.lower()
        if not word:
            return None
        naming = names_self(before)
        roles = self.user_roles if claims_self(before) else self.plain_roles if speaks_of_self(before) else []
        targets = [*(self.user_names if naming else []), *roles]
        own = naming and bool(self.named_speaker) and written[:1].isupper()  # "I'm Mar": on to "Marlow" only
        if not targets and not own:
            return None
        key = (written if own else word, *targets)
        if key not in self.going_on_ids:
            ids = set(completions(self.tok, word, targets, self.named_speaker) if targets else ())
            if own:
                ids.update(off_own_name(self.tok, written, self.named_speaker))
            self.going_on_ids[key] = torch.tensor(sorted(ids), dtype=torch.long, device=device) if ids else None
        return self.going_on_ids[key]

    def _not_roles(self, device: torch.device, claims: bool) -> Tensor:
        """The tokens that may not come next where the reply says what its speaker is, does or has: right after "I'm a"
        and its kin (``claims``: ``claims_self`` of the reply so far), those that begin a word the user said of themself
        (``sia.model.naming.role_starts``); elsewhere in such a clause (``speaks_of_self``) those that begin a word of
        what the user does (``doings``: not a name or a place: kept from "welcome to our beautiful city of
        Cluj-Napoca", the backbone named another city, "of Morocco"), and within a word (the reply ends in a letter or
        digit) only those that begin a new one."""
        if self.not_roles is None:
            ids = role_starts(self.tok, self.user_roles, self.named_speaker)
            # in either case: "the bank" and "the Bank of ..." alike
            lower = role_starts(self.tok, [*self.plain_roles, *(w.capitalize() for w in self.plain_roles)], self.named_speaker)
            new_word = [i for i in lower if (raw := self.tok.token_bytes(i)) and raw[:1].isspace()]
            self.not_roles = tuple(torch.tensor(t, dtype=torch.long, device=device) for t in (ids, lower, new_word))
        every, plain, spaced = self.not_roles
        if claims:
            return every
        return spaced if self.text[-1:].isalnum() else plain

    def _not_names(self, device: torch.device) -> Tensor:
        """The tokens that may not come right after "I'm": those beginning a name the user gave, and where the persona
        has a name, any capitalised word but that name (``sia.model.naming.other_names``)."""
        if self.not_names is None:
            if self.named_speaker:
                ids = other_names(self.tok, self.named_speaker, self.user_names)
            else:
                ids = name_starts(self.tok, self.user_names)
            self.not_names = torch.tensor(ids, dtype=torch.long, device=device)
        return self.not_names

    def _unsaid(self, device: torch.device) -> Tensor | None:
        """The tokens that may not come next in a persona's reply: those that would write a stem of
        ``sia.model.unsaid.STEMS`` (but the ones the user's message holds) in the word the reply is writing, or begin
        a word with one; None where there are none."""
        if self.unsaid is None:
            return None
        word = word_written(self.text)
        key = word if goes_on_a_stem(word) else None  # every other word bans the same tokens
        if key not in self.unsaid_ids:
            banned = self.unsaid.banned(word, self.user_stems)
            self.unsaid_ids[key] = torch.tensor(banned, dtype=torch.long, device=device) if banned else None
        return self.unsaid_ids[key]

    def _ended_sooner(self, logits: Tensor, params: SamplingParams) -> Tensor:
        """``logits`` with the reply's end pulled nearer once the reply holds ``max_words`` words, by END_PULL nats for
        each word past max_words - 1, or once it is in its last ``wind_down`` tokens (a quarter of its limit at most),
        by WIND_PULL nats for each token into them (the larger pull where both hold): the sentence closers (not an
        ellipsis) where the model's most likely token begins a new word (so no word is cut short: a letter, a digit, an
        apostrophe or a hyphen goes on with it) and the last word is not one a sentence cannot end on (``OPEN_WORDS``),
        the end tokens right after a closer."""
        pull = 0.0
        if params.max_words:
            pull = END_PULL * (len(_WORD.findall(self.text)) - params.max_words + 1)
        zone = min(params.wind_down, params.max_new_tokens // WIND_SHARE)
        if zone:
            pull = max(pull, WIND_PULL * (len(self.tokens) - params.max_new_tokens + zone + 1))
        if pull <= 0 or self.pulled is None:
            return logits
        enders, ends = self.pulled
        if self.text[-1:].isalnum():  # after a word or a number
            begins = self.tok.token_text(int(likeliest(logits)))[:1]
            if begins.isalnum() or begins in "'’-":  # the model goes on with the word ("night" + "'s")
                return logits
            if self.text[-1].isalpha() and _WORD.findall(self.text)[-1].lower() in OPEN_WORDS:
                return logits  # the sentence cannot end here ("that can be found in")
            return logits.index_add(0, enders, logits.new_full(enders.shape, pull))
        if self.tokens and self.tokens[-1] in self.enders:
            return logits.index_add(0, ends, logits.new_full(ends.shape, pull))
        return logits

    def _addressed(self) -> bool:
        """Whether the reply so far says the address's words, in order, as words ("Sir" counts, "sirloin" does not)."""
        said = [w.lower() for w in _WORD.findall(self.text)]
        n = len(self.address_words)
        return any(said[i : i + n] == self.address_words for i in range(len(said) - n + 1))

    def push(self, token: int, params: SamplingParams, end_ids: frozenset[int]) -> str:
        """Record a token; return the newly visible text and set finish_reason when the row is done (or ``taken_back``
        when the reply begins in another language)."""
        self.taken_back = None
        self.tokens.append(token)
        if token in end_ids:
            self.text += lowered(self.decoder.flush(), params.lowercase)
            self.finish_reason = "stop"
        else:
            self.text += lowered(self.decoder.push(token), params.lowercase)
        if not self.emitted:  # nothing shown yet: the reply starts at its first visible character
            self.text = self.text.lstrip()
        for stop in self.stops:
            cut = self.text.find(stop)
            if cut >= 0:
                self.text = self.text[:cut]
                self.finish_reason = "stop"
        if self.max_sentences and self.finish_reason is None:
            end = sentences_end(self.text, self.max_sentences)
            if end is not None:  # the token that began the next sentence is kept in ``tokens`` but not shown
                self.text = self.text[:end]
                self.finish_reason = "stop"
        if self.finish_reason is None and len(self.tokens) >= params.max_new_tokens:
            self.text += lowered(self.decoder.flush(), params.lowercase)
            self.finish_reason = "length"
        if self.judging and not self._judged():
            return ""  # the opening is not judged yet: nothing is shown
        visible = len(self.text) if self.finish_reason else _visible_text(self.text, self.stops)
        if not self.emitted and visible and not params.lowercase:  # the reply's first letter, before it is shown
            self.text = capitalised(self.text)
        delta, self.emitted = self.text[self.emitted : visible], max(self.emitted, visible)
        return delta

    def _judged(self) -> bool:
        """Whether the reply's opening is judged and kept. The first word is judged once whole, the opening's other
        words (with an English message, after a first word that is no common English opener nor the user's own lower
        case word) once the word after them begins; the reply is taken back (``taken_back``, and the reply begins again
        empty) where the first word is another language's or the speaker's name calling out before a comma ("Sia, I'm
        glad"), or a word of the opening is another language's ("Zurich, das ist")."""
        found = list(islice(_WORD.finditer(self.text), OPENING_WORDS + 1))
        ended = self.finish_reason is not None
        if not self.first_passed:
            whole = bool(found) and found[0].end() < len(self.text)
            if not (whole or ended or len(self.tokens) >= FIRST_WORD_TOKENS):
                return False
            word = found[0].group() if found else ""
            if self._calls_speaker() or (self.user_words is not None and foreign_opening(word, self.user_words)):
                return self._take_back()
            self.first_passed = True
            # "The", "I", "Oh" or the user's own "bees" open English: nothing more is waited for
            self.held_on = not (english_opener(word) or word.lower() in self.user_plain)
        if self.user_words is not None and self.held_on:
            if foreign_opening(self.text, self.user_words, ended=ended):  # each word judged once the next has begun
                return self._take_back()
            if not (len(found) > OPENING_WORDS or ended or len(self.tokens) >= OPENING_TOKENS):
                return False
        self.judging = False
        return True

    def _take_back(self) -> bool:
        """The reply taken back: its first token banned, the reply begun again empty, ``taken_back`` its tokens read."""
        self.banned_first.append(self.tokens[0])
        read = len(self.tokens) - 1  # every token but the newest went through the model
        self._begin()
        self.taken_back = read
        return False

    def _calls_speaker(self) -> bool:
        """Whether the reply opens with the speaker's name and a comma: "Sia, ..." ("Sia is ..." and "Sia." stay)."""
        n = len(self.speaker)
        return bool(n) and self.text[:n].lower() == self.speaker and self.text[n : n + 1] == ","

    def release(self, event: StreamEvent) -> list[StreamEvent]:
        """The events to deliver now that ``event`` is this row's newest: none while the first word is judged, the
        first word's all at once when it passes."""
        if self.judging:
            self.held.append(event)
            return []
        events, self.held = [*self.held, event], []
        return events


def reply_events(
    row: ReplyDecoder,
    logits: Tensor,
    params: SamplingParams,
    rid: int,
    banned: Tensor,
    end_ids: frozenset[int],
    restart: Callable[[int], Tensor],
) -> list[StreamEvent]:
    """The row's next token from its (V,) logits (``banned`` ids never), recorded, and the events to deliver. A reply
    taken back (its first word in another language) begins again at once: ``restart(n)`` forgets the row's n tokens
    the model has read and returns the logits of its first token."""
    while True:
        logits_b = logits.index_fill(0, banned, float("-inf"))  # (V,)
        token = row.sample(logits_b, params)
        log_p = F.log_softmax(logits_b.float(), dim=-1)  # (V,)
        top: tuple[tuple[int, float], ...] = ()
        if params.top_logprobs:
            values, ids = log_p.topk(params.top_logprobs)
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        delta = row.push(token, params, end_ids)
        if row.taken_back is None:
            return row.release(StreamEvent(row=rid, token=token, text=delta, logprob=float(log_p[token]), top_logprobs=top))
        logits = restart(row.taken_back)


def prompt_scoring(lengths: Sequence[int], nll_from: Sequence[int] | None) -> tuple[list[int], int]:
    """Each prompt's first scored ``prompt_nll`` index (``nll_from``, default 0: all of them) and the first position of
    the left-padded prompts whose logits are needed; ValueError for an index outside its prompt."""
    starts = [0] * len(lengths) if nll_from is None else [int(a) for a in nll_from]
    if len(starts) != len(lengths):
        raise ValueError(f"{len(starts)} nll_from values for {len(lengths)} prompts")
    for a, n in zip(starts, lengths, strict=True):
        if not 0 <= a <= n - 1:
            raise ValueError(f"nll_from {a} is outside a prompt of {n} tokens (0 to {n - 1})")
    L = max(lengths)
    return starts, min(L - n + a for a, n in zip(starts, lengths, strict=True))


def prompt_nll(logits: Tensor, idx: Tensor, lengths: Sequence[int], starts: Sequence[int], logits_from: int) -> Tensor:
    """logits (B, L - logits_from, V) of the left-padded prompts idx (B, L) from position ``logits_from`` on -> (B, L - 1)
    NLL of each prompt token after the first (index j scores position j + 1), NaN before each row's scored start."""
    B, L = idx.shape
    nll = torch.full((B, L - 1), float("nan"), device=idx.device)
    if logits_from < L - 1:
        log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, L - 1 - logits_from, V)
        nll[:, logits_from:] = -log_probs.gather(-1, idx[:, logits_from + 1 :, None]).squeeze(-1)
    first = torch.tensor([L - n + a for n, a in zip(lengths, starts, strict=True)], device=idx.device)
    return nll.masked_fill(torch.arange(L - 1, device=idx.device) < first[:, None], float("nan"))


def stream(
    model: IdentityModel,
    prompts: Sequence[Sequence[int]],
    cond: Conditioning,
    params: SamplingParams | Sequence[SamplingParams],
    *,
    tokenizer: Tokenizer | None = None,
    summary_masks: Sequence[Sequence[bool]] | None = None,
    use_cache: bool = True,
    nll_from: Sequence[int] | None = None,
) -> Stream[list[Generation]]:
    """A StreamEvent per row and step; the result is the list of finished Generations, one per prompt.

    ``params``: one SamplingParams for every row, or one per row.

    ``summary_masks`` marks, per prompt token, whether it counts towards the turn summary (default: all).
    ``nll_from``: per prompt, the first ``prompt_nll`` index wanted (default 0); the entries before it are NaN and the
    logits they would need are not computed (a turn scores its message, not the persona's prompt before it).
    With ``use_cache=False`` every step recomputes the whole sequence (the slow reference for the cache).
    """
    return Stream(_decode(model, prompts, cond, params, tokenizer, summary_masks, use_cache, nll_from))


def check_room(model: IdentityModel, prompt_len: int, max_new_tokens: int) -> None:
    """ValueError unless a prompt of ``prompt_len`` tokens and its reply fit the model's context (a model that
    writes through memory tokens reads them after the reply, in the same cache)."""
    n_memory = model.config.memory_tokens if model.stateful else 0
    if prompt_len + max_new_tokens + n_memory > model.config.block_size:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context "
            f"of {model.config.block_size - n_memory} tokens"
        )


@torch.inference_mode()
def _decode(
    model: IdentityModel,
    prompts: Sequence[Sequence[int]],
    cond: Conditioning,
    params: SamplingParams | Sequence[SamplingParams],
    tokenizer: Tokenizer | None,
    summary_masks: Sequence[Sequence[bool]] | None,
    use_cache: bool,
    nll_from: Sequence[int] | None = None,
) -> Generator[StreamEvent, None, list[Generation]]:
    tok = tokenizer or model.tokenizer
    B = len(prompts)
    if cond.batch_size != B:
        raise ValueError(f"{B} prompts but the conditioning has {cond.batch_size} rows")
    lengths = [len(p) for p in prompts]
    if min(lengths, default=0) < 1:
        raise ValueError("every prompt needs at least one token")
    L = max(lengths)
    each = list(params) if isinstance(params, Sequence) else [params] * B
    if len(each) != B:
        raise ValueError(f"{len(each)} sampling settings for {B} prompts")
    check_room(model, L, max(p.max_new_tokens for p in each))
    starts, logits_from = prompt_scoring(lengths, nll_from)
    n_memory = model.memory_after_reply
    device = model.device
    masks = [[True] * len(p) for p in prompts] if summary_masks is None else [list(m) for m in summary_masks]
    for b, (mask, prompt) in enumerate(zip(masks, prompts, strict=True)):
        if len(mask) != len(prompt):
            raise ValueError(f"summary mask of row {b} has {len(mask)} entries for {len(prompt)} tokens")
    idx, valid = left_padded(prompts, tok.pad_id, device)  # (B, L)
    counted = left_padded([[int(m) for m in mask] for mask in masks], 0, device)[0].bool()
    padded = min(lengths) != L
    banned = torch.tensor(tok.banned_ids, dtype=torch.long, device=device)  # never sampled

    def run(
        tokens: Tensor, key_valid: Tensor, count: Tensor, cache: KVCache | None, memory: bool = False, logits_from: int = 0
    ) -> tuple[Tensor, SummarySums, Tensor | None]:
        """Forward over ``tokens`` (B, n) (and then the memory tokens); key_valid (B, prefix + all tokens so far)."""
        positions, mask = padded_inputs(key_valid, tokens.shape[1], model.prefix_len, n_memory if memory else 0)
        attn_mask = mask if padded else None  # unpadded rows take the causal kernel
        extra = {"memory": True} if memory else {}  # only a model that writes through memory tokens takes it
        out = model(
            tokens,
            cond,
            cache=cache,
            positions=positions,
            attn_mask=attn_mask,
            summary_mask=count,
            logits_from=logits_from,
            **extra,
        )
        return out.logits, out.stats, out.memory

    each = row_params(each, cond)  # at the recall temperature where a row recalls; the untold reply where it asks that
    rows = [ReplyDecoder(p, device, tok) for p in each]
    guarded = any(row.judging for row in rows)  # a reply may be taken back: its steps still take the batch's columns
    prefix = torch.ones(B, model.prefix_len, dtype=torch.bool, device=device)  # the self slot, if any
    key_valid = torch.cat([prefix, valid], dim=1)  # (B, prefix + L)
    room = max(p.max_new_tokens for p in each) + n_memory + (TAKEN_BACK_COLUMNS if guarded else 0)
    cache = model.new_cache(cond, L + room) if use_cache else None
    logits, stats, _ = run(idx, key_valid, counted, cache, logits_from=logits_from)  # (B, L - logits_from, V)
    nll = prompt_nll(logits, idx, lengths, starts, logits_from)  # (B, L-1)
    P = model.prefix_len
    if cache is not None and padded and P and model.exact_rows:  # rows attend one by one: each row's keys one view
        cache.mirror([P + L - n for n in lengths])
        key_valid = torch.cat([key_valid[:, :P], key_valid.new_zeros(B, P), key_valid[:, P:]], dim=1)
    last = logits[:, -1]  # (B, V)
    # what a reply begun again starts from (a copy: a view of the prompt's logits would keep them all alive)
    first, prompt_stats = last.clone(), stats
    seq, seq_count = idx, counted

    def restart(b: int, n: int) -> Tensor:
        """Row b's reply begins again: it forgets its n tokens read (alone, they are dropped; beside other rows, its
        earlier columns move over them: ``KVCache.forget_newest``); the logits of its first token."""
        nonlocal stats, padded, key_valid, seq, seq_count
        stats = stats.with_row(b, prompt_stats.row(b))
        if not n:
            return first[b]
        if B == 1:
            key_valid = key_valid[:, :-n]
            if cache is not None:
                cache.length -= n
            else:  # the reference reads the whole sequence every step
                seq, seq_count = seq[:, :-n], seq_count[:, :-n]
            return first[b]
        at = forget_newest(key_valid, cache, b, n, P)
        if cache is None:
            for t, blank in ((seq, tok.pad_id), (seq_count, False)):
                t[b, at + n :] = t[b, at : t.shape[1] - n].clone()
                t[b, at : at + n] = blank
        padded = True
        return first[b]

    while True:
        step = torch.full((B, 1), tok.pad_id, dtype=torch.long, device=device)
        alive = torch.zeros(B, 1, dtype=torch.bool, device=device)
        for b, row in enumerate(rows):
            if row.finish_reason is not None:
                continue
            yield from reply_events(row, last[b], each[b], b, banned, tok.end_ids, partial(restart, b))
            if row.finish_reason is None:
                step[b, 0], alive[b, 0] = row.tokens[-1], True
        if not bool(alive.any()):
            break
        key_valid = torch.cat([key_valid, alive], dim=1)
        if cache is not None:
            logits, step_stats, _ = run(step, key_valid, alive, cache)
            stats = stats + step_stats
        else:
            seq, seq_count = torch.cat([seq, step], dim=1), torch.cat([seq_count, alive], dim=1)
            logits, stats, _ = run(seq, key_valid, seq_count, None)
        last = logits[:, -1]

    if n_memory:
        # the write: each row's last token (sampled, never fed back) and then the memory tokens, not counted
        if cache is not None and padded and model.exact_rows:  # each row's columns one run to the newest, as alone
            key_valid = closed_up(key_valid, cache, P)
        final = torch.tensor([[row.tokens[-1]] for row in rows], dtype=torch.long, device=device)  # (B, 1)
        key_valid = torch.cat([key_valid, key_valid.new_ones(B, 1)], dim=1)
        none = torch.zeros(B, 1, dtype=torch.bool, device=device)
        if cache is not None:
            _, _, memory = run(final, key_valid, none, cache, memory=True)
        else:
            _, _, memory = run(torch.cat([seq, final], dim=1), key_valid, torch.cat([seq_count, none], dim=1), None, memory=True)
        assert memory is not None
        stats = stats.written_by(memory)

    return [
        Generation(
            tokens=row.tokens,
            text=row.text,
            finish_reason=row.finish_reason or "length",
            prompt_nll=nll[b, L - lengths[b] :].clone(),
            stats=stats.row(b),
        )
        for b, row in enumerate(rows)
    ]


def generate(
    model: IdentityModel,
    prompts: Sequence[Sequence[int]],
    cond: Conditioning,
    params: SamplingParams | Sequence[SamplingParams],
    *,
    tokenizer: Tokenizer | None = None,
    summary_masks: Sequence[Sequence[bool]] | None = None,
    use_cache: bool = True,
    nll_from: Sequence[int] | None = None,
) -> list[Generation]:
    """Run ``stream`` to the end and return one Generation per prompt."""
    return stream(
        model, prompts, cond, params, tokenizer=tokenizer, summary_masks=summary_masks, use_cache=use_cache, nll_from=nll_from
    ).finish()
