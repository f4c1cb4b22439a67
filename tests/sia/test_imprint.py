"""The imprint: selection of a message's spans by token shock, replacement and forgetting, its file format, and its
read: an empty imprint is exactly the base model (uncached, cached, batched), a filled one is read at fixed positions
as the user's own tokens were."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from sia.backbones import injected_attention
from sia.backbones.injected_attention import InjectedLayer, copy_plan
from sia.backbones.llama import COMPLETION, PREFIX_READS, LlamaModel, copied
from sia.checkpoint import DEFAULT_CHECKPOINT
from sia.identity.imprint import (
    KINDS,
    Imprint,
    ImprintEntries,
    SpanChoice,
    asides,
    asking,
    clause_breaks,
    corrects,
    dequantise,
    fitted,
    forget_span,
    forget_words,
    given_up,
    greetings,
    imprint_spans,
    mends,
    message_spans,
    others_names,
    own_name_only,
    quantise,
    says_now,
    select_spans,
    superseded,
)
from sia.identity.state import Dynamics, IdentityState, StateFormatError, state_from_bytes, state_to_bytes
from sia.identity.turn import TurnRequest, run_turn
from sia.model.config import LlamaConfig
from sia.model.generate import SamplingParams, generate
from sia.model.tokenizer import ByteTokenizer, completed_texts

from .conftest import hf_tiny

HF_TINY = hf_tiny()
N = 24


@pytest.fixture(scope="module")
def hf_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(HFLlamaConfig(**HF_TINY)).eval()


def build(hf_model: LlamaForCausalLM, **overrides: object) -> LlamaModel:
    fields: dict[str, object] = {
        "d_self": 8,
        "trace_layers": [0, 2],
        "imprint_tokens": N,
        "imprint_span": 16,
        "imprint_min_shock": 0.0,
    }
    config = LlamaConfig.from_hf(HF_TINY, **{**fields, **overrides})
    model = LlamaModel(config, ByteTokenizer()).eval()
    model.load_base(hf_model.state_dict())
    return model


def planted(model: LlamaModel, words: str, *, turn: int = 0, score: float = 5.0, kind: int = 0) -> Imprint:
    """An imprint holding ``words`` (byte tokens) as the base model reads them alone."""
    ids = model.tokenizer.encode(words)
    words = model.read_words(torch.tensor([ids]))
    choice = SpanChoice(0, len(ids), score, kind)
    return imprint_spans(Imprint.empty(model.config), words.keys, words.values, [choice], turn=turn, tokens=torch.tensor(ids))


# --- the read ---


def test_empty_imprint_is_the_base_model_uncached_cached_and_batched(hf_model: LlamaForCausalLM) -> None:
    """An empty entry's weight is exactly 0 (its logit is the closed gate); the extra key columns change only the
    kernel's order of summation, so logits agree to float32 rounding and greedy replies token for token."""
    model, without = build(hf_model), build(hf_model, imprint_tokens=0)
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    fresh = [IdentityState.fresh(model.config)] * 2
    explicit = [replace(fresh[0], imprint=Imprint.empty(model.config))] * 2
    with torch.no_grad():
        expected = hf_model(idx).logits
        base = without(idx, without.condition_states(fresh)).logits
        got = model(idx, model.condition_states(fresh)).logits
        got_explicit = model(idx, model.condition_states(explicit)).logits
    assert model.prefix_len == without.prefix_len + N
    torch.testing.assert_close(got, base, atol=1e-6, rtol=0)
    torch.testing.assert_close(got_explicit, got, atol=0, rtol=0)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    # decoding: cached and padded batches of different lengths give the same tokens as the model without an imprint
    prompts = [list(range(40, 52)), list(range(60, 67))]
    params = SamplingParams(max_new_tokens=8, temperature=0)
    states = [IdentityState.fresh(model.config)] * 2
    ours = generate(model, prompts, model.condition_states(states), params)
    theirs = generate(without, prompts, without.condition_states(states), params)
    assert [g.tokens for g in ours] == [g.tokens for g in theirs]
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.prompt_nll, b.prompt_nll, atol=1e-5, rtol=0, equal_nan=True)


def test_a_filled_imprint_is_read_as_those_tokens_in_context(hf_model: LlamaForCausalLM) -> None:
    """The imprint's u filled entries are the words' keys and values at the u positions just before the first token
    that reads them: the logits equal the base model reading the words themselves right there, up to int8 rounding
    (and unlike the same words read ten positions earlier)."""
    model = build(hf_model)
    words, prompt = "Ana Kowalski, Lisbon", "Where do I live?"
    ids, pids = model.tokenizer.encode(words), model.tokenizer.encode(prompt)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, words))
    n = len(ids)
    with torch.no_grad():
        read = model(torch.tensor([pids]), model.condition_states([state])).logits[0]
        alone = model(torch.tensor([pids]), model.condition_states([IdentityState.fresh(model.config)])).logits[0]
        base = model.base_view()
        fresh = base.condition_states([IdentityState.fresh(model.config)])
        at = torch.tensor([list(range(n)) + list(range(n, n + len(pids)))])
        in_context = base(torch.tensor([ids + pids]), fresh, positions=at).logits[0, n:]
        apart = torch.tensor([list(range(n)) + list(range(n + 10, n + 10 + len(pids)))])
        earlier = base(torch.tensor([ids + pids]), fresh, positions=apart).logits[0, n:]
    assert (read - alone).abs().max() > 0.1  # the imprint changes what the model says
    error = (read - in_context).abs().max()
    # it is the words themselves (int8-rounded), there: four times closer than to the words read ten positions earlier
    assert error < 0.25 * (read - earlier).abs().max()


def test_the_persona_prompt_does_not_read_the_imprint(hf_model: LlamaForCausalLM) -> None:
    """With ``reads_from`` the tokens before it (a turn's context: the persona's prompt) read as with no imprint, the
    tokens from it on read the imprint placed just before it."""
    model = build(hf_model)
    words, system, message = "Ana Kowalski, Lisbon", "You are kind. ", "Where do I live?"
    ids, sids, mids = (model.tokenizer.encode(t) for t in (words, system, message))
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, words))
    idx = torch.tensor([sids + mids])
    S = len(sids)
    with torch.no_grad():
        read = model(idx, model.condition_states([state], [S])).logits[0]
        alone = model(idx, model.condition_states([IdentityState.fresh(model.config)], [S])).logits[0]
        base = model.base_view()
        fresh = base.condition_states([IdentityState.fresh(model.config)])
        # the words between the prompt and the message, the prompt not seeing them: positions say where they are
        order = torch.tensor([ids + sids + mids])
        n = len(ids)
        at = torch.tensor([list(range(S - n, S)) + list(range(S)) + list(range(S, S + len(mids)))])
        mask = torch.ones(1, 1, order.shape[1], order.shape[1], dtype=torch.bool).tril()
        mask[0, 0, n : n + S, :n] = False  # the prompt does not see the words
        in_between = base(order, fresh, positions=at, attn_mask=mask).logits[0, n:]
    torch.testing.assert_close(read[:S], alone[:S], atol=1e-5, rtol=0)
    assert (read[S:] - alone[S:]).abs().max() > 0.1
    torch.testing.assert_close(read, in_between, atol=0.02, rtol=0)


def test_the_imprint_survives_a_turn_and_shapes_the_next(hf_model: LlamaForCausalLM) -> None:
    model = build(hf_model)
    dynamics = Dynamics.from_config(model.config)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    first = run_turn(model, TurnRequest(IdentityState.fresh(model.config), "I am Zbigniew, from Ushuaia.", dynamics), params)
    imprint = first.state.imprint
    assert imprint is not None and imprint.used > 0
    spans = imprint.spans()
    text = "".join(model.tokenizer.decode(s.tokens or ()) for s in spans)
    assert "Zbigniew" in text or "Ushuaia" in text
    assert all(s.turn == 0 for s in spans)
    # privacy: the same turn with no text kept imprints the same entries without token ids
    private = run_turn(
        model, TurnRequest(IdentityState.fresh(model.config), "I am Zbigniew, from Ushuaia.", dynamics, keep_text=False), params
    ).state.imprint
    assert private is not None and bool((private.token == -1).all())
    assert torch.equal(private.keys, imprint.keys) and [s.tokens for s in private.spans()] == [None] * len(spans)


def test_a_turn_that_denies_a_value_takes_it_out_of_the_imprint_where_text_is_kept(hf_model: LlamaForCausalLM) -> None:
    """A turn's write drops what an earlier turn imprinted of a value the message denies ("technically not Lyon"); in
    privacy mode (no text kept) nothing can be matched and the older span stays."""
    model = build(hf_model, imprint_tokens=48)  # room for every span: none leaves for want of it
    dynamics = Dynamics.from_config(model.config)
    params = SamplingParams(max_new_tokens=2, temperature=0)

    def texts(keep_text: bool) -> tuple[list[int], list[str]]:
        state = IdentityState.fresh(model.config)
        for message in ("Lyon, my home.", "A cat, mine.", "Well, technically not Lyon."):
            state = run_turn(model, TurnRequest(state, message, dynamics, keep_text=keep_text), params).state
        assert state.imprint is not None
        spans = state.imprint.spans()
        return [s.turn for s in spans], [model.tokenizer.decode(s.tokens or ()) for s in spans]

    turns, kept = texts(True)
    assert [t for n, t in zip(turns, kept, strict=True) if n == 0] == [" my home."]  # "Lyon," went
    assert any("cat" in t for n, t in zip(turns, kept, strict=True) if n == 1)
    private_turns, _ = texts(False)
    assert private_turns.count(0) == 2  # without text the older span is not found


