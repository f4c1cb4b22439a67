"""Shape checks for the bundled held-out dialogue corpus (sia/learn/data/dialogue.jsonl)."""

from __future__ import annotations

import json
import unicodedata
from functools import cache
from typing import Any

from sia.learn.dialogue import DIALOGUE_FILE as DIALOGUE_PATH

N_CONVERSATIONS = 60
MIN_TURNS, MAX_TURNS = 3, 5
MIN_TOTAL_TURNS = 240
MAX_USER_CHARS = 400
MAX_ASSISTANT_CHARS = 600


@cache
def _conversations() -> list[dict[str, Any]]:
    lines = DIALOGUE_PATH.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _has_control_chars(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def test_file_exists_and_every_line_is_json() -> None:
    assert DIALOGUE_PATH.is_file()
    for n, line in enumerate(DIALOGUE_PATH.read_text(encoding="utf-8").splitlines(), 1):
        assert line.strip(), f"blank line {n}"
        assert isinstance(json.loads(line), dict), f"line {n} is not an object"


def test_conversation_count_and_unique_ids() -> None:
    convs = _conversations()
    assert len(convs) == N_CONVERSATIONS
    ids = [c["id"] for c in convs]
    assert len(set(ids)) == len(ids)
    assert all(isinstance(i, str) and i for i in ids)
    assert all(isinstance(c.get("topic"), str) and c["topic"].strip() for c in convs)


def test_turn_counts() -> None:
    convs = _conversations()
    for c in convs:
        assert isinstance(c["turns"], list)
        assert MIN_TURNS <= len(c["turns"]) <= MAX_TURNS, c["id"]
    assert sum(len(c["turns"]) for c in convs) >= MIN_TOTAL_TURNS


def test_turn_strings_are_clean_and_bounded() -> None:
    limits = {"user": MAX_USER_CHARS, "assistant": MAX_ASSISTANT_CHARS}
    for c in _conversations():
        for k, turn in enumerate(c["turns"]):
            assert set(turn) == set(limits), (c["id"], k)
            for role, limit in limits.items():
                text = turn[role]
                where = (c["id"], k, role)
                assert isinstance(text, str), where
                assert text, where
                assert text == text.strip(), where
                assert not _has_control_chars(text), where
                assert len(text) <= limit, where
