"""Whose name a reply gives as its own: the decoder's rule that keeps a persona from taking its user's name.

Told "Hi! I'm Rafael and I grow coffee near Manizales", the bundled backbone often answers as the user: "I am Rafael,
a loyal and dedicated friend..." (a sixth to a quarter of the introductions of ``experiments/probes``'s
``introduction_language``, for every persona). The persona's prompt names the persona; the message names the user,
and the 135M backbone mixes the two up. So a reply never says the user's name right after the words by which a speaker
names itself ("I'm", "I am", "my name is", "call me"): the tokens that would begin it are banned there
(``ReplyDecoder.sample``), and the model says something else ("I'm so glad you're here").

The user's names are read from the message the reply answers: the capitalised word after "I'm", "I am", "my name is",
"my name's", "name's" or "call me" ("I'm Ana Kowalski": Ana), the word that opens a message signed "... here" ("Esteban here",
"hello!! olga here"). A name a greeting opens with ("Hi Sia, ...") is left alone: it is most often the persona's.

A persona with a name (a chat turn's ``speaker``) gives no other name as its own either: the backbone also makes one
up ("Oi, amo, sir! I'm Antonio", "I am Elena", "I'm Monsieur Giovanni"; 19 of ``introduction_language``'s 320 replies).
Right after those words, no token that begins a capitalised word may come but the one that begins the persona's own
name (``other_names``): "I'm Marlow, at your service" or "I'm so glad", never "I'm Antonio".

Where it says "my name is" (or "my name's") its name comes next, whole, and ends there (``gives_name``; the token after
it may not go on the word: "My name is Pip, and", not "Pipa"): kept from every other name, the backbone trailed off
there instead ("My name is... (pausing)", "My name is a"; 7 of ``introduction_language``'s 320 replies, 2026-12-06).

A persona's reply takes no more of what the user says of themself than their name: told "Hey! Call me Bea. I'm a
firefighter in Valencia", bolt answered "i'm a firefighter in valencia and i love the sea.", pip "I'm a music teacher
in Graz." to Lukas, sia "I'm your friendly and compassionate dentist here in Chennai" to Priya. Right after the words
by which a speaker says what it is or where it lives ("I'm", "I am", "I work as", "I live in", "I'm from", and a few
words between: "I'm just a", "I'm your", "I'm based in"; ``claims_self``), no token may come that begins a word of
the user's own clauses (``user_roles``: the words after their "I", "I'm" or "my" up to the clause's end, but the
common ones: "I'm a firefighter in Valencia" gives firefighter and Valencia). "I'm glad", "I'm not a firefighter" and
"you're a firefighter" stay the model's to say.

Nor anywhere else in a clause where the persona says what it is, does or has (``speaks_of_self``: the clause has
"I", "I've", "my", "we" or "our", and after the last of them no "you" or "your" but "I'm your", no denial, no word of
opinion or feeling): told "I'm Rafael and I grow coffee near Manizales", sia answered "I grow coffee in Manizales",
bolt "i'm a bartender, and i grow coffee.", pip told by a flower seller "Welcome to my flower shop". There the tokens
that begin a word of what the user does are banned (``doings``: written in lower case and not right after "in" or
"from", so not their name or city: kept from "welcome to our beautiful city of Cluj-Napoca", the backbone named another
city, "of Morocco"); within a word only those that begin a new one. "I'm glad you're enjoying your cheese", "I think
Lisbon is lovely" and "I love the sea" stay the model's to say.

Banning the tokens that begin such a word is not enough: the tokenizer spells a word in more ways than one, and the
model took another ("I'm catarina sousa" as " cat" + "ar" + "ina" where " catar" was banned; "I'm ingrid" as " in" +
"grid"; 2 of ``introduction_language``'s 320 replies, 2026-12-06). So every token that spells a start of the word
is banned there, not only its first token (" c", " ca", " cat", " catar"), but a common English word (" in" of
"Ingrid"); and where the word a reply is writing is a start of one of the user's names or words ("in"), no token may
take it further into that word (``completions``: "grid"), but where the longer start is a common English word ("a"
+ "n") or a start of the persona's own name: "I'm in good hands" stays the model's to say. A capitalised start of the
persona's own name right after "I'm" goes on only along that name (``off_own_name``): "I'm Mar" + "iolle" was the
backbone's way past the rule of other names.

A reply to a message in which the user introduces themself by name and asks nothing opens by greeting them by that name
(``greeting``: "Nice to meet you, Kim!"), and the backbone goes on as the one who greets. Left to open on its own, it
mostly went on as if it stood where the user does: "Hello there, hello! I'm Sia, a loyal and dedicated colleague at
Deloitte in Leeds." to "Hi! I'm Kim, I work for Deloitte in Leeds.", "Welcome to my classroom!" to a maths teacher,
"welcome to the bike shop!" to someone who works at one.
"""

