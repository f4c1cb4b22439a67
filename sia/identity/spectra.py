"""Spectra of a trace: what the inspector, the plots and the evaluation reports show of T.

The trace T is not symmetric; the metric reads its symmetric part, so its spectrum is eig sym(T), with
sym(T) = (T + Tᵀ) / 2. The metric M(T) divided by its base c has eigenvalues in [1 - rho, 1 + rho].
"""

from __future__ import annotations

import torch
from torch import Tensor

from sia.identity.state import stabilised_metric
from sia.model.config import AnyConfig

__all__ = ["spectral_entropy", "trace_eigenvalues"]


def trace_eigenvalues(trace: Tensor, config: AnyConfig) -> tuple[Tensor, Tensor]:
    """trace (..., d, d) -> (eig sym(T), eig M(T) / c), each (..., d), ascending, float64."""
    t = trace.double()
    sym = 0.5 * (t + t.transpose(-1, -2))  # (..., d, d)
    metric = stabilised_metric(trace, config).double() / config.metric_base
    return torch.linalg.eigvalsh(sym), torch.linalg.eigvalsh(metric)


def spectral_entropy(eigenvalues: Tensor) -> Tensor:
    """(..., d) eigenvalues -> (...) entropy in nats of p = |lambda| / sum |lambda|; 0 where all are 0."""
    magnitude = eigenvalues.abs().double()
    total = magnitude.sum(-1, keepdim=True)  # (..., 1)
    p = magnitude / total.clamp_min(torch.finfo(torch.float64).tiny)
    terms = torch.where(p > 0, -p * torch.log(p.clamp_min(torch.finfo(torch.float64).tiny)), torch.zeros_like(p))
    return terms.sum(-1)
