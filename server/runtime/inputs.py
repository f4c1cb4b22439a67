"""What a request may carry into a turn, checked before any identity is held: decoding choices, a user id, a message."""

from __future__ import annotations

from dataclasses import dataclass

from sia.model.generate import SamplingParams

__all__ = ["Sampling", "check_message", "check_user"]


@dataclass(frozen=True)
class Sampling:
    """What a request may say about decoding; None means the persona's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0  # report this many alternatives with every generated token

    def __post_init__(self) -> None:
        # the fields given are checked now, before any identity is held; the persona fills in the rest
        SamplingParams(
            max_new_tokens=64 if self.max_tokens is None else self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=tuple(self.stop),
            top_logprobs=self.top_logprobs,
        )


def check_user(user: str) -> None:
    """User ids are 1 to 256 printable characters (they appear in logs and URLs)."""
    if not isinstance(user, str) or not 0 < len(user) <= 256 or not user.isprintable():
        raise ValueError("user must be 1 to 256 printable characters")


def check_message(message: str) -> None:
    """A message is text without NUL characters (no text store or terminal takes them)."""
    if not isinstance(message, str):
        raise TypeError(f"message must be str; got {type(message).__name__}")
    if "\x00" in message:
        raise ValueError("message must not contain NUL characters")