from __future__ import annotations

import re
import weakref

from sia.model.language import ENGLISH, asks
from sia.model.tokenizer import Tokenizer
from sia.model.unsaid import leading_letters

__all__ = [
    "GREETING_SENTENCES",
    "capital_starts",
    "claims_self",
    "completions",
    "continuations",
    "doings",
    "gives_name",
    "greeting",
    "leads",
    "name_starts",
    "names_self",
    "off_own_name",
    "other_names",
    "own_name",
    "role_starts",
    "speaks_of_self",
    "spellings",
    "told_roles",
    "user_names",
    "user_roles",
]

# "my name is", "my full name is", or "name's" / "real name is" where a clause begins ("hey, name's Ruth"): the
# writer's own name, not another's ("his name is Max", "my cat's name is Luna")
_WHICH_NAME = r"(?:(?:full|real|first|last|actual|proper|legal|given|nick)\s*)?"
_NAME_IS = rf"(?:\bmy\s+|(?:^|(?<=[^\w\s'’]))\s*){_WHICH_NAME}name(?:\s+is|['’]s)"
_GIVEN = re.compile(rf"(?i:\b(?:i'm|i’m|i am|calls? me)|{_NAME_IS})\s+([A-Z][^\W\d_]*)")
# "hi my name is jo", "my names Kofi", "hey, name's ruth": after the words that can only give the writer's name, a
# name written in lower case too; not after "i'm" ("i'm tired") or "call me" ("call me crazy"), and not a word that
# says what the name is like ("my name's pretty long")
_GIVEN_PLAIN = re.compile(rf"(?i:{_NAME_IS}|\bmy\s+names)\s+([^\W\d_]+)\b(?!['’])")
_OF_A_NAME = frozenset({
    "actually", "also", "bit", "boring", "common", "complicated", "difficult", "easy", "embarrassing", "funny", "hard",
    "irrelevant", "kinda", "kind", "literally", "long", "lovely", "nice", "normal", "pretty", "pronounced", "quite",
    "rare", "really", "secret", "short", "silly", "simple", "sort", "spelled", "spelt", "super", "too", "unimportant",
    "unusual", "very", "weird", "written",
})  # fmt: skip
_GREETING = r"^\W*(?i:(?:hi|hey|heya|hello|good \w+)(?: there)?\W+)"
# "Esteban here", "hello!! olga here" (a name after a greeting alone, "Hi Sia, ...", is most often the persona's)
_SIGNED = re.compile(_GREETING + r"?([^\W\d_]+)(?:\s+[^\W\d_]+)?\s+(?i:here)\b")
_NAMES_SELF = re.compile(r"(?:^|\W)(?:i'm|i’m|i am|my name is|my name's|my name’s|call me)\s*$", re.IGNORECASE)
_GIVES_NAME = re.compile(r"(?:^|\W)my name(?: is|'s|’s)\s*$", re.IGNORECASE)
# where a reply says what its speaker is or where it lives: the next word is the claim ("I'm just a", "I live in")
_CLAIMS_SELF = re.compile(
    r"(?:^|\W)(?:i'm|i’m|i am|i work as|i work in|i live in|i live near|i come from)"
    r"(?:\s+(?:a|an|the|your|just|also|only|actually|really|now|currently|from|in|based|here|living|working|as|one|of))*\s*$",
    re.IGNORECASE,
)


