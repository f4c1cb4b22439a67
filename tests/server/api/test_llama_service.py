"""The service over a LLaMA-family backbone (a tiny one written by the test): chat, the OpenAI route with BPE
token log-probabilities, personas with system prompts, and the admin routes over a trace in chosen layers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from server.core.config import Settings
from server.db import migrate
from server.main import create_app
from server.store import Store
from sia.backbones.llama import LlamaModel
from sia.backbones.slot_maps import init_slot_map
from sia.checkpoint import load_model
from sia.identity.state import state_from_bytes, state_to_bytes
from sia.model.generate import sentences_end
from sia.model.language import OPEN_WORDS
from sia.personas import CHAT_FORM, CHAT_SAMPLING, EARLIER_CHAT_PROMPTS, PERSONAS
from tests.server.api.test_admin import ID, ok
from tests.sia.conftest import build_tiny_vocab, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> LlamaModel:
    root = tmp_path_factory.mktemp("tiny-llama")
    tiny = write_tiny_gguf(root / "tiny.gguf", build_tiny_vocab())
    model = load_model(tiny.path, cache_dir=root / "models")
    assert isinstance(model, LlamaModel)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a read that writes something, as trained identity parameters would
        for attn in model.attentions:
            init_slot_map(attn.self_value, 1.0, g)
            attn.slot_bias.zero_()
    return model


@pytest.fixture
def client(settings: Settings, tiny_llama: LlamaModel) -> Iterator[TestClient]:
    migrate.upgrade(settings)
    with TestClient(create_app(settings, model=tiny_llama)) as c:
        yield c


def chat(client: TestClient, user: str, message: str) -> dict[str, Any]:
    body: dict[str, Any] = ok(client.post("/v1/personas/sia/chat", json={"user": user, "message": message, "max_tokens": 6}))
    return body


def _tiny_with_texts(tmp_path: Path) -> tuple[LlamaModel, dict[int, str]]:
    """A tiny GGUF-loaded model whose head a test then biases, and the text of each of its tokens."""
    model = load_model(write_tiny_gguf(tmp_path / "tiny.gguf", build_tiny_vocab()).path, cache_dir=tmp_path / "models")
    assert isinstance(model, LlamaModel)
    tok = model.tokenizer
    texts = {i: raw.decode("utf-8", errors="ignore") for i in range(tok.vocab_size) if (raw := tok.token_bytes(i)) is not None}
    return model, texts


def _greeted(c: TestClient, persona: str, user: str, max_tokens: int, **extra: object) -> str:
    """The greedy reply of ``persona`` to ``user``'s "Hello there." over the chat route, ``extra`` fields sent too."""
    body = {"user": user, "message": "Hello there.", "temperature": 0, "max_tokens": max_tokens, **extra}
    return str(ok(c.post(f"/v1/personas/{persona}/chat", json=body))["reply"])


def test_personas_read_their_system_prompt_and_turns_change_the_state(client: TestClient, tiny_llama: LlamaModel) -> None:
    sia = ok(client.get("/admin/personas/sia"))
    assert sia["preamble"] == PERSONAS["sia"].system_prompt
    first = chat(client, "ana", "Hello, how are you today?")
    assert first["turn"] == 0 and isinstance(first["reply"], str)
    chat(client, "ana", "What is the capital of France?")
    blob = client.get(f"{ID}/ana/state").content
    state = state_from_bytes(blob, tiny_llama.config)
    assert state.turns == 2 and state.trace.dtype == torch.float16 and float(state.trace.float().abs().sum()) > 0


def _stored_by_an_earlier_release(settings: Settings) -> None:
    """Every persona marked as brought to no release's defaults yet, as a persona an earlier release stored is."""
    store = Store(settings)
    try:
        for persona in store.list_personas():
            store.update_persona(persona.name, defaults_release=0)
    finally:
        store.close()


