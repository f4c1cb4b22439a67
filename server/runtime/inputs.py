"""What a request may carry into a turn, checked before any identity is held: a user id, a message (decoding choices:
sia.model.generate.Sampling)."""

from __future__ import annotations

__all__ = ["check_message", "check_user"]


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