def test_a_read_after_a_shared_prefix_is_the_read_of_the_whole(hf_model: LlamaForCausalLM) -> None:
    """``read_words(..., shared=P)`` keeps the base model's read of the first P tokens (a persona's prompt) and reads
    only the rest: the same keys, values, logits and kinds as reading all of it, the prefix read once for every
    message after it, and only the newest PREFIX_READS prefixes kept."""
    model = build(hf_model, imprint_kinds_layer=1)
    prompt = list(b"You are Sia, a warm persona. ")
    P = len(prompt)
    for message in (b"I am Zbigniew, from Ushuaia.", b"my cat is called Tofu"):
        ids = torch.tensor([prompt + list(message)])
        whole, after = model.read_words(ids, logits=True), model.read_words(ids, logits=True, shared=P)
        assert after.start == P and after.keys.shape == (*whole.keys.shape[:2], len(message), whole.keys.shape[3])
        for got, want in ((after.keys, whole.keys[:, :, P:]), (after.values, whole.values[:, :, P:])):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert after.logits is not None and whole.logits is not None and after.kinds is not None and whole.kinds is not None
        torch.testing.assert_close(after.logits, whole.logits[P:], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(after.kinds, whole.kinds[P:], atol=1e-5, rtol=1e-5)
    assert len(model._prefix_reads) == 1  # both messages read the one prompt
    for i in range(PREFIX_READS + 1):
        model.read_words(torch.tensor([[65 + i, *prompt, 66]]), shared=P + 1)
    assert len(model._prefix_reads) == PREFIX_READS
    model.forget_prefix_reads()
    assert not model._prefix_reads
    with pytest.raises(ValueError, match="shared must leave a token"):
        model.read_words(torch.tensor([prompt]), shared=P)


def test_the_turn_write_reads_the_persona_prompt_once(hf_model: LlamaForCausalLM) -> None:
    """A turn's write after the persona's prompt kept (``TurnRequest.shared``) imprints what a read of the whole
    prompt imprints: the same spans, their entries within one quantisation step."""
    model = build(hf_model)
    dynamics, params = Dynamics.from_config(model.config), SamplingParams(max_new_tokens=4, temperature=0)
    context = tuple(b"You are Sia, a warm persona. ")
    fresh = IdentityState.fresh(model.config)
    written = [
        run_turn(model, TurnRequest(fresh, "I am Zbigniew, from Ushuaia.", dynamics, context, shared=s), params).state.imprint
        for s in (0, None)
    ]
    read_all, kept = written
    assert read_all is not None and kept is not None and read_all.used > 0
    assert [(s.first, s.length, s.tokens) for s in kept.spans()] == [(s.first, s.length, s.tokens) for s in read_all.spans()]
    for q, scale in (("keys", "key_scale"), ("values", "value_scale")):
        a = dequantise(getattr(read_all, q), getattr(read_all, scale))
        b = dequantise(getattr(kept, q), getattr(kept, scale))
        assert bool(((a - b).abs() <= getattr(read_all, scale).float().unsqueeze(-1) * 1.01 + 1e-6).all())
    with pytest.raises(ValueError, match="shared must count tokens of the context"):
        run_turn(model, TurnRequest(fresh, "hi", dynamics, context, shared=len(context) + 1), params)


# --- selection ---


def test_selection_keeps_the_span_of_a_planted_rare_name() -> None:
    tok = ByteTokenizer()
    message = "hi there, my name is Xochitl Quispe, how are you?"
    pieces = [tok.token_text(t) for t in tok.encode(message)]
    surprisal = torch.full((len(pieces),), 1.0)
    at = message.index("Xochitl")
    surprisal[at : at + 7] = 9.0  # the rare name surprises the identity
    choices = select_spans(surprisal, clause_breaks(pieces), budget=40, max_span=30, min_score=4.0)
    assert [message[c.start : c.end] for c in choices] == [" my name is Xochitl Quispe,"]
    # a clause longer than the span keeps the peak and reaches back two thirds of the span for its cue
    short = select_spans(surprisal, clause_breaks(pieces), budget=40, max_span=12, min_score=4.0)
    assert [message[c.start : c.end] for c in short] == ["name is Xoch"]
    assert select_spans(surprisal, clause_breaks(pieces), budget=40, max_span=30, min_score=10.0) == []


def test_clause_breaks_at_punctuation_and_conjunctions() -> None:
    pieces = ["I", " live", " in", " Lyon", " and", " I", " knit", "."]
    assert clause_breaks(pieces).tolist() == [False, False, False, True, False, False, False, True]
    # a pause does not end a clause of fewer than min_tokens tokens; a sentence's end always does
    pieces = ["Ana", " here", ",", " Ana", " Kowalski", ".", " Hi", "!"]
    assert clause_breaks(pieces).tolist() == [False, False, False, False, False, True, False, True]
    assert clause_breaks(pieces, min_tokens=2).tolist() == [False, False, True, False, False, True, False, True]
    pieces = ["I", " build", " and", " repair", " violins", " in", " tri", "este"]
    assert clause_breaks(pieces).tolist() == [False] * 8  # "I build" is too short a clause to stand alone
    # before a conjunction that the writer's "I", "I'm", "my" or "we" follows, a clause of two tokens ends too
    pieces = ["I", "'m", " Grace", " and", " I", "'m", " a", " midwife"]
    assert clause_breaks(pieces).tolist() == [False, False, True] + [False] * 5
    pieces = ["I", " paint", " and", " my", " wife", " sings"]
    assert clause_breaks(pieces).tolist() == [False, True] + [False] * 4
    pieces = ["I", "'m", " Grace", " and", " Ian", "'s", " wife"]  # "Ian" is no "I"
    assert not clause_breaks(pieces).any()
    # a conjunction ends a clause only as a word of its own, not inside a place's name
    pieces = [" pharmacist", ",", " living", " in", " a", "lex", "and", "ria"]
    assert not clause_breaks(pieces).any()
    pieces = [" from", " val", "para", "í", "so"]
    assert not clause_breaks(pieces).any()
    pieces = ["I", " live", " in", " and", "or", "ra", " and", " I", " ski"]
    assert clause_breaks(pieces).tolist() == [False] * 5 + [True] + [False] * 3


def test_a_place_said_beside_what_the_user_does_is_a_clause_of_its_own() -> None:
    """ "I'm a dentist | here in Owerri": the job and the place each a clause (the tagger labels each with its own kind),
    the place scoring at least as the clause it was said beside, so that a dull place keeps up with a surprising job."""
    pieces = ["I", "'m", " a", " dentist", " here", " in", " Ow", "erri", "."]
    assert clause_breaks(pieces).nonzero().flatten().tolist() == [3, 8]
    surprisal = torch.tensor([1.0, 1.0, 1.0, 9.0, 1.0, 1.0, 2.0, 1.0, 1.0])
    chosen = message_spans(surprisal, pieces, None, budget=40, max_span=16, min_score=4.0)
    assert [("".join(pieces[c.start : c.end]), c.score) for c in chosen] == [("I'm a dentist", 9.0), (" here in Owerri.", 9.0)]
    pieces = ["I", " build", " and", " repair", " violins", " in", " Tri", "este"]
    assert clause_breaks(pieces).nonzero().flatten().tolist() == [4]
    # a clause that says where the user lives or comes from stays whole, as does a place said with a time, one written
    # in lower case, and one after "I'm" alone
    for said in (
        ["I", " live", " in", " Lisbon", " now"],
        ["I", " was", " born", " in", " Kano", " actually"],
        ["my", " shop", " was", " in", " Bo", " for", " years"],
        ["My", " sister", " works", " in", " Oslo", " too"],
        ["We", " had", " dinner", " at", " a", " restaurant", " in", " Rome", " last", " night"],
        ["I", "'m", " a", " nurse", " in", " lisbon"],
        ["I", "'m", " from", " Porto", " originally"],
    ):
        assert not clause_breaks(said).any(), said


def test_questions_to_the_persona_are_not_imprinted() -> None:
    pieces = ["I", "'m", " Ana", " Kowalski", ".", " What", "'s", " a", " good", " book", "?"]
    assert asking(pieces).tolist() == [False] * 5 + [True] * 6
    surprisal = torch.full((len(pieces),), 9.0)
    chosen = message_spans(surprisal, pieces, None, budget=20, max_span=16, min_score=4.0)
    assert [(c.start, c.end) for c in chosen] == [(0, 5)]
    with pytest.raises(ValueError, match="questions must be"):
        select_spans(surprisal, clause_breaks(pieces), budget=4, max_span=2, min_score=0, questions=torch.zeros(3).bool())


def test_questions_and_requests_without_a_question_mark_are_not_imprinted() -> None:
    def asked(text: list[str]) -> list[str]:
        return ["".join(p for p, a in zip(text, asking(text).tolist(), strict=True) if a)]

    # a question word or a request opens the sentence: all of it asks, with or without a question mark
    assert asked(["what", "'s", " 18", "%", " of", " 250"]) == ["what's 18% of 250"]
    assert asked(["Tell", " me", " a", " joke", ".", " I", "'m", " a", " nurse", "."]) == ["Tell me a joke."]
    assert asked(["Quick", " one", ":", " which", " is", " heavier"]) == [" which is heavier"]
    assert asked(["When", " was", " the", " first", " email", " sent"]) == ["When was the first email sent"]
    assert asked(["Convert", " 5", " miles", " to", " km", ",", " please", "."]) == ["Convert 5 miles to km, please."]
    assert asked(["wat", " is", " the", " diffrence"]) == ["wat is the diffrence"]
    # a fact told beside a question keeps its clause; "when" before a statement and "can't" do not ask
    assert asked(["I", " have", " a", " cat", ",", " is", " that", " weird", "?"]) == ["?"]  # its clause is left out
    assert asked(["When", " I", "'m", " off", ",", " I", " paint", "."]) == [""]
    assert asked(["Can", "’t", " wait", " to", " see", " my", " cat", "."]) == [""]
    # a request after the greetings a sentence opens with asks; a greeting alone or before a statement does not
    assert asked(["hii", " can", " u", " help", " me", " plan", " a", " trip"]) == ["hii can u help me plan a trip"]
    assert asked(["Hey", " there", ",", " what", "'s", " a", " good", " book"]) == ["Hey there, what's a good book"]
    assert asked(["hey", " i", "'m", " Sam", ",", " can", " you", " help"]) == [""]
    assert asked(["Good", " morning", " everyone"]) == [""]
    for pieces, kept in (
        (["Tell", " me", " a", " joke", ".", " I", "'m", " a", " nurse", "."], [(5, 10)]),
        (["I", " have", " a", " cat", ",", " is", " that", " weird", "?"], [(0, 5)]),
    ):
        chosen = message_spans(torch.full((len(pieces),), 9.0), pieces, None, budget=20, max_span=16, min_score=4.0)
        assert [(c.start, c.end) for c in chosen] == kept


def test_a_clause_that_only_greets_is_not_imprinted() -> None:
    """A clause naming nothing but greetings, exclamations or the one addressed, in any language and however drawn out
    ("Servus.", "hiii", "Good afternoon.", "Eish!"), is never imprinted; one that names anything else is."""
    tok = ByteTokenizer()

    def greeted(text: str) -> list[str]:
        said = [tok.token_text(t) for t in tok.encode(text)]
        marks = greetings(said).tolist()
        return ["".join(p for p, m in zip(said[a:b], marks[a:b], strict=True) if m) for a, b in _clause_ranges(said)]

    assert greeted("Servus. Prison officer at the Karlau, Graz.") == ["Servus.", "", ""]
    assert greeted("Good afternoon. Kunle Adeyemi, actuary.") == ["Good afternoon.", "", ""]
    assert greeted("Eish! Load shedding in Gweru") == ["Eish!", ""]
    assert greeted("hiii aigerim here") == [""] and greeted("Hello there, I'm Ana") == ["Hello there,", ""]
    assert greeted("holaaa! Well hello there!") == ["holaaa!", " Well hello there!"]
    assert greeted("I'm Kia.") == [""] and greeted("Dia here.") == [""]  # a name that is also a greeting's word
    # an emoji closes a thought as a comma does: the greeting before it goes, the name after it stays
    said = completed_texts(tok, tok.encode("hiii 🌼 tove here"))
    marks = greetings(said).tolist()
    assert ["".join(said[a:b]) for a, b in _clause_ranges(said)] == ["hiii 🌼", " tove here"]
    assert "".join(p for p, m in zip(said, marks, strict=True) if m) == "hiii 🌼"
    said = completed_texts(tok, tok.encode("good morning from the night shift 😵 im a guard in cebu"))
    assert ["".join(said[a:b]) for a, b in _clause_ranges(said)] == [
        "good morning from the night shift 😵",
        " im a guard in cebu",
    ]
    message = "Assalomu alaykum! My name is Dilnoza."
    said = [tok.token_text(t) for t in tok.encode(message)]
    chosen = message_spans(torch.full((len(said),), 9.0), said, None, budget=60, max_span=40, min_score=4.0)
    assert [message[c.start : c.end] for c in chosen] == [" My name is Dilnoza."]


def test_someone_elses_name_is_never_the_users_and_a_clause_of_their_own_name_is() -> None:
    """A clause that gives someone else's name ("his name is Bubbles", "a labrador named Skipper") is marked, and a span
    of it the tagger labels a name is stored as of no kind: it never replaces the name the user gave. A clause that
    gives the writer's own name ("I'm called Ana", "Aroha's the name", "my parents named me Kofi") is not marked; one
    that gives it and says nothing more ("Hi, I'm Sam") is labelled a name where the tagger gave it no kind."""
    tok = ByteTokenizer()

    def marked(text: str) -> bool:
        return bool(others_names(completed_texts(tok, tok.encode(text))).any())

    for text in (
        "his name is Bubbles",
        "Her name's Luna",
        "a labrador named Skipper",
        "my son's name is Tamati",
        "my dog’s real name is Rex",
        "He is named Kapiteni",
        "I named him Hadrian",
        "she's called Mochi",
    ):
        assert marked(text), text
    for text in (
        "My name is Ana",
        "name's Ruth",
        "Aroha's the name",
        "I'm called Ana",
        "I was named after my gran",
        "my parents named me Kofi",
        "I live in Lyon",
    ):
        assert not marked(text), text
    for text in ("Hi, I'm Sam", "hey there, Lerato here", "my name is Ana Kowalski", "hi my name is jo", "Hi! Ewa Nowak here"):
        assert own_name_only(text), text
    for text in ("I'm Grace and I'm a midwife", "I'm a nurse", "Hey, Cosmin from Cluj-Napoca", "eero.", "his name is Rex"):
        assert not own_name_only(text), text
    message = "Priyanka here, tester in Hyderabad. I keep a goldfish, his name is Bubbles."
    pieces = [tok.token_text(t) for t in tok.encode(message)]
    kinds = torch.zeros(len(pieces), len(KINDS))
    kinds[:, KINDS.index("name")] = 1.0  # a tagger sure that every clause states a name
    chosen = message_spans(torch.full((len(pieces),), 9.0), pieces, kinds, budget=200, max_span=60, min_score=4.0)
    said = [(message[c.start : c.end], KINDS[c.kind], c.replaces) for c in chosen]
    assert ("Priyanka here,", "name", True) in said
    assert (" his name is Bubbles.", "unknown", False) in said
    assert all(kind == "name" for text, kind, _ in said if "Bubbles" not in text)
    # a clause the tagger leaves unlabelled that only gives the user's own name is labelled one, and sure
    message = "Hi, I'm Sam. My daughter's name is Lily."
    pieces = [tok.token_text(t) for t in tok.encode(message)]
    unlabelled = torch.zeros(len(pieces), len(KINDS))
    chosen = message_spans(torch.full((len(pieces),), 9.0), pieces, unlabelled, budget=200, max_span=60, min_score=4.0)
    said = [(message[c.start : c.end], KINDS[c.kind], c.replaces) for c in chosen]
    assert said == [("Hi, I'm Sam.", "name", True), (" My daughter's name is Lily.", "unknown", False)]


def _clause_ranges(pieces: list[str]) -> list[tuple[int, int]]:
    breaks = clause_breaks(pieces).tolist()
    out, start = [], 0
    for i, end in enumerate(breaks):
        if end or i == len(pieces) - 1:
            out.append((start, i + 1))
            start = i + 1
    return out


def test_a_clause_saying_what_is_no_longer_so_is_not_imprinted() -> None:
    """In "oh wait, i'm not in cusco anymore, got transferred to puno" the older city's clause is left out, so it
    does not come back beside the newer one; a clause that merely mentions a past ("I moved to Puno") is kept."""
    pieces = ["oh", " wait", ",", " i", "'m", " not", " in", " cus", "co", " any", "more", ",", " got", " transferred", " to",
              " pun", "o", " last", " month", "."]  # fmt: skip
    stale = superseded(pieces)
    assert "".join(p for p, s in zip(pieces, stale.tolist(), strict=True) if s) == "oh wait, i'm not in cusco anymore,"
    chosen = message_spans(torch.full((len(pieces),), 9.0), pieces, None, budget=40, max_span=16, min_score=4.0)
    assert ["".join(pieces[c.start : c.end]) for c in chosen] == [" got transferred to puno last month."]
    kept = (["I", " moved", " to", " Puno", "."], ["I", " used", " the", " bus", "."], ["I", " bake", " from", " scratch", "."])
    assert not any(superseded(text).any() for text in kept)
    assert superseded(["Bould", "ering", " used", " to", " be", " my", " thing", "."]).all()
    assert superseded(["I", "'m", " no", " longer", " at", " the", " fish", " plant"]).all()
    # what the user left, quit, stopped or moved out of, and what is over or ended
    for text in ("i left the dentist office friday", "I quit the band", "we moved out of Fremont last month",
                 "roller derby is over for me", "the Horta marina job ended", "Oh, scratch Usedom"):  # fmt: skip
        assert superseded([text]).all(), text
    assert not any(superseded([t]).any() for t in ("my left hand", "it's over there", "I moved to Split", "I'm the left back"))
    # what the user has gone off, what is gone, given away or rehomed, what died, what is on pause or got boring
    for text in ("Honestly I've gone off chess", "The goldfish are gone", "We rehomed the parrot with my uncle",
                 "I gave my old bike away", "Biscuit died in March", "Knitting's on pause", "fishing got boring",
                 "I retired from accounting in the spring"):  # fmt: skip
        assert superseded([text]).all(), text
    assert not any(superseded([t]).any() for t in ("we're gone to the coast till Friday", "I'm holding a hamster", "off to work"))
    # what the user moved or switched from ends its clause before the "to" of what they moved or switched to
    pieces = ["I", " recently", " moved", " from", " Lag", "os", " to", " Ab", "uja", "."]
    chosen = message_spans(torch.full((len(pieces),), 9.0), pieces, None, budget=40, max_span=16, min_score=4.0)
    assert ["".join(pieces[c.start : c.end]) for c in chosen] == [" to Abuja."]
    assert ("lagos",) in given_up(pieces)
    pieces = ["I", " switched", " from", " nursing", " to", " teaching", "."]
    assert clause_breaks(pieces).tolist() == [False, False, False, True, False, False, True]
    pieces = ["We", " moved", " to", " Lisbon", " from", " Porto", "."]  # what they moved to comes first: one clause
    assert clause_breaks(pieces).tolist() == [False] * 6 + [True] and not superseded(pieces).any()


def test_a_clause_that_says_what_is_so_now_is_marked() -> None:
    """``says_now``: a clause with "now", "these days", "currently", "as of" or "since last month" is marked, its
    neighbours not; one that says what is no longer so is not (it is never imprinted)."""
    tok = ByteTokenizer()

    def marked(text: str) -> str:
        pieces = [tok.token_text(t) for t in tok.encode(text)]
        return "".join(p for p, now in zip(pieces, says_now(pieces).tolist(), strict=True) if now)

    assert marked("Got promoted! I'm a producer now, so more meetings") == " I'm a producer now,"
    assert marked("these days it's bouldering, three times a week") == "these days it's bouldering,"
    assert marked("since last month I rent in Braga") == "since last month I rent in Braga"
    assert marked("I live in Puno and I love it") == ""
    assert marked("I'm not in Lyon anymore now") == ""


def test_a_clause_taken_back_in_the_same_message_is_not_imprinted() -> None:
    """ "fave colour's yellow. nah scratch that, it's teal": the clause before the one that takes it back is left out,
    the mended one kept (also where the mending and the taking back are one clause); a message that takes nothing back,
    and a retraction opening a message, leave every clause."""
    tok = ByteTokenizer()

    def kept(text: str) -> list[str]:
        pieces = [tok.token_text(t) for t in tok.encode(text)]
        chosen = message_spans(torch.full((len(pieces),), 9.0), pieces, None, budget=200, max_span=60, min_score=4.0)
        return ["".join(pieces[c.start : c.end]) for c in chosen]

    assert kept("fave colour's yellow. nah scratch that, it's teal") == [" it's teal"]  # "scratch" says what is over
    assert kept("doing audits for KPMG... wait no, I switched to EY") == [".", ".", " wait no,", " I switched to EY"]
    assert kept("my cat is Tom, ah no sorry, Tim") == [" ah no sorry,", " Tim"]
    assert kept("Paris is lovely. no wait, I moved to Lyon") == [" no wait,", " I moved to Lyon"]
    assert kept("no wait, I moved to Lyon in May") == ["no wait,", " I moved to Lyon in May"]  # nothing before it
    assert kept("I said no, sorry to say. I live in Lyon") == ["I said no,", " sorry to say.", " I live in Lyon"]
    assert kept("I drive trams, scratching my head all day") == ["I drive trams,", " scratching my head all day"]
    # the mending clause itself says what is so, though it opens with "scratch" (three tokens before its comma: one
    # clause): it is kept, and gives up no word alone
    mended = ["My", " cat", " is", " Tom", ".", " Scratch", " that", ",", " my", " cat", " is", " called", " Felix", "."]
    chosen = message_spans(torch.full((len(mended),), 9.0), mended, None, budget=200, max_span=60, min_score=4.0)
    assert ["".join(mended[c.start : c.end]) for c in chosen] == [" Scratch that, my cat is called Felix."]
    assert all(len(group) > 1 for group in given_up(mended))


def test_a_clause_that_says_the_one_before_is_over_leaves_both_out() -> None:
    """ "I told you I live in Graz, but that was last year": the clause before is left out, and this one too where it
    names nothing else; "I had a tortoise for twelve years but he died last winter" the same. A clause that dismisses
    what it names ("Forget the trumpet", "never mind Lyon") or says it was sold says it is over: it is left out and gives
    its words up. A message that says none of that keeps every clause."""
    tok = ByteTokenizer()

    def kept(text: str) -> list[str]:
        pieces = [tok.token_text(t) for t in tok.encode(text)]
        chosen = message_spans(torch.full((len(pieces),), 9.0), pieces, None, budget=200, max_span=60, min_score=4.0)
        return ["".join(pieces[c.start : c.end]) for c in chosen]

    assert kept("I told you I live in Graz, but that was last year. Now it's Linz") == [" Now it's Linz"]
    assert kept("I had a tortoise for twelve years but he died last winter. Now I have a kitten") == [" Now I have a kitten"]
    assert kept("Forget the trumpet, I sold it. It's pottery now") == [" It's pottery now"]
    assert kept("I love Graz, it was lovely before the rain") == ["I love Graz,", " it was lovely before the rain"]
    assert kept("I never forget the trumpet lessons") == ["I never forget the trumpet lessons"]
    assert given_up(["Forget", " the", " trumpet", ","]) == [("trumpet",)]
    assert given_up(["oh", " never", " mind", " Lyon"]) == [("lyon",)]
    assert given_up(["we", " sold", " the", " boat"]) == [("boat",)]
    assert given_up(["I", " bought", " a", " boat"]) == []
    # in a message that corrects, a clause restating what is still so gives nothing up ("still a nurse")
    assert ("nurse",) not in given_up(["Moved", " to", " York", ",", " still", " a", " nurse", "."])
    assert ("nurse",) in given_up(["Moved", " to", " York", ",", " I", " said", " nurse", "."])


def test_a_dash_between_words_ends_a_clause_one_inside_a_word_does_not() -> None:
    """ "I need to correct myself — I moved over to Ponta Delgada": the value is its own clause, not cut off by a
    window around the correction's words; "Saint-Louis" and "inter-island" stay whole."""
    pieces = ["I", " need", " to", " correct", " myself", " —", " I", " moved", " to", " Split", " -", " and", " stay"]
    assert clause_breaks(pieces).nonzero().flatten().tolist() == [5, 10]
    assert not clause_breaks(["I", " live", " in", " Saint", "-", "Louis", " now"]).any()


def test_a_message_that_gives_a_value_up_takes_it_out_of_what_earlier_turns_imprinted() -> None:
    """ "technically not Lyon", "it is NOT a chinchilla", "Correction: was an actuary", "roller derby used to be my
    thing": such a clause is not imprinted, and every span an earlier turn imprinted that names what it gives up goes
    (as a word, an s after it allowed); the other spans, the same turn's and those kept without their text stay."""
    denial = ["Well", ",", " technically", " not", " Ly", "on", "."]
    assert given_up(denial) == [("lyon",)] and superseded(denial, denied=["lyon"]).all()
    assert not superseded(denial).any()  # a denial of what the user never said is a clause like any other
    assert given_up(["it", " is", " NOT", " a", " chin", "chilla", ",", " it", " is", " a", " degu", "."]) == [("chinchilla",)]
    assert given_up(["Please", " don't", " use", " Barth", "olomew", "."]) == [("bartholomew",)]
    assert given_up(["Correction", ":", " was", " an", " actuary", "."]) == [("actuary",)]
    assert given_up(["I", " was", " an", " actuary", "."]) == []  # "was" gives up something only in a correction
    assert given_up(["roller", " derby", " used", " to", " be", " my", " thing"]) == [("roller",), ("derby",)]
    assert given_up(["I", " live", " in", " Lyon", " and", " I", " love", " it", "."]) == []
    # in a message that corrects, a clause naming a few things goes where the user said every one of them before
    corrected = ["ok", " I", " was", " wrong", ",", " I", " said", " Vela", " Luka", ",", " it", "'s", " Split", " now"]
    assert given_up(corrected) == [("vela", "luka"), ("split",)]
    stale = superseded(corrected, denied=["vela", "luka"])
    assert "".join(p for p, s in zip(corrected, stale.tolist(), strict=True) if s) == "ok I was wrong, I said Vela Luka,"
    assert not superseded(corrected, denied=["vela"])[5:10].any()  # every word of the clause must have been said
    # in a message that corrects, a clause opening with what something was gives it up, whatever earlier turns held
    was = ["wait", ",", " my", " shop", " was", " in", " Bo", ",", " now", " it", "'s", " in", " Ken", "ema"]
    assert given_up(was) == [("shop",), ("kenema",)]
    assert "".join(p for p, s in zip(was, superseded(was).tolist(), strict=True) if s) == "wait, my shop was in Bo,"
    assert not superseded(["my", " shop", " was", " in", " Bo", " for", " years", "."]).any()  # no correction: kept
    texts = {0: "living in Lyon for two years", 10: "my two cats", 20: "Lyonnaise cooking", 30: "Lyon again, today"}
    imprint = _add(_add(_add(_imprint(20), 3, 5.0, seed=0), 3, 5.0, seed=1), 3, 5.0, seed=2)  # turn 0
    imprint = _add(imprint, 3, 5.0, turn=3, seed=3)  # the giving-up turn's own span
    keys, values = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    imprint = imprint_spans(imprint, keys, values, [SpanChoice(0, 3, 5.0)], turn=0, tokens=None)  # no text kept

    def decode(ids: list[int]) -> str:
        return texts[ids[0]] if ids else ""

    kept, found = forget_words(imprint, [("lyon",), ("degu",)], decode, turn=3)
    assert [s.tokens[0] if s.tokens else None for s in kept.spans()] == [10, 20, 30, None] and kept.used == 12
    assert found == ["lyon"]
    no_cat, found = forget_words(imprint, [("cat",)], decode, 3)
    assert [s.tokens[0] if s.tokens else None for s in no_cat.spans()] == [0, 20, 30, None] and found == ["cat"]
    # a group counts only where every word of it was said before: "two years" (turn 0) and "living" (turn 0) take
    # the same span; "lyon" with "degu" takes nothing
    both, found = forget_words(imprint, [("two", "living")], decode, 3)
    assert [s.tokens[0] if s.tokens else None for s in both.spans()] == [20, 30, None] and found == ["two", "living"]
    assert forget_words(imprint, [("lyon", "degu")], decode, 3) == (imprint, [])
    assert forget_words(imprint, [], decode, 3) == (imprint, []) and forget_words(imprint, [("degu",)], decode, 3) == (
        imprint,
        [],
    )


def test_a_span_that_names_more_than_what_is_given_up_keeps_the_rest() -> None:
    """ "I'm Pavel, a sound engineer in Prague" then "not Prague any more": a span labelled with a kind that is not a
    place keeps "a sound engineer" (its entries before the words "in Prague", with their keys and values, and its
    kind); a city's span or one of unknown kind goes whole (a place's rest, "we stay", names no fact), and so does a
    span with nothing named before the word."""
    pieces = {1: " a", 2: " sound", 3: " engineer", 4: " in", 5: " Prague", 6: ".", 7: " Prague", 8: " is", 9: " home",
              10: " we", 11: " stay", 12: " I", 13: " have", 14: " a", 15: " cat", 16: " from"}  # fmt: skip
    decode = _decoder(pieces)

    imprint = _said(_said(_imprint(30), [1, 2, 3, 4, 5, 6], "job"), [7, 8, 9], "job")
    imprint = _said(_said(_said(imprint, [10, 11, 4, 5], "city"), [10, 11, 4, 5], "unknown"), [12, 13, 14, 15, 16, 5], "pet")
    kept, found = forget_words(imprint, [("prague",)], decode, turn=1)
    assert found == ["prague"]
    assert [(s.tokens, s.kind) for s in kept.spans()] == [((1, 2, 3), "job"), ((12, 13, 14, 15), "pet")]
    assert torch.equal(kept.keys[:, :, :3], imprint.keys[:, :, :3]) and kept.used == 7
    assert torch.equal(kept.values[:, :, 3:7], imprint.values[:, :, 17:21])


def test_an_unlabelled_span_keeps_what_it_names_before_a_place_given_up() -> None:
    """ "i restore old textiles for a museum in cusco" (no label, as most clauses of a job) then "not in cusco anymore":
    the span keeps "i restore old textiles for a museum", still unlabelled; one whose rest names one thing ("we stay")
    goes whole."""
    pieces = {1: " i", 2: " restore", 3: " old", 4: " textiles", 5: " for", 6: " a", 7: " museum", 8: " in", 9: " cusco",
              10: " we", 11: " stay"}  # fmt: skip
    imprint = _said(_said(_imprint(30), [1, 2, 3, 4, 5, 6, 7, 8, 9], "unknown"), [10, 11, 8, 9], "unknown")
    kept, found = forget_words(imprint, [("cusco",)], _decoder(pieces), turn=1)
    assert found == ["cusco"]
    assert [(s.tokens, s.kind) for s in kept.spans()] == [((1, 2, 3, 4, 5, 6, 7), "unknown")]
    assert torch.equal(kept.keys[:, :, :7], imprint.keys[:, :, :7]) and kept.used == 7


def test_a_span_keeps_the_place_said_after_what_is_given_up() -> None:
    """ "I'm an electrician in Gdańsk" then "not an electrician any more": nothing is named before the word, so the span
    keeps the place said after it, "in Gdańsk" (its keys, values and tokens, its offsets moved on), labelled as a city
    where the span was and with no kind otherwise; what follows the word unless it opens as a place does ("for two
    years") goes with it."""
    pieces = {1: " I", 2: "'m", 3: " an", 4: " electrician", 5: " in", 6: " Gda", 7: "ńsk", 8: ".", 9: " for", 10: " two",
              11: " years"}  # fmt: skip
    decode = _decoder(pieces)

    imprint = _said(_said(_imprint(30), [1, 2, 3, 4, 5, 6, 7, 8], "city"), [1, 2, 3, 4, 5, 6, 7, 8], "job")
    imprint = _said(imprint, [1, 2, 3, 4, 9, 10, 11], "job")
    kept, found = forget_words(imprint, [("electrician",)], decode, turn=1)
    assert found == ["electrician"]
    assert [(s.tokens, s.kind, s.offset) for s in kept.spans()] == [((5, 6, 7, 8), "city", 4), ((5, 6, 7, 8), "unknown", 4)]
    assert torch.equal(kept.keys[:, :, :4], imprint.keys[:, :, 4:8]) and kept.used == 8
    assert torch.equal(kept.values[:, :, 4:8], imprint.values[:, :, 12:16])


def test_a_correcting_message_replaces_older_values_even_with_an_unsure_label() -> None:
    """A message that corrects or updates what the user said ("correction", "wait", "we moved", "anymore") makes each
    clause it labels sure: it goes first and replaces the older spans of its kind. The same unsure label in another
    message replaces nothing (test_an_unsure_label_is_stored_but_neither_goes_first_nor_replaces)."""
    assert corrects(["Correction", ":", " was", " an", " actuary", "."])
    assert corrects(["ah", " wait", ",", " we", " moved", " to", " N", "adi"])
    assert corrects(["Oh", " big", " news", ",", " I", " switched", " to", " EY"])
    assert not corrects(["I", " knit", " on", " Sundays", "."])
    assert not corrects(["I", " live", " in", " Lyon", " and", " I", " love", " it", "."])
    # the other ways people say they update or mend what they said
    for said in (
        "Oh, I should mention I relocated to Porto last month.",
        "Just so you know, I changed jobs, I'm a plumber these days.",
        "My favourite colour has changed to purple.",
        "Forget what I said about Madrid, I live in Seville.",
        "I misspoke earlier, my name is Joanna.",
        "Sorry, typo: I meant Lyon.",
        "My bad, it's red.",
        "Let me rephrase: my hobby is knitting.",
        "These days I'm into pottery rather than chess.",
        "Turns out I prefer yellow after all.",
        "I changed my mind, my favourite colour is orange.",
        "Oops, I meant to say I have a parrot.",
        "Hold on, I got that wrong, I live in Graz.",
        "Let me correct that: my pet is a rabbit.",
        "New city for me: Lisbon!",
    ):
        assert corrects([said]), said
    assert not corrects(["That's correct, I knit on Sundays."]) and not corrects(["I love my new scarf."])

    def chosen(pieces: list[str]) -> list[tuple[str, str, bool]]:
        kinds = torch.zeros(len(pieces), len(KINDS))
        kinds[:, 0], kinds[:, KINDS.index("city")] = 0.6, 0.4  # labelled from 0.3, sure from 0.5
        out = message_spans(torch.full((len(pieces),), 9.0), pieces, kinds, budget=40, max_span=16, min_score=4.0, min_label=0.3)
        return [("".join(pieces[c.start : c.end]), KINDS[c.kind], c.replaces) for c in out if c.kind]

    update = ["Update", ":", " we", " live", " in", " Pun", "o", " now", "."]
    assert chosen(update) == [("Update: we live in Puno now.", "city", True)]
    assert chosen(["Today", *update[2:-2], "."]) == [("Today we live in Puno.", "city", False)]
    # a clause that says what is so now is sure from the stored label's threshold, in any message; its neighbours not
    now = ["I", " live", " in", " Pun", "o", " now", ",", " my", " sister", " is", " in", " Lima", "."]
    assert chosen(now) == [("I live in Puno now,", "city", True), (" my sister is in Lima.", "city", False)]


def test_the_clause_carrying_a_correction_is_chosen_first_and_outlasts_chatter() -> None:
    """In a message that corrects, the clause carrying each correction (the one holding the words that correct where it
    names something after them, else the next of its sentence that names something, never one left out) is chosen
    whatever its shock, scores ``mend_bonus`` more, and then holds its place in a full imprint as a known kind does."""
    tok = ByteTokenizer()

    def pieces(text: str) -> list[str]:
        return [tok.token_text(t) for t in tok.encode(text)]

    def mended(text: str) -> list[str]:
        said = pieces(text)
        marks = mends(said, left_out=asking(said) | superseded(said)).tolist()
        out, run = [], ""
        for piece, mark in zip(said, marks, strict=True):
            run += piece if mark else ""
            if run and not mark:
                out, run = [*out, run], ""
        return out + ([run] if run else [])

    assert mended("my birthday is 12 May. ah no sorry, 21 May, I mix them up") == [" 21 May,"]
    assert mended("update: I just accepted the offer from UST, so scratch the startup, lol") == [
        " I just accepted the offer from UST,"
    ]  # "update:" names nothing after its word (a clause of its own here); "lol" after the clause given up neither
    assert mended("Oh, scratch Usedom, my wife rebooked for Rugen.") == [" my wife rebooked for Rugen."]
    assert mended("omg what am I saying, it's 23 November, the 22nd is my brother's") == [" it's 23 November,"]
    # where the sentence of the correcting words names nothing more, the next one's first clause; never a second one on
    assert mended("take back the turquoise thing. since I painted my kitchen orange I love it") == [
        " since I painted my kitchen orange I love it"
    ]
    assert mended("Scratch that. Is it Friday? I love jazz.") == []
    assert mended("scratch that\nIs it Friday?\nI love jazz") == []  # a line break ends a sentence too
    # words that correct softly, or say only what is over, point at nothing; nor does a correction whose next clause
    # carries a sure label
    assert mended("oops, English. I live in Rimouski") == [] and mended("I actually love my cat, Tom") == []
    said = pieces("no wait, I looked around, everything is cobalt blue.")
    sure = torch.tensor([i >= len("no wait, I looked around,") for i in range(len(said))])
    assert not bool(mends(said, sure=sure).any()) and bool(mends(said).any())
    assert mended("I love jazz and I live in Lyon.") == []  # corrects nothing
    # "sorry, no" corrects where the "no" stands alone or before the words that mend, not where it opens what it names
    assert mended("Sorry, no intro! Waleska, Gdynia.") == [] and not corrects(pieces("Sorry, no intro!"))
    assert corrects(pieces("sorry no, it's Lyon")) and corrects(pieces("Sorry no it's Lyon"))
    # a newer value the identity expected (little shock) is chosen first, past min_score, and scores the bonus more
    text = "ah no sorry, 21 May, I mix them up"
    surprisal = torch.full((len(text),), 9.0)
    may = text.index(" 21 May,")
    surprisal[may : may + len(" 21 May,")] = 2.0
    settings = {"budget": 8, "max_span": 40, "min_score": 4.0}
    assert [text[c.start : c.end] for c in message_spans(surprisal, pieces(text), None, **settings)] == []  # nothing fits
    chosen = message_spans(surprisal, pieces(text), None, mend_bonus=64.0, **settings)
    assert [(text[c.start : c.end], c.score, c.kind) for c in chosen] == [(" 21 May,", 66.0, 0)]
    # held: it outlasts a known kind's span scored lower and chatter scored far higher
    imprint = _add(_add(_imprint(), 3, 66.0, seed=1), 4, 3.0, kind=KINDS.index("city"), seed=2)
    imprint = _add(imprint, 5, 20.0, seed=3)  # chatter: does not fit, and evicts neither
    assert [(s.kind, s.score) for s in imprint.spans()] == [("unknown", 66.0), ("city", 3.0)]
    # among known kinds it ranks by its own shock (2.0): a job that surprised less is dropped, one that surprised more
    # takes its place
    assert _add(imprint, 5, 1.0, kind=KINDS.index("job"), seed=4).spans() == imprint.spans()
    imprint = _add(imprint, 5, 2.5, kind=KINDS.index("job"), seed=4)
    assert [(s.kind, s.score) for s in imprint.spans()] == [("city", 3.0), ("job", 2.5)]
    with pytest.raises(ValueError, match="imprint_mend_bonus"):
        LlamaConfig(imprint_mend_bonus=-1.0)


def test_selection_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="breaks"):
        select_spans(torch.ones(3), torch.zeros(2, dtype=torch.bool), budget=4, max_span=2, min_score=0)
    with pytest.raises(ValueError, match="finite"):
        select_spans(torch.tensor([1.0, float("nan")]), torch.zeros(2, dtype=torch.bool), budget=4, max_span=2, min_score=0)


