"""The sums a forward pass accumulates over a turn's counted tokens, from which the model reads the turn summary
(``IdentityModel.summarize``) that updates the identity state: merged across chunks and batch rows exactly, so the
summary needs no second pass over the turn.

Notation: B batch, n_layer the layers whose input is summed (a LLaMA backbone: its trace layers), C residual width,
K memory tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

__all__ = ["SummarySums"]


@dataclass
class SummarySums:
    """Mergeable sums from which the turn summary is read, so it needs no second pass.

    The pooled hidden state z is a softmax-weighted mean over counted tokens, z = sum_i e^{a_i} x_i / sum_i e^{a_i},
    kept in online-softmax form (running max, normaliser, weighted sum) so chunks merge exactly. With mean
    pooling every score a_i is 0 and z is the plain mean.
    """

    layer_inputs: Tensor  # (B, n_layer, C) sum of each attention's normalised input over counted tokens
    hidden: Tensor  # (B, C) sum of e^{a_i - pool_max} x_i over counted tokens (x: final normalised hidden state)
    count: Tensor  # (B,) tokens counted
    pool_max: Tensor  # (B,) running maximum of the pooling scores a_i
    pool_norm: Tensor  # (B,) sum of e^{a_i - pool_max}

    def __add__(self, other: SummarySums) -> SummarySums:
        top = torch.maximum(self.pool_max, other.pool_max)
        mine, theirs = torch.exp(self.pool_max - top), torch.exp(other.pool_max - top)  # (B,)
        merged = SummarySums(
            self.layer_inputs + other.layer_inputs,
            self.hidden * mine.unsqueeze(-1) + other.hidden * theirs.unsqueeze(-1),
            self.count + other.count,
            top,
            self.pool_norm * mine + other.pool_norm * theirs,
        )
        # a row to which ``other`` adds no token (a row that has stopped, decoding beside others) keeps its sums as
        # they are, bit for bit: the merge would rescale them to another running maximum, the same sums rounded anew
        empty = other.count == 0  # (B,); chosen on the device, with no wait for the host at a decoding step
        kept = [
            torch.where(empty.view(-1, *[1] * (t.dim() - 1)), getattr(self, f.name), t)
            for f, t in zip(fields(self), (getattr(merged, f.name) for f in fields(self)), strict=True)
        ]
        return SummarySums(*kept)

    def row(self, b: int) -> SummarySums:
        return SummarySums(*(getattr(self, f.name)[b : b + 1] for f in fields(self)))

    def with_row(self, b: int, row: SummarySums) -> SummarySums:
        """These sums with row ``b`` replaced by ``row``'s (one row)."""
        mine = [getattr(self, f.name) for f in fields(self)]
        theirs = [getattr(row, f.name) for f in fields(self)]
        return SummarySums(*(torch.cat([t[:b], r, t[b + 1 :]]) for t, r in zip(mine, theirs, strict=True)))

    def written_by(self, memory: Tensor) -> SummarySums:
        """These sums with z = [the memory tokens' final hidden states (B, K, C); the pooled hidden state], flat."""
        B = memory.shape[0]
        z = torch.cat([memory.reshape(B, -1), self.hidden / self.pool_norm.unsqueeze(-1)], dim=-1)  # (B, (K+1)·C)
        ones = z.new_ones(B)
        return SummarySums(self.layer_inputs, z, self.count, torch.zeros_like(ones), ones)

    @staticmethod
    def cat(parts: list[SummarySums]) -> SummarySums:
        """Stack per-row stats back into one batch."""
        return SummarySums(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(SummarySums)))
