"""The shipped held-out dialogue: hand-written everyday conversations for measuring reply quality.

``sia/learn/data/dialogue.jsonl`` holds one conversation per line, ``{"id", "topic", "turns": [{"user", "assistant"}]}``.
It is evaluation data only: nothing trains on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DIALOGUE_FILE", "Conversation", "Exchange", "load_dialogue"]

DIALOGUE_FILE = Path(__file__).parent / "data" / "dialogue.jsonl"


@dataclass(frozen=True)
class Exchange:
    """One turn: what the user says and the reply (the assistant's) a model is trained or evaluated on."""

    user: str
    reply: str


@dataclass(frozen=True)
class Conversation:
    id: str
    topic: str
    turns: tuple[Exchange, ...]


def load_dialogue(path: str | Path = DIALOGUE_FILE) -> list[Conversation]:
    """Every conversation of the file, in order; ValueError naming the line of a malformed one."""
    conversations = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            turns = tuple(Exchange(user=str(t["user"]), reply=str(t["assistant"])) for t in data["turns"])
            conversations.append(Conversation(id=str(data["id"]), topic=str(data["topic"]), turns=turns))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a conversation ({exc})") from exc
    return conversations
