"""Attention maps recomputed from a model's own inputs with the reference formula of sia.model.attention."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from sia.identity.state import Dynamics
from sia.learn.native.episodes import EncodedTurn, StateBatch, batch_turns, forward_turn
from sia.learn.native.play import cat_states, model_device
from sia.model.native import LayerConditioning, SIAModel, TraceAttention
from sia.model.tokenizer import ByteTokenizer

# ---------------------------------------------------------------------------------------------------------
# 5. Attention maps
# ---------------------------------------------------------------------------------------------------------


@dataclass
class AttentionCapture:
    """One TraceAttention call: its normalised input, the turn's conditioning, and its output (after o_proj)."""

    x: Tensor  # (B, L, C)
    lc: LayerConditioning
    output: Tensor  # (B, L, C)


@contextmanager
def capture_attention(model: SIAModel) -> Iterator[list[AttentionCapture]]:
    """Within the block, every TraceAttention forward appends an AttentionCapture (layer order per forward)."""
    captures: list[AttentionCapture] = []

    def hook(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        captures.append(AttentionCapture(args[0].detach(), args[1], output.detach()))

    handles = [attn.register_forward_hook(hook) for attn in model.attentions if isinstance(attn, TraceAttention)]
    try:
        yield captures
    finally:
        for handle in handles:
            handle.remove()


def attention_weights(attn: TraceAttention, capture: AttentionCapture) -> Tensor:
    """Attention weights (B, H, L, 1 + L) by the reference formula; key 0 is the self slot, key j + 1 token j.

    weight_ij = softmax_j(-(q_i - k_j)^T M (q_i - k_j)) with raw q = W_q x + b_q, k = W_k x + b_k, the
    slot's raw key W_ks s + b_ks (the first d columns of the augmented slot key) and M the stabilised metric;
    query i sees the slot and tokens 0..i. For one unpadded row this is exactly what the fast form computes.
    """
    x, lc = capture.x, capture.lc
    B, L, _ = x.shape
    H, d = attn.n_head, attn.d
    q = attn.q_proj(x).view(B, L, H, d).transpose(1, 2)  # (B, H, L, d)
    k = attn.k_proj(x).view(B, L, H, d).transpose(1, 2)
    keys = torch.cat([lc.slot_key[..., :d], k], dim=2)  # (B, H, 1+L, d)
    diff = (q.unsqueeze(3) - keys.unsqueeze(2)).double()  # (B, H, L, 1+L, d)
    dist = torch.einsum("bhijd,bhde,bhije->bhij", diff, lc.metric.double(), diff)  # (B, H, L, 1+L)
    visible = torch.ones(L, L + 1, dtype=torch.bool, device=x.device).tril(diagonal=1)
    return torch.softmax((-dist).masked_fill(~visible, float("-inf")), dim=-1).to(x.dtype)


def probe_attention_maps(model: SIAModel, turn: EncodedTurn, state: StateBatch) -> Tensor:
    """(2, n_layer, H, L, 1+L): the turn under a fresh state (row 0) and under ``state`` (row 1)."""
    tok = ByteTokenizer()
    device = model_device(model)
    states = cat_states([StateBatch.fresh(model.config, 1, device), state])
    batch = batch_turns([turn, turn], pad_id=tok.pad_id, device=device)
    with capture_attention(model) as captures:
        forward_turn(model, batch, states, Dynamics.from_config(model.config))
    traces = [a for a in model.attentions if isinstance(a, TraceAttention)]
    return torch.stack([attention_weights(a, c) for a, c in zip(traces, captures, strict=True)], dim=1)