# --- replacement and forgetting ---


def _imprint(capacity: int = 10) -> Imprint:
    return Imprint.blank(2, 1, capacity, 4)


def _decoder(pieces: dict[int, str]) -> Callable[[list[int]], str]:
    """A decode of made-up token ids, each one of ``pieces``."""
    return lambda ids: "".join(pieces[i] for i in ids)


def _said(imprint: Imprint, ids: list[int], kind: str) -> Imprint:
    """``imprint`` with one span of turn 0 holding the tokens ``ids`` (random keys and values), labelled ``kind``."""
    n = len(ids)
    keys, values, tokens = torch.randn(2, 1, n, 4), torch.randn(2, 1, n, 4), torch.tensor(ids)
    return imprint_spans(imprint, keys, values, [SpanChoice(0, n, 5.0, KINDS.index(kind))], turn=0, tokens=tokens)


def _add(imprint: Imprint, length: int, score: float, kind: int = 0, turn: int = 0, seed: int = 0) -> Imprint:
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(2, 1, length, 4, generator=g), torch.randn(2, 1, length, 4, generator=g)
    tokens = torch.arange(length) + 10 * seed
    return imprint_spans(imprint, keys, values, [SpanChoice(0, length, score, kind)], turn=turn, tokens=tokens)


def test_a_span_that_does_not_fit_replaces_the_lowest_scored_ones() -> None:
    imprint = _add(_add(_add(_imprint(), 4, 5.0, seed=1), 3, 2.0, seed=2), 3, 7.0, seed=3)
    assert [(s.length, s.score) for s in imprint.spans()] == [(4, 5.0), (3, 2.0), (3, 7.0)] and imprint.used == 10
    imprint = _add(imprint, 3, 6.0, seed=4)  # evicts the 2.0 span
    assert [(s.length, s.score) for s in imprint.spans()] == [(4, 5.0), (3, 7.0), (3, 6.0)]
    assert [s.tokens for s in imprint.spans()][1] == (30, 31, 32)  # spans move up whole, never averaged
    kept = imprint
    assert _add(imprint, 2, 1.0, seed=5).spans() == kept.spans()  # a weaker span than all is dropped


