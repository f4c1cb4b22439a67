"""The default personas: a description each, and what opens every turn for them.

A pretrained chat backbone reads a persona as its system prompt (through the checkpoint's chat template); the
native model was trained on a short bracketed preamble ("[sia]") from the corpus instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sia.model.config import ModelConfig
from sia.model.generate import SamplingParams, logit_bias_pairs
from sia.model.identity_model import IdentityModel
from sia.model.tokenizer import Tokenizer

__all__ = [
    "DEFAULTS_RELEASE",
    "DEFAULT_PERSONA",
    "PERSONAS",
    "Persona",
    "outdated_defaults",
    "persona_defaults",
    "persona_preamble",
    "persona_prompt",
    "persona_sampling",
    "word_bias",
]

DEFAULT_PERSONA = "sia"


@dataclass(frozen=True)
class Persona:
    description: str
    system_prompt: str  # the style, for a chat backbone


PERSONAS: dict[str, Persona] = {
    "sia": Persona(
        "a warm, attentive companion who answers in gentle full sentences",
        "You are Sia, a warm and attentive companion. Answer in a few gentle, complete sentences.",
    ),
    "bolt": Persona(
        "a terse assistant that answers in clipped lowercase fragments",
        # three worked examples (none among the easy questions) raised bolt's answered share on their held-out part
        # from 40 to 55 % (experiments/LOG.md, 2026-11-28 (j))
        "You are Bolt, a terse assistant. Answer in as few words as possible, in lowercase, with no pleasantries. For"
        ' example, asked "What colour is a lemon?" you say "yellow."; asked "What is 4 plus 4?" you say "8."; asked "What'
        ' is a chair?" you say "a seat for one."',
    ),
    "pip": Persona(
        "a bubbly, excitable friend who loves exclamation marks",
        "You are Pip, a bubbly and excitable friend. You are enthusiastic about everything and love exclamation marks!",
    ),
    "marlow": Persona(
        "a formal, old-fashioned butler who speaks with elaborate courtesy",
        "You are Marlow, a formal, old-fashioned butler. You speak with elaborate courtesy and address the user as sir or madam.",
    ),
}


def persona_preamble(persona: str) -> str:
    """The native model's short text before every turn of ``persona``, e.g. "[sia]" (what its corpus trains on)."""
    if persona not in PERSONAS:
        raise ValueError(f"unknown persona {persona!r}; expected one of {sorted(PERSONAS)}")
    return f"[{persona}]"


def persona_prompt(model: IdentityModel, name: str) -> str:
    """What opens every turn of persona ``name`` for ``model``: a chat backbone's system prompt, or the native
    model's corpus preamble."""
    if name not in PERSONAS:
        raise ValueError(f"unknown persona {name!r}; expected one of {sorted(PERSONAS)}")
    if isinstance(model.config, ModelConfig):
        return persona_preamble(name)
    return PERSONAS[name].system_prompt


# Decoding defaults for a small chat backbone: cooler than 1 with a nucleus cut, which keeps a 135M model on topic
# far better than greedy decoding or temperature 0.8, and repetition control over the reply (a 1.15 penalty on every
# token it already holds, no 4-gram twice), which took the replies that loop from 9-63 % to none on the easy questions'
# tuning part without costing answers (measured: experiments/LOG.md, benchmarks/results/reply_quality.json).
CHAT_SAMPLING: dict[str, object] = {
    "temperature": 0.4,
    "top_p": 0.9,
    # 160 tokens, the last 32 winding down (below): every reply is what a 128-token limit gave up to its 128th token,
    # and then ends its sentence (experiments/LOG.md, 2026-12-05 (q))
    "max_tokens": 160,
    "repetition_penalty": 1.15,
    "no_repeat_ngram": 4,
    # a reply to a question about the user's facts, with an imprint to answer from, decoded greedily: the tuning part's
    # first 20 users over HTTP answer 68.5 % of their questions so, 61.1 % with every turn sampled as above, 66.7 % with
    # every turn greedy (experiments/LOG.md, 2026-12-03 (c))
    "recall_temperature": 0.0,
    # in a reply's last 32 tokens its end is pulled nearer (half a nat more at every token), so a reply the token
    # limit would cut in a sentence ends at a sentence's end first: on the easy questions' tuning part, which chose it,
    # marlow's replies cut by the limit went from about half to none and pip's from a fifth to none (docs/model.md,
    # "Replies that end in a sentence"; experiments/LOG.md, 2026-12-05 (o))
    "wind_down": 32,
}


# the form of a persona's replies where a small chat backbone does not keep it from the prompt alone, chosen on the
# easy questions' tuning part (experiments/LOG.md, 2026-12-01 (b)): bolt's replies in lower case, ended after their
# first sentence (its style check 4 -> 71 %, answered 58.7 -> 53.3 %: answers given only in a later sentence are cut);
# sia's ended after four ("a few gentle, complete sentences": style 79 -> 91 %, answered 55 -> 53 %, one question);
# pip's first full stop after a word written "!" (style 69 -> 93 %, answered 53 -> 57 %; held out 62 -> 90 %, 60 -> 54 %)
# and marlow's ", sir" before its first sentence end (style 81 -> 96 %, answered 52 -> 55 %; held out 77 -> 93 %,
# 52 -> 50 %), in place of the bias below (2026-12-03 (d)); bolt's end pulled nearer past eight words (style 71 -> 95 %,
# answered 53 -> 51 %; greedy 79 -> 99 %, 49 -> 44 %; six words: style 100 %, answered 40 %; ten: 85 %, 52 %; 2026-12-04 (a))
CHAT_FORM: dict[str, dict[str, object]] = {
    "bolt": {"lowercase": True, "max_sentences": 1, "max_words": 8},
    "sia": {"max_sentences": 4},
    "pip": {"exclaim": True},
    "marlow": {"address": ", sir"},
}


