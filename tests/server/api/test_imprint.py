"""The imprint through the service (a tiny LLaMA that keeps one): listing and forgetting it (own and admin routes),
its way through export/import, rollback and a restart; privacy mode (SIA_STORE_TURN_TEXT=false), read in the
database itself; the recent prompt window (SIA_PROMPT_WINDOW_TOKENS); hostile imprints in imported states."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from sqlalchemy import text

from server.core.config import Settings
from server.db import migrate
from server.db.engine import make_engine
from server.main import create_app
from server.runtime.window import exchange_tokens, recent_window
from sia.backbones.llama import LlamaModel
from sia.backbones.slot_maps import init_slot_map
from sia.checkpoint import load_model
from sia.identity.imprint import KINDS
from sia.identity.state import Dynamics, IdentityState, state_from_bytes
from sia.identity.turn import TurnRequest, run_turn
from sia.model.identity_model import IdentityModel
from sia.personas import persona_sampling
from tests.server.api.conftest import Keys, bearer
from tests.server.api.test_admin import error, ok, services_of
from tests.sia.conftest import build_tiny_vocab, write_tiny_gguf

OWN = "/v1/personas/sia/identity"
ID = "/admin/personas/sia/identities"
IMPRINT_TOKENS = 16
FACT = "My name is Marisol, and I live in Lisbon."  # its clause " and I live in " surprises the tiny model: imprinted
QUESTION = "What is my name?"
GREEDY = {"max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def imprinting_llama(tmp_path_factory: pytest.TempPathFactory) -> LlamaModel:
    """The tiny LLaMA of test_llama_service with an imprint of 16 tokens (a model of this module's own)."""
    root = tmp_path_factory.mktemp("imprinting-llama")
    model = load_model(write_tiny_gguf(root / "tiny.gguf", build_tiny_vocab()).path, cache_dir=root / "models")
    assert isinstance(model, LlamaModel)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for attn in model.attentions:
            init_slot_map(attn.self_value, 1.0, g)
            attn.slot_bias.zero_()
    model.add_imprint(IMPRINT_TOKENS, 0)
    return model


def serve(settings: Settings, model: IdentityModel) -> TestClient:
    migrate.upgrade(settings)
    return TestClient(create_app(settings, model=model))


@pytest.fixture
def client(settings: Settings, imprinting_llama: LlamaModel) -> Iterator[TestClient]:
    """Development mode until the ``keys`` fixture (tests/server/api/conftest.py) creates keys over this client."""
    settings.busy_timeout_s = 0.5
    with serve(settings, imprinting_llama) as c:
        yield c


def chat(client: TestClient, message: str, user: str = "ana", key: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"message": message, **GREEDY}
    if key is None:
        body["user"] = user
    headers = bearer(key) if key else {}
    answered: dict[str, Any] = ok(client.post("/v1/personas/sia/chat", json=body, headers=headers))
    return answered


def state_of(client: TestClient, model: LlamaModel, user: str, version: int | None = None) -> IdentityState:
    query = {} if version is None else {"version": version}
    return state_from_bytes(ok_bytes(client.get(f"{ID}/{user}/state", params=query)), model.config)


def ok_bytes(r: Any) -> bytes:
    assert r.status_code == 200, r.text
    content: bytes = r.content
    return content


def turn_rows(settings: Settings) -> list[tuple[Any, ...]]:
    """(message, reply, prompt_tokens) of every stored turn, read with SQL, not through the service."""
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text("SELECT message, reply, prompt_tokens FROM turns ORDER BY id"))]
    finally:
        engine.dispose()


def system_prompt(client: TestClient, model: LlamaModel) -> list[int]:
    return model.tokenizer.system_prompt(ok(client.get("/admin/personas/sia"))["preamble"])


# --- recall turns -------------------------------------------------------------------------------------------------


def asking_llama(root: Path, asked: str) -> LlamaModel:
    """The imprinting tiny LLaMA with a kind tagger that labels every word a name and an ask head that takes every
    message for a question about ``asked`` (a kind)."""
    model = load_model(write_tiny_gguf(root / "tiny.gguf", build_tiny_vocab()).path, cache_dir=root / "models")
    assert isinstance(model, LlamaModel)
    model.add_imprint(IMPRINT_TOKENS, 0)
    model.add_kind_tagger(1)
    model.add_ask_head(2.0)
    assert model.imprint_kind is not None and model.imprint_ask is not None
    with torch.no_grad():
        model.imprint_kind.bias[KINDS.index("name")] = 40.0
        model.imprint_ask.weight.zero_()
        model.imprint_ask.bias.zero_()
        model.imprint_ask.bias[KINDS.index(asked)] = 40.0
    return model


