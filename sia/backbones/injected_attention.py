"""The attention of a LLaMA-family layer with Trace Tensor Attention and the self slots injected.

Notation: B batch, L tokens in this call, C residual width, H query heads, H_kv key/value heads, G = H / H_kv,
d head width, w a layer's kernel width, d_s self-state width, S self slots per key/value head, R_i the rotation of position i.

The pretrained logits stay; the identity adds to them (docs/attention.md, "Injecting into a pretrained model"):

    e_ij = (R_i q_i)·(R_j k_j) / sqrt(d)            the base model, RoPE as it was trained
           - (u_i - w_j)^T M (u_i - w_j)            trace layers only: u, w unit *pre-rotation* query and key
    e_is = (R_i q_i)·k_s / sqrt(d) - u_i^T M u_i + log(|s|^2/d_s) + b (+ g_h·x_i)
                                                    the self slots: k_s = W_ks s at positions 0..S-1, at the metric's origin;
                                                    g_h·x_i the per-token read gate (config.slot_gate), x_i the layer's input
    e_in = (R_i q_i)·(R_n k_n) / sqrt(d) - ... - shift (+ a_h·x_i + c_h)
                                                    the imprint's entries (§10), rotated to their fixed positions; a·x + c
                                                    the imprint's per-token read gate (config.imprint_gate), which also
                                                    scales the token's read adapter by 2·sigmoid(a_H·x_i + c_H)

M is the injected metric of the stored trace (sia.identity.state.stabilised_metric with offset 0, so M = 0 for a zero
trace), carried as its r eigenpairs largest in magnitude, M = V Λ V^T with V (d, r) orthonormal (config.metric_rank;
all d by default; sia.identity.state.metric_factors). Expanding the square drops the row constant u_i^T M u_i, so each
layer is one fused kernel call over

    q~_i = [R_i q_i / sqrt(d), 2 Λ V^T u_i, 1, g·x_i, a·x_i + c]      k~_j = [R_j k_j, V^T w_j, -w_j^T M w_j, 0, 0]
    k~_s = [k_s, 0, gate(s), 1, 0]      k~_n = [R_n k_n, V^T w_n, -w_n^T M w_n - shift, 0, 1]

(the middle block, r wide, only in trace layers, the g·x column only with the read gate, the last column a·x_i + c
with the imprint's gate, plus the closed gate on the persona prompt's tokens; zero-padded to a multiple of 8). A
fresh identity has M = 0, the slot's gate at -1e4, whose softmax weight is exactly 0, and no entries: the logits are
the base model's, whatever the gates add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sia.backbones.packed_linear import Linear, Stacked, cast
from sia.backbones.slot_maps import LowRank, slot_map
from sia.model.attention import attend
from sia.model.config import LlamaConfig
from sia.model.kv_cache import KVCache

__all__ = [
    "CLOSED_GATE",
    "CopyPlan",
    "EntryReads",
    "InjectedAttention",
    "InjectedLayer",
    "copy_plan",
    "injected_attention_reference",
    "rotate",
    "row_starts",
]

CLOSED_GATE = -1e4  # the slot's logit for a zero self state: exp(-1e4 - max) is exactly 0 in float32 and bfloat16


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


@lru_cache(maxsize=256)
def _head_index(heads: tuple[int, ...], device: torch.device) -> Tensor:
    """The query heads' indices as a tensor on ``device``, made once, not at every decoding step (four operators)."""
    return torch.tensor(heads, device=device)