def test_a_restart_brings_default_personas_to_this_releases_decoding_unless_an_admin_changed_them(
    settings: Settings, tiny_llama: LlamaModel
) -> None:
    """A persona stored by an earlier release (128 tokens, no repetition control, bolt's prompt without its worked
    examples) takes today's defaults when the service starts; a field an admin set to something else stays as it is,
    and so does a field an admin sets back to an earlier default once this release's defaults were applied."""
    migrate.upgrade(settings)
    earlier = {"max_tokens": 128, "repetition_penalty": 1.0, "no_repeat_ngram": 0, "recall_temperature": None}
    with TestClient(create_app(settings, model=tiny_llama)) as c:
        ok(c.patch("/admin/personas/sia", json=earlier))
        ok(c.patch("/admin/personas/bolt", json={**earlier, "max_tokens": 40, "preamble": "You are terse."}))
        ok(c.patch("/admin/personas/pip", json={"preamble": EARLIER_CHAT_PROMPTS["bolt"][0], "exclaim": False}))
        ok(c.patch("/admin/personas/marlow", json={"preamble": "You are Marlow.", "address": ""}))
    with TestClient(create_app(settings, model=tiny_llama)) as c:  # the same release: an admin's values stay
        assert ok(c.get("/admin/personas/sia"))["max_tokens"] == 128
    _stored_by_an_earlier_release(settings)
    with TestClient(create_app(settings, model=tiny_llama)) as c:
        sia, bolt = ok(c.get("/admin/personas/sia")), ok(c.get("/admin/personas/bolt"))
        pip = ok(c.get("/admin/personas/pip"))
        assert pip["preamble"] == EARLIER_CHAT_PROMPTS["bolt"][0]  # not pip's own earlier prompt: the admin's
        assert pip["exclaim"] is True  # an earlier release's default
        marlow = ok(c.get("/admin/personas/marlow"))
        assert marlow["preamble"] == "You are Marlow." and marlow["address"] == CHAT_FORM["marlow"]["address"]
        ok(c.patch("/admin/personas/bolt", json={"preamble": EARLIER_CHAT_PROMPTS["bolt"][0], "lowercase": False}))
    with TestClient(create_app(settings, model=tiny_llama)) as c:  # set back after the upgrade: the admin's choice
        again = ok(c.get("/admin/personas/bolt"))
        assert (again["preamble"], again["lowercase"]) == (EARLIER_CHAT_PROMPTS["bolt"][0], False)
    for field in earlier:
        assert sia[field] == CHAT_SAMPLING[field]
    assert bolt["max_tokens"] == 40 and bolt["preamble"] == "You are terse."  # the admin's own choices
    assert (bolt["repetition_penalty"], bolt["no_repeat_ngram"]) == (
        CHAT_SAMPLING["repetition_penalty"],
        CHAT_SAMPLING["no_repeat_ngram"],
    )
    assert sia["preamble"] == PERSONAS["sia"].system_prompt and sia["temperature"] == CHAT_SAMPLING["temperature"]
    assert (bolt["lowercase"], bolt["max_sentences"], bolt["max_words"]) == tuple(CHAT_FORM["bolt"].values())  # no form before
    assert (sia["lowercase"], sia["max_sentences"]) == (False, 4) == (False, CHAT_FORM["sia"]["max_sentences"])


def test_a_restart_leaves_a_reply_form_an_admin_chose(settings: Settings, tiny_llama: LlamaModel) -> None:
    migrate.upgrade(settings)
    with TestClient(create_app(settings, model=tiny_llama)) as c:
        assert (ok(c.get("/admin/personas/bolt"))["lowercase"], ok(c.get("/admin/personas/bolt"))["max_sentences"]) == (True, 1)
        ok(c.patch("/admin/personas/bolt", json={"max_sentences": 3}))
        ok(c.patch("/admin/personas/sia", json={"lowercase": True}))
    with TestClient(create_app(settings, model=tiny_llama)) as c:
        assert ok(c.get("/admin/personas/bolt"))["max_sentences"] == 3 and ok(c.get("/admin/personas/sia"))["lowercase"]


def test_openai_logprobs_report_each_tokens_bytes(client: TestClient, tiny_llama: LlamaModel) -> None:
    body = {"model": "sia", "user": "bob", "messages": [{"role": "user", "content": "Hello, world!"}]}
    r = ok(client.post("/v1/chat/completions", json={**body, "max_tokens": 5, "logprobs": True, "top_logprobs": 2}))
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"]
    tok = tiny_llama.tokenizer
    for item in content:
        assert len(item["top_logprobs"]) == 2 and item["logprob"] <= 0
        if item["bytes"] is not None:
            assert bytes(item["bytes"]).decode("utf-8", errors="replace") == item["token"]
    ids = tok.encode(r["choices"][0]["message"]["content"])
    assert r["choices"][0]["message"]["content"] == tok.decode(ids)


