"""The LLaMA-family model with the injected identity: parity with transformers at zero state, the fast form against
the written-out reference, cache and batching, history dependence, and the state's size."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from sia.backbones.injected_attention import InjectedLayer, injected_attention_reference
from sia.backbones.llama import LlamaModel, RMSNorm
from sia.backbones.slot_maps import LowRank, init_slot_map
from sia.identity.state import Dynamics, IdentityState, state_to_bytes
from sia.identity.turn import TurnRequest, run_turn
from sia.model.config import LlamaConfig
from sia.model.generate import SamplingParams, generate
from sia.model.tokenizer import ByteTokenizer

from .conftest import hf_tiny

HF_TINY = hf_tiny(max_position_embeddings=256)


@pytest.fixture(scope="module")
def hf_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(HFLlamaConfig(**HF_TINY)).eval()


def build(hf_model: LlamaForCausalLM, **overrides: object) -> LlamaModel:
    config = LlamaConfig.from_hf(HF_TINY, d_self=8, trace_layers=[0, 2], **overrides)
    model = LlamaModel(config, ByteTokenizer()).eval()
    model.load_base(hf_model.state_dict())
    return model


SLOT_SHAPES = [(1, None), (3, None), (3, 4)]  # (self_slots, slot_rank)


def open_read(model: LlamaModel) -> LlamaModel:
    """Untrained identity parameters read nothing (slot values are zero); give them trained-like magnitudes."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for attn in model.attentions:
            init_slot_map(attn.self_key, 1.0, g)
            init_slot_map(attn.self_value, 1.0, g)
            attn.slot_bias.zero_()  # open: the untrained default keeps the slot nearly closed
    return model


def random_state(config: LlamaConfig, seed: int) -> IdentityState:
    g = torch.Generator().manual_seed(seed)
    trace = torch.randn(config.trace_shape, generator=g).to(torch.float16)
    return IdentityState(trace=trace, self_state=torch.rand(config.d_self, generator=g) * 2 - 1, turns=4)


def test_zero_state_logits_equal_transformers(hf_model: LlamaForCausalLM) -> None:
    model = build(hf_model)
    idx = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_model(idx).logits
        fresh = [IdentityState.fresh(model.config)] * 2
        got = model(idx, model.condition_states(fresh)).logits
        base = build(hf_model, attention="dot")
        plain = base(idx, base.condition_states(fresh)).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(plain, expected, atol=1e-4, rtol=0)


def test_zero_state_left_padded_batch_equals_transformers(hf_model: LlamaForCausalLM) -> None:
    """Padded rows (positions and a key mask) give each row the logits transformers gives it alone."""
    model = build(hf_model)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42]]
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    cond = model.condition_states([IdentityState.fresh(model.config)] * 2)
    gens = generate(model, prompts, cond, params)
    with torch.no_grad():
        for prompt, gen in zip(prompts, gens, strict=True):
            logits = hf_model(torch.tensor([prompt])).logits[0]
            nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(prompt[1:]), reduction="none")
            torch.testing.assert_close(gen.prompt_nll, nll, atol=1e-4, rtol=0)
            assert gen.tokens[0] == int(logits[-1].argmax())


