"""Tokenizers: the interface generation and turns rely on, and the native model's byte-level tokenizer.

Two tokenizers implement ``Tokenizer``: ``ByteTokenizer`` here (every UTF-8 string round-trips exactly, four
special tokens for chat) and ``sia.backbones.chat_tokenizer.ChatTokenizer`` (a pretrained backbone's BPE and chat template).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import ClassVar, Protocol

__all__ = ["ByteTokenizer", "IncrementalDecoder", "Tokenizer", "completed_texts"]


class Tokenizer(Protocol):
    """What generation, turns and the service need from a tokenizer."""

    vocab_size: int
    pad_id: int
    end_ids: frozenset[int]  # ids that end a reply
    banned_ids: tuple[int, ...]  # ids never sampled in a reply

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes | None:
        """The UTF-8 bytes a token stands for; None for a special token."""
        ...

    def token_text(self, token_id: int) -> str: ...

    def system_prompt(self, text: str) -> list[int]:
        """The tokens a persona's prompt puts before every turn ([] for no prompt)."""
        ...

    def turn_prompt(self, message: str, context: Sequence[int] = ()) -> tuple[list[int], tuple[int, int]]:
        """context + the user's message as a turn + the reply's opening; and the (start, end) token span of the
        message followed by the token that closes it (what shock scores)."""
        ...

    def reply_tokens(self, text: str) -> list[int]:
        """A reply as a transcript holds it after ``turn_prompt``: its tokens and what closes it."""
        ...


class ByteTokenizer:
    """Ids 0..255 are bytes; 256..259 are <|pad|>, <|user|>, <|assistant|>, <|end|>."""

    n_bytes = 256
    pad_id = 256
    user_id = 257
    assistant_id = 258
    end_id = 259
    specials: ClassVar[dict[int, str]] = {
        pad_id: "<|pad|>",
        user_id: "<|user|>",
        assistant_id: "<|assistant|>",
        end_id: "<|end|>",
    }
    vocab_size = 260
    end_ids = frozenset({end_id})
    # never sampled: the markers only a prompt uses, and the NUL byte, which no text contains (a reply holding it
    # could not be stored as text by PostgreSQL, nor shown by most terminals)
    banned_ids: tuple[int, ...] = (0, pad_id, user_id, assistant_id)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode takes str; got {type(text).__name__}")
        try:
            return list(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValueError(f"text is not encodable as UTF-8: {exc}") from exc

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes back to text; special tokens are dropped; invalid byte runs become U+FFFD."""
        return bytes(i for i in ids if 0 <= i < self.n_bytes).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes | None:
        return bytes([token_id]) if 0 <= token_id < self.n_bytes else None

    def token_text(self, token_id: int) -> str:
        raw = self.token_bytes(token_id)
        return self.specials.get(token_id, "") if raw is None else raw.decode("utf-8", errors="replace")

    def to_file(self, path: str | Path) -> None:
        """Describe the tokenizer so a checkpoint says which one it was trained with."""
        spec = {"type": "byte", "vocab_size": self.vocab_size, "specials": {str(k): v for k, v in self.specials.items()}}
        Path(path).write_text(json.dumps(spec, indent=2) + "\n")

    @classmethod
    def from_file(cls, path: str | Path) -> ByteTokenizer:
        """Load and check a tokenizer description; anything but this byte tokenizer is refused."""
        tok = cls()
        try:
            spec = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        expected = {"type": "byte", "vocab_size": tok.vocab_size, "specials": {str(k): v for k, v in tok.specials.items()}}
        if spec != expected:
            raise ValueError(f"{path}: unsupported tokenizer {spec!r}; expected {expected!r}")
        return tok

    def chat_prompt(self, message: str, context: Iterable[int] = ()) -> list[int]:
        """<context> <|user|> message <|end|> <|assistant|> : the prompt the reply continues."""
        return [*context, self.user_id, *self.encode(message), self.end_id, self.assistant_id]

    def system_prompt(self, text: str) -> list[int]:
        """The native model reads a persona's preamble as plain bytes before the turn."""
        return self.encode(text)

    def reply_tokens(self, text: str) -> list[int]:
        return [*self.encode(text), self.end_id]

    def turn_prompt(self, message: str, context: Sequence[int] = ()) -> tuple[list[int], tuple[int, int]]:
        prompt = self.chat_prompt(message, context)
        start = len(context) + 1  # after <|user|>
        return prompt, (start, start + len(self.encode(message)) + 1)  # the message bytes and their <|end|>


class IncrementalDecoder:
    """Turns a stream of token ids into text deltas without splitting multi-byte characters."""

    def __init__(self, token_bytes: Callable[[int], bytes | None] | None = None) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._bytes = token_bytes or ByteTokenizer().token_bytes

    def push(self, token: int) -> str:
        raw = self._bytes(token)
        if raw is None:  # special tokens are not text
            return ""
        return str(self._decoder.decode(raw))

    def flush(self) -> str:
        return str(self._decoder.decode(b"", final=True))


def completed_texts(tok: Tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token's text as the characters it completes: a character written over several tokens (an emoji, a letter
    some vocabularies split) belongs whole to its last token, the tokens before it holding ""; special tokens hold
    nothing. What the imprint's clause rules read of a message, so that "🌼" or "ś" is a character there, not
    replacement marks."""
    decoder = IncrementalDecoder(tok.token_bytes)
    texts = [decoder.push(t) for t in ids]
    if texts:
        texts[-1] += decoder.flush()
    return texts
