"""The training-only read-out: it names each stated fact from the self state alone, giving the write a gradient
from the first step (against state collapse). Kept beside a training checkpoint, never shipped."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn

from sia.learn.adapter import facts

__all__ = ["READOUT_FILE", "ReadOut"]

READOUT_FILE = "readout.safetensors"  # beside a training checkpoint (a run's last/)


class ReadOut(nn.Module):
    """Training only: per fact kind, a linear classifier of the self state over that kind's training values.

    The states are standardised first, so that what tells users apart is what counts, at any scale. With ``momentum``
    null, across the rows of each call: a turn at which few episodes of the batch are still playing then gives a noisy
    standardisation, one episode alone a zero input, and the write no signal. With a momentum (the shipped recipe's),
    by running first and second moments of the states, moved by that share at every training call: one row is read
    as well as many."""

    def __init__(self, d_self: int, momentum: float | None = None) -> None:
        super().__init__()
        if momentum is not None and not 0 < momentum <= 1:
            raise ValueError(f"the read-out's momentum must be in (0, 1] or None; got {momentum}")
        self.heads = nn.ModuleDict({kind: nn.Linear(d_self, len(facts.values(kind, "train"))) for kind in facts.KINDS})
        self.index = {kind: {v: i for i, v in enumerate(facts.values(kind, "train"))} for kind in facts.KINDS}
        self.momentum = momentum
        self.moments: Tensor
        self.updates: Tensor
        self.register_buffer("moments", torch.zeros(2, d_self))  # running mean of s and of s², per feature
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))  # 0: no running moments (standardise per call)

    @classmethod
    def saved(cls, path: str | Path, d_self: int) -> ReadOut:
        """The read-out saved at ``path``, for self states of ``d_self`` features."""
        readout = cls(d_self)
        readout.load(path)
        return readout

    def standardise(self, s: Tensor, update: bool = False) -> Tensor:
        """s (N, d_s) standardised per feature: by the running moments where there are any (moved first, with
        ``update`` and a momentum), else across the N rows."""
        s = s.float()
        if update and self.momentum is not None:
            with torch.no_grad():
                share = 1.0 if int(self.updates) == 0 else self.momentum
                self.moments.lerp_(torch.stack([s.mean(0), (s * s).mean(0)]), share)
                self.updates += 1
        if int(self.updates) > 0:
            mean, square = self.moments[0], self.moments[1]
            return (s - mean) / ((square - mean * mean).clamp_min(0).sqrt() + 1e-3)
        return (s - s.mean(0)) / (s.std(0) + 1e-3) if s.shape[0] > 1 else s

    def loss(self, s: Tensor, stated: list[facts.Fact], update: bool = False) -> tuple[Tensor, float]:
        """s (N, d_s): row i should name stated[i]'s value; mean cross-entropy over rows, and the share named right.
        ``update``: a training call, which moves the running moments (with a momentum). The rows of one kind are
        read together and the share is counted on the device: one host read per call, not one per row."""
        s = self.standardise(s, update)
        total, right = s.new_zeros(()), s.new_zeros((), dtype=torch.long)
        for kind in dict.fromkeys(fact.kind for fact in stated):
            rows = [i for i, fact in enumerate(stated) if fact.kind == kind]
            picked = s[torch.tensor(rows, device=s.device)]
            targets = torch.tensor([self.index[kind][stated[i].value] for i in rows], device=s.device)
            logits = self.heads[kind](picked)
            total = total + F.cross_entropy(logits, targets, reduction="sum")
            right = right + (logits.argmax(-1) == targets).sum()
        return total / len(stated), int(right) / len(stated)

    def load(self, path: str | Path) -> None:
        """The read-out saved at ``path``; one saved before running moments existed standardises per call."""
        tensors = load_file(str(path))
        if any(key.startswith("spell.") for key in tensors):
            raise ValueError(f"the read-out at {path} reads names and cities as tokens, which this trainer no longer does")
        if "moments" not in tensors:
            tensors = {**tensors, "moments": torch.zeros_like(self.moments), "updates": torch.zeros_like(self.updates)}
        self.load_state_dict(tensors)