def test_admin_routes_see_traces_in_their_layers(client: TestClient, tiny_llama: LlamaModel) -> None:
    config = tiny_llama.config
    chat(client, "cy", "Tell me about the weather.")
    detail = ok(client.get(f"{ID}/cy"))
    heads = detail["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [
        (layer, h) for layer in config.trace_layer_ids for h in range(config.n_kv_head)
    ]
    assert all(len(h["eigenvalues"]) == config.head_dim for h in heads)
    assert client.get(f"{ID}/cy/plot.png").content.startswith(b"\x89PNG")
    ok(client.post(f"{ID}/cy/reset", json={"layers": [config.trace_layer_ids[0]]}))
    state = state_from_bytes(client.get(f"{ID}/cy/state").content, config)
    assert float(state.trace[0].float().abs().sum()) == 0  # that layer's trace is fresh, the self state is kept
    assert float(state.self_state.abs().sum()) > 0
    untraced = next(i for i in range(config.n_layer) if i not in config.trace_layer_ids)
    r = client.post(f"{ID}/cy/reset", json={"layers": [untraced]})
    assert r.status_code == 400 and "carry a trace" in r.json()["error"]["message"]
    cf = ok(client.post(f"{ID}/cy/counterfactual", json={"message": "And now?", "max_tokens": 4, "seed": 1}))
    assert cf["seed"] == 1 and {"current", "other"} <= set(cf)
    versions = ok(client.get(f"{ID}/cy/history"))
    assert len(versions["data"]) >= 3


def test_state_operations_round_trip_the_float16_trace(client: TestClient, tiny_llama: LlamaModel) -> None:
    """Snapshot, diff, clean-up, rollback and export/import act on this model's state as on the native one's."""
    config = tiny_llama.config
    chat(client, "dee", "I like long walks by the sea.")
    first = client.get(f"{ID}/dee/state").content
    ok(client.post(f"{ID}/dee/snapshots", json={"name": "after-one"}), 201)
    chat(client, "dee", "Tell me something about whales.")
    diff = ok(client.get(f"{ID}/dee/diff", params={"a": 2}))
    assert len(diff["trace_norm"]) == len(config.trace_layer_ids) and len(diff["trace_norm"][0]) == config.n_kv_head
    assert all(x > 0 for row in diff["trace_norm"] for x in row) and diff["turns"] == 1
    cleaned = ok(client.post(f"{ID}/dee/cleanup", json={"energy": 0.9}))
    assert all(0 < r <= config.head_dim for row in cleaned["ranks"] for r in row)
    state = state_from_bytes(client.get(f"{ID}/dee/state").content, config)
    assert state.trace.dtype == torch.float16
    ok(client.post(f"{ID}/dee/rollback", json={"snapshot": "after-one"}))
    assert client.get(f"{ID}/dee/state").content == first  # bit for bit
    exported = client.get(f"{ID}/dee/state").content
    ok(client.put(f"{ID}/eve/state", content=exported, headers={"content-type": "application/octet-stream"}))
    assert client.get(f"{ID}/eve/state").content == exported
    wrong = state_from_bytes(exported, config)
    as_float32 = state_to_bytes(replace(wrong, trace=wrong.trace.float()))
    r = client.put(f"{ID}/eve/state", content=as_float32, headers={"content-type": "application/octet-stream"})
    assert r.status_code == 422 and "dtype" in r.json()["error"]["message"]


def test_a_message_longer_than_the_context_is_a_clear_4xx_and_changes_nothing(client: TestClient, tiny_llama: LlamaModel) -> None:
    chat(client, "fay", "Hi!")
    before = client.get(f"{ID}/fay/state").content
    message = "word " * tiny_llama.config.block_size  # within the character limit, beyond the model's context
    r = client.post("/v1/personas/sia/chat", json={"user": "fay", "message": message, "max_tokens": 4})
    assert r.status_code == 400 and "exceeds" in r.json()["error"]["message"]
    assert client.get(f"{ID}/fay/state").content == before


