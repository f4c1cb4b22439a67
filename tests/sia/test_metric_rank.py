"""The metric carried as its largest eigenpairs (config.metric_rank): the factors against the metric, a cut that is
exact while the trace holds few turns, narrower trace layers, and the fast form against the reference at a cut."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from sia.backbones.injected_attention import InjectedLayer, injected_attention_reference
from sia.backbones.llama import LlamaModel
from sia.identity.state import IdentityState, metric_factors, stabilised_metric, trace_step
from sia.model.config import LlamaConfig, ModelConfig
from sia.model.generate import SamplingParams, generate
from sia.model.tokenizer import ByteTokenizer

from .conftest import hf_tiny

HF_TINY = hf_tiny(max_position_embeddings=256)
D = 16  # the tiny model's head width


@pytest.fixture(scope="module")
def hf_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(HFLlamaConfig(**HF_TINY)).eval()


def build(hf_model: LlamaForCausalLM, metric_rank: int | None) -> LlamaModel:
    config = LlamaConfig.from_hf(HF_TINY, d_self=8, trace_layers=[0, 2], metric_rank=metric_rank, metric_scale=4.0)
    model = LlamaModel(config, ByteTokenizer()).eval()
    model.load_base(hf_model.state_dict())
    model.init_identity(seed=1, slot_bias=0.0)
    return model


def turns_trace(config: LlamaConfig, turns: int, seed: int) -> torch.Tensor:
    """The trace ``turns`` updates leave (each adds a rank-1 K ⊗ Q per layer and head), stored as the config says."""
    g = torch.Generator().manual_seed(seed)
    n, H, d, _ = config.trace_shape
    trace = torch.zeros(1, n, H, d, d)
    for _ in range(turns):
        k, q = torch.randn(1, n, H, d, generator=g), torch.randn(1, n, H, d, generator=g)
        trace = trace_step(trace, k, q, torch.tensor([3.0]), alpha=0.3, decay=0.95)
    return trace[0].to(torch.float16)


def state_of(config: LlamaConfig, trace: torch.Tensor, seed: int) -> IdentityState:
    g = torch.Generator().manual_seed(seed)
    return IdentityState(trace=trace, self_state=torch.rand(config.d_self, generator=g) * 2 - 1, turns=3)


def test_all_eigenpairs_are_the_metric_and_a_cut_keeps_the_largest() -> None:
    config = LlamaConfig.from_hf(HF_TINY, d_self=8, trace_layers=[0, 2])
    trace = torch.randn(config.trace_shape, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    basis, values = metric_factors(trace, config)
    assert basis.shape == config.trace_shape and values.shape == config.trace_shape[:-1]
    whole = (basis * values.unsqueeze(-2)) @ basis.transpose(-1, -2)
    torch.testing.assert_close(whole, stabilised_metric(trace, config), atol=1e-6, rtol=0)
    torch.testing.assert_close(basis.transpose(-1, -2) @ basis, torch.eye(D).expand_as(basis), atol=1e-6, rtol=0)
    bound = config.metric_base * config.metric_max_deform
    assert float(values.abs().max()) < bound
    cut_basis, cut = metric_factors(trace, config, 5)
    assert cut_basis.shape == (*config.trace_shape[:-1], 5) and cut.shape == (*config.trace_shape[:-2], 5)
    largest = values.abs().sort(dim=-1, descending=True).values
    torch.testing.assert_close(cut.abs().sort(dim=-1, descending=True).values, largest[..., :5])
    # what the cut leaves out moves a logit -(u - w)^T M (u - w) of unit u, w by at most 4 times its largest magnitude
    left = whole - (cut_basis * cut.unsqueeze(-2)) @ cut_basis.transpose(-1, -2)
    g = torch.Generator().manual_seed(1)
    u = torch.nn.functional.normalize(torch.randn(200, *config.trace_shape[:-1], generator=g), dim=-1)
    w = torch.nn.functional.normalize(torch.randn(200, *config.trace_shape[:-1], generator=g), dim=-1)
    moved = ((u - w).unsqueeze(-2) @ left @ (u - w).unsqueeze(-1)).abs()
    assert float(moved.max()) <= 4 * float(largest[..., 5].max()) + 1e-6
    assert float(moved.max()) > 0


def test_a_trace_of_few_turns_is_whole_in_twice_as_many_eigenpairs() -> None:
    """Each turn adds a rank-1 term to T, two to its symmetric part: three turns need at most 6 pairs, and a cut to 6
    gives the metric the whole decomposition does."""
    config = LlamaConfig.from_hf(HF_TINY, d_self=8, trace_layers=[0, 2])
    trace = turns_trace(config, 3, 0)
    basis, values = metric_factors(trace, config, 6)
    whole = stabilised_metric(trace, config)
    cut = (basis * values.unsqueeze(-2)) @ basis.transpose(-1, -2)
    assert float(whole.abs().max()) > 0.05
    torch.testing.assert_close(cut, whole, atol=2e-3 * float(whole.abs().max()), rtol=0)  # float16 storage's rounding


@pytest.mark.parametrize("rank", [0, D + 1, True, 2.5, "4"])
def test_a_metric_rank_outside_one_to_the_head_width_is_refused(rank: object) -> None:
    with pytest.raises(ValueError, match="metric_rank"):
        LlamaConfig.from_hf(HF_TINY, metric_rank=rank)
    with pytest.raises(ValueError, match="rank must be in"):
        metric_factors(torch.zeros(1, 2, D, D), LlamaConfig.from_hf(HF_TINY), 0)


def test_the_native_metric_is_not_cut() -> None:
    with pytest.raises(ValueError, match="offset"):
        metric_factors(torch.zeros(1, 2, 8, 8), ModelConfig(), 2)


def test_trace_layers_narrow_to_the_rank(hf_model: LlamaForCausalLM) -> None:
    whole, cut = build(hf_model, None), build(hf_model, 3)
    for layer, (a, b) in enumerate(zip(whole.attentions, cut.attentions, strict=True)):
        if layer in (0, 2):
            assert (a.w, b.w) == (40, 24)  # 16 + 16 + 3 columns and 16 + 3 + 3, each to a multiple of 8
        else:
            assert a.w == b.w == 24


def test_few_turns_read_the_same_through_a_cut(hf_model: LlamaForCausalLM) -> None:
    """Two turns' trace has at most 4 eigenpairs per layer and head: a model carrying 4 reads what one carrying all 16
    reads, in the training form and in inference's, and decodes the same tokens, alone and batched."""
    whole, cut = build(hf_model, None), build(hf_model, 4)
    cut.load_state_dict(whole.state_dict())
    states = [state_of(whole.config, turns_trace(whole.config, 2, seed), seed) for seed in (0, 1)]
    idx = torch.randint(0, 300, (2, 14), generator=torch.Generator().manual_seed(2))
    fresh = [IdentityState.fresh(whole.config)] * 2
    with torch.no_grad():
        base = whole(idx, whole.condition_states(fresh)).logits
        expected = whole(idx, whole.condition_states(states)).logits
        got = cut(idx, cut.condition_states(states)).logits
    with torch.enable_grad():
        trained = cut(idx, cut.condition_states(states)).logits.detach()
    assert float((expected - base).abs().max()) > 1e-2  # the trace moves the logits
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=0)
    torch.testing.assert_close(trained, expected, atol=2e-4, rtol=0)
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42]]
    batched = generate(cut, prompts, cut.condition_states(states), params)
    for prompt, state, row in zip(prompts, states, batched, strict=True):
        assert generate(cut, [prompt], cut.condition_states([state]), params)[0].tokens == row.tokens
        assert generate(whole, [prompt], whole.condition_states([state]), params)[0].tokens == row.tokens


