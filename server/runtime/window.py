"""The recent prompt window (SIA_PROMPT_WINDOW_TOKENS): the newest stored exchanges of an identity, rendered as the
model reads a transcript, put after the persona's prompt as a turn's context.

A turn's state reads and writes only from its message on (the turn passes ``reads_from = len(context)``), so the
window is text the model attends to, never something the identity learns from a second time.
"""

from __future__ import annotations

from server.store import Store
from sia.model.tokenizer import Tokenizer

__all__ = ["WINDOW_PAGE", "exchange_tokens", "recent_window"]

WINDOW_PAGE = 32  # stored turns read per query while the window fills


def exchange_tokens(tok: Tokenizer, message: str, reply: str) -> list[int]:
    """One exchange as a transcript holds it (as sia.learn.natural renders one): the user's turn, then the reply."""
    return tok.turn_prompt(message)[0] + tok.reply_tokens(reply)


def recent_window(store: Store, tok: Tokenizer, persona: str, user: str, budget: int) -> list[int]:
    """The newest stored exchanges of (persona, user) that fit in ``budget`` tokens together, whole ones only, in
    conversation order. It ends at the first turn kept without text: what lies beyond that gap is not the recent
    conversation any more."""
    kept: list[list[int]] = []  # newest first
    room, offset = budget, 0
    while room > 0:
        page = store.recent_turns(persona, user, limit=WINDOW_PAGE, offset=offset)
        for turn in page:
            if not turn.text_kept:
                return _in_order(kept)
            tokens = exchange_tokens(tok, turn.message, turn.reply)
            if len(tokens) > room:
                return _in_order(kept)
            kept.append(tokens)
            room -= len(tokens)
        if len(page) < WINDOW_PAGE:
            break
        offset += WINDOW_PAGE
    return _in_order(kept)


def _in_order(newest_first: list[list[int]]) -> list[int]:
    return [t for exchange in reversed(newest_first) for t in exchange]