def test_sia_dtype_bfloat16_decodes_in_bfloat16_and_keeps_the_write_in_float32(settings: Settings, tmp_path: Any) -> None:
    """SIA_DTYPE=bfloat16: the weights are cast at start-up, turns answer through the batcher and store a finite
    float32 self state; the self update stays float32."""
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", build_tiny_vocab())
    model = load_model(tiny.path, cache_dir=tmp_path / "models")
    assert isinstance(model, LlamaModel)
    migrate.upgrade(settings)
    with TestClient(create_app(settings.model_copy(update={"dtype": "bfloat16"}), model=model)) as client:
        for message in ("My favourite colour is green.", "What is my favourite colour?"):
            assert isinstance(chat(client, "ana", message)["reply"], str)
        state = state_from_bytes(client.get(f"{ID}/ana/state").content, model.config)
    assert model.wte.weight.dtype == torch.bfloat16 and model.self_update.proj.weight.dtype == torch.float32
    assert state.turns == 2 and state.self_state.dtype == torch.float32 and bool(torch.isfinite(state.self_state).all())
    assert float(state.self_state.abs().sum()) > 0
    with pytest.raises(ValueError, match="dtype"):
        Settings(dtype="float16")


def test_sia_device_chooses_where_the_model_computes_and_a_missing_gpu_is_refused_at_once(
    settings: Settings, tmp_path: Any
) -> None:
    """SIA_DEVICE: cpu (the default), or auto where torch sees no GPU, serves on the CPU in float32 (SIA_DTYPE=auto);
    cuda where torch sees none is refused before any model is loaded, saying what to set instead; anything but cpu,
    auto or cuda[:N] is refused as a setting."""
    from server.runtime.services import served_model, serving_device

    assert settings.device == "cpu" and settings.dtype == "auto"
    for bad in ("gpu", "cuda:x", "mps", "", "cuda0"):
        with pytest.raises(ValueError, match="device"):
            Settings(device=bad)
    assert serving_device("cpu") == torch.device("cpu")
    assert serving_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", build_tiny_vocab())
    model = load_model(tiny.path, cache_dir=tmp_path / "models")
    served = served_model(settings.model_copy(update={"device": "auto" if not torch.cuda.is_available() else "cpu"}), model=model)
    assert served.device.type == "cpu" and served.wte.weight.dtype == torch.float32
    if not torch.cuda.is_available():
        for setting in ("cuda", "cuda:1"):
            with pytest.raises(ValueError, match=r"no CUDA GPU.*use cpu or auto"):  # not the absent checkpoint's error
                served_model(settings.model_copy(update={"device": setting, "checkpoint": tmp_path / "absent"}))


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch sees no CUDA GPU here: the service on a GPU is checked where it sees one"
)
def test_the_service_on_a_gpu_decodes_there_and_keeps_state_on_the_cpu(settings: Settings, tmp_path: Any) -> None:
    """SIA_DEVICE=cuda: the model moves to the GPU and decodes in bfloat16 (SIA_DTYPE=auto), the self update in float32;
    concurrent users' turns go through the batcher and store finite states. A turn of the library on the GPU in
    float32 answers and updates the state as on the CPU."""
    from concurrent.futures import ThreadPoolExecutor

    from sia.identity.state import Dynamics, IdentityState
    from sia.identity.turn import TurnRequest, run_turn
    from sia.model.generate import SamplingParams

    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", build_tiny_vocab())
    cpu = load_model(tiny.path, cache_dir=tmp_path / "models")
    gpu = load_model(tiny.path, cache_dir=tmp_path / "models").to("cuda")
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    state = IdentityState.fresh(cpu.config)
    for message in ("My favourite colour is green.", "What is my favourite colour?"):
        request = TurnRequest(state=state, message=message, dynamics=Dynamics.from_config(cpu.config))
        on_cpu, on_gpu = run_turn(cpu, request, params), run_turn(gpu, request, params)
        assert on_gpu.reply == on_cpu.reply and on_gpu.state.trace.device.type == "cpu"
        assert torch.allclose(on_gpu.state.trace.float(), on_cpu.state.trace.float(), atol=1e-3)
        assert torch.allclose(on_gpu.state.self_state, on_cpu.state.self_state, atol=1e-3)
        state = on_cpu.state

    model = load_model(tiny.path, cache_dir=tmp_path / "models")
    migrate.upgrade(settings)
    with TestClient(create_app(settings.model_copy(update={"device": "cuda"}), model=model)) as client:
        users = [f"gpu{i}" for i in range(4)]
        with ThreadPoolExecutor(len(users)) as pool:
            for message in ("My favourite colour is green.", "What is my favourite colour?"):
                replies = pool.map(chat, [client] * len(users), users, [message] * len(users))
                assert all(isinstance(r["reply"], str) for r in replies)
        states = [state_from_bytes(client.get(f"{ID}/{u}/state").content, model.config) for u in users]
    assert model.wte.weight.device.type == "cuda" and model.wte.weight.dtype == torch.bfloat16
    assert model.self_update.proj.weight.dtype == torch.float32
    for stored in states:
        assert stored.turns == 2 and bool(torch.isfinite(stored.self_state).all()) and float(stored.self_state.abs().sum()) > 0