@pytest.mark.parametrize(("slots", "rank"), SLOT_SHAPES)
def test_fast_injected_attention_equals_reference(hf_model: LlamaForCausalLM, slots: int, rank: int | None) -> None:
    model = open_read(build(hf_model, self_slots=slots, slot_rank=rank))
    state = random_state(model.config, 0)
    s = state.self_state.unsqueeze(0)
    cond = model.condition_states([state])
    x = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(2))
    positions = torch.arange(9).unsqueeze(0)
    with torch.no_grad():
        for layer in (0, 1):  # a trace layer and a layer with only the self slot
            attn, lc = model.attentions[layer], cond.layers[layer]
            assert isinstance(lc, InjectedLayer) and (lc.metric is None) == (layer == 1)
            fast = attn(x, lc, model.rope(positions), None, layer, None)
            slow = injected_attention_reference(attn, x, lc, s, positions, model.config.rope_theta)
            torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_the_read_gate_starts_at_zero_and_shifts_the_slots_logits_per_token(hf_model: LlamaForCausalLM) -> None:
    """``slot_gate``: zero at start, the model reads exactly as one without the gate; moved, the fast form still equals
    the reference (which adds g_h·x_i to every slot's logit of query i, head h), and only the slots' weights change."""
    plain = open_read(build(hf_model, self_slots=2))
    gated = build(hf_model, self_slots=2, slot_gate=True)
    gated.load_state_dict(plain.state_dict(), strict=False)
    assert all(attn.w == other.w for attn, other in zip(gated.attentions, plain.attentions, strict=True))  # the padding had room
    state = random_state(gated.config, 4)
    idx = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(
            gated(idx, gated.condition_states([state])).logits, plain(idx, plain.condition_states([state])).logits, atol=0, rtol=0
        )
        for attn in gated.attentions:
            attn.slot_gate.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(6))
        cond = gated.condition_states([state])
        x = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(2))
        positions = torch.arange(9).unsqueeze(0)
        for layer in (0, 1):
            attn, lc = gated.attentions[layer], cond.layers[layer]
            assert isinstance(lc, InjectedLayer)
            fast = attn(x, lc, gated.rope(positions), None, layer, None)
            slow = injected_attention_reference(attn, x, lc, state.self_state.unsqueeze(0), positions, gated.config.rope_theta)
            torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
            assert (
                fast
                - plain.attentions[layer](
                    x, plain.condition_states([state]).layers[layer], plain.rope(positions), None, layer, None
                )
            ).abs().max() > 1e-3
        fresh = [IdentityState.fresh(gated.config)]
        torch.testing.assert_close(  # a fresh identity reads nothing, whatever the gate says: still the base model
            gated(idx, gated.condition_states(fresh)).logits, hf_model(idx).logits, atol=1e-4, rtol=0
        )
    cached = generate(gated, [[1, 2, 3, 4]], gated.condition_states([state]), SamplingParams(max_new_tokens=4, temperature=0.0))
    full = generate(
        gated, [[1, 2, 3, 4]], gated.condition_states([state]), SamplingParams(max_new_tokens=4, temperature=0.0), use_cache=False
    )
    assert cached[0].tokens == full[0].tokens
    with pytest.raises(ValueError, match="slot_gate"):
        LlamaConfig.from_hf(HF_TINY, slot_gate=1)


def test_the_base_view_reads_the_same_weights_as_the_base_model(hf_model: LlamaForCausalLM) -> None:
    model = open_read(build(hf_model))
    idx = torch.randint(0, 300, (1, 8), generator=torch.Generator().manual_seed(6))
    state = random_state(model.config, 2)
    base = model.base_view()
    with torch.no_grad():
        expected = hf_model(idx).logits
        plain = base(idx, base.condition_states([state])).logits  # the base ignores any state
        deformed = model(idx, model.condition_states([state])).logits
    torch.testing.assert_close(plain, expected, atol=1e-4, rtol=0)
    assert (deformed - expected).abs().max() > 1e-2  # this model still reads the state: the view changed nothing
    assert model.config.attention == "trace" and base.prefix_len == 0 and base.wte is model.wte


def test_metric_acts_before_rotation_so_relative_positions_are_kept(hf_model: LlamaForCausalLM) -> None:
    """Shifting every position by the same offset leaves the logits unchanged under a deformed metric (the slot,
    a key at position 0, is closed here: it alone is tied to an absolute position)."""
    model = open_read(build(hf_model))
    state = replace(random_state(model.config, 1), self_state=torch.zeros(model.config.d_self))
    cond = model.condition_states([state])
    idx = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        at_zero = model(idx, cond, positions=torch.arange(10).unsqueeze(0)).logits
        shifted = model(idx, cond, positions=torch.arange(37, 47).unsqueeze(0)).logits
    torch.testing.assert_close(shifted, at_zero, atol=2e-4, rtol=0)


