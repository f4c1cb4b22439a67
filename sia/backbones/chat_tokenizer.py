"""The chat tokenizer of a LLaMA-family model directory: ``tokenizer.json`` plus the chat template.

Two halves, both standard components rather than hand-written ones:

- ``tokenizers.Tokenizer`` (byte-level BPE) does all encoding and decoding. ``build_gguf_tokenizer`` makes one
  from a GGUF file's vocabulary, merges and token types, with the pre-tokenizer its ``tokenizer.ggml.pre``
  names (a small registry, ``PRE_TOKENIZERS``).
- The chat template (Jinja, from ``tokenizer_config.json``) renders in the sandboxed environment transformers
  uses (``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``tojson``, ``strftime_now``).

Message text is never parsed for special tokens: ``encode`` treats ``"<|im_start|>"`` in user text as the
characters it is made of, so a user cannot forge a turn. Only the template's own pieces (the text around a
message) are encoded with special tokens parsed. ``turn_prompt`` therefore renders the template around a
marker and encodes the pieces separately; at the boundary this can differ from encoding the whole rendered
string in one go (BPE cannot merge across the cut), which is the price of the injection guarantee.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

logger = logging.getLogger(__name__)

__all__ = ["PRE_TOKENIZERS", "ChatTokenizer", "build_gguf_tokenizer", "bytes_to_unicode"]

# llama.cpp's tokenizer.ggml.token_type values
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# a marker the template renders in place of a message's text; no template or message contains it
_MARKER = "\x00SIA-MESSAGE-MARKER\x00"

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _smollm() -> pre_tokenizers.PreTokenizer:
    # every digit its own piece, then GPT-2's regex: SmolLM2's tokenizer.json, and llama.cpp's "smollm" pre-type
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _llama3() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# tokenizer.ggml.pre -> the pre-tokenizer its merges were learned with
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "smollm": _smollm,
    "gpt2": _gpt2,
    "default": _gpt2,
    "llama-bpe": _llama3,
    "llama3": _llama3,
}


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to the printable character byte-level BPE spells it with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


@lru_cache(maxsize=1)
@lru_cache(maxsize=1)
def _unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def build_gguf_tokenizer(tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], pre: str) -> Tokenizer:
    """The byte-level BPE tokenizer a GGUF file describes (``tokenizer.ggml.model == 'gpt2'``).

    ``tokens`` are in byte-level spelling, ``merges`` are ``"left right"`` strings, control tokens
    (type 3) become special added tokens and user-defined ones (type 4) plain added tokens.
    """
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre {pre!r} is not supported; supported pre-tokenizers: {sorted(PRE_TOKENIZERS)}")
    if len(token_types) != len(tokens):
        raise ValueError(f"the GGUF lists {len(tokens)} tokens but {len(token_types)} token types")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError(
            f"the GGUF vocabulary repeats tokens ({len(tokens) - len(vocab)} duplicates); it cannot be a BPE vocabulary"
        )
    pairs: list[tuple[str, str]] = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ValueError(f"GGUF merge {merge!r} is not two tokens separated by one space")
        pairs.append((parts[0], parts[1]))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in ("llama-bpe", "llama3")))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = set(bytes_to_unicode().values())
    control = [
        AddedToken(token, special=True, normalized=False)
        for token, kind in zip(tokens, token_types, strict=True)
        # a control token outside the byte alphabet is a llama.cpp mislabel, as transformers also judges
        if kind == TOKEN_TYPE_CONTROL and set(token) <= alphabet
    ]
    user = [
        AddedToken(token, special=False, normalized=False)
        for token, kind in zip(tokens, token_types, strict=True)
        if kind == TOKEN_TYPE_USER_DEFINED
    ]
    tokenizer.add_special_tokens(control)
    tokenizer.add_tokens(user)
    return tokenizer


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _token_string(value: object, key: str) -> str | None:
    """A special token as tokenizer_config.json spells it: a string, an AddedToken dict, or absent."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise ValueError(f"tokenizer_config.json {key} is {value!r}; expected a token string")