def _any_word(alternatives: str) -> re.Pattern[str]:
    """A pattern of any of ``alternatives`` (a regular expression's alternation) as a whole word, in any case."""
    return re.compile(rf"(?<![\w'’])(?:{alternatives})(?![\w'’])", re.IGNORECASE)


# the subject of a reply's clause where it speaks of its speaker ("I", "my", "we", "our"), of its listener ("you",
# "your"), and a denial ("I'm not a lawyer" says nothing the user is); and where a reply's clause begins
_FIRST_PERSON = _any_word(r"i|i['’](?:m|ve|d|ll)|my|mine|myself|we|we['’](?:re|ve|d|ll)|our|ours|ourselves")
_SECOND_PERSON = _any_word(r"you|you['’](?:re|ve|d|ll)|your|yours|yourself")
# a clause with none of these after "and" goes on the one before it ("I'm a brilliant and talented civil engineer")
_ANY_PERSON = _any_word(
    r"i|i['’](?:m|ve|d|ll)|my|me|we|we['’](?:re|ve|d|ll)|our|us|you|you['’](?:re|ve|d|ll)|your|he|he['’]s|she|she['’]s"
    r"|it|it['’]s|its|they|they['’]re|their|them|his|her|this|that|there"
)
_DENIED = re.compile(r"(?<![\w'’])(?:not|never|no)(?![\w'’])|n['’]t(?![\w'’])", re.IGNORECASE)
# words after which a clause says what its speaker thinks or feels of something, not what it is ("I think Lisbon is",
# "I'd love to hear about", "I'm glad to see")
_OPINION = _any_word(
    r"think|thought|believe|hope|know|knew|guess|bet|imagine|wonder|remember|recall|see|saw|hear|heard|feel|felt|find|"
    r"found|agree|love|loved|like|liked|adore|enjoy|enjoyed|admire|understand|mean|wish|want|wanted|glad|happy|excited|"
    r"delighted|thrilled|sorry|curious|interested|fascinated|pleased|honoured|honored|sure|afraid"
)
# "I'm your trusty pilot" says what its speaker is: that "your" frees nothing
_BEING_YOURS = re.compile(
    r"^(?:\s+am)?(?:\s+(?:just|also|only|really|actually|now|truly|always))*\s+your(?![\w'’])", re.IGNORECASE
)
# what ends a reply's clause, kept by the split: the clauses and the marks between them in one pass
_REPLY_CLAUSE = re.compile(r"([.!?;:,\n()]|(?<![\w'’])(?:and|but|so|because)(?![\w'’]))", re.IGNORECASE)
# a clause set beside the name its speaker just gave ("I am Sia, the electrician of "): it says what the speaker is
_BESIDE_OWN_NAME = re.compile(
    r"(?<![\w'’])(?:i['’]m|i am)\s+[A-Z][\w'’-]*\s*,\s+(?:a|an|the)(?![\w'’])[^.!?;:,\n()]*$", re.IGNORECASE
)
_SENTENCES = re.compile(r"(?<=[.!?])\s+")
_PLACED = re.compile(r"(?i:\b(?:in|from|near|at|around|outside)\s+)([^\W\d_]+)")
# a message's clauses: what lies between marks, "and" and "but"
_CLAUSES = re.compile(r"[.,;:!?()]|\b(?:and|but)\b", re.IGNORECASE)
# a clause whose subject is the user: what follows its "I", "I'm" or "my"
_OWN_CLAUSE = re.compile(r"(?i:(?:^|\W)(?:i'm|i’m|i am|i've|i’ve|i|my)\b)(.*)")
_APPOSITION = re.compile(r"^\s*(?i:an?)\s")  # "I'm Lukas, a music teacher in Graz": the clause after goes on it
# words of such a clause that say nothing of who the user is, or that a reply says of itself anyway ("I'm glad")
_COMMON_WORDS = (
    "a an the and but or so to of in on at by for from with near into over as about than then this that these "
    "those am is are was were be been being have has had do does did will would can could just also really very "
    "too quite now here there where when what who which how all some any much many lot lots bit little big new "
    "old good great glad happy sorry delighted thrilled excited pleased sure afraid fine well ready curious "
    "interested looking going doing trying getting living working based work live called named name years year "
    "every day week month last since like love not never always still usually currently actually only one two "
    "three me my mine you your it its they them their our we us he she him his her hello hey hi nice meet"
)
_COMMON = frozenset(_COMMON_WORDS.split())


