"""The evaluation's figures (matplotlib, Agg): attention maps, self-state trajectory, spectra, shocks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sia.identity.spectra import trace_eigenvalues
from sia.learn.native.attention_maps import probe_attention_maps
from sia.learn.native.corpus import Episode
from sia.learn.native.episodes import EncodedTurn
from sia.learn.native.play import encode_episodes, play_episodes
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer

PLOT_FILES = {
    "attention": "attention.png",
    "self_state": "self_state.png",
    "trace_spectra": "trace_spectra.png",
    "shocks": "shocks.png",
}


# ---------------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _token_label(token: int) -> str:
    names = {ByteTokenizer.pad_id: "pad", ByteTokenizer.user_id: "U", ByteTokenizer.assistant_id: "A", ByteTokenizer.end_id: "E"}
    if token in names:
        return f"<{names[token]}>"
    char = bytes([token]).decode("latin-1")
    return "␣" if char == " " else char if char.isprintable() else f"x{token:02x}"


def _label_axis(set_ticks: Any, set_labels: Any, labels: Sequence[str], *, most: int = 64, **style: Any) -> None:
    """Tick labels for a heatmap axis, thinned to at most ``most`` (the 'self' column is always labelled)."""
    step = max(1, math.ceil(len(labels) / most))
    ticks = [0, *range(step, len(labels), step)] if step > 1 else list(range(len(labels)))
    set_ticks(ticks)
    set_labels([labels[i] for i in ticks], **style)


def _plot_attention(maps: Tensor, turn: EncodedTurn, path: Path, title: str) -> None:
    """Heatmaps, head 0, of layer 0 and the last layer: fresh, accumulated, and their difference.

    Rows are the queries that predict the reply (from <|assistant|> on), columns the keys: 'self', then tokens.
    """
    plt = _pyplot()
    n_layer = maps.shape[1]
    layers = sorted({0, n_layer - 1})
    first, last = turn.reply_start - 1, len(turn.ids) - 1
    rows = slice(first, last)
    xlabels = ["self", *(_token_label(t) for t in turn.ids)]
    ylabels = [_token_label(t) for t in turn.ids[rows]]
    fig, axes = plt.subplots(len(layers), 3, figsize=(22, 4.5 * len(layers)), squeeze=False)
    for r, layer in enumerate(layers):
        fresh = maps[0, layer, 0, rows].cpu().numpy()
        accumulated = maps[1, layer, 0, rows].cpu().numpy()
        diff = accumulated - fresh
        bound = max(float(abs(diff).max()), 1e-12)
        top = max(float(fresh.max()), float(accumulated.max()), 1e-12)
        panels = (
            ("fresh state", fresh, "viridis", 0.0, top),
            ("accumulated state", accumulated, "viridis", 0.0, top),
            ("accumulated - fresh", diff, "RdBu_r", -bound, bound),
        )
        for c, (name, values, cmap, lo, hi) in enumerate(panels):
            ax = axes[r][c]
            image = ax.imshow(values, aspect="auto", cmap=cmap, vmin=lo, vmax=hi, interpolation="nearest")
            ax.set_title(f"layer {layer}, head 0: {name}", fontsize=9)
            _label_axis(ax.set_xticks, ax.set_xticklabels, xlabels, fontsize=4, rotation=90)
            _label_axis(ax.set_yticks, ax.set_yticklabels, ylabels, fontsize=5)
            ax.set_xlabel("key (self slot, then tokens)", fontsize=8)
            ax.set_ylabel("query (reply)", fontsize=8)
            fig.colorbar(image, ax=ax, fraction=0.03, format="%.1e" if c == 2 else None)
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.04, right=0.96, bottom=0.1, top=0.9, wspace=0.2, hspace=0.35)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _mark_turns(ax: Any, episode: Episode) -> None:
    """On a 'turns played' axis: shade each shock turn (played between x = t and t + 1) and draw a dotted
    line at each probe turn's entering state (x = t)."""
    for t, turn in enumerate(episode.turns):
        if turn.shock:
            ax.axvspan(t, t + 1, color="red", alpha=0.08)
    for probe in episode.probes:
        ax.axvline(probe.turn, color="green", linestyle=":", alpha=0.6)


