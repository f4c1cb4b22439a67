"""Trace Tensor Attention: attention scores as distances in a learned-by-experience metric.

Notation: B batch, H heads, Lq query length, Lk key length, d query/key width, d_v value width,
T a trace (metric) of shape (d, d), S = T + T^T its doubled symmetric part.

    score_ij = -(q_i - k_j)^T T (q_i - k_j)
             = -q_i^T T q_i + (S q_i)^T k_j - k_j^T T k_j

The first term is constant along a softmax row and drops out, so TTA is ordinary dot-product attention
(scale 1) over the augmented vectors q~_i = [S q_i, 1] and k~_j = [k_j, -k_j^T T k_j]. The derivation, and
why this is exact, is in docs/attention.md. The reference below is the seed formula and is only a test oracle.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "attend",
    "augment_keys",
    "augment_queries",
    "folds_query_heads",
    "key_bias",
    "trace_tensor_attention",
    "trace_tensor_attention_reference",
]


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, trace: Tensor) -> Tensor:
    """Validate shapes and return the trace broadcastable against (B, H, d, d)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, L, d); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, _, d = q.shape
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != d:
        raise ValueError(f"k must be (B={B}, H={H}, Lk, d={d}); got {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be (B, H, Lk, d_v) matching k {tuple(k.shape)}; got {tuple(v.shape)}")
    if trace.shape == (H, d, d):
        return trace.unsqueeze(0)  # (1, H, d, d)
    if trace.shape == (B, H, d, d):
        return trace
    raise ValueError(f"trace must be (H={H}, d={d}, d) or (B={B}, H, d, d); got {tuple(trace.shape)}")


def trace_tensor_attention_reference(q: Tensor, k: Tensor, v: Tensor, trace: Tensor, *, causal: bool = False) -> Tensor:
    """The seed formula, verbatim: O(B·H·Lq·Lk·d) memory. Test oracle only.

    With ``causal=True`` query i sits at position Lk - Lq + i (bottom-right alignment), as when decoding
    against a cache.
    """
    trace = _check_inputs(q, k, v, trace)
    Lq, Lk = q.shape[2], k.shape[2]
    diff = q.unsqueeze(3) - k.unsqueeze(2)  # (B, H, Lq, Lk, d)
    scores = torch.einsum("bhijd,bhde,bhije->bhij", diff, trace.expand(q.shape[0], -1, -1, -1), diff)
    if causal:
        visible = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(diagonal=Lk - Lq)
        scores = scores.masked_fill(~visible, float("inf"))
    weights = torch.softmax(-scores, dim=-1)  # (B, H, Lq, Lk)
    return torch.einsum("bhij,bhjk->bhik", weights, v)


def key_bias(k: Tensor, trace: Tensor) -> Tensor:
    """-k_j^T T k_j for every key: (B, H, Lk, d) x (B|1, H, d, d) -> (B, H, Lk, 1)."""
    return -((k @ trace) * k).sum(dim=-1, keepdim=True)


def augment_queries(q: Tensor, sym: Tensor, width: int | None = None) -> Tensor:
    """q~ = [S q, 1, 0...]: (B, H, L, d) -> (B, H, L, width) with width >= d + 1 (default d + 1).

    ``sym`` is S = T + T^T, (B|1, H, d, d). Since S is symmetric, (S q_i)^T = q_i^T S, one batched matmul.
    """
    d = q.shape[-1]
    width = d + 1 if width is None else width
    out = q.new_zeros(*q.shape[:-1], width)
    out[..., :d] = q @ sym  # (B, H, L, d)
    out[..., d] = 1.0
    return out


def augment_keys(k: Tensor, trace: Tensor, width: int | None = None) -> Tensor:
    """k~ = [k, -k^T T k, 0...]: (B, H, L, d) -> (B, H, L, width) with width >= d + 1 (default d + 1)."""
    d = k.shape[-1]
    width = d + 1 if width is None else width
    out = k.new_zeros(*k.shape[:-1], width)
    out[..., :d] = k
    out[..., d : d + 1] = key_bias(k, trace)
    return out