def user_names(message: str) -> list[str]:
    """The names the user gives as their own in ``message``, in order, each once (not a word in capitals where the
    message has lower-case letters too: "my budgie learned my name and i'm SCREAMING")."""
    given = [(m.start(1), m.group(1)) for m in _GIVEN.finditer(message)]
    plain = [(m.start(1), m.group(1)) for m in _GIVEN_PLAIN.finditer(message) if m.group(1).lower() not in _OF_A_NAME]
    found = [name for _, name in sorted(given + plain)]
    signed = _SIGNED.match(message)
    if signed is not None:
        found.append(signed.group(1))
    # a word in capitals in a message written in lower case is shouted, not a name ("i'm SCREAMING")
    mixed = any(c.islower() for c in message)
    return [
        name for name in dict.fromkeys(found) if name.lower() not in ENGLISH and not (mixed and len(name) > 1 and name.isupper())
    ]


# how a reply to a message in which the user gives their name and asks nothing opens (``greeting``): the greeting, then a
# question back, begun, which the model finishes ("How are you doing?", "How are you today?"); such a reply ends with
# that question, its second sentence (GREETING_SENTENCES). Left to go on after the greeting, the backbone spoke as if it
# stood where the user does ("Welcome to my lovely city.", "What brings you to my shop today?"); begun "How are", it
# asked after what the user had said, "How are things with your cat?", and as well "How are things with your dog?" of
# one that had just died: "How are you" asks after the user alone
GREETING_OPENING = "Nice to meet you, {name}! How are you"
GREETING_SENTENCES = 2


def greeting(message: str) -> str:
    """The opening of a reply to ``message`` where the user gives their name in it (``user_names``) and asks the
    persona nothing (``sia.model.language.asks``): "Nice to meet you, Kim! How are you" for "Hi! I'm Kim, I work for
    Deloitte in Leeds." (GREETING_OPENING), greeting by the last name given ("I'm Katarzyna, but everyone calls me
    Kasia": Kasia), its first letter capitalised ("olga here": Olga); "" for every other message."""
    names = user_names(message)
    if not names or asks(message):
        return ""
    name = names[-1]
    return GREETING_OPENING.format(name=name[:1].upper() + name[1:])


def user_roles(message: str) -> list[str]:
    """The words the user says of themself in ``message``: those of its clauses whose subject is "I" or "my", and of a
    clause that opens with "a" or "an" right after one ("I'm Lukas, a music teacher"), but the common ones, in order,
    each once: "I'm a firefighter in Valencia and I love the sea" gives firefighter, Valencia, sea."""
    found: list[str] = []
    own = False
    for clause in _CLAUSES.split(message):
        m = _OWN_CLAUSE.search(clause)
        if m is not None or (own and _APPOSITION.match(clause)):
            found += re.findall(r"[^\W\d_]+", clause if m is None else m.group(1))
            own = True
        elif clause.strip():
            own = False
    return [w for w in dict.fromkeys(found) if len(w) > 2 and w.lower() not in _COMMON]