def _plot_self_state(selves: Tensor, episode: Episode, path: Path) -> None:
    """Each self-state component after each turn (x = 0 is the fresh identity)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    x = list(range(selves.shape[0]))
    for i in range(selves.shape[1]):
        ax.plot(x, selves[:, i].cpu().numpy(), marker="o", markersize=3, linewidth=1, label=f"s[{i}]")
    _mark_turns(ax, episode)
    ax.set_xlabel("turns played (0 = fresh)")
    ax.set_ylabel("self-state component")
    ax.set_ylim(-1.05, 1.05)
    ax.set_title(f"self state over one episode ({episode.persona}); red: shock turns, dotted: probes", fontsize=9)
    if selves.shape[1] <= 16:
        ax.legend(fontsize=6, ncol=4)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_spectra(trace_eigs: Tensor, metric_eigs: Tensor, rho: float, episode: Episode, path: Path) -> None:
    """Per layer: min/mean/max eigenvalue of sym(T) (top) and of M / c (bottom) for each head, over the turns."""
    plt = _pyplot()
    turns, n_layer, n_head = trace_eigs.shape[0], trace_eigs.shape[1], trace_eigs.shape[2]
    x = list(range(turns))
    fig, axes = plt.subplots(2, n_layer, figsize=(3.6 * n_layer, 6), squeeze=False, sharex=True)
    for layer in range(n_layer):
        for row, (eigs, name) in enumerate(((trace_eigs, "eig sym(T)"), (metric_eigs, "eig M / c"))):
            ax = axes[row][layer]
            for h in range(n_head):
                e = eigs[:, layer, h].cpu().numpy()
                (line,) = ax.plot(x, e.mean(-1), linewidth=1, label=f"head {h}")
                ax.fill_between(x, e.min(-1), e.max(-1), color=line.get_color(), alpha=0.15)
            if row == 1:
                ax.axhline(1 - rho, color="grey", linestyle="--", linewidth=0.8)
                ax.axhline(1 + rho, color="grey", linestyle="--", linewidth=0.8)
                ax.set_xlabel("turns played")
            _mark_turns(ax, episode)
            ax.set_title(f"layer {layer}: {name}", fontsize=9)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.suptitle("trace and metric spectra over one episode (line: mean, band: min to max; red: shock turns)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_shocks(episodes: Sequence[Episode], indices: Sequence[int], shocks: Sequence[Sequence[float]], path: Path) -> None:
    """Shock per turn for a few episodes; designed shock turns (ScriptedTurn.shock) are marked with a red cross."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, episode, values in zip(indices, episodes, shocks, strict=True):
        (line,) = ax.plot(
            range(len(values)), values, marker="o", markersize=3, linewidth=1, label=f"episode {i} ({episode.persona})"
        )
        marked = [t for t, turn in enumerate(episode.turns) if turn.shock]
        ax.scatter(marked, [values[t] for t in marked], marker="x", s=70, color="red", zorder=3)
        line.set_alpha(0.8)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("turn")
    ax.set_ylabel("standardised shock")
    ax.set_title("shock per turn (red x: shock turns of the corpus)", fontsize=9)
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_episode(episodes: Sequence[Episode]) -> int:
    """The episode the per-episode plots follow: the longest, preferring one with a shock turn, then probes."""
    return max(
        range(len(episodes)),
        key=lambda i: (len(episodes[i].turns), any(t.shock for t in episodes[i].turns), len(episodes[i].probes), -i),
    )


def plot_all(model: SIAModel, episodes: Sequence[Episode], shocks: Sequence[Sequence[float]], out_dir: Path) -> dict[str, Any]:
    """All four plots; returns the data behind the per-episode ones."""
    index = _plot_episode(episodes)
    episode = episodes[index]
    encoded = encode_episodes(model, [episode], transcript=False)[0]
    capture = frozenset((0, t) for t in range(len(encoded) + 1))
    play = play_episodes(model, [encoded], capture=capture)
    states = [play.captured[(0, t)] for t in range(len(encoded) + 1)]
    selves = torch.cat([s.self_state for s in states])  # (turns + 1, d_s)
    traces = torch.cat([s.trace for s in states])  # (turns + 1, n_layer, H, d, d)
    trace_eigs, metric_eigs = trace_eigenvalues(traces, model.config)
    _plot_self_state(selves, episode, out_dir / PLOT_FILES["self_state"])
    _plot_spectra(trace_eigs, metric_eigs, model.config.metric_max_deform, episode, out_dir / PLOT_FILES["trace_spectra"])

    probe = episode.probes[0] if episode.probes else None
    t = probe.turn if probe is not None else len(encoded) - 1
    maps = probe_attention_maps(model, encoded[t], states[t])
    slot_mass = maps[:, :, :, :, 0].mean(dim=(2, 3))  # (2, n_layer): mean attention on the self slot
    title = f"episode {index} ({episode.persona}), turn {t}" + (f": probe of {probe.fact!r}" if probe else "")
    _plot_attention(maps, encoded[t], out_dir / PLOT_FILES["attention"], title)

    with_shock = [i for i, e in enumerate(episodes) if any(turn.shock for turn in e.turns)]
    shown = (with_shock + [i for i in range(len(episodes)) if i not in with_shock])[:5]
    _plot_shocks([episodes[i] for i in shown], shown, [shocks[i] for i in shown], out_dir / PLOT_FILES["shocks"])
    return {
        "episode": index,
        "attention_turn": t,
        "self_slot_attention": {"fresh": slot_mass[0].tolist(), "accumulated": slot_mass[1].tolist()},
        "self_state": selves.tolist(),
        "trace_eig_min": trace_eigs.amin(dim=(1, 2, 3)).tolist(),
        "trace_eig_max": trace_eigs.amax(dim=(1, 2, 3)).tolist(),
        "metric_eig_over_c_min": metric_eigs.amin(dim=(1, 2, 3)).tolist(),
        "metric_eig_over_c_max": metric_eigs.amax(dim=(1, 2, 3)).tolist(),
        "shock_episodes": shown,
        "shocks": [list(shocks[i]) for i in shown],
    }