def test_a_span_that_cannot_make_room_evicts_nothing() -> None:
    imprint = _add(_add(_imprint(), 3, 2.0, seed=1), 7, 9.0, seed=2)  # full: a weak span and a strong one
    # six tokens would need the strong span's room too: the weak span stays and the new one is dropped
    assert _add(imprint, 6, 5.0, seed=3).spans() == imprint.spans()
    assert [s.score for s in _add(imprint, 3, 5.0, seed=3).spans()] == [9.0, 5.0]  # three tokens fit in the weak one's


def test_a_restatement_of_a_kind_replaces_the_old_value() -> None:
    imprint = _add(_add(_imprint(), 3, 5.0, kind=2, seed=1), 3, 4.0, kind=1, seed=2)
    moved = _add(imprint, 2, 3.0, kind=2, turn=5, seed=3)  # "I moved to Lyon" though it scores lower
    assert [(s.kind, s.turn, s.tokens) for s in moved.spans()] == [("name", 0, (20, 21, 22)), ("city", 5, (30, 31))]


def test_a_replaced_span_keeps_the_place_it_says_where_the_new_one_says_none() -> None:
    """ "I'm a bus mechanic in Kumasi", then "I teach at the college now" (a job replacing the job): the older span keeps
    " in Kumasi." (its entries as they were, no kind); where the new span says a place ("I'm a teacher in York now"), the
    older span goes whole, as it does without the tokenizer's decode (or without text). A restatement of a place
    replaces a place whole."""
    pieces = {1: " I", 2: "'m", 3: " a", 4: " mechanic", 5: " in", 6: " Kum", 7: "asi", 8: ".", 9: " teach", 10: " at",
              11: " college", 12: " now", 13: " York"}  # fmt: skip
    decode = _decoder(pieces)

    job, city = KINDS.index("job"), KINDS.index("city")
    said = [1, 2, 3, 4, 5, 6, 7, 8]
    keys, values = torch.randn(2, 1, 8, 4), torch.randn(2, 1, 8, 4)
    imprint = imprint_spans(_imprint(30), keys, values, [SpanChoice(0, 8, 5.0, job)], turn=0, tokens=torch.tensor(said))

    def then(ids: list[int], kind: int, *, text: bool = True, with_decode: bool = True) -> Imprint:
        n = len(ids)
        return imprint_spans(
            imprint,
            torch.randn(2, 1, n, 4),
            torch.randn(2, 1, n, 4),
            [SpanChoice(0, n, 5.0, kind)],
            turn=1,
            tokens=torch.tensor(ids) if text else None,
            decode=decode if with_decode else None,
        )

    def spans(after: Imprint) -> list[tuple[tuple[int, ...] | None, str]]:
        return [(s.tokens, s.kind) for s in after.spans()]

    teach = [1, 9, 10, 11, 12]
    kept = then(teach, job)
    assert spans(kept) == [((5, 6, 7, 8), "unknown"), (tuple(teach), "job")]
    assert torch.equal(kept.keys[:, :, :4], imprint.keys[:, :, 4:8]) and kept.spans()[0].offset == 4
    assert spans(then([1, 2, 3, 9, 5, 13, 12], job)) == [((1, 2, 3, 9, 5, 13, 12), "job")]
    assert spans(then(teach, job, with_decode=False)) == [(tuple(teach), "job")]
    assert spans(then(teach, job, text=False)) == [(None, "job")]
    assert spans(then([5, 13], city)) == [(tuple(said), "job"), ((5, 13), "city")]


