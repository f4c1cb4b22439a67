"""A LLaMA-family causal LM with Trace Tensor Attention and the self slot injected into every layer's attention.

Notation: B batch, L tokens in this call, C residual width, H query heads, H_kv key/value heads, G = H / H_kv,
d head width, w a layer's kernel width, d_s self-state width, I SwiGLU width, R_i the rotation of position i.

The pretrained logits stay; the identity adds to them (docs/attention.md, "Injecting into a pretrained model"):

    e_ij = (R_i q_i)·(R_j k_j) / sqrt(d)            the base model, RoPE as it was trained
           - (u_i - w_j)^T M (u_i - w_j)            trace layers only: u, w unit *pre-rotation* query and key
    e_is = (R_i q_i)·k_s / sqrt(d) - u_i^T M u_i + log(|s|^2/d_s) + b (+ g_h·x_i)
                                                    the self slots: k_s = W_ks s at positions 0..S-1, at the metric's origin;
                                                    g_h·x_i the per-token read gate (config.slot_gate), x_i the layer's input

M is the injected metric of the stored trace (sia.identity.state.stabilised_metric with offset 0, so M = 0 for a zero
trace). Expanding the square drops the row constant u_i^T M u_i, so each layer is one fused kernel call over

    q~_i = [R_i q_i / sqrt(d), 2 M u_i, 1, g·x_i]      k~_j = [R_j k_j, w_j, -w_j^T M w_j, 0]      k~_s = [k_s, 0, gate(s), 1]

(the middle block only in trace layers, the last column only with the read gate; zero-padded to a multiple of 8).
A fresh identity has M = 0 and the slot's gate at -1e4, whose softmax weight is exactly 0: the logits are the base
model's, whatever the read gate adds.
"""

from __future__ import annotations

import copy
import functools
import math
import re
import time
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sia.identity.state import SelfUpdate, TurnSummary, stabilised_metric
from sia.model.attention import attend
from sia.model.conditioning import Conditioning
from sia.model.config import LlamaConfig
from sia.model.identity_model import IdentityModel, ModelOutput
from sia.model.kv_cache import KVCache
from sia.model.summary_sums import TurnStats
from sia.model.tokenizer import Tokenizer

__all__ = ["IDENTITY_PARAMETERS", "InjectedLayer", "LlamaModel", "hf_name", "injected_attention_reference"]

CLOSED_GATE = -1e4  # the slot's logit for a zero self state: exp(-1e4 - max) is exactly 0 in float32 and bfloat16
# Untrained, the slot is shut: its value is zero, and any mass it took would dilute the base model's attention. A
# finite bias cannot shut it everywhere (some heads' logits all lie far below zero, e.g. -15, where a slot at -12
# still wins), so it starts at the closed gate; training starts it open (e.g. at 0) to give the read a gradient.
UNTRAINED_SLOT_BIAS = CLOSED_GATE
IDENTITY_PARAMETERS = ("self_key", "self_value", "slot_bias", "slot_gate", "self_update", "pool", "memory")  # names SIA adds


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


@dataclass
class InjectedLayer:
    """One layer's share of a turn's conditioning, per batch row."""

    metric: Tensor | None  # (B, H_kv, d, d) M per key/value head; None in a layer without a trace
    slot_key: Tensor  # (B, H_kv, S, w) augmented self-slot keys, S = config.self_slots
    slot_value: Tensor  # (B, H_kv, S, w)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE in the rotate-half layout: x (B, heads, L, d), cos/sin (B, 1, L, d)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


SMALL_PRODUCT_ROWS = 32  # up to this many rows (decoding: one per batch row), a float32 CPU product runs as W·xᵀ
PACKED_MIN_ROWS = 3  # from this many rows on, a float32 CPU product uses the packed copy of its weight, if it has one
PACKED_DTYPES = (torch.float32, torch.bfloat16)  # what a packed copy may hold


def packing_available() -> bool:
    """Whether this torch build can pack weights for oneDNN's matrix products (x86 CPU builds can)."""
    ops = torch.ops.mkldnn
    built = bool(torch._C._has_mkldnn)  # what torch.backends.mkldnn.is_available() reads
    return built and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


NO_BFLOAT16_PACKING = (
    "this CPU cannot pack bfloat16 weights (oneDNN's bfloat16 products need AVX-512 BW, VL and DQ, or AVX-NE-CONVERT)"
)


@functools.cache
def bfloat16_packing_available() -> bool:
    """Whether oneDNN can pack bfloat16 weights on this CPU (tried once on a small matrix): its bfloat16 path needs
    AVX-512 BW, VL and DQ or AVX-NE-CONVERT, which AVX2-only CPUs lack."""
    if not packing_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), None)
    except RuntimeError:
        return False
    return True


@functools.cache
def bfloat16_products_fast() -> bool:
    """Whether this CPU multiplies bfloat16 matrices no slower than float32 ones (timed once): it does with native
    bfloat16 instructions (AVX-512 BF16, AMX); without them bfloat16 is emulated, measured 86x slower."""
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(128, 576, dtype=dtype), torch.randn(576, 576, dtype=dtype)
        a @ b
        start = time.perf_counter()
        for _ in range(5):
            a @ b
        times[dtype] = time.perf_counter() - start
    return times[torch.bfloat16] <= 1.2 * times[torch.float32]