@pytest.mark.parametrize(("slots", "rank"), SLOT_SHAPES)
def test_cached_decoding_equals_full_recompute(hf_model: LlamaForCausalLM, slots: int, rank: int | None) -> None:
    model = open_read(build(hf_model, self_slots=slots, slot_rank=rank))
    assert model.prefix_len == slots
    states = [random_state(model.config, 5), IdentityState.fresh(model.config)]
    cond = model.condition_states(states)
    params = SamplingParams(max_new_tokens=6, temperature=0.9, seed=3, top_logprobs=3)
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9]]
    cached = generate(model, prompts, cond, params)
    full = generate(model, prompts, cond, params, use_cache=False)
    for a, b in zip(cached, full, strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(a.prompt_nll, b.prompt_nll, atol=1e-5, rtol=0)
        torch.testing.assert_close(a.stats.hidden, b.stats.hidden, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("slots", "rank"), SLOT_SHAPES)
def test_batched_rows_equal_solo_rows(hf_model: LlamaForCausalLM, slots: int, rank: int | None) -> None:
    model = open_read(build(hf_model, self_slots=slots, slot_rank=rank))
    states = [random_state(model.config, 6), random_state(model.config, 7), IdentityState.fresh(model.config)]
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14]]
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    batched = generate(model, prompts, model.condition_states(states), params)
    for state, prompt, got in zip(states, prompts, batched, strict=True):
        (solo,) = generate(model, [prompt], model.condition_states([state]), params)
        assert got.tokens == solo.tokens
        torch.testing.assert_close(got.prompt_nll, solo.prompt_nll, atol=1e-5, rtol=0)


def test_gqa_shapes_of_cache_state_and_summary(hf_model: LlamaForCausalLM) -> None:
    model = build(hf_model)
    config = model.config
    assert config.trace_shape == (2, 2, 16, 16)  # trace layers, key/value heads, d, d
    cond = model.condition_states([IdentityState.fresh(config)])
    cache = model.new_cache(cond, 10)
    assert [tuple(k.shape) for k in cache.keys] == [(1, 2, 11, 40), (1, 2, 11, 24), (1, 2, 11, 40)]  # slot + 10 tokens
    (gen,) = generate(model, [[1, 2, 3]], cond, SamplingParams(max_new_tokens=2, temperature=0.0))
    summary = model.summarize(gen.stats)
    assert summary.queries.shape == summary.keys.shape == (1, 2, 2, 16)
    torch.testing.assert_close(summary.queries.norm(dim=-1), torch.ones(1, 2, 2))
    shared = build(hf_model, trace_per_head=False)
    assert shared.config.trace_shape == (2, 1, 16, 16)
    (gen,) = generate(shared, [[1, 2, 3]], shared.condition_states([IdentityState.fresh(shared.config)]), SamplingParams(2))
    assert shared.summarize(gen.stats).keys.shape == (1, 2, 1, 16)


def test_history_changes_the_next_token_distribution_and_reset_restores_it(hf_model: LlamaForCausalLM) -> None:
    model = open_read(build(hf_model))
    config = model.config
    fresh = IdentityState.fresh(config)
    state = fresh
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    for message in ("hello there", "my cat is called Tom", "what about the weather?"):
        state = run_turn(model, TurnRequest(state, message, Dynamics.from_config(config)), params).state
    assert state.turns == 3 and float(state.trace.float().abs().sum()) > 0 and float(state.self_state.abs().sum()) > 0
    assert state.trace.dtype == torch.float16
    prompt = ByteTokenizer().chat_prompt("and now?")
    idx = torch.tensor([prompt])
    with torch.no_grad():
        p_fresh = model(idx, model.condition_states([fresh])).logits[0, -1].log_softmax(-1)
        p_hist = model(idx, model.condition_states([state])).logits[0, -1].log_softmax(-1)
        p_reset = model(idx, model.condition_states([IdentityState.fresh(config)])).logits[0, -1].log_softmax(-1)
    kl = float((p_hist.exp() * (p_hist - p_fresh)).sum())
    assert kl > 1e-4
    assert torch.equal(p_reset, p_fresh)


def test_the_trace_alone_changes_attention(hf_model: LlamaForCausalLM) -> None:
    """With the self state at zero (slot closed), a non-zero trace still moves the logits; a zero trace does not."""
    model = build(hf_model)
    idx = torch.randint(0, 300, (1, 8), generator=torch.Generator().manual_seed(8))
    state = replace(random_state(model.config, 9), self_state=torch.zeros(model.config.d_self))
    with torch.no_grad():
        fresh = model(idx, model.condition_states([IdentityState.fresh(model.config)])).logits
        traced = model(idx, model.condition_states([state])).logits
    assert float((traced - fresh).abs().max()) > 1e-3


