"""Whether a reply keeps to its user's language (the decoder's rule for the first word of a reply to English), and
whether a message speaks of the persona rather than of its writer (the imprint's rule for whom a question asks about).

The bundled backbone answers an introduction that names a foreign person or place in that place's language ("Hi! I'm
Ana Kowalski, I live in Lisbon" -> "Eu estes ao Ana Kowalski, sistema de uma criatura..."), and the reply's first
token decides it: decoded again without that token, the reply is English (``experiments/probes``'s
``introduction_language``). No list of first tokens can be banned beforehand: the tokenizer writes "Eu" as "E" + "u"
and "Nice" as "N" + "ice". So the decoder reads the reply's first *word* once it is whole, and takes the reply back
when that word is another language's (``ReplyDecoder``). The rule here is that judgement, deliberately narrow: it
speaks of English only, since that is the language whose words it knows.

* A message is **English** when its letters are mostly ASCII and it holds no more of the other languages' common
  words than English ones ("Olá! Just kidding, I speak English" is English; "Olá, eu sou a Ana" is not).
* A reply's first word is **foreign** when the user did not write it ("Este es mi perro" may be answered "Este"), it
  is not a common English word ("a", "me", "no" belong to both), and it is either a word that begins a sentence in
  another language ("Eu", "Este", "Je", "Das") or holds a letter outside ASCII ("Ouémão", "Zdravím": the backbone's
  openers of a reply in Portuguese or Czech). A greeting is no sign ("Bonjour, welcome to Lyon" goes on in English).
  A name with an accent that the user wrote in an earlier turn ("José") can be taken for one; the reply begun again
  then names it after its first word ("Your name is José").
* A greeting that goes on in its language is caught by the words after it: a reply **opens** in another language when
  its first word is foreign or one of the next ``OPENING_WORDS - 1`` is ("Zurich, das ist ein heiße Buch.", "O que
  não é muito", "Gracias a la manera de esto"). A word after the first counts where it is written in lower case (or
  opens a sentence) and is one of those languages' common words, or is lower case with a letter outside ASCII; a name
  ("Los Angeles", "José") does not count, nor a particle inside one ("Rio de Janeiro": the word after it is
  capitalised), nor English words spelt with an accent ("a café"; ``LOANS``), nor the second word of a greeting
  ("Bien sûr, I'd say it's Paris": ``GREETINGS``). A reply that opens with a common English
  word ("The", "I", "Oh": ``OPENERS``) is English from there (``english_opener``): only the others wait for their next
  words before they are shown.
* A message speaks **of the persona** when it says "you" (or "your", "yourself", "u") and nothing of its writer ("I",
  "my", "me", "we"): "What's your name?", "Where do you live?", "Tell me about yourself" ask the persona, whatever
  kind's word they hold, and "Can you recommend a film?" is a request put to it; neither is answered from what the
  user told (``of_the_persona``). A request's "tell me" or "give me" is no word of the writer's; "who's talking to
  you?" is (the writer is the one talking).
* A question about a kind of fact the user **never told** (the imprint holds nothing of that kind) is answered by
  saying so, in the persona's form: "I don't think you've told me your favourite colour. What is it?" (``untold_reply``;
  which kinds, and how the imprint decides, in ``sia.identity.imprint.ImprintEntries.untold``). The kind tagger leaves
  some clauses unlabelled ("lilac is everything to me", "but honestly now it's green"), so where the imprint keeps the
  text of a span naming a word of the kind's own (``KIND_WORDS``: the colours' names) the persona does not claim it
  was never told, and the read answers (``names_kind``).
* A question about a kind of fact whose value people tell as a clause of their own (a job: "I restore pipe organs", a
  hobby: "I turn bowls on a lathe") is answered by saying that clause back: the reply opens ``ECHO_OPENING`` ("You told
  me you") and the read goes on with the user's verb ("restore pipe organs"), where a reply of its own would name a
  noun it makes up ("You're a hard-working church worker"; which kinds: config.imprint_echo, and the imprint's rule:
  ``sia.identity.imprint.ImprintEntries.echoed``).
* A message that asks what the persona knows of its writer **as a whole** ("What do you know about me?", "What have I
  told you so far?", "Tell me about myself") is answered with what the user told of their facts, in their own words,
  quoted: "You've told me: “I'm Ana Kowalski”, “I live in Lisbon” and “I have a cat”." (``about_the_user``,
  ``recollection_reply``; which clauses: ``sia.identity.imprint.Imprint.recollection``). A reply of the model's own
  names one fact at most.
* ``OPEN_WORDS`` are the English words a sentence does not end on ("in", "a", "with", "is"): a reply's word limit
  waits past them before it pulls the sentence's end (``ReplyDecoder``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "ECHO_LEAN_KINDS",
    "ECHO_OPENING",
    "GREETINGS",
    "KIND_WORDS",
    "LOANS",
    "OPENERS",
    "OPENING_WORDS",
    "OPEN_WORDS",
    "UNTOLD",
    "about_the_user",
    "asked_parts",
    "asks",
    "english",
    "english_opener",
    "foreign_opening",
    "message_words",
    "names_kind",
    "of_the_persona",
    "recollection_reply",
    "spoken_clause",
    "untold_reply",
]

WORD = re.compile(r"[^\W\d_]+")  # a run of letters
NON_ASCII_SHARE = 0.5  # a message whose letters are more than this share outside ASCII is not English


def _listed(words: str) -> frozenset[str]:
    return frozenset(words.split())


# common English words that another language shares or nearly shares ("a", "in", "no", "me"): never foreign
ENGLISH = _listed(
    "a about after all also am an and any are as at be because been but by can could did do does for from had has have "
    "he her here hi him his how i if in into is it its just like may me more my no not of oh ok on one or our out she "
    "so some than that the their them then there these they this to up was we were what when which who will with "
    "would yes you your"
)
# English words a sentence does not end on (articles, determiners, conjunctions, prepositions, auxiliaries): a word
# limit pulls no sentence's end right after one ("that can be found in." / "known as a.", ``sia.model.generate``)
OPEN_WORDS = _listed(
    "a an the my your his our their its this these those every each some any and or but nor because if than as of in "
    "on at to for with from by into onto about over under through between among without within across toward towards "
    "is are was were am be been being has have had can could will would should shall may might must very quite rather "
    "such who which whose whom"
)
# words that begin or hold together a sentence in Portuguese, Spanish, French, Italian, German, Dutch, Polish or Czech
# (pronouns, articles, verbs of being, prepositions, conjunctions). Greetings are not among them: a persona may well
# open "Bonjour, welcome to Lyon" or "Hola, amigo!" and go on in English, and does
FOREIGN = _listed(
    "ao aos aquí às auch avec como das de del della dem der des det die é ein eine el ela ele elle em es está estamos "
    "estas este estes esto estou estoy et eu für ich ihr il ist je jsem la las le les los mais más mas meu minha moi "
    "mon nos nossa nosso nous para pero por que qué qui ser si sí sie sim sono sou soy sua suis também tu uma un una "
    "und une você vous wir"
)

# the words after a reply's first judged as the first is (``foreign_opening``): English's own "die" aside
FOREIGN_LATER = FOREIGN - {"die"}
# English words spelt with a letter outside ASCII: no sign of another language after a reply's first word
LOANS = _listed(
    "café cafés naïve naïvely naïveté résumé résumés fiancé fiancée façade façades déjà crème brûlée jalapeño jalapeños "
    "piñata piñatas entrée entrées décor cliché clichés sauté sautéed soufflé protégé rosé touché doppelgänger über"
)
# greetings and courtesies of two words that a reply in English may open with ("Bien sûr, I'd say it's Paris."): their
# second word is no sign of another language (a third word still is: "Bien sûr, das ist…")
GREETINGS = frozenset(
    tuple(phrase.split())
    for phrase in (
        "bien sûr",
        "bon appétit",
        "bon voyage",
        "très bien",
        "buenos días",
        "buenas tardes",
        "buenas noches",
        "muchas gracias",
        "muito obrigado",
        "muito obrigada",
        "bom dia",
    )
)
OPENING_WORDS = 3  # a reply's words judged for its language (``foreign_opening``)
# the English words most replies open with: a reply that opens with one is English from its first word, so nothing
# after it is held back (``english_opener``); a reply opening otherwise ("Zurich,", "Gracias", "O") is held until its
# opening is judged
OPENERS = (
    ENGLISH
    | OPEN_WORDS
    | _listed(
        "absolutely ah aha alright amazing aw aww awesome certainly dear double good great half hello hey hmm indeed "
        "let minus nice no oh okay please plus sorry sure thank thanks there those times today two three four five "
        "six seven eight nine ten well welcome what why wow yes yeah"
    )
)


def message_words(text: str) -> frozenset[str]:
    """The words of ``text``, lower-cased: what a reply may echo without being foreign."""
    return frozenset(w.lower() for w in WORD.findall(text))


def english(text: str) -> bool:
    """Whether a message reads as English: letters mostly ASCII, and no more common words of the other languages than
    of English (a message with no words of either, "hi" or "ok?", is English)."""
    letters = [c for c in text if c.isalpha()]
    if letters and sum(not c.isascii() for c in letters) / len(letters) > NON_ASCII_SHARE:
        return False
    said = [w.lower() for w in WORD.findall(text)]
    return sum(w in FOREIGN for w in said) <= sum(w in ENGLISH for w in said)


def _first_foreign(word: str, user_words: frozenset[str]) -> bool:
    w = word.lower()
    return (w in FOREIGN or not w.isascii()) and w not in user_words and w not in ENGLISH


def _later_foreign(word: str, user_words: frozenset[str], opens_sentence: bool, before_name: bool) -> bool:
    w = word.lower()
    if w in user_words or w in ENGLISH or w in LOANS:
        return False
    lower = word == w
    if w in FOREIGN_LATER:
        return (lower and not before_name) or opens_sentence  # "Rio de Janeiro", "Welcome to Los Angeles" are names
    return lower and not w.isascii()  # "heiße", "não"; not "José" nor "Zürich"


def english_opener(word: str) -> bool:
    """Whether a reply whose first word is ``word`` opens in English beyond doubt (``OPENERS``: "The", "I", "Oh",
    "Welcome"), so that its next words need no judging."""
    return word.lower() in OPENERS


def foreign_opening(opening: str, user_words: frozenset[str] = frozenset(), *, ended: bool = False) -> bool:
    """Whether a reply to an English message opens in another language: ``opening`` is the reply so far, at least its
    first word, which is judged whole. Of the next words up to the OPENING_WORDS-th, a word is judged once the word after
    it has begun (its case tells a name's particle), or where ``ended`` (the reply ends with ``opening``).
    ``user_words``: the message's words (``message_words``), which a reply may echo."""
    found = list(WORD.finditer(opening))[: OPENING_WORDS + 1]
    if not found:
        return False
    if _first_foreign(found[0].group(), user_words):
        return True
    greeted = len(found) > 1 and (found[0].group().lower(), found[1].group().lower()) in GREETINGS
    for i in range(2 if greeted else 1, min(len(found), OPENING_WORDS)):
        word, nxt = found[i], found[i + 1] if i + 1 < len(found) else None
        if nxt is None and not ended:
            break  # the next word's case is not known yet (the word may not even be whole)
        before = opening[: word.start()].rstrip()
        opens_sentence = bool(before) and before[-1] in ".!?…"
        before_name = nxt is not None and nxt.group()[:1].isupper()
        if _later_foreign(word.group(), user_words, opens_sentence, before_name):
            return True
    return False


# the second person, and the words by which a message's writer speaks of themself (or of a "we" they belong to)
SECOND_PERSON = _listed("you your yours yourself yourselves u ur ya you're youre you've you'd you'll")
FIRST_PERSON = _listed("i i'm im i've ive i'd i'll my mine myself me we we're our ours ourselves us")
# a request's "me" is its addressee ("tell me about yourself"); the one "talking to you", or whom "you're talking
# to", is the writer
_REQUEST_ME = re.compile(r"\b(?:tell|give|show|let|send|teach)\s+me\b")
_TALKING = r"(?:talk|speak|chat|writ|typ|messag|text)\w*"
_THE_WRITER = re.compile(rf"\b{_TALKING}\s+(?:to|with)\s+(?:you|u)\b|\b(?:you|u)(?:'re|\s+are)?\s+{_TALKING}\s+(?:to|with)\b")


def of_the_persona(text: str) -> bool:
    """Whether a message speaks of the persona it is sent to and not of its writer: a second-person word and no
    first-person one, a request's "tell me" aside ("What's your name?", "Tell me about yourself."; not "Do you remember
    my name?", nor "Who's talking to you?", nor "Do you know who you're talking to?")."""
    lowered = text.lower().replace("\u2019", "'")
    if _THE_WRITER.search(lowered):
        return False
    said = [w.strip("'") for w in re.findall(r"[a-z']+", _REQUEST_ME.sub(" ", lowered))]  # "'you'" is "you"
    return any(w in SECOND_PERSON for w in said) and not any(w in FIRST_PERSON for w in said)


# the words a question or a request opens with ("what's my name", "remind me where I live", "name the town I work in",
# "guess my colour"); an auxiliary verb opens one only before its subject ("do you remember", not "had a long day"),
# "where" and "when" only before an auxiliary ("where do I live", not "when I'm not working")
_OPENERS = _listed(
    "what what's whats why how how's hows which who who's whos whom whose where's wheres when's whens tell "
    "explain give recommend suggest describe list show teach write remind guess name say pick choose recall repeat spell "
    "quiz test any"
)
_WHERE = _listed("where when")
# a question inside a sentence: a question word, at most two words, an auxiliary and its subject ("if u got me a shirt
# what colour should it be"; not "in Lyon, where the food is great")
_EMBEDDED = re.compile(
    r"\b(?:what|which|who|where|when|why|how)(?: [a-z']+){0,2} "
    r"(?:is|are|am|was|were|do|does|did|can|could|would|should|will|shall) (?:i|you|u|we|they|he|she|it|my|your|there)\b"
)
_AUXILIARIES = _listed("is are am was were do does did have has had can could would should will shall may might must")
_SUBJECTS = _listed("i you u ya we they he she it my your there this that these those anyone anybody someone somebody everyone")
# what a sentence may open with before its question ("ok so what's my name", "wait whats my name lol", "go on, say it")
_INTERJECTIONS = _listed("ok okay so wait hey heyy hi hello oh well and but alright right lol hmm um uh now then go on")
_RECALLING = re.compile(
    r"\b(?:you|u|ya)\s+(?:still\s+)?(?:remember|recall)\b|\bremember\s+(?:my|me|what|where|who|when|how|which)\b"
)


def asks(text: str) -> bool:
    """Whether a message asks the persona something: it holds a question mark, asks whether the persona remembers
    ("you remember my name", "remember where I live"), or one of its sentences opens, after any interjection ("ok
    so", "wait", "go on,"), with a question word or a request ("what's my name", "name the town I work in", "guess my
    colour") or with an auxiliary verb before its subject ("do you know", "is it"), or holds a question after a
    condition ("if u got me a shirt what colour should it be"). A message that asks nothing tells: "On weekends I go
    bouldering with my sister.", "I moved to York last month." Read widely: what it calls a question, the imprint may
    answer (``sia.model.identity_model``)."""
    if "?" in text:
        return True
    lowered = text.lower().replace("\u2019", "'")
    if _RECALLING.search(lowered):
        return True
    for part in re.split(r"[.!;:\n…]+", lowered):  # a sentence, not a clause: ", which I love" asks nothing
        words = re.findall(r"[a-z']+", part)
        while words and words[0] in _INTERJECTIONS:
            words.pop(0)
        first, then = [*words, "", ""][:2]
        if first in _OPENERS or (first in _AUXILIARIES and then in _SUBJECTS) or (first in _WHERE and then in _AUXILIARIES):
            return True
        if _EMBEDDED.search(" ".join(words)):
            return True
    return False


# per kind of fact: what the user has not told, and the question that asks for it (``untold_reply``)
UNTOLD = {
    "name": ("your name", "What is it?"),
    "city": ("where you live", "Where is home?"),
    "job": ("what you do for a living", "What do you do?"),
    "colour": ("your favourite colour", "What is it?"),
    "pet": ("about a pet", "Do you have one?"),
    "hobby": ("what you like to do for fun", "What do you enjoy?"),
}
# how a reply that says back the user's own clause opens (``ReplyDecoder``)
ECHO_OPENING = "You told me you"
# the kinds whose echo leans to the user's own words after "I" ("You told me you fix cars", not "... work as a
# car-fixer"): a job's; a hobby's or a pet's echo leaning so took the words of other clauses ("you commute to")
ECHO_LEAN_KINDS = ("job",)
_AMERICAN = re.compile(r"\b(?:colors?|favorite)\b", re.IGNORECASE)


def untold_reply(kind: str, message: str, *, address: str = "", exclaim: bool = False) -> str:
    """The reply to ``message``, a question about a ``kind`` of fact (a key of ``UNTOLD``) that the user never told: it
    says so and asks ("I don't think you've told me your favourite colour. What is it?"), spelt as the message spells
    "colour", its first sentence closed with the persona's form of address (", sir") and, with ``exclaim``, an
    exclamation mark. ValueError for a kind without such a reply."""
    if kind not in UNTOLD:
        raise ValueError(f"no reply for an untold {kind!r}; kinds: {sorted(UNTOLD)}")
    what, question = UNTOLD[kind]
    if kind == "colour" and _AMERICAN.search(message):
        what = "your favorite color"
    return f"I don't think you've told me {what}{address}{'!' if exclaim else '.'} {question}"


# the words that name a value of a closed kind of fact, where the kind has them: a span holding one may state that kind
# whatever the tagger's label. The colours leave out the names that are as often something else ("rose", "ruby",
# "amber", "olive", "honey", "salmon", "lime", "gold"): a user called Ruby who never told a colour is still told so
KIND_WORDS: dict[str, frozenset[str]] = {
    "colour": _listed(
        "red orange yellow green blue purple violet indigo pink brown black white grey gray teal turquoise aqua cyan "
        "magenta maroon burgundy crimson scarlet ochre ocher mustard lilac lavender mauve beige khaki emerald navy "
        "cobalt azure cerulean sapphire periwinkle cornflower coral apricot terracotta fuchsia fuschia claret ivory "
        "charcoal taupe chartreuse vermilion sienna umber sepia tangerine marigold ultramarine aubergine eggplant "
        "magnolia oxblood cerise puce vermillion greige"
    ),
    # the animals people keep, with the breeds they name them by; a word that is as often something else keeps the
    # untold reply away where it is said (a shepherd by trade, "chicken" for dinner): it only costs a question caught
    "pet": _listed(
        "pet pets cat cats kitten kittens kitty moggy dog dogs puppy puppies pup pups doggo hound hounds mutt rabbit "
        "rabbits bunny bunnies hamster hamsters gerbil gerbils guinea pig pigs piglet mouse mice rat rats ferret ferrets "
        "chinchilla chinchillas hedgehog hedgehogs degu degus parrot parrots parakeet parakeets budgie budgies "
        "budgerigar cockatiel cockatiels cockatoo cockatoos canary canaries finch finches lovebird lovebirds macaw "
        "macaws bird birds chicken chickens hen hens rooster duck ducks goose geese pigeon pigeons dove doves sparrow "
        "quail peacock fish goldfish guppy guppies betta koi tetra tetras axolotl axolotls tortoise tortoises turtle "
        "turtles terrapin lizard lizards gecko geckos iguana chameleon dragon snake snakes python boa frog frogs toad "
        "tarantula spider scorpion snail snails crab crabs shrimp horse horses pony ponies donkey donkeys mule goat "
        "goats sheep lamb cow cows calf alpaca alpacas llama llamas camel labrador retriever spaniel poodle terrier "
        "beagle dachshund collie corgi husky greyhound whippet pug bulldog chihuahua shepherd schnauzer pomeranian "
        "labradoodle cockapoo rottweiler boxer dalmatian mastiff setter pointer sheepdog siamese persian tabby sphynx "
        "ragdoll bengal"
    ),
}


def names_kind(kind: str, text: str) -> bool:
    """Whether ``text`` holds a word that names a value of ``kind`` (``KIND_WORDS``; False for a kind without such
    words): "lilac is everything to me" names a colour."""
    words = KIND_WORDS.get(kind)
    return words is not None and any(w in words for w in WORD.findall(text.lower()))


# "what do you know about me", "do you remember anything about me", "what have I told you so far", "tell me about myself"
_ABOUT_ME = re.compile(
    r"\b(?:you|u)\s+(?:know|remember|recall|learned|learnt|have\s+learned|have\s+learnt)\s+"
    r"(?:(?:so\s+far|anything|everything|much|all)\s+)?(?:about|of)\s+(?:me|myself)\b"
    r"|\bwhat\s+(?:have|did)\s+i\s+(?:told|tell)\s+you(?:\s+so\s+far|\s+about\s+(?:me|myself))?\s*[?.!]*\s*$"
    r"|\btell\s+me\s+about\s+myself\b"
)
# what the persona knows of the user as the grounds of another question ("Which wool should I buy, based on what you
# know about me?"): that question asks for one fact, which the read answers
_GROUNDS = re.compile(r"\b(?:based\s+on|given|from|considering|using|with|by)\s+(?:what|all|everything)(?:\s+(?:do|did))?\s*$")


def about_the_user(text: str) -> bool:
    """Whether a message asks what the persona knows of its writer as a whole ("What do you know about me?", "Tell me
    what you remember about me.", "what have I told you so far?", "Tell me about myself"), not one fact of theirs ("What
    did I tell you about my job?"), nor what it says of them ("I want you to know about me that I hate mornings"), nor
    another question asked on those grounds ("Which wool should I buy, based on what you know about me?")."""
    lowered = " ".join(text.lower().replace("\u2019", "'").split())
    found = _ABOUT_ME.search(lowered)
    return found is not None and not _GROUNDS.search(lowered[: found.start()])


_LEADING = re.compile(r"^(?:(?:and|but|so|also|plus|or|oh|well|btw|anyway)\b[\s,]*)+", re.IGNORECASE)
_BREAK = re.compile(r"(?<=\w)[.!?…]+\s+")  # a sentence's end inside a clause ("Hi. I'm Ana")
_EDGES = " \t,;:.!?…-–—'\"“”‘’()"


def spoken_clause(text: str) -> str:
    """A clause the user wrote, as a reply quotes it: one line, its leading conjunction ("and I have a cat") and its
    edges' marks dropped, a sentence's end inside it a comma (the quote stays one sentence), double quotes single; ""
    where no letter is left, or where it opens by speaking to the persona ("You know my name, right?" tells it nothing
    of the user's)."""
    said = " ".join(text.split()).replace('"', "'").replace("“", "'").replace("”", "'")
    said = _BREAK.sub(", ", said.strip(_EDGES))
    said = _LEADING.sub("", said).strip(_EDGES)
    first = said.split(" ", 1)[0].lower().replace("\u2019", "'")
    return said if any(c.isalpha() for c in said) and first not in SECOND_PERSON else ""


_QUESTION_WORD = r"(?:what|what's|whats|where|where's|who|who's|which|how|when)"
# "What's my name and what do I do?": a question's second part after "and", opening with a question word
_SECOND_QUESTION = re.compile(rf",?\s+(?:and|&)\s+(?={_QUESTION_WORD}\b)", re.IGNORECASE)


def asked_parts(text: str) -> list[str]:
    """The questions a message joins with "and" ("What's my name and what do I do?" -> "What's my name", "what do I
    do?"), where each opens with a question word; [] for a message that asks one thing ("Where do I live and work?" asks
    one place)."""
    said = " ".join(text.replace("\u2019", "'").split())
    parts = [p.strip() for p in _SECOND_QUESTION.split(said)]
    if len(parts) < 2 or not all(re.match(rf"{_QUESTION_WORD}\b", p, re.IGNORECASE) for p in parts):
        return []
    return parts


def recollection_reply(clauses: Sequence[str], *, address: str = "", exclaim: bool = False) -> str:
    """The reply to a message asking what the persona knows of the user (``about_the_user``): the user's own clauses,
    quoted, in order, in one sentence closed by the persona's form of address (", sir") and, with ``exclaim``, an
    exclamation mark: "You've told me: “I'm Ana Kowalski”, “I live in Lisbon” and “I have a cat”." ValueError for no
    clause, or one that is not one printable line."""
    if not clauses:
        raise ValueError("a recollection needs at least one clause")
    for clause in clauses:
        if not clause or not clause.isprintable():
            raise ValueError(f"a recollected clause must be one printable line; got {clause!r}")
    quoted = [f"“{c}”" for c in clauses]
    listing = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"
    return f"You've told me: {listing}{address}{'!' if exclaim else '.'}"