class Linear(nn.Linear):
    """``nn.Linear`` (no bias) with two faster paths for float32 inference on a CPU (no gradients):

    * at most SMALL_PRODUCT_ROWS rows compute (W xᵀ)ᵀ instead of x Wᵀ, one row doubled to two: the BLAS kernels for
      a few rows are far slower in the x Wᵀ orientation, and slowest of all for one row (every matrix of one
      SmolLM2 decode step on the 2-core machine: 52 ms for one row, 22 ms this way; docs/performance.md);
    * after ``pack()``, from PACKED_MIN_ROWS rows on (batched decoding, prefill), oneDNN's product with a copy of W
      in its own blocked layout: eight rows 1.6x and sixteen 1.8x faster again, and a row's result does not depend
      on how many rows are multiplied with it. The copy costs W's size in memory, so packing is asked for, not
      automatic; it is used only while W is the tensor it was made from (an in-place change of W retires it);
    * after ``pack(torch.bfloat16)``, every product (any number of rows) with a bfloat16 copy of W in that layout,
      x rounded to bfloat16 on the way in and the result returned in float32, as under bfloat16 autocast: half the
      bytes to read, so decoding, which is bound by reading the weights, runs faster on CPUs with bfloat16
      instructions, and a row's result still does not depend on its mates (the same kernel for one row or many).

    Anything else (a GPU, bfloat16, gradients) is ``nn.Linear`` as it is."""

    packed: Tensor | None = None
    packed_dtype: torch.dtype = torch.float32  # the copy's: float32, or bfloat16 (every product then uses it)
    min_rows = PACKED_MIN_ROWS  # products of this many rows or more use the copy
    _packed_from: tuple[int, int] = (0, -1)  # W's storage and version when packed

    def pack(self, dtype: torch.dtype = torch.float32, *, every_row: bool = False) -> int:
        """Keep a packed copy of the weight in ``dtype``: float32 (for products of PACKED_MIN_ROWS rows or more, or
        of any number with ``every_row``) or bfloat16 (for every product, rounded as under bfloat16 autocast);
        returns the copy's bytes."""
        w = self.weight
        if w.device.type != "cpu" or w.dtype != torch.float32:
            raise ValueError(f"only float32 weights on a CPU are packed; this one is {w.dtype} on {w.device}")
        if dtype not in PACKED_DTYPES:
            raise ValueError(f"weights are packed in float32 or bfloat16; got {dtype}")
        if not packing_available():
            raise ValueError("this torch build cannot pack weights (oneDNN is not available)")
        if dtype == torch.bfloat16 and not bfloat16_packing_available():
            raise ValueError(f"{NO_BFLOAT16_PACKING}; pack them in float32")
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().to(dtype), None)
        self.packed_dtype = dtype
        self.min_rows = 1 if every_row or dtype == torch.bfloat16 else PACKED_MIN_ROWS
        self._packed_from = (w.data_ptr(), w._version)
        return w.numel() * dtype.itemsize

    def unpack(self) -> None:
        """Drop the packed copy (its memory is freed): back to the unpacked paths."""
        self.packed = None

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        rows = x.numel() // x.shape[-1]
        cpu_float32 = w.device.type == "cpu" and w.dtype == torch.float32 and x.dtype == torch.float32
        if not cpu_float32 or torch.is_grad_enabled():
            return super().forward(x)
        flat = x.reshape(rows, x.shape[-1])
        # one row doubled to two: both kernels multiply a single row in another, slower or differently rounded way
        pair = torch.cat([flat, flat]) if rows == 1 else flat
        packed = self.packed is not None and self._packed_from == (w.data_ptr(), w._version)
        if packed and rows >= self.min_rows:
            out: Tensor = torch.ops.mkldnn._linear_pointwise(
                pair.to(self.packed_dtype).contiguous(), self.packed, None, "none", [], ""
            )[:rows].to(x.dtype)
        elif rows <= SMALL_PRODUCT_ROWS:
            out = torch.mm(w, pair.t()).t()[:rows].contiguous()  # (rows, out)
        else:
            return super().forward(x)
        return out.view(*x.shape[:-1], w.shape[0])