def test_deformation_is_bounded_by_the_metric_scale(hf_model: LlamaForCausalLM) -> None:
    """|logit change| <= 4 c rho for any trace, however large (unit vectors, |u - w|^2 <= 4)."""
    model = build(hf_model)
    c = model.config
    huge = replace(IdentityState.fresh(c), trace=(1e4 * torch.randn(c.trace_shape)).to(torch.float16))
    cond = model.condition_states([huge])
    lc = cond.layers[0]
    assert isinstance(lc, InjectedLayer) and lc.metric is not None
    eig = torch.linalg.eigvalsh(lc.metric.double())
    assert float(eig.abs().max()) <= c.metric_scale * c.metric_max_deform + 1e-6


def test_default_stored_identity_is_at_most_256_kib() -> None:
    config = LlamaConfig()  # SmolLM2-135M's shape and the default injection
    blob = state_to_bytes(IdentityState.fresh(config))
    assert config.trace_shape == (10, 3, 64, 64)
    assert len(blob) <= 256 * 1024
    assert len(blob) - config.state_bytes < 1024  # the container adds only a header and counters
    full = LlamaConfig(trace_layers=list(range(30)), state_dtype="float32")
    assert full.state_bytes > 1_400_000  # a float32 trace per layer and head: 1.4 MB


