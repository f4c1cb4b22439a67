"""The memory evaluation's plots (``sia eval`` for a pretrained backbone): recall by depth, the self state over an
episode, the trace spectra after it, the training curves."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sia.backbones.llama import LlamaModel
from sia.identity.spectra import trace_eigenvalues
from sia.learn.adapter import facts
from sia.learn.adapter.unroll import Carry

__all__ = ["plot_recall", "plot_self_state", "plot_spectra", "plot_training"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_recall(by_depth: list[dict[str, Any]], path: Path, conditions: Sequence[str], target: float) -> None:
    """Recall per fact by depth under each of ``conditions``, chance, and the per-fact ``target``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    depths = [f["depth"] for f in by_depth]
    for name in conditions:
        ax.plot(depths, [f[name]["per_fact"] for f in by_depth], marker="o", label=name.replace("_", " "))
    ch = [f["chance"]["per_fact"] for f in by_depth]
    ax.plot(depths, ch, "k--", label="chance")
    ax.axhline(target, color="grey", lw=0.5)
    ax.set(
        xlabel="unrelated turns between statement and question",
        ylabel="recall per fact",
        ylim=(0, 1),
    )
    ax.set_xscale("symlog", linthresh=1)  # logarithmic from 1 turn on, and 0 (right after the statement) beside it
    ax.set_xticks(depths)
    ax.set_xticklabels([str(d) for d in depths])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_self_state(states: list[Carry], episode: facts.Episode, row: int, path: Path) -> None:
    plt = _pyplot()
    selves = torch.stack([c.self_state[row] for c in states[: len(episode.turns)]]).float().cpu()  # (turns, d_s)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    image = ax.imshow(selves.T.numpy(), aspect="auto", cmap="coolwarm", vmin=-1, vmax=1, interpolation="nearest")
    ax.set(xlabel="turn", ylabel="self-state dimension", title=f"self state over an episode (facts at turn {episode.stated_at})")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_spectra(model: LlamaModel, carry: Carry, row: int, path: Path) -> None:
    plt = _pyplot()
    trace = carry.trace[row].float().cpu()  # (n_trace, heads, d, d)
    eig = trace_eigenvalues(trace, model.config)[0].flip(-1)[:, 0]  # (n_trace, d) eig sym(T), first head, largest first
    fig, ax = plt.subplots(figsize=(7, 3.5))
    image = ax.imshow(eig.numpy(), aspect="auto", cmap="magma", interpolation="nearest")
    ax.set(xlabel="eigenvalue index (largest first)", ylabel="trace layer", title="trace spectra after an episode")
    ax.set_yticks(range(len(model.trace_layers)), [str(i) for i in model.trace_layers])
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_training(history: Path, path: Path) -> None:
    plt = _pyplot()
    records = [json.loads(line) for line in history.read_text().splitlines() if line.strip()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    steps = [r["step"] for r in records]
    for key in ("answer", "readout", "distill"):
        points = [(r["step"], r[key]) for r in records if r.get(key)]
        if points:
            left.plot(*zip(*_smooth(points), strict=True), label=key)
    left.set(xlabel="step", ylabel="loss (smoothed)")
    left.legend()
    evals = [(r["step"], r["heldout"]["per_fact"], r["heldout"]["all"]) for r in records if "heldout" in r]
    if evals:
        right.plot([e[0] for e in evals], [e[1] for e in evals], marker="o", label="held-out per fact")
        right.plot([e[0] for e in evals], [e[2] for e in evals], marker="o", label="held-out all three")
    right.plot(steps, [r["max_between"] / 10 for r in records], "k:", label="curriculum turns / 10")
    right.set(xlabel="step", ylim=(0, 1))
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _smooth(points: list[tuple[float, float]], width: int = 20) -> list[tuple[float, float]]:
    out = []
    for i in range(len(points)):
        window = points[max(0, i - width + 1) : i + 1]
        out.append((points[i][0], sum(v for _, v in window) / len(window)))
    return out