class LowRank(nn.Module):
    """x -> up(down(x)): a map of rank ``rank``, (d_in + d_out)·rank weights instead of d_in·d_out."""

    def __init__(self, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, d_out, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.up(self.down(x))
        return out


def slot_map(d_in: int, d_out: int, rank: int | None) -> nn.Module:
    """A layer's map from the self state to its slots' keys or values: full (one Linear) or of rank ``rank``."""
    return nn.Linear(d_in, d_out, bias=False) if rank is None else LowRank(d_in, d_out, rank)


def init_slot_map(m: nn.Module, std: float, generator: torch.Generator) -> None:
    """Random weights whose map has the entries of a full one drawn with ``std`` (std 0: the map is zero; a
    low-rank one keeps a random ``down``, so that ``up`` has a gradient, as in LoRA)."""

    def draw(weight: Tensor, scale: float) -> None:
        weight.copy_(torch.randn(weight.shape, generator=generator) * scale) if scale > 0 else weight.zero_()

    if isinstance(m, LowRank):
        d_in, rank = m.down.in_features, m.down.out_features
        draw(m.down.weight, 1.0 / math.sqrt(d_in))
        draw(m.up.weight, std * math.sqrt(d_in / rank))
    else:
        assert isinstance(m, nn.Linear)
        draw(m.weight, std)


def _row_by_row(m: nn.Module, s: Tensor, alone: bool) -> Tensor:
    """``m(s)`` for (B, d) rows; with ``alone`` one row at a time, so that a row's result is bit for bit the one it
    gets alone (a product's rounding can depend on how many rows it multiplies)."""
    if s.shape[0] == 1 or not alone:
        out: Tensor = m(s)
        return out
    return torch.cat([m(s[b : b + 1]) for b in range(s.shape[0])])


class InjectedAttention(nn.Module):
    """Grouped-query attention with RoPE, plus (when stateful) the metric deformation and the self slot."""

    def __init__(self, config: LlamaConfig, has_trace: bool) -> None:
        super().__init__()
        self.H, self.H_kv, self.d = config.n_head, config.n_kv_head, config.head_dim
        self.has_trace = has_trace
        self.stateful = config.attention == "trace"
        self.gated = self.stateful and config.slot_gate
        # kernel width: rotated block, (pre-rotation block,) bias column, (read gate column,) zero padding
        self.w = _round8(self.d + (self.d if has_trace else 0) + 1 + int(self.gated)) if self.stateful else self.d
        C, d = config.n_embd, config.head_dim
        self.S = config.self_slots
        self.q_proj = Linear(C, self.H * d, bias=False)
        self.k_proj = Linear(C, self.H_kv * d, bias=False)
        self.v_proj = Linear(C, self.H_kv * d, bias=False)
        self.o_proj = Linear(self.H * d, C, bias=False)
        if self.stateful:
            self.self_key = slot_map(config.d_self, self.H_kv * self.S * d, config.slot_rank)
            self.self_value = slot_map(config.d_self, self.H_kv * self.S * d, config.slot_rank)
            self.slot_bias = nn.Parameter(torch.zeros(self.H_kv * self.S))
        if self.gated:
            self.slot_gate = nn.Linear(C, self.H, bias=False)  # per query head, a token's shift of the slots' logits

    def condition(self, metric: Tensor | None, s: Tensor, shift: float = 0.0, rows_alone: bool = False) -> InjectedLayer:
        """metric (B, H_kv, d, d) or None, s (B, d_s) -> this layer's InjectedLayer; every slot's logit lowered by
        ``shift`` (the model's read_shift); ``rows_alone``: each row's slots computed as if it were alone."""
        B, H_kv, S, d, w = s.shape[0], self.H_kv, self.S, self.d, self.w
        energy = s.float().square().mean(-1)  # (B,) |s|^2 / d_s, in [0, 1]
        gate = torch.where(energy > 0, torch.log(energy.clamp_min(1e-30)), torch.full_like(energy, CLOSED_GATE))
        k_s = _row_by_row(self.self_key, s, rows_alone).view(B, H_kv, S, d)  # (B, H_kv, S, d)
        bias = gate.view(B, 1, 1, 1) + (self.slot_bias - shift).view(1, H_kv, S, 1)  # (B, H_kv, S, 1)
        mid = d if self.has_trace else 0  # the slots have no pre-rotation key: the metric does not score them
        ones = s.new_ones(B, H_kv, S, int(self.gated))  # the read gate's column: the query's g·x lands on the slots only
        zeros = s.new_zeros(B, H_kv, S, mid), s.new_zeros(B, H_kv, S, w - d - mid - 1 - ones.shape[-1])
        slot_key = torch.cat([k_s, zeros[0], bias.to(s.dtype), ones, zeros[1]], dim=-1)  # (B, H_kv, S, w)
        slot_value = F.pad(_row_by_row(self.self_value, s, rows_alone).view(B, H_kv, S, d), (0, w - d))  # (B, H_kv, S, w)
        return InjectedLayer(metric, slot_key, slot_value)

    def forward(
        self,
        x: Tensor,
        lc: InjectedLayer | None,
        rope: tuple[Tensor, Tensor],
        cache: KVCache | None,
        layer: int,
        attn_mask: Tensor | None,
        starts: list[int] | None = None,
    ) -> Tensor:
        """``starts``: instead of ``attn_mask``, each row's keys as the prefix and the columns from its start on
        (``row_starts``): every row then attends alone, as it would unbatched, bit for bit."""
        B, L, _ = x.shape
        H, H_kv, d, w = self.H, self.H_kv, self.d, self.w
        cos, sin = rope
        q = self.q_proj(x).view(B, L, H, d).transpose(1, 2)  # (B, H, L, d) pre-rotation
        k = self.k_proj(x).view(B, L, H_kv, d).transpose(1, 2)  # (B, H_kv, L, d)
        v = self.v_proj(x).view(B, L, H_kv, d).transpose(1, 2)
        q_rot = rotate(q, cos, sin) / math.sqrt(d)  # (B, H, L, d), the base scale folded in
        k_rot = rotate(k, cos, sin)
        if lc is None:  # the base model
            q_aug, k_aug, v_aug = q_rot, k_rot, v
        else:
            q_parts, k_parts = [q_rot], [k_rot]
            if lc.metric is not None:
                metric = lc.metric.to(q.dtype)  # (B, H_kv, d, d)
                u = F.normalize(q, dim=-1)  # (B, H, L, d) unit pre-rotation queries
                u = u.reshape(B, H_kv, H // H_kv * L, d)  # query heads grouped by their key/value head
                q_parts.append((2.0 * u @ metric).view(B, H, L, d))  # 2 M u (M symmetric)
                w_k = F.normalize(k, dim=-1)  # (B, H_kv, L, d)
                k_parts.append(w_k)
                k_bias = -((w_k @ metric) * w_k).sum(-1, keepdim=True)  # (B, H_kv, L, 1) = -w^T M w
            else:
                k_bias = k.new_zeros(B, H_kv, L, 1)
            q_parts.append(q.new_ones(B, H, L, 1))
            if self.gated:
                q_parts.append(self.slot_gate(x).transpose(1, 2).unsqueeze(-1))  # (B, H, L, 1) g_h·x_i
            k_parts.append(k_bias)
            q_aug = F.pad(torch.cat(q_parts, dim=-1), (0, w - sum(p.shape[-1] for p in q_parts)))  # (B, H, L, w)
            k_aug = F.pad(torch.cat(k_parts, dim=-1), (0, w - sum(p.shape[-1] for p in k_parts)))  # (B, H_kv, L, w)
            v_aug = F.pad(v, (0, w - d))
        if cache is None:
            if lc is not None:
                k_aug = torch.cat([lc.slot_key.to(k_aug.dtype), k_aug], dim=2)  # (B, H_kv, S+L, w)
                v_aug = torch.cat([lc.slot_value.to(v_aug.dtype), v_aug], dim=2)
        else:
            k_aug, v_aug = cache.extend(layer, k_aug, v_aug)  # (B, H_kv, slot+cached+L, w)
        if starts is None:
            y = attend(q_aug, k_aug, v_aug, causal=True, attn_mask=attn_mask, enable_gqa=H_kv != H)  # (B, H, L, w)
        else:
            y = self._attend_rows(q_aug, k_aug, v_aug, starts, cache.prefix if cache is not None else 0)
        y = y[..., :d].transpose(1, 2).reshape(B, L, H * d)
        out: Tensor = self.o_proj(y)
        return out

    def _attend_rows(self, q: Tensor, k: Tensor, v: Tensor, starts: list[int], prefix: int) -> Tensor:
        """Each row alone: its queries that are not padding against the prefix and its own key columns."""
        B, H, Lq, w = q.shape
        Lk = k.shape[2]
        y = q.new_zeros(B, H, Lq, w)
        for b, start in enumerate(starts):
            keys, values = k[b : b + 1], v[b : b + 1]
            if start > prefix:
                keys = torch.cat([keys[:, :, :prefix], keys[:, :, start:]], dim=2)
                values = torch.cat([values[:, :, :prefix], values[:, :, start:]], dim=2)
            n = min(Lq, Lk - start)  # the queries at the row's own columns (padding queries stay zero)
            if n == 0:
                continue
            y[b : b + 1, :, Lq - n :] = attend(q[b : b + 1, :, Lq - n :], keys, values, causal=True, enable_gqa=self.H_kv != H)
        return y


def row_starts(attn_mask: Tensor, prefix: int) -> list[int] | None:
    """Where each left-padded row's own key columns start, if ``attn_mask`` (B, 1, Lq, Lk) is what ``padded_inputs``
    makes (the prefix and one run of columns to the end visible, causal): the rows can then attend one by one;
    None for any other mask. A row whose last column is hidden (a row fed padding while it leaves) starts at Lk:
    nothing of it is computed."""
    visible = attn_mask[:, 0, -1]  # (B, Lk): the last query sees every key of its row
    Lq, Lk = attn_mask.shape[2], attn_mask.shape[3]
    live = visible[:, -1]  # (B,)
    first = torch.where(live, prefix + visible[:, prefix:].int().argmax(dim=1), Lk)  # (B,)
    at = torch.arange(Lk, device=attn_mask.device)
    own = (at < prefix) | (at >= first[:, None])  # (B, Lk)
    causal = torch.ones(Lq, Lk, dtype=torch.bool, device=attn_mask.device).tril(diagonal=Lk - Lq)
    if not torch.equal(attn_mask[live, 0], (causal & own[:, None, :])[live]):
        return None
    return [int(f) for f in first.tolist()]


def injected_attention_reference(
    attn: InjectedAttention, x: Tensor, lc: InjectedLayer, s: Tensor, positions: Tensor, rope_theta: float
) -> Tensor:
    """The injected attention written out term by term, O(B·H·L·L·d) memory: test oracle only.

    x (B, L, C) normalised layer input, s (B, d_s) the self state, positions (B, L); causal, no cache.
    """
    B, L, _ = x.shape
    H, H_kv, d = attn.H, attn.H_kv, attn.d
    G = H // H_kv
    inv_freq = 1.0 / (rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))  # (d/2,)
    angles = positions.float().unsqueeze(-1) * inv_freq  # (B, L, d/2)
    angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)  # (B, 1, L, d)
    cos, sin = angles.cos(), angles.sin()
    q = attn.q_proj(x).view(B, L, H, d).transpose(1, 2)  # (B, H, L, d)
    k = attn.k_proj(x).view(B, L, H_kv, d).transpose(1, 2).repeat_interleave(G, dim=1)  # (B, H, L, d)
    v = attn.v_proj(x).view(B, L, H_kv, d).transpose(1, 2).repeat_interleave(G, dim=1)
    base = rotate(q, cos, sin) @ rotate(k, cos, sin).transpose(-1, -2) / math.sqrt(d)  # (B, H, L, L)
    if lc.metric is not None:
        metric = lc.metric.repeat_interleave(G, dim=1)  # (B, H, d, d)
        diff = F.normalize(q, dim=-1).unsqueeze(3) - F.normalize(k, dim=-1).unsqueeze(2)  # (B, H, L, L, d)
        base = base - torch.einsum("bhijd,bhde,bhije->bhij", diff, metric, diff)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    base = base.masked_fill(~causal, float("-inf"))
    S = attn.S
    k_s = attn.self_key(s).view(B, H_kv, S, d).repeat_interleave(G, dim=1)  # (B, H, S, d)
    energy = s.square().mean(-1)  # (B,)
    gate = torch.where(energy > 0, energy.clamp_min(1e-30).log(), torch.full_like(energy, CLOSED_GATE))
    q_rot = rotate(q, cos, sin)
    slot = (
        q_rot @ k_s.transpose(-1, -2) / math.sqrt(d)
        + gate.view(B, 1, 1, 1)
        + attn.slot_bias.view(H_kv, S).repeat_interleave(G, dim=0).view(1, H, 1, S)
    )  # (B, H, L, S)
    if attn.gated:
        slot = slot + attn.slot_gate(x).transpose(1, 2).unsqueeze(-1)  # (B, H, L, 1): the token's read gate
    if lc.metric is not None:  # the slot sits at the origin of the metric's space: distance u^T M u
        u = F.normalize(q, dim=-1)
        slot = slot - torch.einsum("bhid,bhde,bhie->bhi", u, metric, u).unsqueeze(-1)
    weights = torch.softmax(torch.cat([slot, base], dim=-1), dim=-1)  # (B, H, L, S + L)
    v_s = attn.self_value(s).view(B, H_kv, S, d).repeat_interleave(G, dim=1)
    y = weights @ torch.cat([v_s, v], dim=2)  # (B, H, L, d)
    out: Tensor = attn.o_proj(y.transpose(1, 2).reshape(B, L, H * d))
    return out


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class Block(nn.Module):
    def __init__(self, config: LlamaConfig, has_trace: bool) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = InjectedAttention(config, has_trace)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(
        self,
        x: Tensor,
        lc: InjectedLayer | None,
        rope: tuple[Tensor, Tensor],
        cache: KVCache | None,
        layer: int,
        attn_mask: Tensor | None,
        starts: list[int] | None = None,
    ) -> tuple[Tensor, Tensor]:
        h = self.attn_norm(x)  # (B, L, C), also the input the turn summary reads
        x = x + self.attn(h, lc, rope, cache, layer, attn_mask, starts)
        x = x + self.mlp(self.mlp_norm(x))
        return x, h


