"""Whose name a reply gives as its own: the decoder's rule that keeps a persona from taking its user's name.

Told "Hi! I'm Rafael and I grow coffee near Manizales", the bundled backbone often answers as the user: "I am Rafael,
a loyal and dedicated friend..." (a sixth to a quarter of the introductions of ``experiments/probes``'s
``introduction_language``, for every persona). The persona's prompt names the persona; the message names the user,
and the 135M backbone mixes the two up. So a reply never says the user's name right after the words by which a speaker
names itself ("I'm", "I am", "my name is", "call me"): the tokens that would begin it are banned there
(``ReplyDecoder.sample``), and the model says something else ("I'm so glad you're here").

The user's names are read from the message the reply answers: the capitalised word after "I'm", "I am", "my name is",
"my name's" or "call me" ("I'm Ana Kowalski": Ana), the word that opens a message signed "... here" ("Esteban here",
"hello!! olga here"). A name a greeting opens with ("Hi Sia, ...") is left alone: it is most often the persona's.
"""

from __future__ import annotations

import re

from sia.model.language import ENGLISH
from sia.model.tokenizer import Tokenizer

__all__ = ["name_starts", "names_self", "user_names"]

_GIVEN = re.compile(r"(?i:\b(?:i'm|i’m|i am|my name is|my name's|my name’s|calls? me))\s+([A-Z][^\W\d_]*)")
_GREETING = r"^\W*(?i:(?:hi|hey|heya|hello|good \w+)(?: there)?\W+)"
# "Esteban here", "hello!! olga here" (a name after a greeting alone, "Hi Sia, ...", is most often the persona's)
_SIGNED = re.compile(_GREETING + r"?([^\W\d_]+)(?:\s+[^\W\d_]+)?\s+(?i:here)\b")
_NAMES_SELF = re.compile(r"(?:^|\W)(?:i'm|i’m|i am|my name is|my name's|my name’s|call me)\s*$", re.IGNORECASE)


def user_names(message: str) -> list[str]:
    """The names the user gives as their own in ``message``, in order, each once."""
    found = [m.group(1) for m in _GIVEN.finditer(message)]
    signed = _SIGNED.match(message)
    if signed is not None:
        found.append(signed.group(1))
    return [name for name in dict.fromkeys(found) if name.lower() not in ENGLISH]


def names_self(text: str) -> bool:
    """Whether a reply so far ends where its speaker's name comes next ("Hello! I'm", "my name is ")."""
    return _NAMES_SELF.search(text) is not None


def name_starts(tok: Tokenizer, names: list[str]) -> list[int]:
    """The tokens that begin ``names`` (after a space or not, capitalised as written or in lower case); a first token
    that is only white space is not one of them (a byte tokenizer writes " Ana" as " " + "A" + ...)."""
    starts: set[int] = set()
    for name in names:
        for form in {name, name.lower()}:
            for text in (" " + form, form):
                ids = tok.encode(text)
                first = next((t for t in ids if tok.decode([t]).strip()), None)
                if first is not None:
                    starts.add(first)
    return sorted(starts)