def test_the_served_model_packs_its_matrices_unless_told_not_to(settings: Settings, tmp_path: Any) -> None:
    """SIA_PACKED_WEIGHTS (default auto): a float32 backbone on a CPU is served with its matrices packed, in
    float32, in bfloat16 (float32 where the CPU cannot pack bfloat16), or (auto, the default) in bfloat16 where the
    CPU multiplies it natively, else float32; off, or in bfloat16 weights, not.
    The setting's earlier true / false still read as float32 / off; anything else is refused."""
    from server.runtime.services import served_model
    from sia.backbones.packed_linear import bfloat16_packing_available, bfloat16_products_fast, packing_available

    if not packing_available():
        pytest.skip("this torch build has no oneDNN to pack weights with")
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", build_tiny_vocab())
    # a CPU that cannot pack bfloat16 (AVX2 alone) packs float32 when asked for bfloat16, and says so in the log
    bfloat16 = torch.bfloat16 if bfloat16_packing_available() else torch.float32
    auto = bfloat16 if bfloat16_products_fast() else torch.float32
    cases: list[tuple[dict[str, Any], torch.dtype | None]] = [
        ({}, auto),
        ({"packed_weights": "auto"}, auto),
        ({"packed_weights": "float32"}, torch.float32),
        ({"packed_weights": "bfloat16"}, bfloat16),
        ({"packed_weights": "off"}, None),
        ({"dtype": "bfloat16"}, None),
    ]
    for update, want in cases:
        model = load_model(tiny.path, cache_dir=tmp_path / "models")
        assert isinstance(model, LlamaModel)
        served_model(settings.model_copy(update=update), model=model)
        up = model.blocks[0].mlp.gate_up.linear()  # the MLP's gate and up maps, packed as their stacked product
        assert (model.lm_head.packed is not None) is (want is not None) and (up.packed is not None) is (want is not None)
        assert model.blocks[0].mlp.up_proj.packed is None  # the stacked maps' own copies would never be read
        if want is not None:
            assert up.packed_dtype == want and model.exact_rows is (want == torch.bfloat16)
    assert Settings(packed_weights=True).packed_weights == "float32"  # type: ignore[arg-type]
    assert Settings(packed_weights="false").packed_weights == "off"
    with pytest.raises(ValueError, match="packed_weights"):
        Settings(packed_weights="half")


def test_sia_read_shift_weakens_the_served_read_and_is_checked(settings: Settings, tmp_path: Any) -> None:
    """SIA_READ_SHIFT: the served model conditions with its slots' logits lowered by it, in place of the checkpoint's
    own shift, which holds where it is unset; a non-finite or absurd value is refused at start-up, and so is a shift
    for the native model, which has no adapter to shift."""
    from server.runtime.services import served_model
    from sia.checkpoint import NATIVE_CHECKPOINT

    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", build_tiny_vocab())
    model = load_model(tiny.path, cache_dir=tmp_path / "models")
    assert isinstance(model, LlamaModel) and model.read_shift == 0.0
    served = served_model(settings.model_copy(update={"read_shift": 1.5}), model=model)
    assert served is model and model.read_shift == 1.5
    model.config = replace(model.config, read_shift=0.5)  # a checkpoint exported with its own shift
    model.set_read_shift(model.config.read_shift)
    assert settings.read_shift is None and served_model(settings, model=model).read_shift == 0.5  # unset: its own
    assert served_model(settings.model_copy(update={"read_shift": 0.0}), model=model).read_shift == 0.0  # set: in place
    assert Settings(read_shift=" ").read_shift is None  # SIA_READ_SHIFT= (empty) is unset
    for bad in (float("nan"), float("inf"), 100.0):
        with pytest.raises(ValueError, match="read_shift"):
            Settings(read_shift=bad)
    native = load_model(NATIVE_CHECKPOINT)
    with pytest.raises(ValueError, match="SIA_READ_SHIFT"):
        served_model(settings.model_copy(update={"read_shift": 1.0}), model=native)