def attend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, attn_mask: Tensor | None = None, enable_gqa: bool = False) -> Tensor:
    """Dot-product attention with scale 1 on already-augmented vectors, bottom-right causal alignment.

    q (B, H, Lq, w), k and v (B, H_kv, Lk, w) with one common width w, so the fused (flash) CPU kernel runs;
    H_kv = H unless ``enable_gqa`` (then H_kv divides H and each key/value head serves H / H_kv query heads).
    ``attn_mask`` is an optional boolean (B|1, 1|H, Lq, Lk) mask of visible keys (e.g. left padding); it
    already has to encode causality if given together with ``causal``.
    """
    Lq, Lk = q.shape[2], k.shape[2]
    if enable_gqa and Lq == 1 and q.device.type == "cpu" and folds_query_heads(q.dtype):
        return _folded(q, k, v, attn_mask)
    if attn_mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=1.0, enable_gqa=enable_gqa)
    if not causal or Lq == 1:
        # A single causal query is the newest position: it sees every key.
        return F.scaled_dot_product_attention(q, k, v, scale=1.0, enable_gqa=enable_gqa)
    if Lq == Lk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0, enable_gqa=enable_gqa)
    if Lq > Lk:
        raise ValueError(f"causal attention needs Lq <= Lk; got Lq={Lq}, Lk={Lk}")
    # SDPA's is_causal aligns top-left. Prepending Lk - Lq throw-away query rows makes the problem square,
    # so the block-skipping causal kernel still runs; rows are independent, so the result is exact.
    pad = q.new_zeros(*q.shape[:2], Lk - Lq, q.shape[3])
    out = F.scaled_dot_product_attention(torch.cat([pad, q], dim=2), k, v, is_causal=True, scale=1.0, enable_gqa=enable_gqa)
    return out[:, :, Lk - Lq :]


@functools.cache
def folds_query_heads(dtype: torch.dtype) -> bool:
    """Whether a CPU runs a decoding step's grouped attention in ``dtype`` faster with each key/value head's query heads
    folded into its queries (``_folded``) than with ``enable_gqa``. In bfloat16 (and float16) always: measured 2-6x
    faster so on a 2-core AMD EPYC, and alike on a 2-core Xeon with AMX. In float32 CPUs differ (the AMD EPYC 1.3x
    slower folded, the Xeon 2-3x faster), so it is timed once a process, best of three, at a decoding step's shapes:
    eight rows, 9 query heads on 3 key/value heads, the stateless model's keys 64 wide and a full state's 72 and 136
    wide (experiments/LOG.md, 2026-12-01 (f), 2026-12-04 (s))."""
    if dtype != torch.float32:
        return True
    shapes = [(torch.randn(8, 9, 1, w), torch.randn(8, 3, n, w)) for w, n in ((64, 110), (72, 176), (136, 176))]
    best = {True: float("inf"), False: float("inf")}
    for _ in range(3):
        for folded in (True, False):
            start = time.perf_counter()
            for q, k in shapes:
                _folded(q, k, k, None) if folded else F.scaled_dot_product_attention(q, k, k, scale=1.0, enable_gqa=True)
            best[folded] = min(best[folded], time.perf_counter() - start)
    return best[True] < best[False]


def _folded(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> Tensor:
    """One query per head, H heads sharing H_kv key/value heads: each key/value head's H / H_kv query heads taken as
    that head's queries, so the kernel runs without ``enable_gqa``: the same attention, in fewer, larger blocks
    (``folds_query_heads`` says whether that is faster on this CPU)."""
    B, H, _, w = q.shape
    H_kv = k.shape[1]
    if attn_mask is not None and attn_mask.shape[1] != 1:  # a mask per query head: grouped as the queries are
        attn_mask = attn_mask.reshape(attn_mask.shape[0], H_kv, H // H_kv, attn_mask.shape[-1])
    y = F.scaled_dot_product_attention(q.reshape(B, H_kv, H // H_kv, w), k, v, attn_mask=attn_mask, scale=1.0)
    return y.view(B, H, 1, v.shape[-1])


def trace_tensor_attention(q: Tensor, k: Tensor, v: Tensor, trace: Tensor, *, causal: bool = False) -> Tensor:
    """Trace Tensor Attention by exact reduction to scaled_dot_product_attention.

    q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, d_v), trace (H, d, d) shared by the batch or
    (B, H, d, d) one per row. Returns (B, H, Lq, d_v). Nothing of size B·H·Lq·Lk·d is allocated.

    Where the key bias can ride along as an additive (B, H, 1, Lk) mask (no causal mask needed and
    d_v == d) the vectors keep their width; otherwise they are augmented by one column and zero-padded
    to a common width so that the fused kernel runs (see docs/attention.md, "Choosing the kernel").
    """
    trace = _check_inputs(q, k, v, trace)
    d, d_v = q.shape[-1], v.shape[-1]
    Lq = q.shape[2]
    sym = trace + trace.transpose(-1, -2)  # (B|1, H, d, d)
    if (not causal or Lq == 1) and d_v == d:
        bias = key_bias(k, trace).transpose(-1, -2)  # (B, H, 1, Lk)
        return F.scaled_dot_product_attention(q @ sym, k, v, attn_mask=bias, scale=1.0)
    width = max(d + 1, d_v)
    q_aug = augment_queries(q, sym, width)  # (B, H, Lq, w)
    k_aug = augment_keys(k, trace, width)  # (B, H, Lk, w)
    v_pad = v if d_v == width else F.pad(v, (0, width - d_v))  # (B, H, Lk, w)
    return attend(q_aug, k_aug, v_pad, causal=causal)[..., :d_v]
