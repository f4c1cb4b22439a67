"""Shock: how surprising a user's message is to this identity, relative to what is usual for it.

    nll_t   = mean over the message's tokens of -log p(token | context, current state)
    Shock_t = clip((nll_t - mu) / sigma, -clip, clip)

mu and sigma pool the identity's running statistics (count n, mean, M2) with a prior of weight n0
(config.shock_prior_mean / _std / _weight), so the first turns, with no history, are measured against the
prior rather than divided by an empty variance. A user who always writes oddly raises mu and stops
shocking the persona. See docs/attention.md, "Shock".
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.identity.state import ShockStats
from sia.model.config import AnyConfig

__all__ = ["message_nll", "pooled_moments", "standardise", "standardised_shock"]


def message_nll(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Mean token NLL per row over the masked targets.

    logits (B, L, V) predict targets (B, L); mask (B, L) selects the message's tokens. Rows with an empty
    mask raise ValueError: a message without tokens has no surprise to measure.
    """
    if logits.shape[:2] != targets.shape or targets.shape != mask.shape:
        raise ValueError(
            "logits (B, L, V), targets and mask (B, L) disagree: "
            f"{tuple(logits.shape)}, {tuple(targets.shape)}, {tuple(mask.shape)}"
        )
    counts = mask.sum(dim=1)  # (B,)
    if bool((counts == 0).any()):
        raise ValueError("every row needs at least one message token to measure shock")
    nll = F.cross_entropy(logits.transpose(1, 2).float(), targets, reduction="none")  # (B, L)
    return (nll * mask).sum(dim=1) / counts


def _pooled(count: Tensor, mean: Tensor, m2: Tensor, config: AnyConfig) -> tuple[Tensor, Tensor]:
    n0, mu0, var0 = config.shock_prior_weight, config.shock_prior_mean, config.shock_prior_std**2
    total = n0 + count
    pooled_mean = (n0 * mu0 + count * mean) / total
    # pooled sum of squares: the prior's, the sample's, and the spread between the two means
    ss = n0 * var0 + m2 + (n0 * count / total) * (mean - mu0) ** 2
    return pooled_mean, (ss / total).sqrt()


def standardise(nll: Tensor, count: Tensor, mean: Tensor, m2: Tensor, config: AnyConfig) -> Tensor:
    """Batched shock: every argument (B,); the statistics are those before this message."""
    pooled_mean, pooled_std = _pooled(count, mean, m2, config)
    return ((nll - pooled_mean) / pooled_std).clamp(-config.shock_clip, config.shock_clip)


def _stats_tensors(stats: ShockStats) -> tuple[Tensor, Tensor, Tensor]:
    return (
        torch.tensor([float(stats.count)], dtype=torch.float64),
        torch.tensor([stats.mean], dtype=torch.float64),
        torch.tensor([stats.m2], dtype=torch.float64),
    )


def pooled_moments(stats: ShockStats, config: AnyConfig) -> tuple[float, float]:
    """Mean and standard deviation of the identity's NLL, pooled with the prior (weight n0)."""
    mean, std = _pooled(*_stats_tensors(stats), config)
    return float(mean), float(std)


def standardised_shock(nll: float, stats: ShockStats, config: AnyConfig) -> float:
    """Standardise one message's NLL against the identity's statistics *before* this message."""
    if not math.isfinite(nll):
        raise ValueError(f"nll must be finite; got {nll}")
    return float(standardise(torch.tensor([nll], dtype=torch.float64), *_stats_tensors(stats), config))