def test_bolts_replies_are_lowercase_single_sentences_unless_a_request_says_otherwise(settings: Settings, tmp_path: Path) -> None:
    """The tiny model, made to like capitals, full stops and spaces, answers bolt (whose defaults write the reply in
    lower case and end it after its first sentence) with the first sentence of its free reply, lowered; a request
    that turns the form off, on either route, gets the free reply; one that asks for it gets it from sia too."""
    liked, texts = _tiny_with_texts(tmp_path)
    tok = liked.tokenizer
    bias = torch.zeros(liked.lm_head.weight.shape[0])
    bias[[i for i, t in texts.items() if t and (t.isspace() or any(c.isupper() for c in t))]] = 2.0
    bias[[i for i, t in texts.items() if t == "."]] = 5.0
    bias[sorted(tok.end_ids)] = -30.0  # and not to end early
    liked.lm_head.bias = torch.nn.Parameter(bias)
    migrate.upgrade(settings)
    free = {"lowercase": False, "max_sentences": 0, "max_words": 0}
    with TestClient(create_app(settings, model=liked)) as c:
        say = partial(_greeted, c, max_tokens=16)

        loose = say("bolt", "a", **free)
        end = sentences_end(loose, 1)
        assert end is not None and end < len(loose.rstrip()) and loose != loose.lower(), loose  # the form has work to do
        assert say("bolt", "b", max_words=0) == loose[:end].lower()
        body = {"model": "bolt", "user": "c", "messages": [{"role": "user", "content": "Hello there."}], "temperature": 0}
        out = ok(c.post("/v1/chat/completions", json={**body, "max_tokens": 16, **free}))
        assert out["choices"][0]["message"]["content"] == loose
        sia = say("sia", "e", **free)
        assert say("sia", "d", lowercase=True, max_sentences=1) == sia[: sentences_end(sia, 1)].lower()


def test_pip_exclaims_and_marlow_addresses_the_user_unless_a_request_says_otherwise(settings: Settings, tmp_path: Path) -> None:
    """The tiny model, made to like letters and full stops, answers pip (whose defaults exclaim) with its free reply up
    to the first full stop after a word, written "!", and marlow (whose defaults address the user) with ", sir" before
    that full stop; a request that turns the rule off, on either route, gets the free reply; one that asks for it gets
    it from sia too."""
    liked, texts = _tiny_with_texts(tmp_path)
    tok = liked.tokenizer
    bias = torch.zeros(liked.lm_head.weight.shape[0])
    bias[[i for i, t in texts.items() if t.strip().isalpha()]] = 2.0
    bias[[i for i, t in texts.items() if t == "."]] = 4.0
    bias[sorted(tok.end_ids)] = -30.0
    liked.lm_head.bias = torch.nn.Parameter(bias)
    migrate.upgrade(settings)
    with TestClient(create_app(settings, model=liked)) as c:
        say = partial(_greeted, c, max_tokens=24)

        def first_stop(text: str) -> int:
            found = re.search(r"[^\W\d_]\.", text)
            assert found is not None and "!" not in text[: found.end()], text  # the rule has work to do
            return found.start() + 1

        loose = say("pip", "a", exclaim=False)
        cut = first_stop(loose)
        assert say("pip", "b")[: cut + 1] == loose[:cut] + "!"
        body = {"model": "pip", "user": "c", "messages": [{"role": "user", "content": "Hello there."}], "temperature": 0}
        out = ok(c.post("/v1/chat/completions", json={**body, "max_tokens": 24, "exclaim": False}))
        assert out["choices"][0]["message"]["content"] == loose
        sia = say("sia", "d", max_sentences=0)
        assert say("sia", "e", max_sentences=0, exclaim=True)[: first_stop(sia) + 1] == sia[: first_stop(sia)] + "!"

        plain = say("marlow", "f", address="")
        cut = first_stop(plain)
        assert say("marlow", "g")[: cut + 6] == plain[:cut] + ", sir."
        out = ok(c.post("/v1/chat/completions", json={**body, "model": "marlow", "max_tokens": 24, "address": ""}))
        assert out["choices"][0]["message"]["content"] == plain
        assert say("sia", "h", max_sentences=0, address=", friend")[: first_stop(sia) + 9] == sia[: first_stop(sia)] + ", friend."