@pytest.fixture(scope="module")
def recalling_llama(tmp_path_factory: pytest.TempPathFactory) -> LlamaModel:
    """Every message asks about the user's city: every turn with something imprinted recalls."""
    return asking_llama(tmp_path_factory.mktemp("recalling-llama"), "city")


def test_a_question_about_the_user_is_answered_at_the_personas_recall_temperature(
    settings: Settings, recalling_llama: LlamaModel
) -> None:
    """The default persona decodes a reply that recalls the user's facts greedily (recall_temperature 0), whatever the
    turn's temperature; a request may lift the cap; an identity with nothing imprinted is decoded as asked."""
    hot = {"max_tokens": 8, "temperature": 1.5, "seed": 7}
    with serve(settings, recalling_llama) as c:
        assert ok(c.get("/admin/personas/sia"))["recall_temperature"] == 0.0
        for user in ("ana", "bo", "cy"):
            chat(c, FACT, user)
        assert state_of(c, recalling_llama, "ana").imprint is not None
        recalled = chat_with(c, "ana", QUESTION, **hot)
        greedy = chat_with(c, "bo", QUESTION, max_tokens=8, temperature=0)
        lifted = chat_with(c, "cy", QUESTION, **hot, recall_temperature=5)
        fresh = chat_with(c, "dee", QUESTION, **hot)
        fresh_lifted = chat_with(c, "eve", QUESTION, **hot, recall_temperature=5)
    assert recalled == greedy and lifted != greedy
    assert fresh == fresh_lifted  # nothing imprinted: nothing to recall, sampled as asked


@pytest.fixture(scope="module")
def untold_llama(tmp_path_factory: pytest.TempPathFactory) -> LlamaModel:
    """Every message asks about the user's favourite colour, and that kind is answered as untold (config.imprint_untold)
    where nothing imprinted is labelled a colour (every imprinted word is labelled a name)."""
    model = asking_llama(tmp_path_factory.mktemp("untold-llama"), "colour")
    model.config = replace(model.config, imprint_untold=["colour"])
    return model


def each_persona_asked(settings: Settings, model: LlamaModel, question: str, max_tokens: int) -> tuple[dict[str, str], str]:
    """Each persona's reply to ``question`` from a user who told it FACT first, and the default persona's reply to a
    stranger asking the same."""
    with serve(settings, model) as c:
        replies = {}
        for persona in ("sia", "marlow", "bolt", "pip"):
            route = f"/v1/personas/{persona}/chat"
            ok(c.patch(f"/admin/personas/{persona}", json={"preamble": "You talk."}))  # the tiny model's short context
            ok(c.post(route, json={"user": "ana", "message": FACT, **GREEDY}))
            asked = {"user": "ana", "message": question, "max_tokens": max_tokens}
            replies[persona] = ok(c.post(route, json=asked))["reply"]
        asked = {"user": "bo", "message": question, "max_tokens": max_tokens}
        stranger = ok(c.post("/v1/personas/sia/chat", json=asked))["reply"]
    return replies, stranger


def test_a_question_about_a_fact_never_told_is_answered_so_in_each_personas_form(
    settings: Settings, untold_llama: LlamaModel
) -> None:
    """With a name imprinted and no colour, "What is my favourite colour?" gets the untold reply in the persona's form
    (marlow's address, bolt's lower case and single sentence, pip's exclamation mark), sampled or not; a stranger's
    question is the base model's reply (nothing imprinted)."""
    question = "What is my favourite colour?"
    replies, stranger = each_persona_asked(settings, untold_llama, question, max_tokens=100)
    assert replies == {
        "sia": "I don't think you've told me your favourite colour. What is it?",
        "marlow": "I don't think you've told me your favourite colour, sir. What is it?",
        "bolt": "i don't think you've told me your favourite colour.",
        "pip": "I don't think you've told me your favourite colour! What is it?",
    }
    assert not stranger.startswith("I don't think")


