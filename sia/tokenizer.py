"""A byte-level tokenizer: every UTF-8 string round-trips exactly, with four special tokens for chat."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

__all__ = ["ByteTokenizer", "IncrementalDecoder"]


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


class IncrementalDecoder:
    """Turns a stream of token ids into text deltas without splitting multi-byte characters."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        if not 0 <= token < ByteTokenizer.n_bytes:
            return ""
        return str(self._decoder.decode(bytes([token])))

    def flush(self) -> str:
        return str(self._decoder.decode(b"", final=True))