def told_roles(message: str) -> list[str]:
    """``user_roles`` of the sentences of ``message`` that tell rather than ask: "How can I use my phone less?" says
    nothing of who its writer is, and an answer may well say "I use my phone...". "I'm Matteo, a barista in Turin. What's
    up?" still tells in its first sentence."""
    told = [part for part in _SENTENCES.split(message) if not part.rstrip().endswith("?")]
    return user_roles(" ".join(told))


def doings(message: str) -> list[str]:
    """The words of ``told_roles`` that say what the user does rather than who or where they are: written in lower case
    (a name or a city is capitalised) and not right after "in", "from", "near", "at", "around" or "outside" (where one
    typed in lower case is a place: "i'm a nurse in lisbon" gives nurse)."""
    placed = {m.group(1).lower() for m in _PLACED.finditer(message)}
    return [w for w in told_roles(message) if not w[:1].isupper() and w.lower() not in placed]


def claims_self(text: str) -> bool:
    """Whether a reply so far ends where its speaker says what it is or where it lives ("I'm a", "i live in ")."""
    return _CLAIMS_SELF.search(text) is not None


def speaks_of_self(text: str) -> bool:
    """Whether a reply so far ends in a clause that says what its speaker is, does or has: the clause (after the last
    mark, "and", "but", "so" or "because") has "I", "I've", "my", "we" or "our", and after the last of them no "you"
    or "your" (but "I'm your"), no denial and no word of opinion or feeling ("think", "love", "glad"). "and i grow ",
    "I've just arrived from ", "welcome to my ", "I'm your trusty " are; "I'm glad you're enjoying your ", "I'm not a ",
    "I think ", "tell me about " are not; nor is a clause without them, but one set beside the name the speaker just gave
    ("I am Sia, the electrician of "). A clause after "and" that has begun and names no one goes on the clause before
    it: "I'm a brilliant and talented " says what the speaker is, as "I'm a brilliant " does ("I'm a chef and " has
    not begun: the next words may speak of another)."""
    parts = _REPLY_CLAUSE.split(text)
    clauses, marks = parts[0::2], parts[1::2]
    clause = clauses[-1]
    at = len(clauses) - 1
    while at and marks[at - 1].lower() == "and" and re.search(r"\w", clause) and not _ANY_PERSON.search(clause):
        at -= 1
        clause = clauses[at] + marks[at] + clause
    subjects = list(_FIRST_PERSON.finditer(clause))
    if subjects:
        last = subjects[-1]
        after = clause[last.end() :]
        if last.group().lower() in ("i", "i'm", "i’m"):
            after = _BEING_YOURS.sub("", after, count=1)
    elif _BESIDE_OWN_NAME.search(text):  # "I am Sia, the electrician of ": the clause beside the speaker's name
        after = clause
    else:
        return False
    return not any(rule.search(after) for rule in (_SECOND_PERSON, _DENIED, _OPINION))


def names_self(text: str) -> bool:
    """Whether a reply so far ends where its speaker's name comes next ("Hello! I'm", "my name is ")."""
    return _NAMES_SELF.search(text) is not None


def gives_name(text: str) -> bool:
    """Whether a reply so far ends where its speaker's name must come next ("Good evening, my name is")."""
    return _GIVES_NAME.search(text) is not None


def own_name(speaker: str) -> str:
    """A persona's name as a reply writes it: ``speaker`` ("marlow") capitalised."""
    return speaker[:1].upper() + speaker[1:]