class ChatTokenizer:
    """Encoding, decoding and chat-template prompts for one model (see the module docstring).

    Attributes:
        vocab_size: rows of the embedding table the ids index (config.json's vocab_size, else the tokenizer's size).
        eos_id, bos_id (None without one), pad_id (eos when unset), end_of_turn_id (the token closing a message).
        end_ids: the ids that end a reply: eos and end_of_turn_id.
        banned_ids: every other special token (pad, bos, the turn-start <|im_start|>, <|endoftext|>, ...), never
            sampled in a reply: decode drops special tokens, so one would vanish from the text.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str,
        special_tokens: Mapping[str, str | None],
        vocab_size: int | None = None,
    ) -> None:
        if not isinstance(tokenizer.decoder, decoders.ByteLevel):
            raise ValueError("only byte-level BPE tokenizers (decoder ByteLevel, as GPT-2/LLaMA-3/SmolLM2) are supported")
        self._tokenizer = tokenizer
        # the same tokenizer, encoding special-token strings as the plain text they are made of
        self._plain = Tokenizer.from_str(tokenizer.to_str())
        self._plain.encode_special_tokens = True
        self._special_ids = frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)

        size = tokenizer.get_vocab_size(with_added_tokens=True)
        if vocab_size is not None and vocab_size < size:
            raise ValueError(f"the model's vocab_size {vocab_size} is smaller than the tokenizer's {size} tokens")
        self.vocab_size: int = size if vocab_size is None else vocab_size

        self._specials = {k: v for k, v in special_tokens.items() if v is not None}
        eos = self._specials.get("eos_token")
        if eos is None:
            raise ValueError("the tokenizer names no eos_token; set it in tokenizer_config.json")
        self.eos_id = self._id(eos, "eos_token")
        bos = self._specials.get("bos_token")
        self.bos_id = None if bos is None else self._id(bos, "bos_token")
        pad = self._specials.get("pad_token")
        self.pad_id: int = self.eos_id if pad is None else self._id(pad, "pad_token")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(chat_template)
        except TemplateError as exc:
            raise ValueError(f"the chat template does not compile: {exc}") from exc

        # the user block: what the template renders around one user message, generation prompt included
        system = [{"role": "system", "content": "x"}]
        prefix = self.render(system, add_generation_prompt=False)
        full = self.render([*system, {"role": "user", "content": _MARKER}], add_generation_prompt=True)
        if not full.startswith(prefix):
            raise ValueError("the chat template renders a conversation that does not start with its first message's rendering")
        self._user_before, self._user_after = self._split(full[len(prefix) :], "user")
        if not self._user_after or self._user_after[0] not in self._special_ids:
            raise ValueError("the chat template does not close a user message with a special end-of-turn token")
        self.end_of_turn_id = self._user_after[0]
        self._system_before, self._system_after = self._split(
            self.render([{"role": "system", "content": _MARKER}], add_generation_prompt=False), "system"
        )
        # what closes an assistant message in a transcript (``<|im_end|>\n`` in ChatML)
        asked = [*system, {"role": "user", "content": "y"}]
        opened = self.render(asked, add_generation_prompt=True)
        answered = self.render([*asked, {"role": "assistant", "content": _MARKER}], add_generation_prompt=False)
        if not answered.startswith(opened):
            raise ValueError("the chat template does not open an assistant message the way its generation prompt does")
        _, self._reply_after = self._split(answered[len(opened) :], "assistant")

        self.end_ids: frozenset[int] = frozenset({self.eos_id, self.end_of_turn_id})
        # every other special token (pad, bos, the turn-start token, <|endoftext|>-like control tokens) is
        # markup that a reply never contains: decode would drop it silently
        # ... and every token holding a NUL byte, which no text contains (PostgreSQL cannot store it as text)
        nul = bytes_to_unicode()[0]
        with_nul = {i for token, i in tokenizer.get_vocab(with_added_tokens=False).items() if nul in token}
        self.banned_ids: tuple[int, ...] = tuple(sorted((self._special_ids - self.end_ids) | with_nul))

    @classmethod
    def from_dir(cls, directory: str | Path) -> ChatTokenizer:
        """The tokenizer of a model directory: tokenizer.json, tokenizer_config.json (and config.json's vocab_size)."""
        directory = Path(directory)
        paths = {name: directory / name for name in ("tokenizer.json", "tokenizer_config.json")}
        missing = [name for name, path in paths.items() if not path.is_file()]
        if missing:
            raise ValueError(
                f"{directory} has no {' or '.join(missing)}; expected a Hugging Face model directory with a tokenizer"
            )
        tokenizer = Tokenizer.from_file(str(paths["tokenizer.json"]))
        config = json.loads(paths["tokenizer_config.json"].read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, list):  # a list of named templates: use the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise ValueError(f"{paths['tokenizer_config.json']} has no chat_template; a chat model needs one")
        specials = {key: _token_string(config.get(key), key) for key in ("bos_token", "eos_token", "pad_token", "unk_token")}
        vocab_size: int | None = None
        model_config = directory / "config.json"
        if model_config.is_file():
            vocab_size = json.loads(model_config.read_text(encoding="utf-8")).get("vocab_size")
        return cls(tokenizer, template, specials, vocab_size)

    def _id(self, token: str, key: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{key} {token!r} is not in the tokenizer's vocabulary")
        return int(token_id)

    def _split(self, rendered: str, role: str) -> tuple[list[int], list[int]]:
        """Encode the template text around the marker, special tokens parsed."""
        parts = rendered.split(_MARKER)
        if len(parts) != 2:
            raise ValueError(f"the chat template does not render a {role} message's content exactly once")
        before, after = parts
        return self._encode_markup(before), self._encode_markup(after)

    def _encode_markup(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text; special-token strings in it are encoded as ordinary text, never as specials."""
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids, special tokens dropped."""
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True))

    def _token(self, token_id: int) -> str:
        token = self._tokenizer.id_to_token(int(token_id))
        if token is None:
            raise ValueError(f"token id {token_id} is outside the tokenizer's vocabulary (size {self.vocab_size})")
        return str(token)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The raw bytes a token stands for (possibly part of a UTF-8 character); None for a special token."""
        if token_id in self._special_ids:
            return None
        table = _unicode_to_bytes()
        token = self._token(token_id)
        # every character of a BPE token is in the byte alphabet; an added token's other characters stand for themselves
        return b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in token)

    def token_text(self, token_id: int) -> str:
        """A token as text: special tokens by their name, a partial UTF-8 character as U+FFFD."""
        raw = self.token_bytes(token_id)
        return self._token(token_id) if raw is None else raw.decode("utf-8", errors="replace")

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        """The chat template applied to messages, as transformers' ``apply_chat_template(tokenize=False)``."""
        try:
            return str(
                self._template.render(
                    messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **self._specials
                )
            )
        except TemplateError as exc:
            raise ValueError(f"the chat template rejected the conversation: {exc}") from exc

    def system_prompt(self, text: str) -> list[int]:
        """The system block for text (``<|im_start|>system\\n...<|im_end|>\\n`` in ChatML); [] for no text."""
        if not text:
            return []
        return [*self._system_before, *self.encode(text), *self._system_after]

    def reply_tokens(self, text: str) -> list[int]:
        """An assistant reply as a transcript holds it: its tokens, the end-of-turn token and what follows it."""
        return [*self.encode(text), *self._reply_after]

    def turn_prompt(self, message: str, context: Sequence[int] = ()) -> tuple[list[int], tuple[int, int]]:
        """context + the user block for message + the generation prompt, and the message's span.

        ``tokens[start:end]`` are the message's own tokens followed by the end-of-turn token that closes it.
        """
        body = self.encode(message)
        tokens = [*context, *self._user_before, *body, *self._user_after]
        start = len(context) + len(self._user_before)
        end = start + len(body) + 1
        assert tokens[end - 1] == self.end_of_turn_id
        return tokens, (start, end)