def test_spans_of_one_kind_from_one_message_stay_together() -> None:
    """ "Ekaterini Papadaki, but everyone calls me Katia": both name spans of a message stay; a later turn's name
    replaces them both."""
    both = _add(_add(_imprint(), 3, 5.0, kind=1, turn=2, seed=1), 2, 4.0, kind=1, turn=2, seed=2)
    assert [(s.kind, s.tokens) for s in both.spans()] == [("name", (10, 11, 12)), ("name", (20, 21))]
    later = _add(both, 2, 3.0, kind=1, turn=3, seed=3)
    assert [(s.turn, s.tokens) for s in later.spans()] == [(3, (30, 31))]


def test_forgetting_one_span() -> None:
    imprint = _add(_add(_add(_imprint(), 3, 5.0, seed=1), 2, 4.0, seed=2), 2, 3.0, seed=3)
    keys_after = imprint.keys[:, :, 5:7].clone()
    left = forget_span(imprint, 1)
    assert [s.tokens for s in left.spans()] == [(10, 11, 12), (30, 31)] and left.used == 5
    assert torch.equal(left.keys[:, :, 3:5], keys_after)
    assert bool((left.span[5:] == -1).all()) and bool((left.keys[:, :, 5:] == 0).all())
    with pytest.raises(ValueError, match="no span 3"):
        forget_span(left, 3)


