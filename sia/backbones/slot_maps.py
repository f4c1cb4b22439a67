"""A layer's maps from the self state to its self slots' keys and values: a full matrix, or one of low rank (the
shipped adapter's, ``config.slot_rank``), and their random initialisation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["LowRank", "init_slot_map", "slot_map"]


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