def name_starts(tok: Tokenizer, names: list[str]) -> list[int]:
    """The tokens that begin ``names`` (capitalised as written or in lower case): the first token of each spelling
    (after a space or not; a first token that is only white space is not one of them: a byte tokenizer writes " Ana"
    as " " + "A" + ...), and every token whose letters (after its white space) are a start of one, but a common English
    word: the tokenizer spells " catarina" as " catar" + "ina" and as " cat" + "ar" + "ina"; " in" of "Ingrid" stays."""
    starts: set[int] = set()
    pieces = spellings(tok)
    for name in names:
        for form in {name, name.lower()}:
            for text in (" " + form, form):
                ids = tok.encode(text)
                first = next((t for t in ids if tok.decode([t]).strip()), None)
                if first is not None:
                    starts.add(first)
            for end in range(1, len(form) + 1):
                if end == len(form) or form[:end].lower() not in ENGLISH:
                    starts |= pieces.get(form[:end], frozenset())
    return sorted(starts)


_SPELLINGS: weakref.WeakKeyDictionary[Tokenizer, dict[str, frozenset[int]]] = weakref.WeakKeyDictionary()


def spellings(tok: Tokenizer) -> dict[str, frozenset[int]]:
    """The tokens of ``tok`` that are letters only after their white space (" Cat", "cat"), by those letters as
    written; computed once per tokenizer."""
    found = _SPELLINGS.get(tok)
    if found is None:
        by_text: dict[str, set[int]] = {}
        for i in range(tok.vocab_size):
            raw = tok.token_bytes(i)
            text = "" if raw is None else raw.decode("utf-8", "ignore").lstrip()
            if text and text.isalpha():
                by_text.setdefault(text, set()).add(i)
        found = {text: frozenset(ids) for text, ids in by_text.items()}
        _SPELLINGS[tok] = found
    return found


_CAPITAL_STARTS: weakref.WeakKeyDictionary[Tokenizer, frozenset[int]] = weakref.WeakKeyDictionary()
_CONTINUATIONS: weakref.WeakKeyDictionary[Tokenizer, frozenset[int]] = weakref.WeakKeyDictionary()
_OTHERS: weakref.WeakKeyDictionary[Tokenizer, dict[str, frozenset[int]]] = weakref.WeakKeyDictionary()  # per speaker


def capital_starts(tok: Tokenizer) -> frozenset[int]:
    """The tokens of ``tok`` that begin a capitalised word: their text, after any white space, opens with an upper-case
    letter (" Antonio", "El", " I"). Computed once per tokenizer."""
    found = _CAPITAL_STARTS.get(tok)
    if found is None:
        found = frozenset(i for i in range(tok.vocab_size) if (text := _text(tok, i)) and text[0].isupper())
        _CAPITAL_STARTS[tok] = found
    return found


def continuations(tok: Tokenizer) -> frozenset[int]:
    """The tokens of ``tok`` that go on a word rather than begin one: their first byte is a letter, a digit or a byte
    beyond ASCII (a piece of a character); computed once per tokenizer."""
    found = _CONTINUATIONS.get(tok)
    if found is None:
        found = frozenset(
            i for i in range(tok.vocab_size) if (head := tok.token_bytes(i)) and (head[0] >= 0x80 or chr(head[0]).isalnum())
        )
        _CONTINUATIONS[tok] = found
    return found


def other_names(tok: Tokenizer, speaker: str, users: list[str]) -> list[int]:
    """The tokens a reply of the persona named ``speaker`` may not say right after "I'm" (``names_self``): those that
    begin a capitalised word, except the ones that begin ``speaker`` capitalised (a persona is named "marlow": " Mar",
    " Marl" and " Marlow" may come), and those that begin a name the user gave (``users``, in any case), but where they
    may begin the persona's own name too (Pippa's " Pip" stays pip's; ``completions`` keeps "pa" from following)."""
    others = _OTHERS.setdefault(tok, {})
    if speaker not in others:
        name = own_name(speaker)
        capitals = capital_starts(tok)
        others[speaker] = capitals - {i for i in capitals if name and _begins(_text(tok, i), name)}
    return sorted(others[speaker] | set(role_starts(tok, users, speaker)))