def test_a_persona_never_opens_its_reply_by_calling_out_its_own_name(settings: Settings, tmp_path: Path) -> None:
    """A tiny model whose head says "S", "i", "a", "," and "S" again under a request's penalties (each token said
    loses 4): its free reply opens "Sia,", which the persona sia takes back and begins without its first token, on
    either route, while bolt, whose name it is not, keeps it."""
    liked, texts = _tiny_with_texts(tmp_path)
    vocab = liked.lm_head.weight.shape[0]
    head = torch.full((vocab,), -30.0)
    for rank, text in enumerate(("S", "i", "a", ",")):
        head[[i for i, t in texts.items() if t == text]] = 20.0 - rank
    liked.lm_head.weight = torch.nn.Parameter(torch.zeros_like(liked.lm_head.weight))
    liked.lm_head.bias = torch.nn.Parameter(head)
    free = {"frequency_penalty": 2.0, "presence_penalty": 2.0, "repetition_penalty": 1.0, "no_repeat_ngram": 0}
    free |= {"lowercase": False, "max_sentences": 0, "max_words": 0}
    migrate.upgrade(settings)
    with TestClient(create_app(settings, model=liked)) as c:
        say = partial(_greeted, c, max_tokens=8, **free)
        assert say("bolt", "a").startswith("Sia,")  # the rule has work to do, and only for its own name
        reply = say("sia", "b")
        assert reply and not reply.startswith("Sia"), reply
        body = {"model": "sia", "user": "c", "messages": [{"role": "user", "content": "Hello there."}], "temperature": 0}
        out = ok(c.post("/v1/chat/completions", json={**body, "max_tokens": 8, **free}))
        assert out["choices"][0]["message"]["content"] == reply


def test_a_word_limit_ends_the_reply_soon_after_it_unless_a_request_lifts_it(settings: Settings, tmp_path: Path) -> None:
    """The tiny model, made to say words (each token a space and a word) far above full stops and its end token: a
    request's word limit of three ends the reply with a full stop at a word's end within a few words of it (not
    counting the words a sentence cannot end on, after which the pull waits), on either route; with the limit off, the
    model's longer free reply. Bolt's defaults carry CHAT_FORM's limit: a request that sets nothing decodes as one that
    sets it."""
    liked, texts = _tiny_with_texts(tmp_path)
    tok = liked.tokenizer
    bias = torch.full((liked.lm_head.weight.shape[0],), -60.0)  # nothing but lowercase words, spaces, full stops
    bias[[i for i, t in texts.items() if t[:1] == " " and t[1:].isalpha() and t[1:].islower()]] = 20.0  # " word"
    bias[[*(i for i, t in texts.items() if t == "."), *tok.end_ids]] = 12.0
    liked.lm_head.bias = torch.nn.Parameter(bias)
    migrate.upgrade(settings)
    with TestClient(create_app(settings, model=liked)) as c:
        say = partial(_greeted, c, max_tokens=16)

        def words(text: str) -> int:
            return len(re.findall(r"[^\W\d_]+", text))

        loose = say("sia", "a", max_sentences=0, max_words=0)
        short = say("sia", "b", max_sentences=0, max_words=3)
        assert words(loose) > 3 + 5 and "." not in loose, loose  # the limit has work to do
        said = re.findall(r"[^\W\d_]+", short)
        past = [w for w in said[3:] if w.lower() not in OPEN_WORDS]  # after "the", "a", "are" the pull waits a word
        assert len(said) >= 3 and len(past) <= 5 and short.endswith("."), short
        assert said[-1].lower() not in OPEN_WORDS, short  # no sentence is ended on a word it cannot end on
        assert loose.startswith(short[:-1])  # the same words up to the end it was pulled to
        body = {"model": "sia", "user": "c", "messages": [{"role": "user", "content": "Hello there."}], "temperature": 0}
        out = ok(c.post("/v1/chat/completions", json={**body, "max_tokens": 16, "max_sentences": 0, "max_words": 3}))
        assert out["choices"][0]["message"]["content"] == short
        assert say("bolt", "d") == say("bolt", "e", max_words=CHAT_FORM["bolt"]["max_words"]) != say("bolt", "f", max_words=3)
