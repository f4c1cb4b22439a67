"""Words a persona never says: the decoder's rule that keeps profanity and slurs out of a persona's replies.

The bundled backbone sometimes picks one up from what it reads: told "My name's Marisol Etxeberria, I'm a pharmacist,
and I live in Bilbao with my two dogs", bolt answered "i'm a bitch, and i live in bilbao." (one reply of about 10 000
the project's benchmarks and probes keep; ``experiments/probes``'s ``introduction_language``). A persona is a service's
voice: it never swears at or insults the person it talks to, whatever the backbone's draw.

No list of tokens can be banned beforehand: the tokenizer spells these words in pieces ("bitch" is " b" + "itch",
"fucking" " f" + "ucking"), and the pieces begin other words (" b" begins "bitter"). So the rule reads the word the
reply is writing: a token may not come where the word it begins or goes on would then open with one of ``STEMS`` ("b"
+ "itch", "bitc" + "h", " fuck"; "bitchy", "fucking" alike), in any case. The model then writes another word ("b" +
"itter"). A stem the user's message holds ("my dog is a bitch") is theirs to use, and the reply may say it back.

``STEMS`` are strong profanity and slurs whose every longer word is one too; words that begin innocent ones
("cock": "cockatiel"; "dick": "Dickens"; "pussy": "pussycat"; "retard": "retardant") are not among them.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from sia.model.tokenizer import Tokenizer

__all__ = [
    "STEMS",
    "UnsaidWords",
    "goes_on_a_stem",
    "leading_letters",
    "said_stems",
    "unsaid_words",
    "word_start",
    "word_written",
]

STEMS = (
    "fuck",
    "motherfuck",
    "shit",
    "bullshit",
    "bitch",
    "cunt",
    "whore",
    "slut",
    "asshole",
    "arsehole",
    "bastard",
    "dickhead",
    "dumbass",
    "jackass",
    "wanker",
    "bollock",
    "twat",
    "nigger",
    "nigga",
    "faggot",
)


def word_start(text: str) -> int:
    """Where the run of letters ``text`` ends with begins (``len(text)`` where it ends with anything else)."""
    n = len(text)
    while n and text[n - 1].isalpha():
        n -= 1
    return n


def word_written(text: str) -> str:
    """The word a reply so far is writing: the letters ``text`` ends with, lower case ("" where it ends with anything
    else: the next token begins a word)."""
    return text[word_start(text) :].lower()


def goes_on_a_stem(word: str) -> bool:
    """Whether a token after ``word`` (``word_written``) can complete a stem in it: ``word`` is "" or a proper prefix of
    a stem. After any other word only the tokens that begin a word with a stem are banned, the same for all of them."""
    return any(len(word) < len(stem) and stem.startswith(word) for stem in STEMS)


def said_stems(message: str) -> frozenset[str]:
    """The stems ``message`` holds (in any case): the ones a reply to it may say back."""
    lowered = message.lower()
    return frozenset(stem for stem in STEMS if stem in lowered)


@dataclass(frozen=True)
class UnsaidWords:
    """One tokenizer's tokens that would write a stem, per stem: ``starts`` those that begin a word with it (their text
    opens with a mark or a space and then the stem: " bitch", "(shit"), ``goes_on`` per word so far (a proper prefix of
    the stem, "" where a word begins with the token itself) those whose leading letters complete it ("" + "bitch",
    "b" + "itch", "bitc" + "hy")."""

    starts: dict[str, frozenset[int]]
    goes_on: dict[tuple[str, str], frozenset[int]]

    def banned(self, word: str, allowed: frozenset[str] = frozenset()) -> list[int]:
        """The tokens that may not come after a reply whose last letters (the word it is writing, lower case; "" after a
        space or a mark) are ``word``; the stems in ``allowed`` may be written."""
        ids: set[int] = set()
        for stem in STEMS:
            if stem in allowed:
                continue
            ids |= self.starts[stem]
            ids |= self.goes_on.get((stem, word), frozenset())  # a key only where ``word`` is a proper prefix of it
        return sorted(ids)


_INDEX: weakref.WeakKeyDictionary[Tokenizer, UnsaidWords] = weakref.WeakKeyDictionary()


def leading_letters(text: str) -> str:
    """The run of letters ``text`` opens with, lower case."""
    n = 0
    while n < len(text) and text[n].isalpha():
        n += 1
    return text[:n].lower()


def unsaid_words(tok: Tokenizer) -> UnsaidWords:
    """``tok``'s ``UnsaidWords``, computed once per tokenizer (a pass over its vocabulary)."""
    found = _INDEX.get(tok)
    if found is None:
        found = _index(tok, range(tok.vocab_size))
        _INDEX[tok] = found
    return found


def _index(tok: Tokenizer, ids: Iterable[int]) -> UnsaidWords:
    # every (stem, the word so far) by the first letter of what the token must open with: stem[k:] after stem[:k]
    rests: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for stem in STEMS:
        for k in range(len(stem)):
            rests[stem[k]].append((stem, k))
    starts: dict[str, set[int]] = {stem: set() for stem in STEMS}
    goes_on: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i in ids:
        raw = tok.token_bytes(i)
        text = "" if raw is None else raw.decode("utf-8", "ignore")
        if not text:
            continue
        if text[0].isalpha():  # the token goes on the word being written (or begins one after a space or a mark)
            lead = leading_letters(text)
            for stem, k in rests.get(lead[0], ()):
                if lead.startswith(stem[k:]):
                    goes_on[stem, stem[:k]].add(i)
            continue
        word = leading_letters(text.lstrip(" \t\n\"'“‘(*_-"))  # a word begun inside the token (" bitch", "\"shit")
        for stem in STEMS:
            if word.startswith(stem):
                starts[stem].add(i)
    return UnsaidWords(
        {stem: frozenset(ids) for stem, ids in starts.items()},
        {key: frozenset(ids) for key, ids in goes_on.items()},
    )