def role_starts(tok: Tokenizer, roles: list[str], speaker: str) -> list[int]:
    """The tokens a reply of the persona named ``speaker`` may not say right after "I'm a" (``claims_self``): those that
    begin a word the user said of themself (``user_roles``), but those that may begin the persona's own name (" Mar" of
    "Marseille" begins "Marlow" too)."""
    name = own_name(speaker)
    return [i for i in name_starts(tok, roles) if not any(_begins(_text(tok, i), form) for form in (name, name.lower()))]


_LEADS: weakref.WeakKeyDictionary[Tokenizer, dict[str, frozenset[int]]] = weakref.WeakKeyDictionary()


def leads(tok: Tokenizer) -> dict[str, frozenset[int]]:
    """The tokens of ``tok`` that go on a word (a letter first), by their leading letters in lower case ("arina," and
    "Arina" under "arina"); computed once per tokenizer."""
    found = _LEADS.get(tok)
    if found is None:
        by_lead: dict[str, set[int]] = {}
        for i in range(tok.vocab_size):
            raw = tok.token_bytes(i)
            lead = leading_letters("" if raw is None else raw.decode("utf-8", "ignore"))
            if lead:
                by_lead.setdefault(lead, set()).add(i)
        found = {lead: frozenset(ids) for lead, ids in by_lead.items()}
        _LEADS[tok] = found
    return found


def completions(tok: Tokenizer, word: str, targets: list[str], speaker: str) -> list[int]:
    """The tokens that would take ``word``, the letters of the word a reply is writing (lower case), further into one
    of ``targets`` (any case) or to its end: "cat" + "ar" or + "arina" into "Catarina". Left out: a piece after which
    the word so far is a common English word other than the target ("a" + "n"), and one after which it is a start
    of the persona's own name (``speaker``), so that a persona still says its name."""
    index, own = leads(tok), own_name(speaker).lower()
    ids: set[int] = set()
    for target in targets:
        whole = target.lower()
        if len(word) >= len(whole) or not whole.startswith(word):
            continue
        for end in range(len(word) + 1, len(whole) + 1):
            start = whole[:end]
            if (start in ENGLISH and start != whole) or (own and own.startswith(start)):
                continue
            ids |= index.get(whole[len(word) : end], frozenset())
    return sorted(ids)


def off_own_name(tok: Tokenizer, word: str, speaker: str) -> list[int]:
    """Where the word a reply writes right after "I'm" is a capitalised start of the persona's own name (``word``, as
    written: "Mar" for marlow), the tokens that would take it anywhere but further along that name: every token that
    goes on a word (``continuations``) but those whose leading letters go on the name ("low", "low,") or none; once the
    name is whole, every token that goes on a word. Only the starts of its own name may follow "I'm" (``other_names``),
    and the backbone went on them into other names ("I'm Mar" + "iolle" told by a Marisol)."""
    own = own_name(speaker).lower()
    start = word.lower()
    if not word[:1].isupper() or not start or not own.startswith(start):
        return []
    if start == own:  # the whole name: it ends there ("Marlow", not "Marlowe")
        return sorted(continuations(tok))
    index = leads(tok)
    along = set().union(*(index.get(own[len(start) : end], frozenset()) for end in range(len(start) + 1, len(own) + 1)))
    return sorted(continuations(tok) - along)


def _text(tok: Tokenizer, i: int) -> str:
    raw = tok.token_bytes(i)
    return "" if raw is None else raw.decode("utf-8", "ignore").lstrip()


def _begins(piece: str, name: str) -> bool:
    """Whether a token's text ``piece`` can begin ``name``: a start of it ("Mar"), or the whole name and what follows
    it ("Marlow," as one token)."""
    return bool(piece) and (name.startswith(piece) or (piece.startswith(name) and not piece[len(name) :][:1].isalpha()))
