"""What the reply-quality benchmark counts in one reply: answered, looping, in the wrong language, in the persona's style.

Plain functions of the reply's text (and, for loops, its tokens), so tests can check them on hand-made strings.
The word lists live in ``benchmarks/data/reply_words.json``.

* **answered**: one of the question's ``accept`` strings is found in the reply, case-insensitively, at the start of a
  word ("spider" is found in "Spiders"); a number (digits, or number words such as "twenty-five") must be a whole
  word, so "12" is not found in "120" nor in "2.12", and "seven" not in "seventeen".
* **loops**: some 3-gram of words appears 3 or more times, or some 6-gram of tokens appears twice.
* **wrong language**: a reply of 5 or more words none of which is a common English word (a short stopword list), or
  one whose letters are mostly not ASCII (Cyrillic, Chinese, ...), or one holding at least 3 function words of
  Portuguese, Spanish, French, German, Italian or Czech and more of them than English stopwords (Spanish and German
  share "es", "in", "die" with the English list). Deliberately crude: it catches the backbone's drift into another
  language, not a stray foreign word or a place's own name ("Rio de Janeiro", "Hola!").
* **style**: one check per persona, from its system prompt (``sia.personas``); a persona without one passes a
  reply that is non-empty and does not loop.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "STYLES",
    "answered",
    "loops",
    "style_ok",
    "words",
    "wrong_language",
]

WORDS_FILE = Path(__file__).parent / "data" / "reply_words.json"
WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")  # letters and digits, with inner apostrophes and hyphens
LOOP_WORD_NGRAM, LOOP_WORD_COUNT = 3, 3
LOOP_TOKEN_NGRAM = 6
FOREIGN_MIN_WORDS = 5
FOREIGN_FUNCTION_WORDS = 3  # the fewest function words of another language that make a reply drift
NON_ASCII_SHARE = 0.5


@cache
def _lists() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(WORDS_FILE.read_text())
    return loaded


@cache
def _set(name: str) -> frozenset[str]:
    return frozenset(_lists()[name])


def words(text: str) -> list[str]:
    """The reply's words, lower-cased (curly apostrophes made straight)."""
    return [w.lower().replace("’", "'") for w in WORD.findall(text)]


def _is_number(accept: str) -> bool:
    if re.fullmatch(r"\d+(?:[.,]\d+)?", accept):
        return True
    parts = re.split(r"[\s-]+", accept)
    return all(p in _set("number_words") for p in parts)


def answered(reply: str, accept: Sequence[str]) -> bool:
    """Whether one of ``accept`` (lower-case) is found at the start of a word of ``reply`` (a number: as a whole word)."""
    text = reply.lower().replace("’", "'")
    for want in accept:
        start, end = r"(?<![^\W_])", ""
        if _is_number(want):  # a whole word, and not a piece of a decimal (2.12, 12.5)
            start, end = start + r"(?<!\d[.,])", r"(?![^\W_])(?![.,]\d)"
        if re.search(start + re.escape(want) + end, text):
            return True
    return False


def _ngram_counts(items: Sequence[object], n: int) -> Counter[tuple[object, ...]]:
    return Counter(tuple(items[i : i + n]) for i in range(len(items) - n + 1))


def loops(reply: str, tokens: Sequence[int] = ()) -> bool:
    """A 3-gram of words 3 or more times, or a 6-gram of ``tokens`` (the reply's token ids) twice."""
    if any(c >= LOOP_WORD_COUNT for c in _ngram_counts(words(reply), LOOP_WORD_NGRAM).values()):
        return True
    return any(c >= 2 for c in _ngram_counts(list(tokens), LOOP_TOKEN_NGRAM).values())


def wrong_language(reply: str) -> bool:
    """5 or more words and no English stopword among them, letters mostly outside ASCII, or another language's function
    words, at least FOREIGN_FUNCTION_WORDS of them and more than the English stopwords."""
    letters = [c for c in reply if c.isalpha()]
    if letters and sum(not c.isascii() for c in letters) / len(letters) > NON_ASCII_SHARE:
        return True
    ws = words(reply)
    english = sum(w in _set("english_stopwords") for w in ws)
    if len(ws) >= FOREIGN_MIN_WORDS and not english:
        return True
    foreign = sum(w in _set("foreign_function_words") for w in ws)
    return foreign >= FOREIGN_FUNCTION_WORDS and foreign > english


def _has(text: str, phrases: frozenset[str]) -> bool:
    """Whether one of ``phrases`` is in ``text`` as whole words ("hi" is not found in "his")."""
    lowered = text.lower().replace("’", "'")
    return any(re.search(r"(?<![^\W_])" + re.escape(p) + r"(?![^\W_])", lowered) for p in phrases)


def sia_style(reply: str) -> bool:
    """ "A few gentle, complete sentences": 1 to 5 sentences, the first letter a capital, ending in . ! or ?"""
    text = reply.strip().rstrip("\"')”’ ")
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    first = next((c for c in text if c.isalpha()), "")
    return bool(text) and first.isupper() and text[-1] in ".!?" and 1 <= len(sentences) <= 5


def bolt_style(reply: str) -> bool:
    """ "As few words as possible, in lowercase, with no pleasantries": at most 12 words, no capital letter, none of
    the pleasantries."""
    ws = words(reply)
    return 0 < len(ws) <= 12 and reply == reply.lower() and not _has(reply, _set("pleasantries"))


def pip_style(reply: str) -> bool:
    """ "Enthusiastic about everything and loves exclamation marks": at least one "!"."""
    return bool(words(reply)) and "!" in reply


def marlow_style(reply: str) -> bool:
    """ "Addresses the user as sir or madam": the reply says sir, madam or ma'am (or my lord, my lady)."""
    return _has(reply, _set("courtesy_address"))


STYLES: dict[str, Callable[[str], bool]] = {"sia": sia_style, "bolt": bolt_style, "pip": pip_style, "marlow": marlow_style}


def style_ok(persona: str, reply: str, tokens: Sequence[int] = ()) -> bool:
    """The persona's style check; for a persona without one: a non-empty reply that does not loop."""
    check = STYLES.get(persona)
    if check is None:
        return bool(words(reply)) and not loops(reply, tokens)
    return check(reply)
