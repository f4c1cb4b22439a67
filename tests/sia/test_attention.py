from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from sia.model import attention
from sia.model.attention import attend, augment_keys, augment_queries, trace_tensor_attention, trace_tensor_attention_reference

SHAPES = [(5, 5), (3, 9), (1, 7), (8, 8)]


def _inputs(B: int, H: int, Lq: int, Lk: int, d: int, d_v: int, dtype: torch.dtype, per_row: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, d, generator=g, dtype=dtype)
    k = torch.randn(B, H, Lk, d, generator=g, dtype=dtype)
    v = torch.randn(B, H, Lk, d_v, generator=g, dtype=dtype)
    shape = (B, H, d, d) if per_row else (H, d, d)
    # non-symmetric and indefinite: a random Gaussian matrix has eigenvalues of both signs
    trace = 0.3 * torch.randn(*shape, generator=g, dtype=dtype)
    return q, k, v, trace


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Lq,Lk", SHAPES)
@pytest.mark.parametrize("d_v", [6, 7, 4, 11])
@pytest.mark.parametrize("per_row", [False, True])
def test_fast_equals_reference_float64(causal: bool, Lq: int, Lk: int, d_v: int, per_row: bool) -> None:
    q, k, v, trace = _inputs(2, 3, Lq, Lk, 6, d_v, torch.float64, per_row)
    sym = trace + trace.transpose(-1, -2)
    assert not torch.allclose(trace, trace.transpose(-1, -2))
    eig = torch.linalg.eigvalsh(sym)
    assert (eig < 0).any() and (eig > 0).any(), "the trace must be indefinite for this test to mean anything"
    fast = trace_tensor_attention(q, k, v, trace, causal=causal)
    ref = trace_tensor_attention_reference(q, k, v, trace, causal=causal)
    torch.testing.assert_close(fast, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("per_row", [False, True])
def test_fast_equals_reference_float32(causal: bool, per_row: bool) -> None:
    q, k, v, trace = _inputs(2, 4, 16, 24, 16, 16, torch.float32, per_row, seed=1)
    fast = trace_tensor_attention(q, k, v, trace, causal=causal)
    ref = trace_tensor_attention_reference(q.double(), k.double(), v.double(), trace.double(), causal=causal)
    torch.testing.assert_close(fast.double(), ref, rtol=1e-4, atol=1e-5)


def test_causal_alignment_is_bottom_right() -> None:
    """With Lq < Lk the last query sees every key and the first sees Lk - Lq + 1 of them."""
    q, k, v, trace = _inputs(1, 1, 2, 5, 4, 4, torch.float64, False)
    out = trace_tensor_attention(q, k, v, trace, causal=True)
    last = trace_tensor_attention(q[:, :, -1:], k, v, trace, causal=False)
    first = trace_tensor_attention(q[:, :, :1], k[:, :, :4], v[:, :, :4], trace, causal=False)
    torch.testing.assert_close(out[:, :, -1:], last, atol=1e-12, rtol=0)
    torch.testing.assert_close(out[:, :, :1], first, atol=1e-12, rtol=0)


def test_only_the_symmetric_part_matters() -> None:
    q, k, v, trace = _inputs(2, 2, 6, 6, 5, 5, torch.float64, True)
    antisym = torch.randn_like(trace)
    antisym = antisym - antisym.transpose(-1, -2)
    sym_part = 0.5 * (trace + trace.transpose(-1, -2))
    for fn in (trace_tensor_attention, trace_tensor_attention_reference):
        a = fn(q, k, v, trace, causal=True)
        torch.testing.assert_close(a, fn(q, k, v, sym_part, causal=True), atol=1e-12, rtol=0)
        torch.testing.assert_close(a, fn(q, k, v, trace + 3.0 * antisym, causal=True), atol=1e-11, rtol=0)
    # and the trace does matter: a different symmetric part changes the output
    other = trace_tensor_attention(q, k, v, sym_part + 0.5 * torch.eye(5, dtype=torch.float64), causal=True)
    assert (other - trace_tensor_attention(q, k, v, trace, causal=True)).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_v", [5, 6])
def test_gradients_flow_through_fast_form(causal: bool, d_v: int) -> None:
    q, k, v, trace = _inputs(2, 2, 4, 6, 5, d_v, torch.float64, True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, trace)]
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v, trace)]
    weight = torch.randn(2, 2, 4, d_v, dtype=torch.float64)
    (trace_tensor_attention(*leaves, causal=causal) * weight).sum().backward()
    (trace_tensor_attention_reference(*ref_leaves, causal=causal) * weight).sum().backward()
    for a, b in zip(leaves, ref_leaves, strict=True):
        assert a.grad is not None and b.grad is not None
        assert a.grad.abs().max() > 0
        torch.testing.assert_close(a.grad, b.grad, atol=1e-9, rtol=0)