def test_int8_entries_round_trip_within_half_a_step() -> None:
    x = torch.randn(3, 2, 5, 16) * 4
    q, scale = quantise(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float16
    err = (dequantise(q, scale) - x).abs()
    assert bool((err <= scale.float().unsqueeze(-1) * 0.5 + 1e-3 * x.abs()).all())


def test_four_bit_entries_pack_two_a_byte_and_round_trip_within_half_a_step() -> None:
    x = torch.randn(3, 2, 5, 16) * 4
    q, scale = quantise(x, 4)
    assert q.dtype == torch.uint8 and q.shape == (3, 2, 5, 8) and scale.dtype == torch.float16
    back = dequantise(q, scale)
    assert back.shape == x.shape
    assert bool((back.abs() <= scale.float().unsqueeze(-1) * 7 + 1e-6).all())  # at most 7 steps either way
    err = (back - x).abs()
    assert bool((err <= scale.float().unsqueeze(-1) * 0.5 + 1e-3 * x.abs()).all())
    assert float(err.mean()) > float((dequantise(*quantise(x)) - x).abs().mean())  # coarser than int8, as it must be
    with pytest.raises(ValueError, match="8 or 4"):
        quantise(x, 2)
    with pytest.raises(ValueError, match="even"):
        quantise(torch.randn(3, 5), 4)


def test_a_four_bit_imprint_is_read_as_the_int8_one_within_its_rounding(hf_model: LlamaForCausalLM) -> None:
    """The same words imprinted in 4 bits and in int8: half the bytes, the same entries to within 4 bits' step, and
    logits that differ by the rounding only (far less than an imprint's own effect)."""
    eight, four = build(hf_model), build(hf_model, imprint_bits=4)
    a, b = planted(eight, "Marisol"), planted(four, "Marisol")
    assert b.keys.dtype == torch.uint8 and b.keys.nbytes * 2 == a.keys.nbytes and b.spans() == a.spans()
    for x, y in zip(a.entries()[:2], b.entries()[:2], strict=True):
        assert float((x - y).abs().max()) <= float(x.abs().max()) / 7
    idx = torch.tensor([four.tokenizer.encode("what is my name?")])
    fresh = IdentityState.fresh(four.config)
    with torch.no_grad():
        base = four(idx, four.condition_states([fresh])).logits
        got = {m: m(idx, m.condition_states([replace(fresh, imprint=i)])).logits for m, i in ((eight, a), (four, b))}
    effect = float((got[eight] - base).abs().max())
    assert effect > 0.05 and float((got[four] - got[eight]).abs().max()) < effect / 2


# --- the file ---


def test_the_imprint_survives_serialisation(hf_model: LlamaForCausalLM) -> None:
    model = build(hf_model)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Marisol"))
    loaded = state_from_bytes(state_to_bytes(state), model.config)
    assert loaded.imprint is not None
    for name, tensor in state.imprint.tensors().items():  # type: ignore[union-attr]
        assert torch.equal(getattr(loaded.imprint, name), tensor), name
    assert len(state_to_bytes(state)) - model.config.state_bytes < 2048  # the container's header


def test_a_four_bit_imprint_survives_serialisation(hf_model: LlamaForCausalLM) -> None:
    model = build(hf_model, imprint_bits=4)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Marisol"))
    loaded = state_from_bytes(state_to_bytes(state), model.config)
    assert loaded.imprint is not None and loaded.imprint.bits == 4
    for name, tensor in state.imprint.tensors().items():  # type: ignore[union-attr]
        assert torch.equal(getattr(loaded.imprint, name), tensor), name
    assert len(state_to_bytes(state)) - model.config.state_bytes < 2048


def test_a_state_stored_under_another_imprint_size_or_precision_is_refitted(hf_model: LlamaForCausalLM) -> None:
    """An identity written before the model's imprint setting changed (int8, N entries) loads under the new one:
    its spans in order, requantised, and where fewer entries are kept the weakest spans dropped first."""
    old = build(hf_model)
    imprint = Imprint.empty(old.config)
    for seed, (words, score, kind) in enumerate((("Marisol", 9.0, 1), ("it rains", 3.0, 0), ("in Lyon", 6.0, 2))):
        ids = old.tokenizer.encode(words)
        read = old.read_words(torch.tensor([ids]))
        choice = SpanChoice(0, len(ids), score, kind)
        imprint = imprint_spans(imprint, read.keys, read.values, [choice], turn=seed, tokens=torch.tensor(ids))
    assert fitted(imprint, old.config) is imprint  # in the model's own layout: as it is
    blob = state_to_bytes(replace(IdentityState.fresh(old.config), imprint=imprint))
    roomy = build(hf_model, imprint_bits=4, imprint_tokens=2 * N)
    loaded = state_from_bytes(blob, roomy.config).imprint
    assert loaded is not None and loaded.bits == 4 and loaded.capacity == 2 * N
    assert [(s.tokens, s.kind, s.score, s.turn) for s in loaded.spans()] == [
        (s.tokens, s.kind, s.score, s.turn) for s in imprint.spans()
    ]
    used = imprint.used
    for x, y in zip(imprint.entries()[:2], loaded.entries()[:2], strict=True):
        assert float((x[:, :, :used] - y[:, :, :used]).abs().max()) <= float(x.abs().max()) / 7
    tight = build(hf_model, imprint_tokens=len("Marisol") + len("in Lyon"))  # "it rains" (unknown kind) must go
    kept = state_from_bytes(blob, tight.config).imprint
    assert kept is not None and [s.kind for s in kept.spans()] == ["name", "city"]
    assert torch.equal(kept.keys[:, :, : len("Marisol")], imprint.keys[:, :, : len("Marisol")])  # int8 kept as it was
    hostile = st_load(blob)
    hostile["imprint.kind"] = torch.full((N,), 99, dtype=torch.int32)
    with pytest.raises(StateFormatError, match="must index"):  # checked in its own layout before it is refitted
        state_from_bytes(st_save(hostile), roomy.config)


def test_an_old_state_without_imprint_loads_empty(hf_model: LlamaForCausalLM) -> None:
    model = build(hf_model)
    blob = st_load(state_to_bytes(IdentityState.fresh(model.config)))
    blob["format_version"] = torch.tensor([1], dtype=torch.int64)
    old = state_from_bytes(st_save(blob), model.config)
    assert old.imprint is None and old.format_version == 2


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("imprint.keys", torch.zeros(3, 2, N, 16, dtype=torch.float32), "dtype"),
        ("imprint.score", torch.full((N,), float("nan")), "NaN"),
        ("imprint.span", torch.tensor([0, -1, 0] + [-1] * (N - 3), dtype=torch.int32), "no gap"),
        ("imprint.span", torch.tensor([1, 1] + [-1] * (N - 2), dtype=torch.int32), "numbered"),
        ("imprint.kind", torch.full((N,), 99, dtype=torch.int32), "must index"),
        ("imprint.token", torch.full((N,), 10**6, dtype=torch.int32), "vocabulary"),
        ("imprint.keys", torch.zeros(3, 2, N + 1, 16, dtype=torch.int8), "shape"),
    ],
)
def test_hostile_imprint_blobs_are_refused(hf_model: LlamaForCausalLM, name: str, value: torch.Tensor, message: str) -> None:
    model = build(hf_model)
    blob = st_load(state_to_bytes(replace(IdentityState.fresh(model.config), imprint=planted(model, "Marisol"))))
    blob[name] = value
    with pytest.raises(StateFormatError, match=message):
        state_from_bytes(st_save(blob), model.config)
    partial = {k: v for k, v in blob.items() if k != "imprint.turn"}
    with pytest.raises(StateFormatError, match="missing"):
        state_from_bytes(st_save(partial), model.config)


def test_state_size_in_the_shipped_shape() -> None:
    """What the entries cost: int8 or 4 bits with float16 scales, against float16's 4·d bytes a layer and head."""
    config = LlamaConfig(imprint_tokens=62, d_self=256, self_slots=4)
    per_entry = 30 * 3 * 2 * (64 + 2) + 24
    assert config.state_bytes == LlamaConfig(d_self=256, self_slots=4).state_bytes + 62 * per_entry
    assert config.state_bytes + 2048 < 1_000_000  # with the file's header: a stored identity under 1 MB
    four = LlamaConfig(imprint_tokens=120, imprint_bits=4, d_self=256, self_slots=4)
    assert four.state_bytes == LlamaConfig(d_self=256, self_slots=4).state_bytes + 120 * (30 * 3 * 2 * (32 + 2) + 24)
    assert four.state_bytes + 2048 < 1_000_000  # 4 bits: the same bytes hold 120 entries
    shipped = LlamaConfig.from_file(DEFAULT_CHECKPOINT / "config.json")  # the bundled model, as it is stored
    blob = state_to_bytes(replace(IdentityState.fresh(shipped), imprint=Imprint.empty(shipped)))
    assert shipped.imprint_tokens and len(blob) < 1_000_000 and len(blob) - shipped.state_bytes < 2048


def test_labelled_clauses_come_first_and_carry_their_kind() -> None:
    pieces = ["I", " am", " Ana", ",", " the", " sky", " is", " weird", "."]
    surprisal = torch.tensor([1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 9.0, 1.0])
    kinds = torch.zeros(len(pieces), len(KINDS))
    kinds[:, 0] = 1.0
    kinds[:4] = torch.nn.functional.one_hot(torch.tensor(KINDS.index("name")), len(KINDS)).float()
    breaks = clause_breaks(pieces)
    # the name's clause is admitted below the shock threshold and fills the budget before the surprising aside
    choices = select_spans(surprisal, breaks, budget=4, max_span=8, min_score=4.0, kinds=kinds)
    assert [(c.start, c.end, KINDS[c.kind]) for c in choices] == [(0, 4, "name")]
    both = select_spans(surprisal, breaks, budget=9, max_span=8, min_score=4.0, kinds=kinds)
    assert [(c.start, KINDS[c.kind]) for c in both] == [(0, "name"), (4, "unknown")]
    with pytest.raises(ValueError, match="kinds must be"):
        select_spans(surprisal, breaks, budget=4, max_span=8, min_score=4.0, kinds=kinds[:3])


def test_an_unsure_label_is_stored_but_neither_goes_first_nor_replaces() -> None:
    """A clause the tagger labels with mean probability between ``min_label`` and ``min_kind`` keeps its kind (for the
    ask head's match and for eviction) but is chosen like an unlabelled clause and replaces nothing."""
    pieces = ["my", " sister", " lives", " in", " Oslo", ",", " the", " sky", " is", " weird", "."]
    surprisal = torch.tensor([1.0, 1.0, 1.0, 1.0, 5.0, 1.0, 1.0, 1.0, 1.0, 9.0, 1.0])
    kinds = torch.zeros(len(pieces), len(KINDS))
    kinds[:, 0] = 1.0
    kinds[:6, 0], kinds[:6, KINDS.index("city")] = 0.65, 0.35
    breaks = clause_breaks(pieces)
    sure = select_spans(surprisal, breaks, budget=6, max_span=8, min_score=4.0, kinds=kinds)
    assert [(c.start, KINDS[c.kind]) for c in sure] == [(6, "unknown")]  # the aside's shock wins the budget: no label
    unsure = select_spans(surprisal, breaks, budget=6, max_span=8, min_score=4.0, kinds=kinds, min_label=0.3)
    assert [(c.start, KINDS[c.kind], c.replaces) for c in unsure] == [(6, "unknown", False)]  # still chosen by shock
    both = select_spans(surprisal, breaks, budget=11, max_span=8, min_score=4.0, kinds=kinds, min_label=0.3)
    assert [(c.start, KINDS[c.kind], c.replaces) for c in both] == [(0, "city", False), (6, "unknown", False)]
    held = _add(_imprint(), 3, 5.0, kind=KINDS.index("city"), seed=1)  # the user's own city, an earlier turn
    keys, values = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    unsure_city = SpanChoice(0, 3, 5.0, KINDS.index("city"), replaces=False)
    kept = imprint_spans(held, keys, values, [unsure_city], turn=4, tokens=torch.arange(3) + 40)
    assert [(s.kind, s.tokens) for s in kept.spans()] == [("city", (10, 11, 12)), ("city", (40, 41, 42))]
    sure_city = SpanChoice(0, 3, 5.0, KINDS.index("city"))
    moved = imprint_spans(held, keys, values, [sure_city], turn=4, tokens=torch.arange(3) + 40)
    assert [(s.kind, s.tokens) for s in moved.spans()] == [("city", (40, 41, 42))]


def test_a_known_kind_outlasts_higher_scored_asides() -> None:
    imprint = _add(_add(_imprint(), 4, 3.0, kind=1, seed=1), 4, 9.0, seed=2)  # a name, then a surprising aside
    imprint = _add(imprint, 4, 2.0, kind=3, seed=3)  # a job: evicts the aside, not the name
    assert [(s.kind, s.score) for s in imprint.spans()] == [("name", 3.0), ("job", 2.0)]
    assert _add(imprint, 4, 50.0, seed=4).spans() == imprint.spans()  # an aside never evicts a fact