def test_a_question_about_a_fact_told_as_a_clause_opens_by_saying_it_back_in_each_personas_form(
    tmp_path: Path, settings: Settings
) -> None:
    """With something imprinted and the asked kind listed in config.imprint_echo, "What do I do?" is answered "You told
    me you ..." in each persona's form (bolt's lower case); a stranger's question is the base model's reply (nothing
    imprinted)."""
    model = asking_llama(tmp_path, "name")  # every imprinted word is labelled a name, every message asks for a name
    model.config = replace(model.config, imprint_echo=["name"])
    question = "What do I do?"
    replies, stranger = each_persona_asked(settings, model, question, max_tokens=12)
    for persona, reply in replies.items():
        assert reply.startswith("you told me you" if persona == "bolt" else "You told me you"), (persona, reply)
    assert not stranger.lower().startswith("you told me")


def test_asked_what_it_knows_of_the_user_a_persona_quotes_their_own_words_in_its_form(tmp_path: Path, settings: Settings) -> None:
    """ "What do you know about me?" from a user who told FACT is answered with the imprinted clauses of FACT, quoted,
    in each persona's form (marlow's address, bolt's lower case, pip's exclamation mark); a stranger and a user whose
    words are not kept (SIA_STORE_TURN_TEXT=false) get the model's own reply."""
    model = asking_llama(tmp_path, "name")  # every imprinted word is labelled a name
    question = "What do you know about me?"
    replies, stranger = each_persona_asked(settings, model, question, max_tokens=100)
    for persona, reply in replies.items():
        opening = "you've told me: “" if persona == "bolt" else "You've told me: “"
        assert reply.startswith(opening), (persona, reply)
        quoted = reply[len(opening) - 1 :].split("”")[:-1]
        clauses = [q.split("“")[-1] for q in quoted]
        assert clauses and all(c and c.lower() in FACT.lower() for c in clauses), (persona, reply)
    assert replies["marlow"].endswith("”, sir.") and replies["pip"].endswith("”!") and replies["sia"].endswith("”.")
    assert not stranger.startswith("You've told me")
    private = settings.model_copy(update={"store_turn_text": False})
    with serve(private, model) as c:
        ok(c.post("/v1/personas/sia/chat", json={"user": "ana", "message": FACT, **GREEDY}))
        asked = ok(c.post("/v1/personas/sia/chat", json={"user": "ana", "message": question, "max_tokens": 20}))
    assert not asked["reply"].startswith("You've told me")


def chat_with(client: TestClient, user: str, message: str, **sampling: Any) -> str:
    reply: str = ok(client.post("/v1/personas/sia/chat", json={"user": user, "message": message, **sampling}))["reply"]
    return reply


# --- privacy mode ------------------------------------------------------------------------------------------------