def test_config_checks() -> None:
    with pytest.raises(ValueError, match="multiple of n_kv_head"):
        LlamaConfig(n_head=9, n_kv_head=4)
    with pytest.raises(ValueError, match="trace_layers"):
        LlamaConfig(trace_layers=[0, 30])
    with pytest.raises(ValueError, match="state_dtype"):
        LlamaConfig(state_dtype="int8")
    with pytest.raises(ValueError, match="self_slots"):
        LlamaConfig(self_slots=0)
    with pytest.raises(ValueError, match="slot_rank"):
        LlamaConfig(d_self=64, slot_rank=64)  # not below the full rank: nothing to factor
    with pytest.raises(ValueError, match="slot_rank"):
        LlamaConfig(slot_rank=0)
    with pytest.raises(ValueError, match="weights_dtype"):
        LlamaConfig(weights_dtype="int8")
    with pytest.raises(ValueError, match="rope_scaling"):
        LlamaConfig.from_hf({**HF_TINY, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ValueError, match="lacks 'hidden_size'"):
        LlamaConfig.from_hf({k: v for k, v in HF_TINY.items() if k != "hidden_size"})


def test_load_base_refuses_wrong_shapes_and_missing_tensors(hf_model: LlamaForCausalLM) -> None:
    model = LlamaModel(LlamaConfig.from_hf(HF_TINY, d_self=8), ByteTokenizer())
    weights = dict(hf_model.state_dict())
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        model.load_base({k: v for k, v in weights.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match="has shape"):
        model.load_base({**weights, "model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match="not a LLaMA tensor name"):
        model.load_base({**weights, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)})


def test_untrained_identity_parameters_keep_the_slot_shut(hf_model: LlamaForCausalLM) -> None:
    """As shipped before training, the slot (zero values) takes no attention mass at all, whatever s is: only the
    trace changes replies. Opened, the same zero-valued slot dilutes attention and the logits move."""
    model = build(hf_model)  # init_identity's defaults: slot biases at the closed gate
    s_only = replace(IdentityState.fresh(model.config), self_state=torch.full((model.config.d_self,), 0.9))
    idx = torch.randint(0, 300, (1, 8), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        fresh = model(idx, model.condition_states([IdentityState.fresh(model.config)])).logits
        shut = model(idx, model.condition_states([s_only])).logits
        for attn in model.attentions:
            attn.slot_bias.zero_()
        opened = model(idx, model.condition_states([s_only])).logits
    assert torch.equal(shut, fresh)
    assert float((opened - fresh).abs().max()) > 1e-3


def test_low_rank_slot_maps_have_the_rank_and_size_asked_for(hf_model: LlamaForCausalLM) -> None:
    """slot_rank r factors each layer's maps from s (width d_s) to its slots' keys and values (width n): (d_s + n)·r
    weights instead of d_s·n, maps of rank r; untrained, the values are still zero (the read shut) and the keys
    have the full maps' scale."""
    full, low = build(hf_model, self_slots=3), build(hf_model, self_slots=3, slot_rank=4)
    attn = low.attentions[0]
    assert isinstance(attn.self_key, LowRank) and isinstance(attn.self_value, LowRank)
    n = 2 * 3 * 16  # key/value heads x slots x head width
    assert sum(p.numel() for p in attn.self_key.parameters()) == (8 + n) * 4
    s = torch.rand(50, 8, generator=torch.Generator().manual_seed(8)) * 2 - 1
    with torch.no_grad():
        keys, values = attn.self_key(s), attn.self_value(s)
        assert int(torch.linalg.matrix_rank(keys)) == 4 and bool((values == 0).all())
        ratio = float(keys.std() / full.attentions[0].self_key(s).std())
    assert 0.5 < ratio < 2.0, ratio


def test_factoring_the_slot_maps_keeps_their_best_low_rank_approximation(hf_model: LlamaForCausalLM) -> None:
    """factor_slots(r): each map becomes its truncated SVD (the error is exactly the dropped singular values); a
    map already of rank r comes through unchanged, and so do the logits it gives."""
    model = open_read(build(hf_model, self_slots=2))
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():  # layer 0's value map of rank 3, to be kept exactly
        value = model.attentions[0].self_value
        assert isinstance(value, torch.nn.Linear)
        value.weight.copy_(
            torch.randn(value.weight.shape[0], 3, generator=g) @ torch.randn(3, value.weight.shape[1], generator=g)
        )
    before = {name: w.clone() for name, w in model.identity_state_dict().items()}
    state = random_state(model.config, 4)
    idx = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(5))
    model.factor_slots(3)
    assert model.config.slot_rank == 3
    for layer, attn in enumerate(model.attentions):
        for name in ("self_key", "self_value"):
            m = getattr(attn, name)
            assert isinstance(m, LowRank)
            weight = before[f"blocks.{layer}.attn.{name}.weight"]
            dropped = torch.linalg.svdvals(weight)[3:].square().sum()
            error = (m.up.weight @ m.down.weight - weight).detach().square().sum()
            assert float(error) == pytest.approx(float(dropped), rel=1e-3, abs=1e-6), (layer, name)
    layer0 = model.attentions[0].self_value
    assert isinstance(layer0, LowRank)
    torch.testing.assert_close(
        (layer0.up.weight @ layer0.down.weight).detach(), before["blocks.0.attn.self_value.weight"], atol=1e-4, rtol=1e-4
    )
    with pytest.raises(ValueError, match="slot_rank"):
        model.factor_slots(8)  # not below d_s = 8
    full = open_read(build(hf_model, self_slots=2))
    with torch.no_grad():  # every map of rank 3: the factored model is the same model
        for attn, low in zip(full.attentions, model.attentions, strict=True):
            for name in ("self_key", "self_value"):
                m = getattr(low, name)
                getattr(attn, name).weight.copy_(m.up.weight @ m.down.weight)
        got = model(idx, model.condition_states([state])).logits
        want = full(idx, full.condition_states([state])).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_bfloat16_model_with_attention_pooling_decodes_and_pools_in_float32(hf_model: LlamaForCausalLM) -> None:
    """Weights cast to bfloat16 (a decoding benchmark's ``--dtype``): the pool scores in the weights' dtype, the
    pooled sums stay float32 and near the float32 model's."""
    model = open_read(build(hf_model, pooling="attention", memory_tokens=2))
    with torch.no_grad():
        assert model.pool is not None
        model.pool.weight.normal_()  # trained-like scores: some tokens count more than others
    state = model.condition_states([random_state(model.config, 4)])
    tokens = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        full = model(tokens, state)
        half = model.to(torch.bfloat16)(tokens, model.condition_states([random_state(model.config, 4)]))
    assert half.stats.hidden.dtype == torch.float32
    torch.testing.assert_close(half.stats.hidden, full.stats.hidden, atol=0.1, rtol=0.05)
    (gen,) = generate(
        model, [[3, 4, 5]], model.condition_states([random_state(model.config, 4)]), SamplingParams(max_new_tokens=3)
    )
    assert len(gen.tokens) == 3


def test_decode_in_bfloat16_answers_as_float32_and_keeps_the_write_float32(hf_model: LlamaForCausalLM) -> None:
    """decode_in(bfloat16): the turn gives the float32 model's greedy reply and shock, and writes a finite float32
    state; the self update stays float32; a dtype that is not floating point is refused. (The bundled model's
    recall and perplexity in bfloat16 are measured in docs/performance.md.)"""
    from sia.identity.state import Dynamics
    from sia.identity.turn import TurnRequest, TurnResult, run_turn

    def turn(model: LlamaModel) -> TurnResult:
        state = random_state(model.config, 5)
        request = TurnRequest(state=state, message="hello there", dynamics=Dynamics.from_config(model.config))
        return run_turn(model, request, SamplingParams(max_new_tokens=4, temperature=0.0))

    expected = turn(open_read(build(hf_model, pooling="attention", memory_tokens=2)))
    half = open_read(build(hf_model, pooling="attention", memory_tokens=2)).decode_in(torch.bfloat16)
    assert half.wte.weight.dtype == torch.bfloat16 and half.self_update.proj.weight.dtype == torch.float32
    got = turn(half)
    assert got.reply == expected.reply and abs(got.shock - expected.shock) < 1e-2
    assert got.state.self_state.dtype == torch.float32 and bool(torch.isfinite(got.state.self_state).all())
    assert not torch.equal(got.state.self_state, random_state(half.config, 5).self_state)  # the turn wrote
    with pytest.raises(ValueError, match="floating-point"):
        half.decode_in(torch.int8)


def test_row_starts_reads_left_padded_masks_and_refuses_any_other() -> None:
    """``row_starts``: the first own key column of each row of a ``padded_inputs`` mask (a row fed padding while it
    leaves starts at the end); None for a mask of another shape, so those rows attend through the mask."""
    from sia.backbones.injected_attention import row_starts
    from sia.model.generate import padded_inputs

    valid = torch.tensor([[1, 1, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1, 1]], dtype=torch.bool)
    _, mask = padded_inputs(valid, 3, prefix_len=2)
    assert row_starts(mask, prefix=2) == [4, 2, 3]
    _, decode = padded_inputs(torch.cat([valid, torch.tensor([[True], [False], [True]])], dim=1), 1, prefix_len=2)
    assert row_starts(decode, prefix=2) == [4, 8, 3]
    holed = mask.clone()
    holed[0, 0, :, 5] = False  # a hole in a row's own columns
    assert row_starts(holed, prefix=2) is None


def test_a_packed_model_answers_as_the_unpacked_one(hf_model: LlamaForCausalLM) -> None:
    """``pack_weights`` packs every backbone matrix (the tied head included; the query, key and value maps and the
    MLP's gate and up maps as their stacked products) and changes no reply: cached batched decoding gives the unpacked
    model's tokens and log-likelihoods; ``unpack_weights`` drops the copies."""
    from sia.backbones.packed_linear import Linear, Stacked, bfloat16_packing_available, packing_available

    if not packing_available():
        pytest.skip("this torch build has no oneDNN to pack weights with")
    model = open_read(build(hf_model, self_slots=2))
    states = [random_state(model.config, s) for s in (1, 2, 3, 4)]
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [15, 16, 17]]
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = generate(model, prompts, model.condition_states(states), params)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert model.pack_weights() == sum(m.weight.numel() * 4 for m in linears)  # every matrix once
    stacked = {id(part) for stack in model.stacks for part in stack.parts}
    assert len(model.stacks) == 2 * model.config.n_layer and len(stacked) == 5 * model.config.n_layer
    linears = [p.linear() if isinstance(p, Stacked) else p for p in model.products()]  # what the products multiply
    assert not stacked & {id(m) for m in linears} and len(linears) == len(model.products())
    assert all(m.packed is not None for m in linears) and model.lm_head.weight is model.wte.weight
    after = generate(model, prompts, model.condition_states(states), params)
    for a, b in zip(before, after, strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(a.prompt_nll, b.prompt_nll, atol=1e-5, rtol=0)
    model.unpack_weights()
    assert all(m.packed is None for m in linears) and not model.exact_rows
    if not bfloat16_packing_available():  # an AVX2-only CPU: refused before any matrix is packed
        with pytest.raises(ValueError, match="cannot pack bfloat16"):
            model.pack_weights(torch.bfloat16)
        assert all(m.packed is None for m in linears) and not model.exact_rows
        return
    # bfloat16: the projections in bfloat16 (half the bytes), the head in float32 for every row count, rows exact
    head = model.lm_head.weight.numel()
    assert model.pack_weights(torch.bfloat16) == sum(m.weight.numel() * 2 for m in linears) + head * 2
    assert model.exact_rows and model.lm_head.packed_dtype == torch.float32 and model.lm_head.min_rows == 1
    assert all(m.packed_dtype == torch.bfloat16 for m in linears if m is not model.lm_head)
    rounded = generate(model, prompts, model.condition_states(states), params)
    for a, b in zip(before, rounded, strict=True):  # bfloat16 products move a log-likelihood by rounding only
        torch.testing.assert_close(a.prompt_nll, b.prompt_nll, atol=0.05, rtol=0.05)
    model.unpack_weights()
    assert not model.exact_rows and all(m.packed is None for m in linears)


def test_the_read_shift_lowers_every_slot_logit_and_a_fresh_identity_still_reads_nothing(hf_model: LlamaForCausalLM) -> None:
    """``set_read_shift``: the slots' bias column moves by exactly the shift, replies move towards the base model's
    as it grows, a fresh identity is the base model at any shift, and a non-finite shift is refused."""
    model = open_read(build(hf_model, self_slots=2))
    state = random_state(model.config, 8)
    idx = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(9))
    model.set_read_shift(0.0)
    with torch.no_grad():
        plain = model.condition_states([state])
        base = model.base_view()
        expected = base(idx, base.condition_states([state])).logits
        distance = []
        for shift in (0.0, 2.0, 8.0):
            model.set_read_shift(shift)
            cond = model.condition_states([state])
            lc, lc0 = cond.layers[1], plain.layers[1]
            assert isinstance(lc, InjectedLayer) and isinstance(lc0, InjectedLayer)
            column = model.attentions[1].d  # the bias column of a layer without a trace
            torch.testing.assert_close(lc.slot_key[..., column], lc0.slot_key[..., column] - shift)
            distance.append(float((model(idx, cond).logits - expected).abs().max()))
        assert distance[0] > distance[1] > distance[2]
        model.set_read_shift(-3.0)  # stronger, and still nothing for a fresh identity
        fresh = [IdentityState.fresh(model.config)]
        torch.testing.assert_close(model(idx, model.condition_states(fresh)).logits, hf_model(idx).logits, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="finite"):
        model.set_read_shift(float("nan"))
    assert model.read_shift == -3.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_the_pretrained_models_formula_bit_for_bit(dtype: torch.dtype) -> None:
    """The fused float32 form and the written-out one (bfloat16) give exactly weight · x / sqrt(mean(x²) + eps) with
    the statistics in float32, as transformers' LLaMA computes it: for one row, many rows and large values."""
    torch.manual_seed(3)
    norm = RMSNorm(48, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    for shape, scale in (((1, 1, 48), 1.0), ((8, 5, 48), 1.0), ((3, 48), 300.0)):
        x = (torch.randn(shape) * scale).to(dtype)
        h = x.float()
        expected = norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
        assert torch.equal(norm(x), expected)


def test_rope_rotates_as_the_rotate_half_form_bit_for_bit(hf_model: LlamaForCausalLM) -> None:
    """``rotate`` with ``LlamaModel.rope``'s cos and signed sin computes RoPE's rotate-half form, x·cos + [-x₂, x₁]·sin,
    to the bit (the sign moved onto the sin is exact)."""
    from sia.backbones.injected_attention import rotate

    model = build(hf_model, self_slots=2)
    d = model.config.head_dim
    positions = torch.tensor([[0, 3, 17, 250]])
    angles = torch.cat([positions.float().unsqueeze(-1) * model.inv_freq] * 2, dim=-1).unsqueeze(1)  # (1, 1, 4, d)
    cos, signed = model.rope(positions)
    assert torch.equal(cos, angles.cos())
    assert torch.equal(signed, torch.cat([-angles.sin()[..., : d // 2], angles.sin()[..., d // 2 :]], dim=-1))
    x = torch.randn(1, 5, 4, d, generator=torch.Generator().manual_seed(0))
    expected = x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1) * angles.sin()
    assert torch.equal(rotate(x, cos, signed), expected)