@dataclass
class EntryReads:
    """What the copy read takes from its layers' attention: per layer, the query heads whose weights on the imprint's
    entries it reads (None: every one; only these are computed), and the weights (B, h, L, N) of each layer asked, in
    layer order."""

    heads: dict[int, list[int] | None]
    weights: list[Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class InferenceMaps:
    """What ``InjectedAttention._infer`` multiplies in one layer for one turn, made once in the turn's dtype (each cast
    or scaling of a small tensor costs a decoding step a few microseconds per layer): the weight (n, C) and bias (n,)
    whose product with a token's input gives the augmented query's tail and the read adapter's down maps and scale
    logit, the adapter's up maps (H·d + 2·H_kv·d, 2r) with zero rows for the keys (None without them), the metric's
    basis scaled for the queries, V·2Λ, and as it is, V (B, H_kv, d, r), and -Λ as a column (B, H_kv, r, 1) (None in a
    layer without a trace: the query's and the key's columns then need no products), the rows'
    adapter gate (B, 1, 1) where some row holds no imprint (None where every row does: the gate is then 1 and its
    product is left out), and the output adapter's down (r, H·d) and up (C, r) maps; with the imprint's gate, both up
    maps doubled (the adapter's scale is 2·sigmoid: the sigmoid is taken at each step, the 2 here once). All in the
    dtype the state's small products run in (``small_products``)."""

    weight: Tensor
    bias: Tensor
    up: Tensor | None
    metric_q: Tensor | None
    metric_k: Tensor | None
    neg_spectrum: Tensor | None
    imprinted: Tensor | None
    out_down: Tensor | None
    out_up: Tensor | None


@dataclass(frozen=True)
class CopyPlan:
    """What the copy read (``sia.backbones.llama.copied``) takes from a turn's entries, made once a turn (``copy_plan``),
    not at every decoding step: each entry's token id (B, N) with an empty entry as 0, then per entry (B, 1, N) whether
    it begins a word or goes on one, the token that must come just before it where it goes on one (-1 where it begins
    one), and its weight where it holds a token (0 elsewhere, float32); which entries hold one token ((B, N, N),
    float32); and which rows copy at all ((B,), and whether every row does, or any)."""

    tokens: Tensor
    begins: Tensor
    goes_on: Tensor
    after: Tensor
    weight: Tensor
    same: Tensor
    copying: Tensor
    every_row: bool
    any_row: bool


def copy_plan(tokens: Tensor, weight: Tensor, after: Tensor) -> CopyPlan:
    """The ``CopyPlan`` of entries with token ids ``tokens`` (B, N) (-1: none), copy weights ``weight`` (B, N) and the
    tokens ``after`` (B, N) they go on from (-1: the entry begins a word)."""
    held = tokens.clamp_min(0)  # an empty entry as token 0, so that every write to a token writes one value
    copying = (weight > 0).any(-1)
    return CopyPlan(
        tokens=held,
        begins=(after < 0).unsqueeze(1),
        goes_on=(after >= 0).unsqueeze(1),
        after=after.unsqueeze(1),
        weight=(weight.float() * (tokens >= 0)).unsqueeze(1),
        same=(held.unsqueeze(-1) == held.unsqueeze(-2)).float(),
        copying=copying,
        every_row=bool(copying.all()),
        any_row=bool(copying.any()),
    )


@dataclass
class InjectedLayer:
    """One layer's share of a turn's conditioning, per batch row."""

    # M per key/value head as V Λ V^T: its basis V (B, H_kv, d, r) and eigenvalues Λ (B, H_kv, r) (metric_factors);
    # None in a layer without a trace
    basis: Tensor | None
    spectrum: Tensor | None
    slot_key: Tensor  # (B, H_kv, S [+ N], w) augmented self-slot keys, S = config.self_slots, then the imprint's N
    slot_value: Tensor  # (B, H_kv, S [+ N], w)
    reads_from: Tensor | None = None  # (B,) the first position that reads the imprint (the persona's prompt does not)
    imprinted: Tensor | None = None  # (B, 1, 1): 1 in a row whose imprint holds something (its read adapter acts), else 0
    # the copy read's layers only (config.imprint_copy): each entry's token id (B, N), -1 none; the token that must
    # come just before for the entry to be copied (B, N): its span's previous token where it goes on a word, -1 where
    # it begins one; and each entry's weight (B, N) in the copy (0: none)
    copy_tokens: Tensor | None = None
    copy_after: Tensor | None = None
    copy_weight: Tensor | None = None

    @property
    def metric(self) -> Tensor | None:
        """M (B, H_kv, d, d) as the layer carries it, V Λ V^T; None without a trace."""
        if self.basis is None or self.spectrum is None:
            return None
        return (self.basis * self.spectrum.unsqueeze(-2)) @ self.basis.transpose(-1, -2)

    @cached_property
    def reading(self) -> bool:
        """Whether any row's imprint holds something: asked once per conditioning, not at every decoding step."""
        return self.imprinted is not None and bool(self.imprinted.any())

    @cached_property
    def copy_plan(self) -> CopyPlan | None:
        """The copy read's ``CopyPlan`` in a copy layer (None elsewhere): made once a conditioning."""
        if self.copy_tokens is None or self.copy_after is None or self.copy_weight is None:
            return None
        return copy_plan(self.copy_tokens, self.copy_weight, self.copy_after)

    @cached_property
    def maps(self) -> list[InferenceMaps]:
        """Where the layer's inference maps (``InjectedAttention._inference_maps``) are kept once its first forward
        without gradients has made them: made once a turn, not at every decoding step. Not a field: rows selected
        from a batch or stacked into one make a new layer, which makes them anew."""
        return []


def small_products(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype the state's small products of a decoding step run in (its query tail, read adapter and metric: a few
    rows by a few columns): float32 on a CPU whatever the model's dtype, since there a bfloat16 product of that size
    costs several times a float32 one and its casts (on a CPU with AMX, 18-25 against 2-5 µs a product, a cast 1 µs);
    elsewhere the model's own."""
    return torch.float32 if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16) else dtype


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE in the rotate-half layout: x (B, heads, L, d), cos and the signed sin (B, 1, L, d) (``LlamaModel.rope``).

    The rotate-half form x·cos + [-x₂, x₁]·[sin, sin] written as x·cos + [x₂, x₁]·[-sin, sin]: the same numbers bit for
    bit (a sign moves exactly), with the halves swapped by one ``roll`` instead of two slices, a negation and a join."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def metric_columns(unit: Tensor, basis: Tensor, neg_spectrum: Tensor) -> tuple[Tensor, Tensor]:
    """A trace layer's key columns for the metric: unit pre-rotation keys (..., L, d) in its basis V (..., d, r), V^T w,
    and their bias column -w^T M w (..., L, 1) from -Λ as a column (..., r, 1)."""
    projected = unit @ basis
    return projected, projected.square() @ neg_spectrum


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
        # the metric's block: its eigenpairs carried (config.metric_rank), in a trace layer
        self.mid = (config.metric_rank or self.d) if has_trace and self.stateful else 0
        # kernel width: rotated block, (metric block,) bias column, (read gate column,) the imprint's column, zero
        # padding. The imprint's column: 1 on its entries, and on a query 0 where it reads them, the closed gate where not
        self.w = _round8(self.d + self.mid + 2 + int(self.gated)) if self.stateful else self.d
        self.unread_at = self.d + self.mid + 1 + int(self.gated)
        # a stateful query's columns after its rotated (and metric) blocks
        self.tail = self.w - self.d - self.mid
        C, d = config.n_embd, config.head_dim
        self.S = config.self_slots
        self.q_proj = Linear(C, self.H * d, bias=False)
        self.k_proj = Linear(C, self.H_kv * d, bias=False)
        self.v_proj = Linear(C, self.H_kv * d, bias=False)
        self.o_proj = Linear(self.H * d, C, bias=False)
        self.qkv = Stacked([self.q_proj, self.k_proj, self.v_proj])  # inference's one product of the three
        if self.stateful:
            self.self_key = slot_map(config.d_self, self.H_kv * self.S * d, config.slot_rank)
            self.self_value = slot_map(config.d_self, self.H_kv * self.S * d, config.slot_rank)
            self.slot_bias = nn.Parameter(torch.zeros(self.H_kv * self.S))
        if self.gated:
            self.slot_gate = nn.Linear(C, self.H, bias=False)  # per query head, a token's shift of the slots' logits
        self.read_rank = config.imprint_read_rank if self.stateful else 0
        self.imprint_gated = self.stateful and config.imprint_gate
        if self.imprint_gated:  # per query head a token's shift of the entries' logits, then its read adapter's scale
            self.imprint_gate = nn.Linear(C, self.H + 1)
        if self.read_rank:  # the imprint's read adapter (LoRA; ``up`` starts at zero: no change until trained)
            r = self.read_rank
            self.imprint_read_q = LowRank(C, self.H * d, r)
            self.imprint_read_v = LowRank(C, self.H_kv * d, r)
            self.imprint_read_o = LowRank(self.H * d, C, r)

    def condition(
        self,
        metric: tuple[Tensor, Tensor] | None,
        s: Tensor,
        shift: float = 0.0,
        rows_alone: bool = False,
        imprint: tuple[Tensor, Tensor, Tensor] | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        reads_from: Tensor | None = None,
        imprint_shift: float = 0.0,
        entry_bias: Tensor | None = None,
    ) -> InjectedLayer:
        """metric: M's basis (B, H_kv, d, r) and eigenvalues (B, H_kv, r) (``InjectedLayer.basis``) or None, s (B, d_s) ->
        this layer's InjectedLayer; every slot's logit lowered by
        ``shift`` (the model's read_shift); ``rows_alone``: each row's slots computed as if it were alone.

        ``imprint``: this layer's imprinted entries, pre-rotation keys and values (B, H_kv, N, d) and which are filled
        (B, N), placed after the slots and rotated by ``rope`` (cos, sin (B, 1, N, d)) to their positions; read by
        the tokens from ``reads_from`` (B,) on, every entry's logit lowered by ``imprint_shift`` and shifted by its
        ``entry_bias`` (B, N) (the asked kind's entries raised, the other kinds' lowered: the model's ``entry_bias``)."""
        B, H_kv, S, d, w = s.shape[0], self.H_kv, self.S, self.d, self.w
        energy = s.float().square().mean(-1)  # (B,) |s|^2 / d_s, in [0, 1]
        gate = torch.where(energy > 0, torch.log(energy.clamp_min(1e-30)), torch.full_like(energy, CLOSED_GATE))
        k_s = _row_by_row(self.self_key, s, rows_alone).view(B, H_kv, S, d)  # (B, H_kv, S, d)
        bias = gate.view(B, 1, 1, 1) + (self.slot_bias - shift).view(1, H_kv, S, 1)  # (B, H_kv, S, 1)
        mid = self.mid  # the slots have no pre-rotation key: the metric does not score them
        ones = s.new_ones(B, H_kv, S, int(self.gated))  # the read gate's column: the query's g·x lands on the slots only
        zeros = s.new_zeros(B, H_kv, S, mid), s.new_zeros(B, H_kv, S, w - d - mid - 1 - ones.shape[-1])
        slot_key = torch.cat([k_s, zeros[0], bias.to(s.dtype), ones, zeros[1]], dim=-1)  # (B, H_kv, S, w)
        slot_value = F.pad(_row_by_row(self.self_value, s, rows_alone).view(B, H_kv, S, d), (0, w - d))  # (B, H_kv, S, w)
        if imprint is not None:
            assert rope is not None
            keys, values = self._imprinted(metric, *imprint, rope, imprint_shift, entry_bias)
            slot_key, slot_value = torch.cat([slot_key, keys.to(slot_key.dtype)], 2), torch.cat([slot_value, values], 2)
        imprinted = None
        if imprint is not None and self.read_rank:
            imprinted = imprint[2].any(-1).to(s.dtype).view(B, 1, 1)
        basis, spectrum = (None, None) if metric is None else metric
        return InjectedLayer(basis, spectrum, slot_key, slot_value, reads_from, imprinted)

    def _imprinted(
        self,
        metric: tuple[Tensor, Tensor] | None,
        k: Tensor,
        v: Tensor,
        filled: Tensor,
        rope: tuple[Tensor, Tensor],
        shift: float,
        entry_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The imprint's augmented keys and values (B, H_kv, N, w): a token's key as the layer's own keys are
        augmented (rotated; the trace's pre-rotation columns), a filled entry's logit shifted by ``-shift`` and its
        ``entry_bias`` (B, N), an empty entry's closed."""
        B, H_kv, N, d = k.shape
        parts = [rotate(k, *rope)]  # (B, H_kv, N, d)
        bias = k.new_zeros(B, H_kv, N, 1)
        if metric is not None:
            basis, neg_spectrum = metric[0].to(k.dtype), -metric[1].to(k.dtype).unsqueeze(-1)
            w_k, bias = metric_columns(F.normalize(k, dim=-1), basis, neg_spectrum)  # (B, H_kv, N, r), (B, H_kv, N, 1)
            parts.append(w_k)
        opened = -shift if entry_bias is None else entry_bias.to(k.dtype) - shift  # (B, N) or a number
        closed = torch.where(filled, opened, CLOSED_GATE).to(k.dtype).view(B, 1, N, 1)
        parts.append(bias + closed)
        key = torch.cat(parts, dim=-1)
        key = F.pad(key, (0, self.unread_at - key.shape[-1]))  # the read gate's column stays 0
        key = torch.cat([key, key.new_ones(B, H_kv, N, 1)], dim=-1)  # the imprint's column
        return F.pad(key, (0, self.w - key.shape[-1])), F.pad(v, (0, self.w - d))

    def forward(
        self,
        x: Tensor,
        lc: InjectedLayer | None,
        rope: tuple[Tensor, Tensor],
        cache: KVCache | None,
        layer: int,
        attn_mask: Tensor | None,
        starts: list[int] | None = None,
        capture: list[tuple[Tensor, Tensor]] | None = None,
        unread: Tensor | None = None,
        reads: EntryReads | None = None,
    ) -> Tensor:
        """``starts``: instead of ``attn_mask``, each row's keys as the prefix and the columns from its start on
        (``row_starts``): every row then attends alone, as it would unbatched, bit for bit. ``capture``: a list that
        receives this layer's pre-rotation keys and values (B, H_kv, L, d), what an imprint keeps. ``unread`` (B, L):
        the tokens that do not read the imprint (the persona's prompt). ``reads``: receives the attention weights of the
        query heads it names for this layer on the imprint's entries (B, h, L, N) (the copy read's pointer)."""
        B, L, _ = x.shape
        H, H_kv, d, w = self.H, self.H_kv, self.d, self.w
        cos, sin = rope
        if not torch.is_grad_enabled():
            return self._infer(x, lc, rope, cache, layer, attn_mask, starts, capture, unread, reads)
        reading = lc is not None and lc.reading
        gate = None  # (B, L, H + 1): the imprint's read gate, where some row's entries are filled (else they are closed:
        # their weights are exactly 0 whatever the gate adds)
        q, v = self.q_proj(x), self.v_proj(x)
        if reading:  # the read adapter, in the rows that hold an imprint
            assert lc is not None and lc.imprinted is not None
            adapted = lc.imprinted.to(x.dtype)  # (B, 1, 1), or per token (B, L, 1): 2·sigmoid(gate), 1 at zero
            if self.imprint_gated:
                gate = self.imprint_gate(x)
                adapted = adapted * 2.0 * torch.sigmoid(gate[..., self.H :])
            if self.read_rank:
                q = q + adapted * self.imprint_read_q(x)
                v = v + adapted * self.imprint_read_v(x)
        q = q.view(B, L, H, d).transpose(1, 2)  # (B, H, L, d) pre-rotation
        k = self.k_proj(x).view(B, L, H_kv, d).transpose(1, 2)  # (B, H_kv, L, d)
        v = v.view(B, L, H_kv, d).transpose(1, 2)
        if capture is not None:
            capture.append((k, v))
        q_rot = rotate(q, cos, sin) / math.sqrt(d)  # (B, H, L, d), the base scale folded in
        k_rot = rotate(k, cos, sin)
        if lc is None:  # the base model
            q_aug, k_aug, v_aug = q_rot, k_rot, v
        else:
            q_parts, k_parts = [q_rot], [k_rot]
            if lc.basis is not None and lc.spectrum is not None:
                basis, spectrum = lc.basis.to(q.dtype), lc.spectrum.to(q.dtype)  # (B, H_kv, d, r), (B, H_kv, r)
                u = F.normalize(q, dim=-1)  # (B, H, L, d) unit pre-rotation queries
                u = u.reshape(B, H_kv, H // H_kv * L, d)  # query heads grouped by their key/value head
                metric_q = u @ (basis * (2.0 * spectrum).unsqueeze(-2))  # 2 Λ V^T u
                q_parts.append(metric_q.view(B, H, L, self.mid))
                w_k, k_bias = metric_columns(F.normalize(k, dim=-1), basis, -spectrum.unsqueeze(-1))  # V^T w, -w^T M w
                k_parts.append(w_k)
            else:
                k_bias = k.new_zeros(B, H_kv, L, 1)
            q_parts.append(q.new_ones(B, H, L, 1))
            if self.gated:
                q_parts.append(self.slot_gate(x).transpose(1, 2).unsqueeze(-1))  # (B, H, L, 1) g_h·x_i
            column = None  # (B, H, L, 1): the query's value in the imprint's column, added to every entry's logit
            if gate is not None:  # entries present: the token's read gate
                column = gate[..., : self.H].transpose(1, 2).unsqueeze(-1)
            if unread is not None:  # the closed gate where a token does not read the imprint
                shut = (unread.to(q.dtype) * CLOSED_GATE).view(B, 1, L, 1).expand(B, H, L, 1)
                column = shut if column is None else column + shut
            if column is not None:
                at = self.unread_at - sum(p.shape[-1] for p in q_parts)
                q_parts.append(F.pad(column, (at, 0)))
            k_parts.append(k_bias)
            q_aug = F.pad(torch.cat(q_parts, dim=-1), (0, w - sum(p.shape[-1] for p in q_parts)))  # (B, H, L, w)
            k_aug = F.pad(torch.cat(k_parts, dim=-1), (0, w - sum(p.shape[-1] for p in k_parts)))  # (B, H_kv, L, w)
            v_aug = F.pad(v, (0, w - d))
        y = self._attend(q_aug, k_aug, v_aug, lc, cache, layer, attn_mask, starts, reads)
        out: Tensor = self.o_proj(y)
        if reading and self.read_rank:
            out = out + adapted * self.imprint_read_o(y)
        return out

    def _attend(
        self,
        q_aug: Tensor,
        k_aug: Tensor,
        v_aug: Tensor,
        lc: InjectedLayer | None,
        cache: KVCache | None,
        layer: int,
        attn_mask: Tensor | None,
        starts: list[int] | None,
        reads: EntryReads | None = None,
    ) -> Tensor:
        """The augmented queries (B, H, L, w) against the state's keys, the cache's and these (B, H_kv, L, w'): the
        heads' outputs (B, L, H·d); ``reads`` receives the weights on the imprint's entries (``entry_weights``). Keys
        and values narrower than the queries (w' < w) are their first columns, the rest zeros: the cache writes them
        into its columns, which hold zeros there (``KVCache.extend``), so a decoding step pads nothing."""
        B, _, L, w = q_aug.shape
        if cache is None:
            k_aug, v_aug = _widened(k_aug, w), _widened(v_aug, w)
            if lc is not None:
                k_aug = torch.cat([lc.slot_key.to(k_aug.dtype), k_aug], dim=2)  # (B, H_kv, S+L, w)
                v_aug = torch.cat([lc.slot_value.to(v_aug.dtype), v_aug], dim=2)
        else:
            k_aug, v_aug = cache.extend(layer, k_aug, v_aug)  # (B, H_kv, slot+cached+L, w)
        prefix = cache.prefix if cache is not None else 0  # the columns before the tokens that ``starts`` counts
        mirrored = cache is not None and cache.mirrored
        if starts is None:
            y = attend(q_aug, k_aug, v_aug, causal=True, attn_mask=attn_mask, enable_gqa=self.H_kv != self.H)  # (B, H, L, w)
        else:
            y = self._attend_rows(q_aug, k_aug, v_aug, starts, prefix, mirrored)
        if reads is not None and lc is not None:
            N = lc.slot_key.shape[2] - self.S
            heads = reads.heads.get(layer)
            if starts is None:
                weights = self.entry_weights(q_aug, k_aug, N, attn_mask, heads)
            else:  # each row's as it computes them alone, over its own keys
                weights = q_aug.new_zeros(B, self.H if heads is None else len(heads), L, N, dtype=torch.float32)
                for b, start in enumerate(starts):
                    n = min(L, k_aug.shape[2] - start)  # the row's queries that are not padding
                    if n:
                        keys = own_columns(k_aug, b, start, prefix, mirrored)
                        weights[b : b + 1, :, L - n :] = self.entry_weights(q_aug[b : b + 1, :, L - n :], keys, N, None, heads)
            reads.weights.append(weights)
        return y[..., : self.d].transpose(1, 2).reshape(B, L, self.H * self.d)

    def entry_weights(
        self,
        q: Tensor,
        k: Tensor,
        N: int,
        attn_mask: Tensor | None,
        heads: list[int] | None = None,
    ) -> Tensor:
        """The attention weights (B, h, L, N) the queries q (B, H, L, w) of the query heads ``heads`` (None: all H)
        give the imprint's N entries among all the keys k (B, H_kv, Lk, w) they see (the slots and entries first,
        then the tokens, causal; ``attn_mask`` as ``_attend`` takes it); float32.
        Written out, not fused: the kernel does not return its weights. A decoding step's one query takes every head's
        logits, one product per key/value head, and then the heads asked for: gathering each asked head's keys copies
        them, which cost it 1.5-3x as much; over a prompt's many queries the asked heads alone cost less
        (experiments/LOG.md, 2026-12-04 (q))."""
        B, H, L, _ = q.shape
        Lk = k.shape[2]
        qf, kf = cast(q, torch.float32), cast(k, torch.float32)
        if heads is None or L == 1:
            logits = qf.reshape(B, self.H_kv, H // self.H_kv * L, -1) @ kf.transpose(-1, -2)  # (B, H_kv, G·L, Lk)
            logits = logits.view(B, H, L, Lk)
            if heads is not None:
                logits = logits.index_select(1, _head_index(tuple(heads), q.device))  # (B, h, L, Lk)
        else:  # only the heads asked for, each against its key/value head
            kv = [h // (H // self.H_kv) for h in heads]
            logits = qf[:, heads] @ kf[:, kv].transpose(-1, -2)  # (B, h, L, Lk)
        if L == 1 and attn_mask is None:  # a decoding step's one query sees every key
            return torch.softmax(logits, dim=-1)[..., self.S : self.S + N]
        at = torch.arange(Lk, device=q.device)
        visible = (at.view(1, Lk) <= torch.arange(Lk - L, Lk, device=q.device).view(L, 1)).expand(B, 1, L, Lk)
        if attn_mask is not None:
            visible = visible & attn_mask
        weights = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)  # (B, H, L, Lk)
        return weights[..., self.S : self.S + N]

    def _infer(
        self,
        x: Tensor,
        lc: InjectedLayer | None,
        rope: tuple[Tensor, Tensor],
        cache: KVCache | None,
        layer: int,
        attn_mask: Tensor | None,
        starts: list[int] | None,
        capture: list[tuple[Tensor, Tensor]] | None,
        unread: Tensor | None,
        reads: EntryReads | None = None,
    ) -> Tensor:
        """``forward`` without gradients, in fewer operators (each costs a few microseconds, and a decoding step calls
        this 30 times): the query, key and value maps as one product (``Stacked``), queries and keys rotated (and
        normalised) together; with a state, one more product gives every head's augmented query after its rotated (and
        metric) blocks, the read gates included, and the read adapter's down maps with its scale. The same arithmetic
        as ``forward``'s training form, to within rounding. The state's small products run in ``small_products``'
        dtype (float32 on a CPU), their results cast to the model's."""
        B, L, _ = x.shape
        H, H_kv, d = self.H, self.H_kv, self.d
        qkv = self.qkv(x)  # (B, L, (H + 2·H_kv)·d): the queries, keys and values, pre-rotation
        maps = scale = tail = None
        if lc is not None:
            if not lc.maps:
                lc.maps.append(self._inference_maps(lc, x.dtype, x.device))
            maps = lc.maps[0]
            t = self.tail
            mixed = F.linear(cast(x, maps.weight.dtype), maps.weight, maps.bias)  # (B, L, H·t [+ 2r (+ 1)])
            tail = cast(mixed[..., : H * t].view(B, L, H, t).transpose(1, 2), x.dtype)  # (B, H, L, t): 1, g·x, a·x + c
            if unread is not None:  # the closed gate where a token does not read the imprint
                tail = tail.clone()
                tail[..., self.unread_at - self.w + t] += unread.to(x.dtype).view(B, 1, L) * CLOSED_GATE
            if maps.up is not None:  # the read adapter, in the rows that hold an imprint
                r2 = 2 * self.read_rank
                down = mixed[..., H * t : H * t + r2]  # (B, L, 2r)
                scale = maps.imprinted  # (B, 1, 1) where some row holds nothing, or per token (B, L, 1)
                if self.imprint_gated:  # 2·sigmoid(a_H·x + c_H): the gate's factor 2 is in the up maps
                    gate = torch.sigmoid(mixed[..., H * t + r2 :])
                    scale = gate if scale is None else scale * gate
                if scale is not None:
                    down = down * scale
                qkv = qkv + cast(F.linear(down, maps.up), x.dtype)  # the up maps' key rows are zero
        n = (H + H_kv) * d
        qk = qkv[..., :n].view(B, L, H + H_kv, d).transpose(1, 2)  # (B, H + H_kv, L, d) queries then keys
        v = qkv[..., n:].view(B, L, H_kv, d).transpose(1, 2)  # (B, H_kv, L, d)
        if capture is not None:
            capture.append((qk[:, H:], v))
        rotated = rotate(qk, *rope)
        q_rot, k_rot = rotated[:, :H] / math.sqrt(d), rotated[:, H:]  # the base scale folded into the queries
        if maps is None:  # the base model
            base: Tensor = self.o_proj(self._attend(q_rot, k_rot, v, lc, cache, layer, attn_mask, starts, reads))
            return base
        assert tail is not None
        if maps.metric_q is not None and maps.metric_k is not None and maps.neg_spectrum is not None:
            unit = F.normalize(cast(qk, maps.metric_q.dtype), dim=-1)  # unit pre-rotation queries and keys
            u = unit[:, :H].reshape(B, H_kv, H // H_kv * L, d)  # query heads grouped by their key/value head
            metric_q = cast((u @ maps.metric_q).view(B, H, L, self.mid), x.dtype)  # 2 Λ V^T u
            w_k, k_bias = metric_columns(unit[:, H:], maps.metric_k, maps.neg_spectrum)  # V^T w, -w^T M w
            q_aug = torch.cat([q_rot, metric_q, tail], dim=-1)  # (B, H, L, w)
            k_aug = torch.cat([k_rot, cast(w_k, x.dtype), cast(k_bias, x.dtype)], dim=-1)  # (B, H_kv, L, d + mid + 1)
        else:
            q_aug = torch.cat([q_rot, tail], dim=-1)
            k_aug = k_rot  # the bias column is 0: no metric
        # keys and values narrower than w: the cache writes them into its zero columns' first ones (``_attend``)
        y = self._attend(q_aug, k_aug, v, lc, cache, layer, attn_mask, starts, reads)
        out: Tensor = self.o_proj(y)
        if maps.out_down is not None and maps.out_up is not None:
            down = F.linear(cast(y, maps.out_down.dtype), maps.out_down)
            out = out + cast(F.linear(down if scale is None else down * scale, maps.out_up), x.dtype)
        return out

    def _inference_maps(self, lc: InjectedLayer, dtype: torch.dtype, device: torch.device) -> InferenceMaps:
        """``InferenceMaps`` of this layer for the turn ``lc`` conditions, for a model computing in ``dtype`` on
        ``device`` (the maps in ``small_products``' dtype): ``_query_maps``' products, the metric's three forms (V·2Λ,
        V and -Λ, as ``forward`` makes them, so that the products agree with its), the adapter's gate where not every
        row reads, and the output adapter's maps."""
        small = small_products(dtype, device)
        weight, bias, up = self._query_maps(lc.reading)
        metric_q = metric_k = neg_spectrum = None
        if lc.basis is not None and lc.spectrum is not None:
            metric_k, spectrum = lc.basis.to(small), lc.spectrum.to(small)
            metric_q, neg_spectrum = metric_k * (2.0 * spectrum).unsqueeze(-2), -spectrum.unsqueeze(-1)
        imprinted = out_down = out_up = None
        if up is not None:
            assert lc.imprinted is not None
            imprinted = None if bool((lc.imprinted == 1).all()) else lc.imprinted.to(small)
            out_down, out_up = self.imprint_read_o.down.weight.to(small), self.imprint_read_o.up.weight.to(small)
            if self.imprint_gated:  # the scale 2·sigmoid(a_H·x + c_H): its 2 taken once here, exactly (a power of two)
                up, out_up = 2.0 * up, 2.0 * out_up
            q_rows = self.H * self.d  # zero rows for the keys, so that the product adds to the stacked q, k, v at once
            up = torch.cat([up[:q_rows], up.new_zeros(self.H_kv * self.d, up.shape[1]), up[q_rows:]]).to(small)
        return InferenceMaps(weight.to(small), bias.to(small), up, metric_q, metric_k, neg_spectrum, imprinted, out_down, out_up)

    def _query_maps(self, reading: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """The maps ``_infer`` multiplies: a weight (n, C) and bias (n,) whose product with a token's input gives, per
        query head, the augmented query's tail (t columns: the bias column's 1, the read gate's g_h·x, the imprint's
        column a_h·x + c_h, zeros) and, when ``reading`` with a read adapter, its query and value down maps (2r) and
        the logit of its scale (1, with the imprint's gate); and the adapter's up maps, block-diagonal (H·d + H_kv·d,
        2r), or None. The imprint's column is 0 where no entry is read (a fresh identity's are closed anyway)."""
        H, C = self.H, self.q_proj.in_features
        t = self.tail
        column = self.unread_at - self.w + t
        ref = self.q_proj.weight
        with torch.no_grad():
            weight, bias = ref.new_zeros(H, t, C), ref.new_zeros(H, t)
            bias[:, 0] = 1.0
            if self.gated:
                weight[:, 1] = self.slot_gate.weight
            if reading and self.imprint_gated:
                weight[:, column] = self.imprint_gate.weight[:H]
                bias[:, column] = self.imprint_gate.bias[:H]
            weight, bias = weight.view(H * t, C), bias.view(H * t)
            if not (reading and self.read_rank):
                return weight, bias, None
            down, read_bias, up = self._fused_read()
            r2 = 2 * self.read_rank
            extra = torch.zeros_like(down[:, 0]) if read_bias is None else read_bias
            weight = torch.cat([weight, down[:r2], down[r2 + H :]])  # the scale's gate row after the down maps
            bias = torch.cat([bias, extra[:r2], extra[r2 + H :]])
        return weight, bias, up

    _fused: tuple[tuple[tuple[int, int], ...], tuple[Tensor, Tensor | None, Tensor]] | None = None

    def _fused_read(self) -> tuple[Tensor, Tensor | None, Tensor]:
        """The read adapter's query and value maps and the imprint's gate as two products for inference: the down maps
        and the gate stacked (2r [+ H + 1], C) with the gate's bias (zeros before it), and the up maps block-diagonal
        (H·d + H_kv·d, 2r). Made from the weights when first asked and again whenever one of them has changed."""
        downs = [self.imprint_read_q.down.weight, self.imprint_read_v.down.weight]
        ups = [self.imprint_read_q.up.weight, self.imprint_read_v.up.weight]
        gate = [self.imprint_gate.weight, self.imprint_gate.bias] if self.imprint_gated else []
        key = tuple((w.data_ptr(), w._version) for w in (*downs, *ups, *gate))
        if self._fused is None or self._fused[0] != key:
            with torch.no_grad():
                down = torch.cat([*downs, *gate[:1]])
                bias = torch.cat([down.new_zeros(2 * self.read_rank), gate[1]]) if gate else None
                up = torch.block_diag(*ups)  # type: ignore[no-untyped-call]
            self._fused = (key, (down, bias, up))
        return self._fused[1]

    def _attend_rows(self, q: Tensor, k: Tensor, v: Tensor, starts: list[int], prefix: int, mirrored: bool) -> Tensor:
        """Each row alone: its queries that are not padding against the prefix and its own key columns."""
        B, H, Lq, w = q.shape
        Lk = k.shape[2]
        y = q.new_zeros(B, H, Lq, w)
        for b, start in enumerate(starts):
            n = min(Lq, Lk - start)  # the queries at the row's own columns (padding queries stay zero)
            if n == 0:
                continue
            keys, values = own_columns(k, b, start, prefix, mirrored), own_columns(v, b, start, prefix, mirrored)
            y[b : b + 1, :, Lq - n :] = attend(q[b : b + 1, :, Lq - n :], keys, values, causal=True, enable_gqa=self.H_kv != H)
        return y


def _widened(t: Tensor, w: int) -> Tensor:
    """t (..., w') with zero columns after its own up to w."""
    return t if t.shape[-1] == w else F.pad(t, (0, w - t.shape[-1]))


def own_columns(t: Tensor, b: int, start: int, prefix: int, mirrored: bool = False) -> Tensor:
    """Row b's keys (or values) of t (B, H_kv, Lk, w) as it holds them alone: the prefix, then its columns from
    ``start`` on (``row_starts``); one view where the prefix is mirrored just before them (``KVCache.mirrored``)."""
    row = t[b : b + 1]
    if mirrored or start == prefix or prefix == 0:
        return row[:, :, start - prefix :]
    return torch.cat([row[:, :, :prefix], row[:, :, start:]], dim=2)


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

    def rotate_half(t: Tensor) -> Tensor:  # RoPE's rotate-half form, written out
        return t * cos + torch.cat([-t[..., d // 2 :], t[..., : d // 2]], dim=-1) * sin

    q = attn.q_proj(x).view(B, L, H, d).transpose(1, 2)  # (B, H, L, d)
    k = attn.k_proj(x).view(B, L, H_kv, d).transpose(1, 2).repeat_interleave(G, dim=1)  # (B, H, L, d)
    v = attn.v_proj(x).view(B, L, H_kv, d).transpose(1, 2).repeat_interleave(G, dim=1)
    base = rotate_half(q) @ rotate_half(k).transpose(-1, -2) / math.sqrt(d)  # (B, H, L, L)
    if lc.metric is not None:
        metric = lc.metric.repeat_interleave(G, dim=1)  # (B, H, d, d) as the layer carries it
        diff = F.normalize(q, dim=-1).unsqueeze(3) - F.normalize(k, dim=-1).unsqueeze(2)  # (B, H, L, L, d)
        base = base - torch.einsum("bhijd,bhde,bhije->bhij", diff, metric, diff)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    base = base.masked_fill(~causal, float("-inf"))
    S = attn.S
    k_s = attn.self_key(s).view(B, H_kv, S, d).repeat_interleave(G, dim=1)  # (B, H, S, d)
    energy = s.square().mean(-1)  # (B,)
    gate = torch.where(energy > 0, energy.clamp_min(1e-30).log(), torch.full_like(energy, CLOSED_GATE))
    q_rot = rotate_half(q)
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