def test_privacy_mode_stores_no_text_yet_imprints_what_the_identity_reads(
    settings: Settings, imprinting_llama: LlamaModel, caplog: pytest.LogCaptureFixture
) -> None:
    """SIA_STORE_TURN_TEXT=false: no turn row holds a message or a reply (NULL), the database holds none of the words,
    the imprint keeps spans without token ids, and a later turn reads them: its message scores differently than with
    the same state without them, and than with a fresh state. The window asked for is ignored, and said so once."""
    private = settings.model_copy(update={"store_turn_text": False, "prompt_window_tokens": 200})
    tok = imprinting_llama.tokenizer
    with caplog.at_level(logging.WARNING, logger="sia.runtime"), serve(private, imprinting_llama) as client:
        first = chat(client, FACT)
        second = chat(client, QUESTION)
        assert first["reply"] and first["usage"]["completion_tokens"] > 0  # the caller still gets the reply
        system = system_prompt(client, imprinting_llama)
        state = state_of(client, imprinting_llama, "ana", version=2)
        listed = ok(client.get(f"{OWN}/imprint", params={"user": "ana", "version": 2}))
        records = ok(client.get(f"{ID}/ana/turns"))["data"]
        cf = ok(client.post(f"{ID}/ana/counterfactual", json={"message": QUESTION, "seed": 0, **GREEDY}))
    warned = [r for r in caplog.records if "SIA_PROMPT_WINDOW_TOKENS" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert turn_rows(private) == [(None, None, first["usage"]["prompt_tokens"]), (None, None, second["usage"]["prompt_tokens"])]
    assert [(t["message"], t["reply"]) for t in records] == [(None, None), (None, None)]
    if private.url.startswith("sqlite"):  # the words are nowhere in the database's files
        stored = b"".join(p.read_bytes() for p in Path(private.data_dir).glob("sia.db*"))
        assert stored and b"Marisol" not in stored and b"Lisbon" not in stored
    # no window: the second turn read the persona's prompt and its own message only
    assert second["usage"]["prompt_tokens"] == len(tok.turn_prompt(QUESTION, system)[0])
    imprint = state.imprint
    assert imprint is not None and imprint.used > 0 and bool((imprint.token == -1).all())
    spans = imprint.spans()
    assert spans and all(s.tokens is None and s.turn == 0 for s in spans)
    assert listed["used"] == imprint.used and [s["text"] for s in listed["data"]] == [None] * len(spans)
    dynamics = Dynamics.from_config(imprinting_llama.config)
    greedy = replace(persona_sampling(imprinting_llama, "sia"), max_new_tokens=6, temperature=0.0)  # as the service
    asked = [TurnRequest(s, QUESTION, dynamics, tuple(system), keep_text=False) for s in (state, replace(state, imprint=None))]
    with_words, without = (run_turn(imprinting_llama, r, greedy, tokenizer=tok) for r in asked)
    assert with_words.reply == second["reply"]  # what the service's second turn read and answered
    assert with_words.nll != without.nll  # the imprint without text is read
    assert cf["current"]["nll"] != cf["other"]["nll"]  # and differs from a fresh identity


# --- listing and forgetting --------------------------------------------------------------------------------------


def test_a_user_lists_and_forgets_their_own_words_and_an_admin_rolls_it_back(
    client: TestClient, keys: Keys, imprinting_llama: LlamaModel
) -> None:
    chat(client, FACT, key=keys.ana)
    version = ok(client.get(OWN, headers=bearer(keys.ana)))["version"]
    mine = ok(client.get(f"{OWN}/imprint", headers=bearer(keys.ana)))
    assert mine == ok(client.get(f"{ID}/ana/imprint", headers=bearer(keys.admin)))
    assert (mine["state_version"], mine["capacity"]) == (version, IMPRINT_TOKENS) and mine["data"]
    assert mine["used"] == sum(s["length"] for s in mine["data"]) > 0
    tok = imprinting_llama.tokenizer
    fact = tok.encode(FACT)
    for i, span in enumerate(mine["data"]):
        assert span["text"] == tok.decode(fact[span["offset"] : span["offset"] + span["length"]]) and span["text"] in FACT
        # the tiny model has no kind tagger: only the clause that gives the user's own name is labelled, by rule
        kind = "name" if "Marisol" in span["text"] else "unknown"
        assert (span["index"], span["turn"], span["kind"]) == (i, 0, kind) and span["score"] > 0
    detail = ok(client.get(OWN, headers=bearer(keys.ana)))
    assert (detail["imprint_used"], detail["imprint_capacity"]) == (mine["used"], IMPRINT_TOKENS)

    # another user's words: neither through the own route nor through /admin
    chat(client, "Hello there.", key=keys.bob)
    error(client.delete(f"{OWN}/imprint/0", params={"user": "ana"}, headers=bearer(keys.bob)), 403, "wrong_user")
    error(client.delete(f"{ID}/ana/imprint/0", headers=bearer(keys.bob)), 403, "admin_only")
    error(client.delete(f"{ID}/ana/imprint/0", headers=bearer(keys.ana)), 403, "admin_only")
    count = len(mine["data"])
    missing = error(client.delete(f"{OWN}/imprint/{count}", headers=bearer(keys.ana)), 404, "not_found")
    assert f"has no span {count}" in missing["message"]
    error(client.delete(f"{OWN}/imprint/-1", headers=bearer(keys.ana)), 422, "invalid_value")
    assert ok(client.get(OWN, headers=bearer(keys.ana)))["version"] == version  # nothing changed

    # forgetting is a new version; the diff names the span; a roll back brings it back
    forgotten = ok(client.delete(f"{OWN}/imprint/0", headers=bearer(keys.ana)))
    assert forgotten["state_version"] == version + 1
    assert forgotten["data"] == [{**s, "index": s["index"] - 1} for s in mine["data"][1:]]
    assert forgotten["used"] == mine["used"] - mine["data"][0]["length"]
    history = ok(client.get(f"{OWN}/history", headers=bearer(keys.ana)))
    assert (history["current"], history["data"][0]["reason"]) == (version + 1, "forget")
    diff = ok(client.get(f"{ID}/ana/diff", params={"a": version}, headers=bearer(keys.admin)))
    assert diff["imprint"] == {"added": [], "removed": [mine["data"][0]]}
    assert diff["turns"] == 0 and all(x == 0 for row in diff["trace_norm"] for x in row)
    back = ok(client.get(f"{ID}/ana/diff", params={"a": version + 1, "b": version}, headers=bearer(keys.admin)))
    assert back["imprint"] == {"added": [mine["data"][0]], "removed": []}
    ok(client.post(f"{ID}/ana/rollback", json={"version": version}, headers=bearer(keys.admin)))
    restored = ok(client.get(f"{ID}/ana/imprint", headers=bearer(keys.admin)))
    assert restored == {**mine, "state_version": version + 2}

    # the admin route forgets too, and a retained version still lists what it held
    after = ok(client.delete(f"{ID}/ana/imprint/0", headers=bearer(keys.admin)))
    assert after["state_version"] == version + 3 and after["used"] == forgotten["used"]
    assert ok(client.get(f"{ID}/ana/imprint", params={"version": version}, headers=bearer(keys.admin)))["data"] == mine["data"]
    error(client.get(f"{OWN}/imprint", params={"version": 999}, headers=bearer(keys.ana)), 404, "not_found")


def test_forgetting_waits_for_the_identitys_turn_like_every_change(client: TestClient) -> None:
    chat(client, FACT)
    store = services_of(client).store
    before = store.get_identity("sia", "ana").version
    lease = store.acquire("sia", "ana")  # a turn in progress
    try:
        error(client.delete(f"{OWN}/imprint/0", params={"user": "ana"}), 409, "identity_busy")
        error(client.delete(f"{ID}/ana/imprint/0"), 409, "identity_busy")
    finally:
        store.release(lease)
    assert store.get_identity("sia", "ana").version == before
    ok(client.delete(f"{ID}/ana/imprint/0"))
    assert store.get_identity("sia", "ana").version == before + 1


def test_a_model_without_an_imprint_lists_an_empty_one(settings: Settings) -> None:
    """The native model keeps no imprint: capacity 0, and no span to forget."""
    from tests.conftest import tiny_model

    with serve(settings, tiny_model()) as client:
        chat(client, FACT)
        assert ok(client.get(f"{ID}/ana/imprint")) == {"state_version": 2, "capacity": 0, "used": 0, "data": []}
        detail = ok(client.get(f"{ID}/ana"))
        assert (detail["imprint_used"], detail["imprint_capacity"]) == (0, 0)
        assert error(client.delete(f"{ID}/ana/imprint/0"), 404, "not_found")["message"].endswith("it has none")
        assert ok(client.get(f"{ID}/ana/diff", params={"a": 1}))["imprint"] == {"added": [], "removed": []}


# --- the imprint as part of the state ---------------------------------------------------------------------------


def test_the_imprint_survives_export_import_and_a_restart(settings: Settings, imprinting_llama: LlamaModel) -> None:
    with serve(settings, imprinting_llama) as client:
        chat(client, FACT)
        listed = ok(client.get(f"{ID}/ana/imprint"))
        exported = ok_bytes(client.get(f"{ID}/ana/state"))
        put = client.put(f"{ID}/eve/state", content=exported, headers={"content-type": "application/octet-stream"})
        assert ok(put) == {"version": 2}  # created at 1, imported as 2
        assert ok_bytes(client.get(f"{ID}/eve/state")) == exported  # bit for bit
        assert ok(client.get(f"{ID}/eve/imprint")) == listed
    with serve(settings, imprinting_llama) as again:  # a new process over the same database
        assert ok(again.get(f"{ID}/ana/imprint")) == listed and ok(again.get(f"{ID}/eve/imprint")) == listed
        assert ok_bytes(again.get(f"{ID}/ana/state")) == exported
        ok(again.delete(f"{ID}/eve/imprint/0"))
        ok(again.post(f"{ID}/eve/rollback", json={"version": 2}))
        assert ok_bytes(again.get(f"{ID}/eve/state")) == exported  # a roll back restores it exactly


def _tampered(blob: bytes, how: str) -> bytes:
    tensors = dict(st_load(blob))
    used = int((tensors["imprint.span"] >= 0).sum())
    if how == "numbering":  # spans must be numbered 0, 1, ... over consecutive entries
        span = tensors["imprint.span"].clone()
        span[:used] = 3
        tensors["imprint.span"] = span
    elif how == "gap":  # entries are filled from the first one on
        span = tensors["imprint.span"].clone()
        span[0] = -1
        tensors["imprint.span"] = span
    elif how == "token":  # a token id the vocabulary does not have
        token = tensors["imprint.token"].clone()
        token[0] = 1 << 20
        tensors["imprint.token"] = token
    elif how == "kind":
        kind = tensors["imprint.kind"].clone()
        kind[:used] = 99
        tensors["imprint.kind"] = kind
    elif how == "shape":
        tensors["imprint.keys"] = tensors["imprint.keys"][:, :, :-1].contiguous()
    elif how == "partial":  # some of the imprint's tensors only
        del tensors["imprint.values"]
    return bytes(st_save(tensors))


@pytest.mark.parametrize("how", ["numbering", "gap", "token", "kind", "shape", "partial"])
def test_a_hostile_imprint_in_an_imported_state_is_refused(client: TestClient, how: str) -> None:
    chat(client, FACT)
    good = ok_bytes(client.get(f"{ID}/ana/state"))
    put = client.put(f"{ID}/ana/state", content=_tampered(good, how), headers={"content-type": "application/octet-stream"})
    assert "imprint" in error(put, 422, "invalid_state")["message"]
    assert ok_bytes(client.get(f"{ID}/ana/state")) == good  # nothing written
    assert ok(client.get(f"{ID}/ana/imprint"))["used"] > 0


# --- the recent prompt window ----------------------------------------------------------------------------------


def test_the_prompt_window_puts_the_newest_whole_exchanges_before_the_message(
    settings: Settings, imprinting_llama: LlamaModel
) -> None:
    """SIA_PROMPT_WINDOW_TOKENS: the second turn reads the persona's prompt, the first exchange as a transcript holds
    it, then its message (its prompt_tokens say so, and the counterfactual reads the same); the imprint still
    takes only the message's own tokens."""
    tok = imprinting_llama.tokenizer
    with serve(settings.model_copy(update={"prompt_window_tokens": 120}), imprinting_llama) as client:
        system = system_prompt(client, imprinting_llama)
        first = chat(client, FACT)
        assert first["usage"]["prompt_tokens"] == len(tok.turn_prompt(FACT, system)[0])  # nothing stored yet
        window = exchange_tokens(tok, FACT, first["reply"])
        second = chat(client, QUESTION)
        assert second["usage"]["prompt_tokens"] == len(system) + len(window) + len(tok.turn_prompt(QUESTION)[0])
        cf = ok(client.post(f"{ID}/ana/counterfactual", json={"message": QUESTION, "seed": 0, **GREEDY}))
        third = len(window) + len(exchange_tokens(tok, QUESTION, second["reply"]))
        assert cf["current"]["usage"]["prompt_tokens"] == len(system) + third + len(tok.turn_prompt(QUESTION)[0])
        state = state_of(client, imprinting_llama, "ana")
        assert state.imprint is not None
        for span in state.imprint.spans():  # offsets count from the message's first token, whatever the window
            said = FACT if span.turn == 0 else QUESTION
            assert span.tokens == tuple(tok.encode(said)[span.offset : span.offset + span.length])
        assert [r[2] for r in turn_rows(settings)] == [first["usage"]["prompt_tokens"], second["usage"]["prompt_tokens"]]

        store = services_of(client).store
        chat(client, "And where do I live?")
        replies = [t["reply"] for t in ok(client.get(f"{ID}/ana/turns"))["data"]]
        messages = [FACT, QUESTION, "And where do I live?"]
        exchanges = [exchange_tokens(tok, m, r) for m, r in zip(messages, replies, strict=True)]
        newest_two = len(exchanges[1]) + len(exchanges[2])
        assert recent_window(store, tok, "sia", "ana", newest_two) == exchanges[1] + exchanges[2]
        assert recent_window(store, tok, "sia", "ana", newest_two - 1) == exchanges[2]  # whole exchanges only
        assert recent_window(store, tok, "sia", "ana", len(exchanges[2]) - 1) == []
        assert recent_window(store, tok, "sia", "ana", 10_000) == [t for e in exchanges for t in e]


def test_a_window_never_makes_a_turn_too_long(settings: Settings, imprinting_llama: LlamaModel) -> None:
    """A window larger than the model's context shrinks to the room the message and its reply leave."""
    block = imprinting_llama.config.block_size
    tok = imprinting_llama.tokenizer
    with serve(settings.model_copy(update={"prompt_window_tokens": 10 * block}), imprinting_llama) as client:
        alone = len(tok.turn_prompt("Hi.", system_prompt(client, imprinting_llama))[0])  # the persona's prompt is long
        read = [chat(client, "Hi.")["usage"]["prompt_tokens"] for _ in range(6)]
        assert read[0] == alone and max(read) > alone  # a window was read
        assert all(n + GREEDY["max_tokens"] <= block for n in read)  # and every turn fit