# words a persona's replies should hold, raised by a logit bias on the one token the backbone's tokenizer writes each
# with, until the reply has said it (logit_bias_once); a word written with more tokens than one is not raised. None
# today: marlow's " sir" +4 (releases 2 and 3: style 37 -> 81 % on the easy questions' tuning part, answered 53 -> 52 %)
# gave way to its address, which says "sir" in 96 % of the replies with 55 % answered (experiments/LOG.md, 2026-12-03 (d))
CHAT_WORDS: dict[str, dict[str, float]] = {}


# the release of the default personas' defaults: a service brings a stored default persona to them once (where a field
# still holds an earlier release's default, EARLIER_CHAT_SAMPLING and EARLIER_CHAT_PROMPTS) and records this number with
# it, so that an admin who later sets a field back to an earlier default keeps it. Raise it whenever a default changes.
DEFAULTS_RELEASE = 7


# the decoding defaults earlier releases stored for a chat backbone's personas, field by field
EARLIER_CHAT_SAMPLING: dict[str, tuple[object, ...]] = {
    "max_tokens": (128,),
    "repetition_penalty": (1.0,),
    "no_repeat_ngram": (0,),
    "lowercase": (False,),
    "max_sentences": (0,),
    "max_words": (0,),
    "wind_down": (0,),
    "exclaim": (False,),
    "address": ("",),
    "logit_bias": ({},),
    "logit_bias_once": (False,),
    "recall_temperature": (None,),
}


# the words an earlier release raised for a default persona (CHAT_WORDS), whose bias a service takes away with its "once"
EARLIER_CHAT_WORDS: dict[str, tuple[dict[str, float], ...]] = {"marlow": ({" sir": 4.0},)}


# chat prompts an earlier release stored for a default persona, which a service brings to today's
EARLIER_CHAT_PROMPTS: dict[str, tuple[str, ...]] = {
    "bolt": ("You are Bolt, a terse assistant. Answer in as few words as possible, in lowercase, with no pleasantries.",),
}


def persona_defaults(model: IdentityModel, name: str) -> dict[str, object]:
    """The stored fields of default persona ``name`` for ``model``: description, prompt and decoding defaults."""
    values: dict[str, object] = {"description": PERSONAS[name].description, "preamble": persona_prompt(model, name)}
    if not isinstance(model.config, ModelConfig):
        values.update(
            CHAT_SAMPLING,
            lowercase=False,
            max_sentences=0,
            max_words=0,
            exclaim=False,
            address="",
            logit_bias={},
            logit_bias_once=False,
        )
        values.update(CHAT_FORM.get(name, {}))
        bias = word_bias(model.tokenizer, CHAT_WORDS.get(name, {}))
        if bias:
            values.update(logit_bias=bias, logit_bias_once=True)
    return values


def word_bias(tokenizer: Tokenizer, words: Mapping[str, float]) -> dict[str, float]:
    """A logit bias (token id written as a decimal -> bias) on the token ``tokenizer`` writes each word with, for the
    words it writes with one token only (a bias on a longer word's first piece would raise a different word)."""
    bias = {}
    for word, value in words.items():
        ids = tokenizer.encode(word)
        if len(ids) == 1:
            bias[str(ids[0])] = value
    return bias


def persona_sampling(model: IdentityModel, name: str) -> SamplingParams:
    """Default persona ``name``'s decoding for ``model``, as a fresh service stores it (the native model: 64 tokens at
    temperature 0.8, top-p 0.95)."""
    d = persona_defaults(model, name)
    return SamplingParams(
        max_new_tokens=int(str(d.get("max_tokens", 64))),
        temperature=float(str(d.get("temperature", 0.8))),
        top_p=float(str(d.get("top_p", 0.95))),
        repetition_penalty=float(str(d.get("repetition_penalty", 1.0))),
        no_repeat_ngram=int(str(d.get("no_repeat_ngram", 0))),
        lowercase=d.get("lowercase") is True,
        exclaim=d.get("exclaim") is True,
        address=str(d.get("address", "")),
        max_sentences=int(str(d.get("max_sentences", 0))),
        max_words=int(str(d.get("max_words", 0))),
        wind_down=int(str(d.get("wind_down", 0))),
        logit_bias=logit_bias_pairs(d.get("logit_bias", {})),
        logit_bias_once=d.get("logit_bias_once") is True,
        recall_temperature=None if d.get("recall_temperature") is None else float(str(d["recall_temperature"])),
        speaker=name,
    )


def outdated_defaults(model: IdentityModel, name: str, stored: Mapping[str, object]) -> dict[str, object]:
    """The fields of a stored default persona ``name`` that still hold an earlier release's default, each with the
    current one: a service brings them up to date once (persona's defaults_release below DEFAULTS_RELEASE) and leaves
    every field an admin changed as it is."""
    if name not in PERSONAS or isinstance(model.config, ModelConfig):
        return {}
    current = persona_defaults(model, name)
    earlier = {**EARLIER_CHAT_SAMPLING, "preamble": EARLIER_CHAT_PROMPTS.get(name, ())}
    words = [word_bias(model.tokenizer, w) for w in EARLIER_CHAT_WORDS.get(name, ())]
    if words:  # an earlier default bias came with "once" on
        earlier.update(logit_bias=(*earlier["logit_bias"], *words), logit_bias_once=(*earlier["logit_bias_once"], True))
    changes = {
        field: current[field]
        for field, values in earlier.items()
        if field in current and stored.get(field) != current[field] and stored.get(field) in values
    }
    if "logit_bias" not in changes:  # "once" goes with the default's bias, not with a bias an admin chose
        changes.pop("logit_bias_once", None)
    return changes