class LlamaModel(IdentityModel):
    """A pretrained LLaMA-family backbone whose attention one identity state per batch row deforms."""

    # exact_rows (IdentityModel) is set by pack_weights(bfloat16): padded rows then attend one by one (``row_starts``)
    # and the slots are conditioned row by row, so that with its row-independent products a batched row computes bit
    # for bit what it does alone

    def __init__(self, config: LlamaConfig, tokenizer: Tokenizer, *, init: bool = True) -> None:
        super().__init__()
        self.config: LlamaConfig = config
        if tokenizer.vocab_size > config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens; the model only {config.vocab_size}")
        self.tokenizer = tokenizer
        self.trace_layers = config.trace_layer_ids
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        blocks = [Block(config, i in self.trace_layers) for i in range(config.n_layer)]
        self.blocks = nn.ModuleList(blocks)
        self.attentions = [block.attn for block in blocks]  # typed views of the registered modules
        self.norm_f = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.self_update = SelfUpdate(config)
        self.pool = nn.Linear(config.n_embd, 1) if config.pooling == "attention" else None
        # K learned input embeddings read after each turn; their final hidden states are the write's z
        self.memory = nn.Parameter(torch.zeros(config.memory_tokens, config.n_embd)) if config.memory_tokens else None
        self.inv_freq: Tensor
        self.register_buffer("inv_freq", self._inv_freq(), persistent=False)  # (d/2,)
        self.read_shift = config.read_shift  # every slot's logit lowered by this at conditioning (set_read_shift)
        if init:
            self.init_identity(seed=0)

    def _inv_freq(self) -> Tensor:
        c = self.config
        return 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32, device="cpu") / c.head_dim))

    # --- parameters ---
    def init_identity(self, seed: int, slot_bias: float = UNTRAINED_SLOT_BIAS) -> None:
        """Deterministic untrained identity parameters: the read shut (slot values zero, the slot's bias at
        ``slot_bias``, by default the closed gate), the write random. Training starts the bias open (e.g. 0)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for attn in self.attentions:
                if attn.stateful:
                    init_slot_map(attn.self_key, 0.02, generator)
                    init_slot_map(attn.self_value, 0.0, generator)
                    attn.slot_bias.fill_(slot_bias)
                if attn.gated:
                    attn.slot_gate.weight.zero_()  # every token reads as the bias says: the gate adds nothing yet
            bound = 1.0 / math.sqrt(self.self_update.proj.in_features)
            for p in self.self_update.parameters():
                p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)
            if self.pool is not None:
                self.pool.weight.zero_()  # scores start equal: mean pooling
                self.pool.bias.zero_()
            if self.self_update.parts:
                self.self_update.centre.zero_()
                self.self_update.spread.fill_(1.0)
            if self.self_update.gate is not None:
                self.self_update.gate.bias.zero_()  # the gate starts half open
            if self.memory is not None:  # the embeddings of random vocabulary tokens: inputs the backbone knows
                rows = torch.randint(0, self.config.vocab_size, (self.memory.shape[0],), generator=generator)
                self.memory.copy_(self.wte.weight[rows].float())

    @property
    def packable(self) -> bool:
        """Whether ``pack_weights`` can pack here: float32 weights on a CPU, with a build that has oneDNN."""
        weight = self.wte.weight
        return weight.device.type == "cpu" and weight.dtype == torch.float32 and packing_available()

    def pack_weights(self, dtype: torch.dtype = torch.float32) -> int:
        """Pack the backbone's matrices for oneDNN's CPU products (``Linear.pack``), at the cost of a second copy of
        them. float32: products of three rows or more (batched decoding, prefill) run faster. bfloat16: the
        projections' products, of any number of rows, read half the bytes and round as under bfloat16 autocast; the
        head stays float32 (packed in float32), so logits keep their precision. Returns the bytes the copies take.
        For inference: training keeps ``nn.Linear``'s products."""
        if dtype not in PACKED_DTYPES:
            raise ValueError(f"weights are packed in float32 or bfloat16; got {dtype}")
        if dtype == torch.bfloat16 and not bfloat16_packing_available():  # before any matrix is packed: nothing changes
            raise ValueError(f"{NO_BFLOAT16_PACKING}; pack them in float32")
        self.exact_rows = dtype == torch.bfloat16
        if dtype == torch.float32:
            return sum(m.pack() for m in self.modules() if isinstance(m, Linear))
        # the head in float32, but with its copy for one row too: a row's logits then come from the same kernel
        # whether it decodes alone or batched, as every bfloat16 product does
        return sum(
            m.pack(torch.float32, every_row=True) if m is self.lm_head else m.pack(dtype)
            for m in self.modules()
            if isinstance(m, Linear)
        )

    def unpack_weights(self) -> None:
        """Drop every packed copy ``pack_weights`` made."""
        self.exact_rows = False
        for m in self.modules():
            if isinstance(m, Linear):
                m.unpack()

    def set_read_shift(self, shift: float) -> None:
        """The read's strength: every self slot's logit lowered by ``shift`` (its attention weight times about
        e^-shift; a negative shift strengthens it) in every conditioning made from now on, in place of the
        checkpoint's own (``config.read_shift``). Memory against language, measured in docs/model.md (the bundled
        adapter: 0 -> 94.8 % recall, 1.072x base perplexity; its own 0.5 -> 91.7 %, 1.003x). A fresh identity reads
        nothing at any shift."""
        if not math.isfinite(shift):
            raise ValueError(f"the read shift must be a finite number; got {shift}")
        self.read_shift = float(shift)

    def factor_slots(self, rank: int) -> None:
        """Replace every layer's slot maps by their best rank-``rank`` approximation, in place: the truncated SVD
        W ≈ U_r S_r V_rᵀ, stored as up = U_r S_r^½ and down = S_r^½ V_rᵀ (config.slot_rank becomes ``rank``). A
        smaller adapter at a cost measured in docs/model.md."""
        config = replace(self.config, slot_rank=rank)  # validates the rank
        with torch.no_grad():
            for attn in self.attentions:
                if not attn.stateful:
                    continue
                for name in ("self_key", "self_value"):
                    old = getattr(attn, name)
                    weight = old.weight if isinstance(old, nn.Linear) else old.up.weight @ old.down.weight
                    u, sv, vh = torch.linalg.svd(weight.float(), full_matrices=False)
                    root = sv[:rank].sqrt()
                    new = LowRank(weight.shape[1], weight.shape[0], rank).to(weight.device)
                    new.up.weight.copy_(u[:, :rank] * root)
                    new.down.weight.copy_(root[:, None] * vh[:rank])
                    setattr(attn, name, new)
        self.config = config

    def identity_state_dict(self) -> dict[str, Tensor]:
        """The parameters SIA adds to the backbone (what a SIA checkpoint stores beside the name of its base)."""
        return {k: v for k, v in self.state_dict().items() if any(part in k for part in IDENTITY_PARAMETERS)}

    @classmethod
    def from_base(cls, config: LlamaConfig, tokenizer: Tokenizer, tensors: dict[str, Tensor], *, seed: int = 0) -> LlamaModel:
        """The backbone's weights (Hugging Face names) taken as they are, with no random initialisation first;
        fresh identity parameters (``init_identity(seed)``)."""
        with torch.device("meta"):  # shapes only: the backbone's storage is the loaded tensors themselves
            model = cls(config, tokenizer, init=False)
        model.load_base(tensors, assign=True)
        for module in model.modules():  # what the base does not provide: SIA's own parameters and the rotary table
            for name, param in list(module.named_parameters(recurse=False)):
                if param.is_meta:
                    setattr(module, name, nn.Parameter(torch.empty(param.shape, dtype=param.dtype)))
            for name, buffer in list(module.named_buffers(recurse=False)):
                if buffer.is_meta and name != "inv_freq":  # the self update's running statistics
                    setattr(module, name, torch.zeros(buffer.shape, dtype=buffer.dtype))  # init_identity fills it
        model.inv_freq = model._inv_freq()
        model.init_identity(seed)
        return model

    def load_base(self, tensors: dict[str, Tensor], *, assign: bool = False) -> None:
        """Load a backbone's weights given by their Hugging Face LLaMA names; every base parameter must be there.

        With ``assign`` the module keeps the given tensors as its parameters (no copy)."""
        own = self.state_dict()
        wanted = {name for name in own if not any(part in name for part in IDENTITY_PARAMETERS)}
        if self.config.tie_embeddings:
            wanted.discard("lm_head.weight")
        loaded: dict[str, Tensor] = {}
        for hf_key, tensor in tensors.items():
            name = hf_name(hf_key)
            if name is None or (name == "lm_head.weight" and self.config.tie_embeddings):
                continue  # rotary tables and a tied head's copy are not parameters here
            if name not in wanted:
                raise ValueError(f"the base checkpoint has an unexpected tensor {hf_key!r}")
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(f"{hf_key} has shape {tuple(tensor.shape)}; this config needs {tuple(own[name].shape)}")
            loaded[name] = tensor
        missing = sorted(wanted - set(loaded))
        if missing:
            raise ValueError(f"the base checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
        self.load_state_dict(loaded, strict=False, assign=assign)
        if self.config.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # assignment replaced the shared parameter: tie again

    # --- per-turn conditioning ---
    def condition(self, trace: Tensor, self_state: Tensor) -> Conditioning:
        """trace (B, *config.trace_shape) as stored, self_state (B, d_s) -> the turn's Conditioning."""
        c = self.config
        self._check_state_shapes(trace, self_state)
        if not self.stateful:
            return Conditioning(layers=[None] * c.n_layer, self_state=self_state)
        B = trace.shape[0]
        metric = stabilised_metric(trace.detach(), c)  # (B, n_trace, trace heads, d, d), float32
        metric = metric.expand(B, metric.shape[1], c.n_kv_head, c.head_dim, c.head_dim)  # shared trace: every head
        slot_of = {layer: i for i, layer in enumerate(self.trace_layers)}
        layers = []
        for layer, attn in enumerate(self.attentions):
            m = metric[:, slot_of[layer]] if layer in slot_of else None
            layers.append(attn.condition(m, self_state.to(self.wte.weight.dtype), self.read_shift, self.exact_rows))
        return Conditioning(layers=layers, self_state=self_state)

    def base_view(self) -> LlamaModel:
        """The same weights read as the base model, the identity switched off: a shallow copy (no tensor is copied,
        this model is untouched) whose config says ``attention="dot"``. For uncached forwards: a cache it made
        would still have the identity's kernel width."""
        twin = copy.copy(self)
        twin.config = replace(self.config, attention="dot")
        return twin

    @property
    def prefix_len(self) -> int:
        """Keys before the first token: the self slots (config.self_slots per key/value head), or none."""
        return self.config.self_slots if self.stateful else 0

    def new_cache(self, cond: Conditioning, max_tokens: int) -> KVCache:
        widths = [attn.w for attn in self.attentions]
        return KVCache(cond, max_tokens, n_head=self.config.n_kv_head, width=widths, dtype=self.wte.weight.dtype)

    # --- forward ---
    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin (B, 1, L, d) for positions (B, L)."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # (B, L, d/2)
        angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)  # (B, 1, L, d)
        dtype = self.wte.weight.dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(
        self,
        idx: Tensor,
        cond: Conditioning,
        *,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        summary_mask: Tensor | None = None,
        memory: bool = False,
        logits_from: int = 0,
    ) -> ModelOutput:
        """idx (B, L) token ids -> logits (B, L, vocab) and the additive turn statistics of these tokens.

        positions (B, L) default to the next L positions after the cache; attn_mask is a boolean (B, 1, L, Lk) mask
        of visible keys including the self slot at key 0 (only needed for padded rows); summary_mask (B, L) picks
        the tokens that count towards the turn summary (default: all). With ``memory`` the K memory tokens follow
        idx (at the K positions after its last, seeing every key its last token sees) and ``memory`` of the output
        holds their final hidden states (B, K, C); attn_mask then covers the L + K queries and keys.
        Logits are computed for positions ``logits_from`` to L - 1 only (B, L - logits_from, vocab).
        """
        L = idx.shape[1]
        positions, weight = self._positions_and_weights(idx, cond, cache, positions, summary_mask)
        x = self.wte(idx)  # (B, L, C)
        K = 0
        if memory:
            if self.memory is None:
                raise ValueError("this model has no memory tokens (config.memory_tokens is 0)")
            K = self.memory.shape[0]
            B = idx.shape[0]
            x = torch.cat([x, self.memory.to(x.dtype).expand(B, K, -1)], dim=1)  # (B, L+K, C)
            after = positions[:, -1:] + torch.arange(1, K + 1, device=idx.device)  # (B, K)
            positions = torch.cat([positions, after], dim=1)
            weight = F.pad(weight, (0, 0, 0, K))  # memory tokens never count towards the summary
        rope = self.rope(positions)
        starts = None
        if self.exact_rows and attn_mask is not None:
            starts = row_starts(attn_mask, cache.prefix if cache is not None else 0)
        layer_inputs = []
        for i, (block, lc) in enumerate(zip(self.blocks, cond.layers, strict=True)):
            assert lc is None or isinstance(lc, InjectedLayer)
            x, h = block(x, lc, rope, cache, i, None if starts is not None else attn_mask, starts)
            if i in self.trace_layers:
                layer_inputs.append((h.float() * weight).sum(dim=1))  # (B, C)
        if cache is not None:
            cache.advance(L + K)
        x = self.norm_f(x)  # (B, L+K, C)
        hidden, pool_max, pool_norm = self._pool(x[:, :L].float(), weight[:, :L])
        stats = TurnStats(torch.stack(layer_inputs, dim=1), hidden, weight.sum(dim=(1, 2)), pool_max, pool_norm)
        logits = self.lm_head(x[:, logits_from:L])
        return ModelOutput(logits=logits, stats=stats, memory=x[:, L:].float() if memory else None)

    # --- what a turn leaves behind ---
    def summarize(self, stats: TurnStats) -> TurnSummary:
        """Per row and trace layer: the unit mean pre-rotation key of each key/value head and the unit mean query of
        the query heads it serves (one pair per layer when the trace is shared), and the pooled hidden state z.

        The projections are linear, so mean(q) = W_q mean(h): no per-token queries need to be kept.
        """
        if not self.stateful:
            raise ValueError(f"the {self.config.attention!r} attention variant keeps no identity state to summarise for")
        if bool((stats.count <= 0).any()):
            raise ValueError("a turn summary needs at least one counted token per row")
        c = self.config
        mean_in = stats.layer_inputs / stats.count.view(-1, 1, 1)  # (B, n_trace, C)
        dtype = self.wte.weight.dtype
        queries, keys = [], []
        for i, layer in enumerate(self.trace_layers):
            attn = self.attentions[layer]
            q = attn.q_proj(mean_in[:, i].to(dtype)).float().view(-1, c.n_kv_head, c.n_head // c.n_kv_head, c.head_dim)
            k = attn.k_proj(mean_in[:, i].to(dtype)).float().view(-1, c.n_kv_head, c.head_dim)  # (B, H_kv, d)
            q = q.mean(2)  # (B, H_kv, d) the queries each key/value head serves
            if not c.trace_per_head:
                q, k = q.mean(1, keepdim=True), k.mean(1, keepdim=True)  # (B, 1, d)
            queries.append(q)
            keys.append(k)
        z = stats.hidden / stats.pool_norm.view(-1, 1)  # (B, C) pooled hidden state
        return TurnSummary(
            queries=F.normalize(torch.stack(queries, dim=1), dim=-1),  # (B, n_trace, trace heads, d)
            keys=F.normalize(torch.stack(keys, dim=1), dim=-1),
            hidden=z,
        )


_HF_NAMES = [
    (re.compile(r"model\.embed_tokens\.weight"), "wte.weight"),
    (re.compile(r"model\.norm\.weight"), "norm_f.weight"),
    (re.compile(r"lm_head\.weight"), "lm_head.weight"),
    (re.compile(r"model\.layers\.(\d+)\.input_layernorm\.weight"), r"blocks.\1.attn_norm.weight"),
    (re.compile(r"model\.layers\.(\d+)\.post_attention_layernorm\.weight"), r"blocks.\1.mlp_norm.weight"),
    (re.compile(r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight"), r"blocks.\1.attn.\2_proj.weight"),
    (re.compile(r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight"), r"blocks.\1.mlp.\2_proj.weight"),
]


def hf_name(hf_key: str) -> str | None:
    """This module's parameter name for a Hugging Face LLaMA tensor name; None for tensors that are not weights."""
    if hf_key.endswith("rotary_emb.inv_freq"):
        return None
    for pattern, name in _HF_NAMES:
        if pattern.fullmatch(hf_key):
            return pattern.sub(name, hf_key)
    raise ValueError(f"{hf_key!r} is not a LLaMA tensor name this loader knows")