def test_an_aside_ranks_below_what_the_user_says_of_themself() -> None:
    """In a message that asks the persona something, a sentence that never speaks of its writer is an aside: its spans
    are chosen as before, but scored lower (so the user's own words outlast its chatter when the imprint is full), and
    a label that is not sure is dropped; a sentence about the user, and a message that asks nothing, are untouched."""
    tok = ByteTokenizer()

    def pieces(text: str) -> list[str]:
        return [tok.token_text(t) for t in tok.encode(text)]

    def marked(text: str) -> str:
        return "".join(p for p, beside in zip(pieces(text), asides(pieces(text)).tolist(), strict=True) if beside)

    tips = "Any tips to stop procrastinating? Asking for basically everyone on earth."
    assert marked(tips) == tips  # the question and the chatter beside it
    assert marked("tell me a joke. I'm bored") == "tell me a joke."  # a request, then the writer speaks
    jokes = "Knock-knock jokes: give me your cheesiest one."
    assert marked(jokes) == jokes  # "me" asks: the words beside it say nothing of the writer
    # the sentence that speaks of its writer is not an aside, though the message asks something
    complaint = "Can I just complain? The ward was chaos. I'm a nurse here in Owerri."
    assert marked(complaint) == "Can I just complain? The ward was chaos."
    assert marked("Zainab here, living in Lahore. Long week.") == ""  # asks nothing: an introduction without an "I"
    assert marked("im a nurse in Lisbon") == ""
    text = "The windows are rattling. Feels like spring, right?"
    surprisal = torch.full((len(text),), 8.0)
    kinds = torch.zeros(len(text), len(KINDS))
    kinds[:, 0] = 1.0
    windows = text.index(" Feels")
    kinds[:windows, 0], kinds[:windows, KINDS.index("city")] = 0.6, 0.4  # an unsure label on the first sentence
    settings = {"budget": 60, "max_span": 40, "min_score": 4.0, "min_label": 0.3}
    plain = message_spans(surprisal, pieces(text), kinds, **settings)
    assert [(c.score, KINDS[c.kind]) for c in plain] == [(8.0, "city"), (8.0, "unknown")]
    weighed = message_spans(surprisal, pieces(text), kinds, aside_weight=0.25, **settings)
    assert [(c.start, c.end) for c in weighed] == [(c.start, c.end) for c in plain]  # the same spans are chosen
    assert [(c.score, KINDS[c.kind]) for c in weighed] == [(2.0, "unknown"), (2.0, "unknown")]
    kinds[:windows, 0], kinds[:windows, KINDS.index("city")] = 0.2, 0.8  # a sure label stays
    assert [KINDS[c.kind] for c in message_spans(surprisal, pieces(text), kinds, aside_weight=0.25, **settings)] == [
        "city",
        "unknown",
    ]
    own = "I keep chickens. My husband says they are his. Is that odd?"
    mine = message_spans(torch.full((len(own),), 8.0), pieces(own), None, aside_weight=0.25, **settings)
    assert [c.score for c in mine] == [8.0, 8.0]
    # in the imprint, the aside's chatter goes before the user's chickens, though it surprised the identity more
    held = _add(_imprint(), 6, 6.0, seed=1)  # "At home we keep chickens"
    chatter = _add(held, 4, 12.0 * 0.25, seed=2)
    assert [s.score for s in _add(chatter, 4, 7.0, seed=3).spans()] == [6.0, 7.0]
    with pytest.raises(ValueError, match="imprint_aside_weight"):
        LlamaConfig(imprint_aside_weight=0.0)


def test_the_imprint_shift_weakens_the_read(hf_model: LlamaForCausalLM) -> None:
    """``imprint_shift`` lowers every imprinted entry's logit: at 20 the imprint is as good as absent; at 1 the read
    moves less than at 0."""
    model = build(hf_model)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Ana Kowalski, Lisbon"))
    idx = torch.tensor([model.tokenizer.encode("Where do I live?")])

    def logits(shift: float, st: IdentityState) -> torch.Tensor:
        model.config = replace(model.config, imprint_shift=shift)
        with torch.no_grad():
            return model(idx, model.condition_states([st])).logits

    fresh = logits(0.0, IdentityState.fresh(model.config))
    full, weaker, shut = logits(0.0, state), logits(1.0, state), logits(20.0, state)
    assert (full - fresh).abs().max() > (weaker - fresh).abs().max() > 0
    torch.testing.assert_close(shut, fresh, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="imprint_shift"):
        replace(model.config, imprint_shift=float("inf"))


# --- the copy read ---


def test_the_copy_read_mixes_the_imprinted_tokens_into_the_next_token_distribution() -> None:
    """p = (softmax(logits) + a) / (1 + |a|), a(v) the pointer's weight on the entries holding token v, each times its
    own weight (a token held twice gets both; an entry without a token, none; an entry that goes on a word, only at a
    position that reads the token before it, and there, where the model would go on the word, a pointer of at least
    COMPLETION: the word is finished as imprinted); a row whose weights are all 0 keeps its logits bit for bit."""
    g = torch.Generator().manual_seed(0)
    B, L, V, n = 3, 3, 11, 4
    logits = torch.randn(B, L, V, generator=g)
    pointer = torch.rand(B, L, n, generator=g) / n  # shares of a softmax over more keys than the entries
    tokens = torch.tensor([[5, 7, 5, -1], [2, 3, 4, 6], [0, 3, 0, -1]])  # row 2: token 0 held twice, then an empty entry
    after = torch.tensor([[-1, 5, -1, -1], [-1, 2, 3, -1], [-1, -1, -1, -1]])  # row 0: token 7 goes on a word after 5
    previous = torch.tensor([[5, 9, 5], [1, 1, 1], [4, 4, 4]])  # the token each position reads
    weight = torch.tensor([[3.0, 2.0, 1.0, 3.0], [0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 1.0, 0.0]])
    unfinished = torch.tensor([[True, True, False], [True] * 3, [True] * 3])  # where the model would go on a word
    got = copied(logits, pointer, copy_plan(tokens, weight, after), previous, unfinished)
    for row in (0, 2):
        a = torch.zeros(L, V)
        for j, t in enumerate(tokens[row].tolist()):
            for i in range(L):
                if t >= 0 and after[row, j] < 0:
                    a[i, t] += weight[row, j] * pointer[row, i, j]
                elif t >= 0 and after[row, j] == previous[row, i]:  # the word's previous piece given: at least
                    least = COMPLETION if unfinished[row, i] else 0.0  # COMPLETION where the model goes on the word
                    a[i, t] += weight[row, j] * max(float(pointer[row, i, j]), least)
        expected = (torch.softmax(logits[row], -1) + a) / (1.0 + a.sum(-1, keepdim=True))
        torch.testing.assert_close(got[row].exp(), expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(got[row].exp().sum(-1), torch.ones(L), atol=1e-6, rtol=0)
        if row == 0:
            assert float(a[1, 7]) == 0 and float(a[0, 7]) > 0 and float(a[2, 7]) > 0  # a word's second piece: after its first
            assert float(a[0, 7]) == 2.0 * COMPLETION  # ... and then at least COMPLETION of the pointer
            assert int(got[row, 0].argmax()) == 7  # the word is finished as imprinted
            assert float(a[2, 7]) == 2.0 * float(pointer[0, 2, 1]) < 2.0 * COMPLETION  # not where the model ends the word
    assert torch.equal(copied(logits, pointer, copy_plan(tokens, weight, after), previous)[0, 2], got[0, 2])  # no floor unasked
    assert torch.equal(got[1], logits[1])
    assert float(got[0, 1, 5]) > float(torch.log_softmax(logits[0], -1)[1, 5])  # the held token gains (no word to finish)
    assert bool((got[2, :, 0] > torch.log_softmax(logits[2], -1)[:, 0]).all())  # token 0 too, whatever the empty entry


def test_the_copy_read_has_finite_gradients_and_learning_through_it_leaves_its_values_as_they_are() -> None:
    """A read trained through the copy (sia.learn.imprint_read's through_copy) takes gradients where no entry points at
    a token (log 0) and where a row does not copy; its values are those of the copy without gradients, bit for bit."""
    g = torch.Generator().manual_seed(1)
    B, L, V, n = 2, 3, 9, 4
    logits = torch.randn(B, L, V, generator=g)
    pointer = torch.rand(B, L, n, generator=g) / n
    pointer[0, 1] = 0.0  # a position whose pointer gives the entries nothing
    tokens = torch.tensor([[2, 4, -1, 2], [1, 3, 5, 7]])
    after = torch.tensor([[-1, 2, -1, -1], [-1, -1, -1, -1]])
    previous = torch.tensor([[0, 0, 2], [1, 1, 1]])
    weight = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])  # row 1 does not copy
    expected = copied(logits, pointer, copy_plan(tokens, weight, after), previous)
    lg, pt = logits.clone().requires_grad_(True), pointer.clone().requires_grad_(True)
    got = copied(lg, pt, copy_plan(tokens, weight, after), previous)
    assert torch.equal(got.detach(), expected)
    got[:, :, [2, 4, 0]].sum().backward()  # held tokens and a token no entry holds
    assert lg.grad is not None and pt.grad is not None
    assert bool(lg.grad.isfinite().all()) and bool(pt.grad.isfinite().all())
    assert float(pt.grad[0, 0].abs().sum()) > 0  # the pointer learns where it copies ...
    assert float(pt.grad[1].abs().sum()) == 0  # ... and not in a row that does not copy


def test_the_copy_read_copies_a_word_s_inner_pieces_only_after_the_piece_before(hf_model: LlamaForCausalLM) -> None:
    """copy_after: an entry whose token goes on a word (a letter or digit first) waits for its span's previous token;
    one that begins a word (a space or a mark first), its span's first, and an empty one wait for nothing."""
    model = build(hf_model, imprint_copy=1.0)
    ids = model.tokenizer.encode(" ab c")
    token = torch.tensor([[*ids, *model.tokenizer.encode("x")] + [-1] * (N - 6)])
    span = torch.tensor([[0, 0, 0, 0, 0, 1] + [-1] * (N - 6)])
    entries = ImprintEntries.stack([None], model.config.imprint_shape, torch.float32)
    entries = replace(entries, token=token, span=span)
    after = model.copy_after(entries)
    assert after.tolist() == [[-1, ids[0], ids[1], -1, ids[3], -1] + [-1] * (N - 6)]


def _copying(hf_model: LlamaForCausalLM, lam: float = 4.0) -> LlamaModel:
    return build(hf_model, imprint_copy=lam, imprint_copy_layers=[1, 2])


def test_the_copy_read_raises_the_imprinted_tokens_and_leaves_a_fresh_identity_the_base_model(
    hf_model: LlamaForCausalLM,
) -> None:
    model, plain = _copying(hf_model), build(hf_model)
    words, prompt = "Ana Kowalski, Lisbon", "Where do I live?"
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, words))
    fresh = IdentityState.fresh(model.config)
    idx = torch.tensor([model.tokenizer.encode(prompt)])
    held = sorted(set(model.tokenizer.encode(words)))
    with torch.no_grad():
        copying = torch.log_softmax(model(idx, model.condition_states([state])).logits[0], -1)
        reading = torch.log_softmax(plain(idx, plain.condition_states([state])).logits[0], -1)
        assert torch.equal(model(idx, model.condition_states([fresh])).logits, plain(idx, plain.condition_states([fresh])).logits)
    gained = copying[:, held].exp().sum(-1) - reading[:, held].exp().sum(-1)  # (L,): the held tokens' probability
    assert bool((gained > 0).all()) and float(gained.max()) > 0.01
    others = [t for t in range(copying.shape[-1]) if t not in held]
    assert bool((copying[:, others] <= reading[:, others] + 1e-5).all())  # every other token loses (or keeps) mass
    # an imprint that keeps no text (privacy mode) is read by attention alone: the copy has no token to give
    untexted = replace(state, imprint=replace(state.imprint, token=torch.full_like(state.imprint.token, -1)))
    with torch.no_grad():
        a = model(idx, model.condition_states([untexted])).logits
        b = plain(idx, plain.condition_states([untexted])).logits
    assert torch.equal(a, b)