def test_the_fast_form_at_a_cut_equals_the_reference_of_the_cut_metric(hf_model: LlamaForCausalLM) -> None:
    """A trace of many turns cut to 3 pairs: each layer's attention is the written-out one under M's 3 largest
    eigenpairs (``InjectedLayer.metric``), and that metric differs from the whole one by what was left out."""
    model = build(hf_model, 3)
    state = state_of(model.config, turns_trace(model.config, 12, 3), 3)
    cond = model.condition_states([state])
    x = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(2))
    positions = torch.arange(9).unsqueeze(0)
    with torch.no_grad():
        for layer in (0, 1, 2):
            attn, lc = model.attentions[layer], cond.layers[layer]
            assert isinstance(lc, InjectedLayer) and (lc.metric is None) == (layer == 1)
            fast = attn(x, lc, model.rope(positions), None, layer, None)
            slow = injected_attention_reference(attn, x, lc, state.self_state.unsqueeze(0), positions, model.config.rope_theta)
            torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    lc = cond.layers[0]
    assert isinstance(lc, InjectedLayer) and lc.metric is not None and lc.basis is not None
    assert lc.basis.shape == (1, 2, D, 3)
    whole = stabilised_metric(state.trace, model.config)[0]  # (H_kv, d, d)
    assert float((lc.metric[0] - whole).abs().max()) > 1e-4
