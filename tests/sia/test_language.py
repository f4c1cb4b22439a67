"""A reply keeps to its user's English (sia.model.language, ReplyDecoder): the first word of a reply is judged once
whole and its first OPENING_WORDS words once the next begins, and a reply that opens in another language is taken back
and begun again without its first token. And it never
gives the user's name as its speaker's (sia.model.naming), nor calls out its speaker's own name ("Sia, ...")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

import sia.model.generate as generate_module
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, reply_params
from sia.model.generate import (
    FIRST_WORD_RETRIES,
    OPENING_TOKENS,
    Generation,
    ReplyDecoder,
    SamplingParams,
    StreamEvent,
    generate,
    reply_events,
    stream,
)
from sia.model.language import (
    OPENING_WORDS,
    asks,
    english,
    english_opener,
    foreign_opening,
    message_words,
    of_the_persona,
)
from sia.model.naming import (
    capital_starts,
    claims_self,
    completions,
    continuations,
    doings,
    gives_name,
    greeting,
    name_starts,
    names_self,
    off_own_name,
    other_names,
    role_starts,
    speaks_of_self,
    told_roles,
    user_names,
    user_roles,
)
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer
from tests.conftest import random_state, tiny_config


@pytest.mark.parametrize(
    ("message", "is_english"),
    [
        ("Hi! I'm Ana Kowalski, I live in Lisbon and I work as a nurse.", True),
        ("hey, I'm Lucía, I teach primary school in Seville", True),
        ("Olá! Just kidding, I speak English. I'm João, a lawyer from Porto Alegre.", True),
        ("hi", True),
        ("Olá, eu sou a Ana e moro em Lisboa", False),
        ("Hola, me llamo Pilar y soy de Madrid", False),
        ("Привет, меня зовут Ольга", False),
    ],
)
def test_a_message_reads_as_english_by_its_words_and_letters(message: str, is_english: bool) -> None:
    assert english(message) is is_english


@pytest.mark.parametrize(
    ("message", "persona"),
    [
        ("What's your name?", True),
        ("Where do you live?", True),
        ("Tell me about yourself.", True),
        ("what do u do for a living", True),
        ("Who are you?", True),
        ("What’s your favourite colour?", True),
        ("What's my name?", False),
        ("Do you remember my name?", False),
        ("Where do I live?", False),
        ("What do you reckon I'll be up to on Saturday?", False),
        ("Who's talking to you right now?", False),
        ("Do you know who you're talking to?", False),
        ("Can you tell me my name?", False),
        ("What colour is the sky?", False),
        ("Where did we meet?", False),
    ],
)
def test_a_message_speaks_of_the_persona_when_it_says_you_and_nothing_of_its_writer(message: str, persona: bool) -> None:
    assert of_the_persona(message) is persona


def test_a_first_word_is_foreign_when_another_language_says_it_and_the_user_did_not() -> None:
    for word in ("Eu", "Este", "je", "Das", "Olá", "É", "Ouémão", "Zdravím"):
        assert foreign_opening(word), word
    for word in ("I", "Nice", "Welcome", "Lisbon", "Marisol", "No", "a", "Me", "Euphoria", "Bonjour", "Hola", ""):
        assert not foreign_opening(word), word
    assert not foreign_opening("Este", message_words("Este es mi perro, Rocky"))  # the user's own word
    assert not foreign_opening("Lucía", message_words("hey, I'm Lucía, I teach in Seville"))  # the user's own name


@pytest.mark.parametrize(
    ("opening", "foreign"),
    [
        ("Zurich, das ist ein", True),  # a greeting or a place, then another language's words
        ("O que não é muito", True),
        ("Gracias a la manera", True),
        ("Bien sûr, welcome", False),  # a greeting's second word
        ("Bien sûr, das ist", True),  # and then another language's
        ("Nice. Das ist", True),  # a sentence that opens with one
        ("Rio de Janeiro is", False),  # a particle inside a name
        ("Welcome to Los Angeles", False),  # a name
        ("Hello José, how", False),  # a name with an accent
        ("I love a café", False),  # an English word with one
        ("Plants die without", False),  # English's own "die"
        ("Nice to meet", False),
        ("Hola, sí", False),  # "sí" may not be whole yet
        ("Welcome to El Paso", False),
        ("Guten Morgen, darumi amo, sir.", False),  # words the rule does not know
    ],
)
def test_an_opening_is_foreign_when_a_word_after_the_first_is_another_languages(opening: str, foreign: bool) -> None:
    assert foreign_opening(opening) is foreign
    assert OPENING_WORDS == 3


def test_a_reply_opens_in_english_from_a_common_english_word() -> None:
    for word in ("The", "I", "oh", "Welcome", "A", "Yes", "Sure"):
        assert english_opener(word), word
    for word in ("Zurich", "Gracias", "O", "Bien", "Hola", "Guten", "Lisbon", ""):
        assert not english_opener(word), word


def test_the_last_word_of_an_opening_is_judged_when_the_reply_ends_there_and_the_users_words_are_let_be() -> None:
    assert foreign_opening("Hola, sí", ended=True)
    assert not foreign_opening("Hola, amigos", ended=True)  # an unknown word is no sign
    assert not foreign_opening("Welcome, meu amigo.", message_words("Olá, meu amigo! I'm Ana."))
    assert foreign_opening("Welcome, meu amigo.")


TOK, CPU = ByteTokenizer(), torch.device("cpu")
NONE = torch.tensor([], dtype=torch.long)


def scripted(
    first: str, replies: dict[str, str], message: str, steps: int = 40, speaker: str = "", lowercase: bool = False
) -> tuple[ReplyDecoder, list[StreamEvent], list[int]]:
    """A greedy row whose model prefers the first characters in ``first``'s order, then spells the reply that begins
    with the character it opened with; the events it delivers and the restarts it asked for."""
    params = SamplingParams(max_new_tokens=steps, temperature=0.0, reply_to=message, speaker=speaker, lowercase=lowercase)
    opening = torch.full((TOK.vocab_size,), -10.0)
    for rank, c in enumerate(first):
        opening[ord(c)] = 10.0 - rank
    row, events, restarts = ReplyDecoder(params, CPU, TOK), [], []

    def restart(n: int) -> torch.Tensor:
        restarts.append(n)
        return opening

    def logits() -> torch.Tensor:
        if not row.tokens:
            return opening
        reply = replies[chr(row.tokens[0])]
        spelled = torch.full((TOK.vocab_size,), -10.0)
        spelled[ord(reply[len(row.tokens)]) if len(row.tokens) < len(reply) else next(iter(TOK.end_ids))] = 10.0
        return spelled

    while row.finish_reason is None:
        events += reply_events(row, logits(), params, 0, NONE, TOK.end_ids, restart)
    return row, events, restarts


REPLIES = {
    "E": "Eu sou a Ana.",
    "L": "La Ana!",
    "T": "Tu es Ana.",
    "S": "Si, Ana.",
    "J": "Je suis Ana.",
    "D": "Das ist Ana.",
    "Q": "Que bom, Ana.",
    "N": "Nice to meet you, Ana.",
    "O": "Ola, la vida, Ana.",
    "R": "Rio de Janeiro, Ana.",
}
FOREIGN_FIRST = "ELTSJDQ"  # seven replies in another language, best first


def test_a_reply_opening_in_another_language_is_taken_back_and_begun_again_without_its_first_token() -> None:
    row, events, restarts = scripted("ELN", REPLIES, "Hi! I'm Ana, I live in Lisbon.")
    assert row.text == "Nice to meet you, Ana."
    assert row.banned_first == [ord("E"), ord("L")]
    assert restarts == [2, 2]  # "Eu" and "La" were read by the model, not the space that closed them
    assert [e.token for e in events] == row.tokens and "".join(e.text for e in events) == row.text  # nothing else shown
    assert all(e.text == "" for e in events[:4]) and events[4].text == "Nice "  # "Nice" opens English: held until whole


def test_a_reply_whose_opening_goes_on_in_another_language_is_taken_back_and_a_names_particle_is_not() -> None:
    row, events, restarts = scripted("ON", REPLIES, "Hi! I'm Ana, I live in Lisbon.")
    assert row.text == "Nice to meet you, Ana." and row.banned_first == [ord("O")]
    assert restarts == [len("Ola, la v") - 1]  # "la" judged once "vida" began; every token but the newest was read
    assert "".join(e.text for e in events) == row.text  # "Ola, la" was never shown
    assert next(e.text for e in events if e.text) == "Nice "  # a reply that opens with an English word: held no longer
    row, events, _ = scripted("RN", REPLIES, "Hi! I'm Ana, I live in Lisbon.")
    held = OPENING_TOKENS - 1  # "Rio" is no English opener: the opening is held until judged (here at OPENING_TOKENS)
    assert [e.text for e in events[:held]] == [""] * held and events[held].text == "Rio de Janei"
    row, events, _ = scripted("RN", REPLIES, "Is rio a river?")  # the user's own word, in lower case: shown at once
    assert next(e.text for e in events if e.text) == "Rio "
    assert row.text == "Rio de Janeiro, Ana."
    row, _, restarts = scripted("ON", REPLIES, "Hola, me llamo Pilar y soy de Madrid")
    assert row.text == "Ola, la vida, Ana." and restarts == []  # the user does not write English: nothing is judged


def test_the_users_own_words_a_message_not_in_english_and_the_last_retry_are_let_be() -> None:
    assert scripted("LN", REPLIES, "Hi! I'm Pilar, la reina.")[0].text == "La Ana!"  # the user said it first
    row, _, restarts = scripted("ELN", REPLIES, "Olá, eu sou a Ana e moro em Lisboa")
    assert row.text == "Eu sou a Ana." and restarts == []  # the user does not write English: nothing is judged
    assert len(FOREIGN_FIRST) > FIRST_WORD_RETRIES
    row, _, restarts = scripted(FOREIGN_FIRST + "N", REPLIES, "Hi, I'm Ana.")
    assert len(restarts) == FIRST_WORD_RETRIES  # so many tries, then the reply is the model's
    assert row.text == REPLIES[FOREIGN_FIRST[FIRST_WORD_RETRIES]]
    row, _, restarts = scripted("ELN", REPLIES, "")
    assert row.text == "Eu sou a Ana." and restarts == []  # off


CALLED = {"S": "Sia, I am glad you asked.", "N": "Nice."}


def test_a_reply_that_calls_out_its_speakers_name_is_taken_back_and_begun_again() -> None:
    """ "Sia, I am glad" (the backbone echoing its prompt's "You are Sia, ...") is begun again without its first token,
    whatever the message's language and in a lowercase persona; the name in a sentence, alone, or as a longer word's
    beginning is let be; without a speaker nothing is judged."""
    for message in ("What is 6 plus 7?", "Olá, quanto é 6 mais 7?", ""):
        row, events, restarts = scripted("SN", CALLED, message, speaker="Sia")
        assert row.text == "Nice." and row.banned_first == [ord("S")] and restarts == [3], message
        assert "".join(e.text for e in events) == "Nice."  # the name was never shown
    assert scripted("SN", CALLED, "hi", speaker="sia", lowercase=True)[0].text == "nice."
    for reply in ("Sia is glad you asked.", "Sia.", "Siam is far, Ana."):
        row, _, restarts = scripted("SN", {**CALLED, "S": reply}, "What is 6 plus 7?", speaker="Sia")
        assert row.text == reply and restarts == []
    row, _, restarts = scripted("SN", CALLED, "What is 6 plus 7?")
    assert row.text == CALLED["S"] and restarts == []  # no speaker: off
    row, _, restarts = scripted("SN", CALLED, "What is 6 plus 7?", speaker="Bolt")
    assert row.text == CALLED["S"] and restarts == []  # another persona's name


@pytest.mark.parametrize("speaker", ["x" * 65, "Sia\n", 3])
def test_a_speaker_must_be_a_short_printable_name(speaker: object) -> None:
    with pytest.raises(ValueError, match="speaker"):
        SamplingParams(speaker=speaker)  # type: ignore[arg-type]


def test_a_reply_taken_back_leaves_no_trace_in_the_reply_or_the_turns_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every first word judged foreign: each guarded row is taken back FIRST_WORD_RETRIES times. The greedy one ends with
    the tokens, text and summary sums of the row decoded alone with those first tokens banned from the start (the
    tokens taken back forgotten), cached or not; the sampled one decodes the same cached or not (its draws
    go on from where the taken-back reply left them); an unguarded row beside them is untouched; each row's events are
    its reply's."""
    torch.manual_seed(1)
    model = SIAModel(tiny_config(block_size=256)).eval()
    config = model.config
    prompts = [list(b"hello there, persona"), list(b"hi"), list(b"what is my name?")]
    states = [IdentityState.fresh(config), random_state(config, 1), random_state(config, 2)]
    plain = SamplingParams(max_new_tokens=10, temperature=0.8, seed=4)
    guarded = replace(plain, reply_to="Hi! I'm Ana from Lisbon.")
    plain_greedy = replace(plain, temperature=0.0)
    params = [guarded, plain, replace(guarded, temperature=0.0)]
    decoded: list[list[Generation]] = []
    monkeypatch.setattr(generate_module, "foreign_opening", lambda opening, user, ended=False: True)
    rows: list[ReplyDecoder] = []
    bans: list[int] = []

    class Recorded(ReplyDecoder):
        def _begin(self) -> None:
            super()._begin()
            if self not in rows:
                rows.append(self)

    class Banned(ReplyDecoder):  # the reference: its first tokens banned at once, nothing judged
        def _begin(self) -> None:
            super()._begin()
            self.banned_first, self.judging = list(bans), False

    for use_cache in (True, False):
        rows.clear()
        monkeypatch.setattr(generate_module, "ReplyDecoder", Recorded)
        decoding = stream(model, prompts, model.condition_states(states), params, use_cache=use_cache)
        events = list(decoding)
        got = decoding.result
        assert [len(row.banned_first) for row in rows] == [FIRST_WORD_RETRIES, 0, FIRST_WORD_RETRIES]
        for b, gen in enumerate(got):
            assert [e.token for e in events if e.row == b] == gen.tokens
            assert "".join(e.text for e in events if e.row == b) == gen.text
        assert rows[0].tokens[0] not in rows[0].banned_first
        decoded.append(got)
        monkeypatch.setattr(generate_module, "ReplyDecoder", Banned)
        bans[:] = rows[2].banned_first  # the greedy row: its reference draws nothing either
        (want,) = generate(model, [prompts[2]], model.condition_states([states[2]]), plain_greedy, use_cache=use_cache)
        assert got[2].tokens == want.tokens and got[2].text == want.text
        torch.testing.assert_close(got[2].stats.hidden, want.stats.hidden, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[2].stats.layer_inputs, want.stats.layer_inputs, atol=1e-4, rtol=1e-4)
        assert float(got[2].stats.count) == float(want.stats.count)
        monkeypatch.setattr(generate_module, "ReplyDecoder", ReplyDecoder)
        (alone,) = generate(model, [prompts[1]], model.condition_states([states[1]]), plain, use_cache=use_cache)
        assert got[1].tokens == alone.tokens
    cached, uncached = decoded
    assert [g.tokens for g in cached] == [g.tokens for g in uncached]  # the sampled row too


def test_a_turn_replies_to_its_message() -> None:
    config = tiny_config()
    request = TurnRequest(IdentityState.fresh(config), "Hi! I'm Ana from Lisbon.", Dynamics.from_config(config))
    params = SamplingParams(temperature=0.0, max_new_tokens=5)
    assert reply_params(params, request) == replace(params, reply_to="Hi! I'm Ana from Lisbon.")
    with pytest.raises(ValueError, match="reply_to"):
        SamplingParams(reply_to=3)  # type: ignore[arg-type]


def next_token(said: str, prefer: torch.Tensor, **params: Any) -> str:
    """The character a greedy reply that has written ``said`` picks next from the logits ``prefer`` (a byte tokenizer's
    (V,)), under ``SamplingParams(**params)``: what its rules leave of the model's choice."""
    sampling = SamplingParams(temperature=0.0, **params)
    row = ReplyDecoder(sampling, CPU, TOK)
    row.queued = []  # ``said`` is the reply so far: no opening the decoder would queue (a greeting) comes before it
    for t in said.encode():
        row.push(t, sampling, TOK.end_ids)
    return chr(row.sample(prefer, sampling))


@pytest.mark.parametrize(
    ("message", "names"),
    [
        ("Hi! I'm Ana Kowalski, I live in Lisbon and I work as a nurse.", ["Ana"]),
        ("Hello, my name is Pierre Dubois and I'm an architect in Lyon.", ["Pierre"]),
        ("hi, i'm Ines, from Coimbra", ["Ines"]),
        ("Hello, I'm Katarzyna, but everyone calls me Kasia.", ["Katarzyna", "Kasia"]),
        ("Hi there, Esteban here. I'm a surf instructor.", ["Esteban"]),
        ("hello!! olga here, I translate books", ["olga"]),
        ("Hi Sia, how are you?", []),  # the persona's name, not the user's
        ("hey I'm tired, I'm a nurse", []),
        ("hey, name's Ruth, nurse at St Mary's", ["Ruth"]),
        # after the words that can only give a name, one written in lower case too; not after "i'm" or "call me"
        ("hi my name is jo and i knit", ["jo"]),
        ("my names kofi btw", ["kofi"]),
        ("ok so my name's yuki, i live in osaka", ["yuki"]),
        ("i'm jo", []),
        ("call me crazy but I love rain", []),
        ("my name is pretty long, sorry", []),  # what the name is like, not the name
        ("my name is not important", []),
        ("my name's jo's mum", []),
        ("hey, name's ruth, nurse", ["ruth"]),
        ("got a puppy, his name's biscuit", []),  # another's name
        ("I have a dog, his name is Max", []),
        ("I'm Kim. My dog's name is Rex", ["Kim"]),
        ("Her name's Bella, she is a beagle", []),
        ("Name's Ruth. Nurse.", ["Ruth"]),
        ("hello! real name is Li Na but call me Nana", ["Li", "Nana"]),
        ("My full name is Ana Kowalski, my nickname is Kiki", ["Ana", "Kiki"]),
        ("my budgie just learned to say my name and i'm SCREAMING", []),  # shouted, not a name
        ("I'M ANA AND I LIVE IN LIMA", ["ANA"]),  # a message all in capitals still gives one
    ],
)
def test_the_names_a_user_gives_as_their_own_are_read_from_the_message(message: str, names: list[str]) -> None:
    assert user_names(message) == names


def test_a_persona_greets_a_user_who_introduces_themself_by_name() -> None:
    """A message giving the user's name that asks nothing is answered by a persona's reply opening "Nice to meet you,
    <name>! How are you" (the last name given, capitalised), the model finishing the question, and the reply ends with it
    (its second sentence; a persona of one sentence stops at the greeting); a question, a message naming nobody and a
    reply without a speaker (a bare model) open as the model does."""
    assert greeting("Hi! I'm Kim, I work for Deloitte in Leeds.") == "Nice to meet you, Kim! How are you"
    assert greeting("Hello, I'm Katarzyna, but everyone calls me Kasia.") == "Nice to meet you, Kasia! How are you"
    assert greeting("hello!! olga here, I translate books") == "Nice to meet you, Olga! How are you"
    assert greeting("hi my name is jo") == "Nice to meet you, Jo! How are you" and greeting("my name is really long") == ""
    assert greeting("I'm Kim. My dog's name is Rex") == "Nice to meet you, Kim! How are you"
    assert greeting("My cat's name is Luna") == ""
    assert greeting("I'm Ana. What's a good book?") == "" and greeting("I love jazz.") == ""
    assert greeting("What's my name?") == "" and greeting("Hi Sia, I'm tired") == ""

    def replied(then: str, **params: Any) -> tuple[str, str | None]:
        """The reply's text and finish when the model would write ``then`` (and its end) after whatever came first."""
        sampling = SamplingParams(temperature=0.0, max_new_tokens=60, **params)
        row = ReplyDecoder(sampling, CPU, TOK)
        said = 0
        while row.finish_reason is None:
            spelled = torch.full((TOK.vocab_size,), -10.0)
            spelled[ord(then[said]) if said < len(then) else next(iter(TOK.end_ids))] = 10.0
            mine = not row.queued  # the opening's tokens come first, whatever the model would write
            row.push(row.sample(spelled, sampling), sampling, TOK.end_ids)
            said += mine
        return row.text, row.finish_reason

    message = "Hi! I'm Kim, I work for Deloitte in Leeds."
    text, finish = replied(" doing? I work at Deloitte too.", reply_to=message, speaker="sia")
    assert text == "Nice to meet you, Kim! How are you doing?" and finish == "stop"
    text, _ = replied(" doing? I work at Deloitte too.", reply_to=message, speaker="bolt", max_sentences=1)
    assert text == "Nice to meet you, Kim!"  # one sentence a reply: the greeting alone
    plain = "Hello there. I work at Deloitte too. So do I. Me too."
    assert replied(plain, reply_to=message)[0] == plain  # no persona: the model's own opening, as long as it goes
    assert replied(plain, reply_to="I'm Kim. Is it Friday?", speaker="sia")[0] == plain


def test_a_reply_never_gives_the_users_name_as_its_speakers() -> None:
    """Right after "I'm" (or "my name is", in any case) the tokens that begin the user's name are banned: the row takes
    its next choice; anywhere else, and for a message that names nobody, the name is the model's to say."""
    assert name_starts(TOK, ["Ana"]) == [ord("A"), ord("a")]  # " Ana" begins with a space: not a name's start
    assert names_self("Hello! I'm") and names_self("so, my name is ") and names_self("i am ")
    assert not names_self("Miami") and not names_self("I'm glad")
    prefer = torch.full((TOK.vocab_size,), -10.0)
    prefer[ord("A")], prefer[ord("S")] = 5.0, 4.0

    def next_after(said: str, message: str) -> str:
        return next_token(said, prefer, reply_to=message)

    assert next_after("Hello! I'm ", "Hi! I'm Ana Kowalski.") == "S"
    assert next_after("hello! i am ", "Hi! I'm Ana Kowalski.") == "S"
    assert next_after("Hello! I'm glad, ", "Hi! I'm Ana Kowalski.") == "A"  # not where a speaker names itself
    assert next_after("Hello! I'm ", "Hi! How are you?") == "A"  # the user gave no name


def test_a_persona_gives_no_name_but_its_own() -> None:
    """A persona with a name says no other after "I'm": no token that begins a capitalised word may come there but
    the one that begins its own name, capitalised or as written; a lower-case word may ("I'm so glad"). Without a
    name (a bare model), only the user's names are kept out; elsewhere in a reply every name is the model's to say."""
    assert capital_starts(TOK) == frozenset(range(ord("A"), ord("Z") + 1))  # the byte tokenizer's capital letters
    assert other_names(TOK, "marlow", []) == sorted(set(range(ord("A"), ord("Z") + 1)) - {ord("M")})
    assert other_names(TOK, "marlow", ["Ana"]) == [*other_names(TOK, "marlow", []), ord("a")]
    prefer = torch.full((TOK.vocab_size,), -10.0)
    prefer[ord("E")], prefer[ord("M")], prefer[ord("s")] = 5.0, 4.0, 3.0

    def next_after(said: str, speaker: str, message: str = "Hi! I'm Ana.") -> str:
        return next_token(said, prefer, reply_to=message, speaker=speaker)

    assert next_after("Good day! I am ", "marlow") == "M"  # "Elena" is not its name; "Marlow" is
    assert next_after("Good day! I am ", "sia") == "s"  # no name of its own starts there: the model's next choice
    assert next_after("Good day! I am ", "") == "E"  # a bare model: only the user's name is banned
    assert next_after("Good day! I met ", "marlow") == "E"  # not where a speaker names itself


@pytest.mark.parametrize(
    ("message", "roles"),
    [
        ("Hey! Call me Bea. I'm a firefighter in Valencia and I love the sea.", ["firefighter", "Valencia", "sea"]),
        ("Hi, I'm Lukas Schneider, a music teacher in Graz.", ["Lukas", "Schneider", "music", "teacher", "Graz"]),
        (
            "My name's Marisol, I'm a pharmacist, and I live in Bilbao with my two dogs.",
            ["Marisol", "pharmacist", "Bilbao", "dogs"],
        ),
        ("i work as a nurse in lisbon", ["nurse", "lisbon"]),
        ("I'm so happy to be here!", []),  # nothing said of who the user is
        ("How many legs does a spider have?", []),  # no clause of the user's own
        ("What is a good name for a cat, and a dog?", []),
        ("Anneke de Vries, veterinarian, Utrecht.", []),  # no "I": the rule of names reads the signed ones
    ],
)
def test_what_a_user_says_of_themself_is_read_from_their_own_clauses(message: str, roles: list[str]) -> None:
    assert user_roles(message) == roles


def test_a_persona_never_says_what_the_user_is_as_its_own() -> None:
    """Right after a persona's "I'm a", "I am your", "I live in" (in any case), the tokens that begin a word the user
    said of themself are banned: the row takes its next choice. "I'm not a", "you're a", a reply without a speaker (a
    bare model) and a message that says nothing of its writer leave the model's choice as it is."""
    assert (
        claims_self("hey! i'm a") and claims_self("I am just your ") and claims_self("I live in") and claims_self("I'm based in ")
    )
    assert (
        not claims_self("I'm not a") and not claims_self("you're a") and not claims_self("I'm glad") and not claims_self("Miami")
    )
    prefer = torch.full((TOK.vocab_size,), -10.0)
    prefer[ord("f")], prefer[ord("b")] = 5.0, 4.0

    def next_after(said: str, message: str, speaker: str = "bolt") -> str:
        return next_token(said, prefer, reply_to=message, speaker=speaker)

    told = "Hey! I'm a firefighter in Valencia."
    assert next_after("i'm a ", told) == "b"  # not "firefighter"
    assert next_after("Oh, I live in ", "I live in Faro.") == "b"  # not "Faro"
    assert next_after("i'm not a ", told) == "f"
    assert next_after("you're a ", told) == "f"
    assert next_after("i'm a ", told, speaker="") == "f"  # a bare model
    assert next_after("i'm a ", "How do bees fly?") == "f"  # the user said nothing of themself
    # a word of the user's that the persona's own name begins like ("Marseille", "Marlow") leaves that name free
    assert role_starts(TOK, ["Marseille", "fish"], "marlow") == [ord("f")]
    assert next_after("I'm ", "I work as a fisher in Marseille.", speaker="marlow") == "b"
    prefer[ord("M")] = 6.0
    assert next_after("I'm ", "I work as a fisher in Marseille.", speaker="marlow") == "M"


@pytest.mark.parametrize(
    ("said", "of_self"),
    [
        ("i'm a bartender, and i grow ", True),
        ("I've just arrived from the city of ", True),
        ("Hola! Welcome to my ", True),
        ("Welcome to our beautiful city of ", True),
        ("I'm your trusty ", True),  # "your" after "I'm" says what the speaker is
        ("I am just your ", True),
        ("I'm glad you're enjoying your ", False),  # about the listener
        ("I'm happy to help you with your ", False),
        ("I'm not a ", False),  # a denial
        ("i don't live in ", False),
        ("I think ", False),  # an opinion, not what the speaker is
        ("I'd love to hear about ", False),
        ("Tell me about ", False),  # no subject of the speaker's
        ("I grow roses. ", False),  # a new sentence
        ("I'm a chef, ", False),  # a new clause
        ("I'm a chef and ", False),
        ("I'm a brilliant and talented ", True),  # a clause after "and" naming no one goes on the one before
        ("I'm glad you're here and ready to ", False),
        ("I'm a chef and you're a ", False),
        ("I love cats and big ", False),
        ("I am Sia, the electrician of ", True),  # beside the name the speaker just gave
        ("i'm bolt, a ", True),
        ("I am Sia, the one you ", False),
        ("I'm Sia, and ", False),
        ("You are Tom, the electrician of ", False),
        ("I am Sia. The weather in ", False),
    ],
)
def test_a_clause_that_says_what_its_speaker_is_does_or_has(said: str, of_self: bool) -> None:
    assert speaks_of_self(said) is of_self


def test_a_persona_says_no_word_the_user_said_of_themself_in_a_clause_about_itself() -> None:
    """Not only right after "I'm a": anywhere in a clause where the persona says what it is, does or has ("and i grow ",
    "welcome to my "), a token that begins a word of the user's own clauses is banned; within a word only the tokens
    that begin a new one. Where the clause is about the user ("I'm glad you're enjoying your "), is an opinion ("I
    think ") or a denial, or the user said nothing of themself, the model's choice stands."""
    prefer = torch.full((TOK.vocab_size,), -10.0)
    prefer[ord("c")], prefer[ord("t")] = 5.0, 4.0
    grower = "I'm Rafael and I grow coffee near Manizales."

    def next_after(said: str, message: str = grower) -> str:
        return next_token(said, prefer, reply_to=message, speaker="sia")

    assert next_after("I am Sia, a warm companion. I grow ") == "t"  # not "coffee"
    assert next_after("Welcome to my ") == "t"
    prefer[ord("C")] = 6.0
    assert next_after("Welcome to my ") == "t"  # "Coffee" too
    prefer[ord("C")] = -10.0
    assert next_after("I'm glad you're enjoying your ") == "c"
    assert next_after("I think ") == "c"
    assert next_after("I'm not a ") == "c"
    assert next_after("I grow ", "How do bees fly?") == "c"  # the user said nothing of themself
    assert told_roles("How can I grow coffee? I tried.") == ["tried"] and told_roles(grower + " Do you?") == user_roles(grower)
    assert next_after("I grow ", "How can I grow coffee at home?") == "c"  # a question tells nothing of its writer
    # a place typed in lower case is a place: banned there, the backbone names another ("our city of Morocco")
    typed = "i'm a nurse in braga and i grow coffee near caldas"
    assert doings(typed) == ["nurse", "grow", "coffee"]
    prefer[ord("b")] = 7.0
    assert next_after("Welcome to our city of ", typed) == "b"  # "braga" stays
    assert next_after("Welcome to our city of ", "i'm a nurse and i grow beans") == "c"  # "beans" does not
    prefer[ord("b")] = -10.0
    # within a word the byte tokenizer's pieces go on it: nothing begins a new word there, so nothing is banned
    assert next_after("I grow tea and ") == "c"  # "and" begins another clause
    assert next_after("I grow te") == "c"
    # a started word is not taken further into the user's ("co" + "f" of "coffee")
    prefer[ord("f")] = 6.0
    assert next_after("I grow co") == "c"
    assert next_after("You grow co") == "f"


def test_a_persona_does_not_spell_the_users_word_in_other_pieces() -> None:
    """The tokenizer spells a word in more ways than one (" cat" + "ar" + "ina" where " catar" is banned): where the
    word a reply writes right after "I'm" begins one of the user's names or words, no token may take it further
    into that word; a longer start that is a common English word ("a" + "n"), one of the persona's own name, another
    word ("I'm in" + "to"), another place in the reply and a message without such words leave the model's choice."""
    # the byte tokenizer's pieces are single characters: each goes on a word by one letter
    assert completions(TOK, "cat", ["Catarina"], "pip") == [ord("A"), ord("a")]
    assert completions(TOK, "a", ["Ana"], "pip") == []  # "an" is English: "I'm an engineer" stays
    assert completions(TOK, "an", ["Ana"], "pip") == [ord("A"), ord("a")]
    assert completions(TOK, "mar", ["Marlowe"], "marlow") == []  # "marl" begins "marlow" too
    assert completions(TOK, "marlow", ["Marlowe"], "marlow") == [ord("E"), ord("e")]
    assert completions(TOK, "bo", ["Catarina"], "pip") == []
    # a user named like the persona: its name's start stays free after "I'm", and the user's rest does not follow it
    assert other_names(TOK, "pip", ["Pippa"]) == other_names(TOK, "pip", [])
    assert completions(TOK, "pip", ["Pippa"], "pip") == [ord("P"), ord("p")]
    prefer = torch.full((TOK.vocab_size,), -10.0)
    prefer[ord("a")], prefer[ord("g")], prefer[ord("f")], prefer[ord("t")] = 5.0, 4.5, 4.0, 3.0

    def next_after(said: str, message: str, speaker: str = "pip") -> str:
        return next_token(said, prefer, reply_to=message, speaker=speaker)

    catarina, ingrid = "Hi, I'm Catarina Sousa. I'm an architect.", "Hey, I'm Ingrid Johansson and I'm a photographer."
    assert next_after("Oh, hello there, I'm cat", catarina) == "g"  # not "a" of "catarina"
    assert next_after("Welcome! I'm in", ingrid) == "a"  # "ina" goes nowhere near "ingrid"
    prefer[ord("g")] = 6.0
    assert next_after("Welcome! I'm in", ingrid) == "a"  # not "g" of "ingrid"
    assert next_after("Welcome! I'm in", "Hey, how are you?") == "g"  # the user gave no name
    assert next_after("You're in", ingrid) == "g"  # not where the persona names itself
    prefer[ord("f")] = 7.0
    assert next_after("i'm a fire", "Hey! I'm a firefighter in Valencia.", speaker="bolt") == "g"  # not "f"
    assert next_after("i'm a fire", "Hey! I'm a nurse.", speaker="bolt") == "f"
    # the user's city after "i live in", in whatever pieces ("B" and "b" begin "Bolt": the next ones are banned)
    prefer[ord("i")] = 8.0
    assert next_after("i live in b", "I live in Bilbao.", speaker="bolt") == "f"


def test_a_persona_that_begins_its_own_name_after_im_goes_on_with_it() -> None:
    """Only the starts of the persona's own name may follow "I'm" among capitalised words; once one is written ("I'm
    Mar"), no token may take it anywhere but on along that name: "Mariolle" is stopped, "Marlow" and "Mar, " are not.
    A lower-case word ("i'm m" + "ad") and a persona without a name are left alone."""
    banned = set(off_own_name(TOK, "Mar", "marlow"))
    assert ord("i") in banned and ord("l") not in banned and ord("L") not in banned and ord(",") not in banned
    assert off_own_name(TOK, "mar", "marlow") == []  # not capitalised
    assert set(off_own_name(TOK, "Marlow", "marlow")) == set(continuations(TOK))  # the whole name ends there
    assert off_own_name(TOK, "Pet", "marlow") == []  # not its name
    prefer = torch.full((TOK.vocab_size,), -10.0)
    prefer[ord("i")], prefer[ord(",")] = 5.0, 4.0
    told = "I'm a pharmacist in Bilbao."

    def next_after(said: str, speaker: str = "marlow") -> str:
        return next_token(said, prefer, reply_to=told, speaker=speaker)

    assert next_after("Welcome, sir. I'm Mar") == ","  # not "i" of "Mariolle"
    prefer[ord("l")] = 4.5
    assert next_after("Welcome, sir. I'm Mar") == "l"
    prefer[ord("e")] = 6.0
    assert next_after("Welcome, sir. I'm Marlow") == ","  # not "Marlowe"
    prefer[ord("e")] = -10.0
    assert next_after("Welcome, sir. You're Mar") == "i"  # not where the persona names itself
    assert next_after("welcome, sir. i'm mar") == "i"  # a lower-case word


def test_a_persona_that_says_my_name_is_says_its_own_name_whole() -> None:
    """After "my name is" (or "my name's"), in any case, a persona with a name writes that name, whatever the model would
    pick (it trailed off there: "My name is... (pausing)"), the next token does not go on its word ("Pip, and", not
    "Pipa"), and then the reply goes on as the model picks; a bare model, and the other ways a speaker names itself
    ("I'm", "call me"), are left to the model."""
    assert gives_name("Good evening, my name is") and gives_name("MY NAME'S ") and gives_name("my name’s")
    assert not gives_name("I'm") and not gives_name("call me") and not gives_name("Anonymy name is")
    assert not gives_name("my name is Marlow")
    prefer = torch.full((TOK.vocab_size,), -10.0)
    prefer[ord("a")], prefer[ord(".")] = 6.0, 5.0  # a letter would go on the name: "Marlowa"

    def reply_after(said: str, speaker: str, lowercase: bool = False) -> str:
        params = SamplingParams(temperature=0.0, reply_to="Hi! How are you?", speaker=speaker, lowercase=lowercase)
        row = ReplyDecoder(params, CPU, TOK)
        for t in said.encode():
            row.push(t, params, TOK.end_ids)
        for _ in range(9):
            row.push(row.sample(prefer, params), params, TOK.end_ids)
        return row.text

    assert reply_after("Good evening, my name is", "marlow") == "Good evening, my name is Marlow.a"
    assert reply_after("So. My name's ", "pip") == "So. My name's Pip.aaaaa"  # no second space
    assert reply_after("hey. my name is", "bolt", lowercase=True) == "hey. my name is bolt.aaa"
    assert reply_after("Good evening, my name is", "") == "Good evening, my name isaaaaaaaaa"  # a bare model
    assert reply_after("Good evening, call me", "marlow") == "Good evening, call meaaaaaaaaa"
    assert continuations(TOK) == frozenset(i for i in range(256) if i >= 0x80 or chr(i).isalnum())  # bytes, no specials


@pytest.mark.parametrize(
    ("message", "asking"),
    [
        ("What's my name?", True),
        ("ok so what's my name", True),  # interjections first, no question mark
        ("Remind me where I live.", True),
        ("Go on, say my name so I know you were paying attention.", True),
        ("Name the town I work in.", True),
        ("do u remember my job", True),
        ("where am i originally from", True),
        ("Tell me a joke.", True),
        ("if u got me a shirt what colour should it be", True),  # a question after a condition
        ("bet you still remember where I live", True),  # whether the persona remembers
        ("I hope it will remind me of home.", False),
        ("On weekends I go bouldering with my sister.", False),
        ("Actually I should say, I moved to York last month, so I commute now.", False),
        ("Had a long day.", False),  # an auxiliary before no subject
        ("When I'm not working I fish.", False),  # "when" before no auxiliary
        ("I live in Lyon, where the food is great.", False),  # a question word inside a sentence
        ("I know what you are thinking.", False),
    ],
)
def test_a_message_asks_when_it_holds_a_question_or_a_request(message: str, asking: bool) -> None:
    assert asks(message) is asking