def test_the_copy_reads_plan_is_made_once_a_conditioning(hf_model: LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the copy read takes from the entries (``CopyPlan``: ids, word starts, weights, the rows that copy) is made
    when a conditioning is first read and kept: a decoding step asks the entries nothing, and the host never waits on
    the device for it; the logits are the same as with a plan made at every call."""
    model = _copying(hf_model)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Ana Kowalski, Lisbon"))
    idx = torch.tensor([model.tokenizer.encode("Where do I live?")])
    made = []
    plan = injected_attention.copy_plan

    def counted(tokens: torch.Tensor, weight: torch.Tensor, after: torch.Tensor) -> object:
        made.append(1)
        return plan(tokens, weight, after)

    monkeypatch.setattr(injected_attention, "copy_plan", counted)
    with torch.no_grad():
        cond = model.condition_states([state])
        first = model(idx, cond).logits
        again = model(idx, cond).logits
        fresh = model(idx, model.condition_states([state])).logits
    assert len(made) == 2  # one for each conditioning, none at the second call with the first
    assert torch.equal(first, again) and torch.equal(first, fresh)
    layer = cond.layers[1]
    assert isinstance(layer, InjectedLayer) and layer.copy_plan is not None and layer.copy_plan.any_row


def test_a_question_of_the_persona_reads_no_imprint(hf_model: LlamaForCausalLM) -> None:
    """ "What's your name?" asks the persona: its row is conditioned as a fresh identity's imprint (the self state as
    it is), bit for bit, whatever the user told; "What's my name?" reads the imprint. Alone and in one batch."""
    model = _copying(hf_model)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Ana Kowalski, Lisbon"))
    blank = replace(state, imprint=IdentityState.fresh(model.config).imprint)
    theirs, mine = "What's your name?", "What's my name?"
    rows = [model.tokenizer.encode(m) for m in (theirs, mine)]
    with torch.no_grad():
        asked = model(torch.tensor(rows[:1]), model.condition_states([state], messages=rows[:1])).logits
        untold = model(torch.tensor(rows[:1]), model.condition_states([blank], messages=rows[:1])).logits
        told = model(torch.tensor(rows[1:]), model.condition_states([state], messages=rows[1:])).logits
        told_blank = model(torch.tensor(rows[1:]), model.condition_states([blank], messages=rows[1:])).logits
        both = model.condition_states([state, state], messages=rows)
        alone = [model.condition_states([blank], messages=[r]) for r in rows]
    assert torch.equal(asked, untold)
    assert float((told - told_blank).abs().max()) > 1e-3
    for layer in (0, 1, 2):  # in a batch, the persona's question's row is a blank imprint's; the user's question's not
        assert torch.equal(both.layers[layer].slot_key[0], alone[0].layers[layer].slot_key[0])
        assert not torch.equal(both.layers[layer].slot_key[1], alone[1].layers[layer].slot_key[0])


def test_a_message_that_asks_nothing_reads_no_imprint(hf_model: LlamaForCausalLM) -> None:
    """ "I moved to York last month." tells; the imprint answers questions: the row is conditioned as a blank imprint's
    (logits bit for bit), while "Remind me where I live." (a request, no question mark) reads it."""
    model = _copying(hf_model)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Ana Kowalski, Lisbon"))
    blank = replace(state, imprint=IdentityState.fresh(model.config).imprint)

    def logits(message: str, s: IdentityState) -> torch.Tensor:
        row = [model.tokenizer.encode(message)]
        with torch.no_grad():
            return model(torch.tensor(row), model.condition_states([s], messages=row)).logits

    told, asked = "I moved to York last month.", "Remind me where I live."
    assert torch.equal(logits(told, state), logits(told, blank))
    assert float((logits(asked, state) - logits(asked, blank)).abs().max()) > 1e-3


def test_a_turn_that_asks_the_persona_keeps_what_the_user_told(hf_model: LlamaForCausalLM) -> None:
    """The turn of "What's your name?" reads no imprint, but its new state still holds every span the user told."""
    model = build(hf_model)
    dynamics = Dynamics.from_config(model.config)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    told = run_turn(model, TurnRequest(IdentityState.fresh(model.config), "I am Zbigniew, from Ushuaia.", dynamics), params)
    asked = run_turn(model, TurnRequest(told.state, "What's your name?", dynamics), params).state.imprint
    before = told.state.imprint
    assert before is not None and asked is not None and before.used > 0
    kept = [(s.turn, s.tokens) for s in before.spans()]
    assert [(s.turn, s.tokens) for s in asked.spans()][: len(kept)] == kept
    n = before.used
    assert torch.equal(asked.keys[..., :n, :], before.keys[..., :n, :])


def test_the_copy_read_is_the_same_uncached_cached_and_batched(hf_model: LlamaForCausalLM) -> None:
    """The pointer's weights are written out with the kernel's own visibility (causal, padding, each row alone): the
    whole sequence read at once, token by token through the cache and in a padded batch give the same logits."""
    model = _copying(hf_model)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Ana Kowalski, Lisbon"))
    fresh = IdentityState.fresh(model.config)
    prompts = [model.tokenizer.encode("Where do I live?"), model.tokenizer.encode("Name?")]
    params = SamplingParams(max_new_tokens=6, temperature=0)
    with torch.no_grad():
        whole = model(torch.tensor([prompts[0]]), model.condition_states([state])).logits[0]
        cond = model.condition_states([state])
        cache = model.new_cache(cond, len(prompts[0]))
        steps = torch.cat([model(torch.tensor([[t]]), cond, cache=cache).logits[0] for t in prompts[0]])
    torch.testing.assert_close(steps, whole, atol=1e-4, rtol=0)
    solo = [generate(model, [p], model.condition_states([s]), params)[0] for p, s in zip(prompts, [state, fresh], strict=True)]
    both = generate(model, prompts, model.condition_states([state, fresh]), params)
    assert [g.tokens for g in both] == [g.tokens for g in solo]
    uncached = generate(model, prompts[:1], model.condition_states([state]), params, use_cache=False)
    assert uncached[0].tokens == solo[0].tokens
    for a, b in zip(both, solo, strict=True):
        torch.testing.assert_close(a.prompt_nll, b.prompt_nll, atol=1e-4, rtol=0, equal_nan=True)


def test_the_copy_read_points_with_the_named_query_heads_only(hf_model: LlamaForCausalLM) -> None:
    """imprint_copy_heads: the pointer is the mean over the named [layer, head] pairs; naming every head of the copy
    layers is the default read exactly, a subset points otherwise (and the cache still agrees with the whole)."""
    every = build(hf_model, imprint_copy=4.0, imprint_copy_heads=[[layer, h] for layer in (1, 2) for h in range(4)])
    model, some = _copying(hf_model), build(hf_model, imprint_copy=4.0, imprint_copy_heads=[[2, 1], [1, 3]])
    assert every.config.imprint_copy_layers == [1, 2] and some.config.imprint_copy_heads == [[1, 3], [2, 1]]
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Ana Kowalski, Lisbon"))
    idx = torch.tensor([model.tokenizer.encode("Where do I live?")])
    with torch.no_grad():
        base, named, fewer = (m(idx, m.condition_states([state])).logits for m in (model, every, some))
        cond = some.condition_states([state])
        cache = some.new_cache(cond, idx.shape[1])
        steps = torch.cat([some(idx[:, i : i + 1], cond, cache=cache).logits for i in range(idx.shape[1])], 1)
    torch.testing.assert_close(named, base, atol=1e-5, rtol=0)
    assert float((fewer - base).abs().max()) > 1e-3
    torch.testing.assert_close(steps, fewer, atol=1e-4, rtol=0)


def test_entry_weights_of_named_heads_are_those_heads_of_every_head_s(hf_model: LlamaForCausalLM) -> None:
    """The copy read's entries' weights of its named query heads: over a prompt computed for those heads only, each the
    same as that head's among every head's, causal or with a mask; at a decoding step (one query) taken
    from every head's, exactly."""
    attn = _copying(hf_model).blocks[1].attn
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, attn.H, 3, attn.w, generator=g), torch.randn(2, attn.H_kv, 9, attn.w, generator=g)
    mask = torch.ones(2, 1, 3, 9, dtype=torch.bool)
    mask[1, ..., 4:6] = False
    for m in (None, mask):
        every = attn.entry_weights(q, k, 3, m)
        torch.testing.assert_close(attn.entry_weights(q, k, 3, m, [3, 0, 2]), every[:, [3, 0, 2]])
        step = attn.entry_weights(q[:, :, -1:], k, 3, None if m is None else m[:, :, -1:], [3, 0, 2])
        assert torch.equal(step, attn.entry_weights(q[:, :, -1:], k, 3, None if m is None else m[:, :, -1:])[:, [3, 0, 2]])
        torch.testing.assert_close(step, every[:, [3, 0, 2], -1:])


def test_the_copy_read_is_weighed_by_the_ask_head(hf_model: LlamaForCausalLM) -> None:
    """An entry copies lam·(1 - p(no fact asked)), nothing where no fact is the likelier; an entry whose token is not
    kept (empty, or in an imprint that keeps no text) copies nothing."""
    model = _copying(hf_model, lam=3.0)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Ana Kowalski, Lisbon"))
    imprints = [state.imprint, replace(state.imprint, token=torch.full_like(state.imprint.token, -1))]
    entries = ImprintEntries.stack(imprints, model.config.imprint_shape, torch.float32)
    asked = torch.zeros(2, len(KINDS))
    asked[:, 0], asked[:, 2] = 0.25, 0.75
    kept = (entries.token >= 0).float()  # (2, N): row 0's filled entries, none of row 1's
    assert 0 < int(kept[0].sum()) < kept.shape[1] and not bool(kept[1].any())
    weight = model.copy_weight(entries, asked)
    assert weight is not None
    torch.testing.assert_close(weight, 3.0 * 0.75 * kept)
    asked[0, 0], asked[0, 2] = 0.6, 0.4  # more likely no fact asked: no copy
    torch.testing.assert_close(model.copy_weight(entries, asked), torch.zeros_like(kept))
    torch.testing.assert_close(model.copy_weight(entries, None), 3.0 * kept)
    assert build(hf_model).copy_weight(entries, asked) is None  # imprint_copy 0: no copy


def test_rows_conditioned_apart_decode_together_with_and_without_the_copy(hf_model: LlamaForCausalLM) -> None:
    """A row that copies and one that does not (a fresh identity), each conditioned alone, joined into one decoding
    batch: each gives the tokens it gives alone, and the copying row's are not those it gives without the copy."""
    from sia.model.batching import DecodeBatch

    model = _copying(hf_model, lam=50.0)
    state = replace(IdentityState.fresh(model.config), imprint=planted(model, "Ana Kowalski, Lisbon"))
    fresh = IdentityState.fresh(model.config)
    prompts = [model.tokenizer.encode("Where do I live?"), model.tokenizer.encode("Name?")]
    params = SamplingParams(max_new_tokens=6, temperature=0)
    rows = list(zip(prompts, [state, fresh], strict=True))
    alone = [generate(model, [p], model.condition_states([s]), params)[0].tokens for p, s in rows]
    plain = build(hf_model)
    assert generate(plain, prompts[:1], plain.condition_states([state]), params)[0].tokens != alone[0]
    batch = DecodeBatch(model)
    rids = [batch.join(p, model.condition_states([s]), params) for p, s in rows]
    while len(batch):
        batch.step()
    assert [batch.take(r).tokens for r in rids] == alone