def test_runs_at_16k_without_pairwise_tensor() -> None:
    """At L = 16384, d = 32 the reference's (L, L, d) float32 tensor would take 34 GB; the fast form must not."""
    L, d = 16384, 32
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, L, d, generator=g) for _ in range(3))
    trace = 0.1 * torch.randn(1, d, d, generator=g)
    for causal in (False, True):
        out = trace_tensor_attention(q, k, v, trace, causal=causal)
        assert out.shape == (1, 1, L, d) and bool(torch.isfinite(out).all())
        # spot-check the last rows against the oracle on a slice (bottom-right causal alignment)
        rows = slice(L - 3, L)
        ref = trace_tensor_attention_reference(q[:, :, rows].double(), k.double(), v.double(), trace.double(), causal=causal)
        torch.testing.assert_close(out[:, :, rows].double(), ref, rtol=1e-4, atol=1e-4)


def _kernels(fn) -> set[str]:  # type: ignore[no-untyped-def]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}


@pytest.mark.parametrize("causal", [False, True])
def test_fast_form_runs_the_fused_kernel(causal: bool) -> None:
    q, k, v, trace = _inputs(1, 2, 64, 64, 31, 32, torch.float32, False)
    kernels = _kernels(lambda: trace_tensor_attention(q, k, v, trace, causal=causal))
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels
    assert "aten::_scaled_dot_product_attention_math" not in kernels
    q, k, v, trace = _inputs(1, 2, 64, 64, 32, 32, torch.float32, False)
    kernels = _kernels(lambda: trace_tensor_attention(q, k, v, trace, causal=causal))
    assert "aten::_scaled_dot_product_attention_math" not in kernels


def test_augmented_dot_product_is_the_score_up_to_a_row_constant() -> None:
    q, k, _, trace = _inputs(1, 1, 4, 6, 3, 3, torch.float64, False)
    sym = trace + trace.transpose(-1, -2)
    logits = augment_queries(q, sym) @ augment_keys(k, trace).transpose(-1, -2)  # (1, 1, 4, 6)
    diff = q.unsqueeze(3) - k.unsqueeze(2)
    scores = -torch.einsum("bhijd,hde,bhije->bhij", diff, trace, diff)
    row_constant = scores - logits
    torch.testing.assert_close(row_constant, row_constant[..., :1].expand_as(row_constant), atol=1e-12, rtol=0)


