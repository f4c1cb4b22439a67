"""What the admin API shows of one identity: the spectra of its trace, and a PNG of how it got there.

Notation: n_layer layers, H heads, d query/key width (config.qk_dim), d_s self-state width, V retained versions.

Per layer and head the trace T (d, d) is summarised by
    ||T||_F                                the Frobenius norm: how much the identity has accumulated there
    eig sym(T), sym(T) = (T + T^T) / 2     ascending; the signed directions the attention metric bends
    eig M(T) / c                           the metric attention uses, in [1 - rho, 1 + rho] (sia.identity.state)
    H = -sum_i p_i ln p_i, p_i = |lambda_i| / sum_j |lambda_j|   over the eigenvalues of sym(T)
The spectral entropy H is 0 when one direction holds everything and ln d when all directions are equal;
a zero trace has none (0 by convention). docs/api-admin.md explains how to read them.

The figure is drawn with matplotlib's object API on the Agg canvas (no pyplot and its global state), so
routes may draw in worker threads concurrently.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sia.identity.spectra import spectral_entropy, trace_eigenvalues
from sia.identity.state import IdentityState
from sia.model.config import AnyConfig

__all__ = ["StateSummary", "TraceSpectrum", "describe_state", "draw_identity", "head_spectra"]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class StateSummary:
    """The numbers the admin API reports for one state."""

    turns: int  # the state's own counter
    self_state: list[float]
    self_norm: float  # ||s||_2
    heads: list[TraceSpectrum]  # layer-major
    imprint_used: int  # imprint entries (tokens) filled
    imprint_capacity: int  # imprint entries in all (0: the model keeps no imprint)


@dataclass(frozen=True)
class TraceSpectrum:
    """The spectra of one layer and head's trace."""

    layer: int
    head: int
    trace_norm: float  # ||T||_F
    eigenvalues: list[float]  # eig sym(T), ascending
    metric_eigenvalues: list[float]  # eig M(T) / c, ascending, in [1 - rho, 1 + rho]
    spectral_entropy: float  # of |eig sym(T)| normalised to sum 1, in nats, in [0, ln d]


def head_spectra(state: IdentityState, config: AnyConfig) -> list[TraceSpectrum]:
    """One TraceSpectrum per layer and head, layer-major."""
    eigs, metric_eigs = trace_eigenvalues(state.trace, config)
    norms = torch.linalg.matrix_norm(state.trace.double())  # (n_layer, H)
    entropy = spectral_entropy(eigs)  # (n_layer, H)
    return [
        TraceSpectrum(
            layer=layer,
            head=head,
            trace_norm=float(norms[i, head]),
            eigenvalues=eigs[i, head].tolist(),
            metric_eigenvalues=metric_eigs[i, head].tolist(),
            spectral_entropy=float(entropy[i, head]),
        )
        for i, layer in enumerate(config.trace_layer_ids)
        for head in range(config.trace_shape[1])
    ]


def describe_state(state: IdentityState, config: AnyConfig) -> StateSummary:
    """The numbers the admin API reports for ``state``: its counter, its self state, every head's spectra and how
    full its imprint is."""
    return StateSummary(
        turns=state.turns,
        self_state=state.self_state.tolist(),
        self_norm=float(torch.linalg.vector_norm(state.self_state.double())),
        heads=head_spectra(state, config),
        imprint_used=0 if state.imprint is None else state.imprint.used,
        imprint_capacity=config.imprint_tokens if state.imprint is None else state.imprint.capacity,
    )


def draw_identity(
    title: str, versions: Sequence[tuple[int, IdentityState]], shocks: Sequence[tuple[int, float]], config: AnyConfig
) -> bytes:
    """Four panels as PNG bytes: eig sym(T) of the last state (rows layer x head, columns ascending
    eigenvalues); ||T||_F per head over the versions; the self state over the versions; shock per turn."""
    assert versions, "need at least the current state"
    numbers = [v for v, _ in versions]
    last = versions[-1][1]
    n_layer, n_head, d, _ = config.trace_shape
    eigs = trace_eigenvalues(last.trace, config)[0].reshape(n_layer * n_head, d)  # (trace layers * heads, d)
    norms = torch.stack([torch.linalg.matrix_norm(s.trace.double()) for _, s in versions])  # (V, n_layer, H)
    selves = torch.stack([s.self_state for _, s in versions])  # (V, d_s)

    fig = Figure(figsize=(12, 8), dpi=80)
    FigureCanvasAgg(fig)
    (ax_eig, ax_norm), (ax_self, ax_shock) = fig.subplots(2, 2)

    bound = max(float(eigs.abs().max()), 1e-12)
    image = ax_eig.imshow(eigs.numpy(), aspect="auto", cmap="RdBu_r", vmin=-bound, vmax=bound, interpolation="nearest")
    rows = [f"L{layer}H{head}" for layer in config.trace_layer_ids for head in range(n_head)]
    step = max(1, math.ceil(len(rows) / 32))
    ax_eig.set_yticks(range(0, len(rows), step), rows[::step], fontsize=7)
    ax_eig.set_xlabel("eigenvalue index (ascending)")
    ax_eig.set_title("eigenvalues of sym(T), current state", fontsize=10)
    fig.colorbar(image, ax=ax_eig, fraction=0.04)

    for i, layer in enumerate(config.trace_layer_ids):
        for head in range(n_head):
            ax_norm.plot(numbers, norms[:, i, head].numpy(), marker=".", linewidth=1, label=f"L{layer}H{head}")
    ax_norm.set_xlabel("state version")
    ax_norm.set_ylabel("||T||_F")
    ax_norm.set_title("trace norm per layer and head over retained versions", fontsize=10)
    if n_layer * n_head <= 16:
        ax_norm.legend(fontsize=6, ncol=4)
    ax_norm.grid(alpha=0.3)

    for i in range(selves.shape[1]):
        ax_self.plot(numbers, selves[:, i].numpy(), marker=".", linewidth=1, label=f"s[{i}]")
    ax_self.set_ylim(-1.05, 1.05)
    ax_self.set_xlabel("state version")
    ax_self.set_ylabel("self-state component")
    ax_self.set_title("self state over retained versions", fontsize=10)
    if selves.shape[1] <= 16:
        ax_self.legend(fontsize=6, ncol=4)
    ax_self.grid(alpha=0.3)

    if shocks:
        ax_shock.plot([i for i, _ in shocks], [s for _, s in shocks], marker="o", markersize=3, linewidth=1)
    else:
        ax_shock.text(0.5, 0.5, "no turns yet", ha="center", va="center", transform=ax_shock.transAxes)
    ax_shock.axhline(0, color="grey", linewidth=0.8)
    ax_shock.set_xlabel("turn")
    ax_shock.set_ylabel("standardised shock")
    ax_shock.set_title("shock per turn", fontsize=10)
    ax_shock.grid(alpha=0.3)

    for ax in (ax_norm, ax_self, ax_shock):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    data = out.getvalue()
    assert data.startswith(PNG_MAGIC)
    return data