def test_uniform_self_bias_is_a_no_op_but_the_self_slot_is_not() -> None:
    """docs/attention.md §5: b(s) = u·s is the same for every key, so softmax ignores it; a self slot does not."""
    B, H, L, d, d_s = 2, 2, 6, 5, 3
    q, k, v, trace = _inputs(B, H, L, L, d, d, torch.float64, True)
    g = torch.Generator().manual_seed(7)
    s = torch.randn(B, d_s, generator=g, dtype=torch.float64)
    u = torch.randn(d_s, generator=g, dtype=torch.float64)
    diff = q.unsqueeze(3) - k.unsqueeze(2)
    scores = -torch.einsum("bhijd,bhde,bhije->bhij", diff, trace, diff)  # (B, H, L, L)
    biased = scores + (s @ u).view(B, 1, 1, 1)  # the seed's b(s_t) = u^T s_t
    p, p_biased = F.log_softmax(scores, -1), F.log_softmax(biased, -1)
    kl_uniform = (p.exp() * (p - p_biased)).sum(-1).max()
    assert kl_uniform < 1e-9

    # the self slot: one extra key/value pair made from s, scored through the same metric
    w_k = torch.randn(H, d_s, d, generator=g, dtype=torch.float64)
    slot_k = torch.einsum("bs,hsd->bhd", s, w_k).unsqueeze(2)  # (B, H, 1, d)
    diff_slot = q - slot_k  # (B, H, L, d)
    slot_score = -torch.einsum("bhid,bhde,bhie->bhi", diff_slot, trace, diff_slot).unsqueeze(-1)
    p_slot = F.log_softmax(torch.cat([slot_score, scores], dim=-1), -1)[..., 1:]  # token keys only
    kl_slot = (p.exp() * (p - p_slot)).sum(-1).mean()
    assert kl_slot > 1e-3
    # and the fast path computes the same slot attention
    v_slot = torch.randn(B, H, 1, d, generator=g, dtype=torch.float64)
    ref = trace_tensor_attention_reference(q, torch.cat([slot_k, k], 2), torch.cat([v_slot, v], 2), trace)
    fast = trace_tensor_attention(q, torch.cat([slot_k, k], 2), torch.cat([v_slot, v], 2), trace)
    torch.testing.assert_close(fast, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("folds", [True, False])
@pytest.mark.parametrize("mask", [None, "rows", "heads"])
def test_a_decoding_step_folds_query_heads_where_this_cpu_is_faster_so_into_the_same_grouped_attention(
    mask: str | None, folds: bool, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One query per head (a decoding step): where ``folds_query_heads`` says so for the dtype, ``attend`` groups each
    key/value head's query heads as its queries instead of calling the kernel with ``enable_gqa``; either way the result
    is grouped-query attention computed in float64 from the same inputs, to the dtype's rounding, with a mask per row
    or per query head."""
    assert isinstance(attention.folds_query_heads(dtype), bool)  # timed once, on this CPU
    monkeypatch.setattr(attention, "folds_query_heads", lambda _dtype: folds)
    g = torch.Generator().manual_seed(3)
    B, H, H_kv, Lk, w = 3, 6, 2, 9, 8
    q, k, v = (torch.randn(B, h, n, w, generator=g).to(dtype) for h, n in ((H, 1), (H_kv, Lk), (H_kv, Lk)))
    visible = torch.rand(B, H if mask == "heads" else 1, 1, Lk, generator=g) > 0.3
    visible[..., 0] = True
    attn_mask = None if mask is None else visible
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = attend(q, k, v, causal=True, attn_mask=attn_mask, enable_gqa=True)
    assert out.shape == (B, H, 1, w) and out.dtype == dtype
    kernel = [e.input_shapes[0] for e in prof.events() if e.name == "aten::scaled_dot_product_attention"]
    # folded, the kernel saw each key/value head's query heads as its queries
    assert kernel == [[B, H_kv, H // H_kv, w] if folds else [B, H, 1, w]]
    group = H // H_kv
    wide_k, wide_v = (x.double().repeat_interleave(group, dim=1) for x in (k, v))  # every query head its own keys
    ref = F.scaled_dot_product_attention(q.double(), wide_k, wide_v, attn_mask=attn_mask, scale=1.0)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    if mask is not None:  # the mask mattered
        assert (F.scaled_dot_product_attention(q.double(), wide_k, wide_v, scale=1.0) - ref).abs().max() > 0.1


def test_attend_rejects_more_queries_than_keys() -> None:
    x = torch.randn(1, 1, 4, 3)
    with pytest.raises(ValueError, match="Lq <= Lk"):
        attend(x, x[:, :, :2], x[:, :, :2], causal=True)


@pytest.mark.parametrize(
    "trace_shape,message",
    [((3, 4, 4), "trace must be"), ((2, 2, 4, 5), "trace must be")],
)
def test_bad_shapes_raise(trace_shape: tuple[int, ...], message: str) -> None:
    q = torch.randn(2, 2, 3, 4)
    with pytest.raises(ValueError, match=message):
        trace_tensor_attention(q, q, q, torch.zeros(trace_shape))
    with pytest.raises(ValueError, match="4-D"):
        trace_tensor_attention(q[0], q[0], q[0], torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match="k must be"):
        trace_tensor_attention(q, q[..., :3], q, torch.zeros(2, 4, 4))
