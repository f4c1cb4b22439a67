"""``sia eval``: what a trained SIA model does with its identity state, measured on held-out episodes.

Every figure is teacher-forced (the corpus's own replies are fed, never sampled, except in the reset check),
computed under ``torch.no_grad`` and batched through the same turn machinery as training
(``sia.learn.native.train.encode_episode_turns``, ``sia.learn.native.episodes.batch_turns`` / ``forward_turn`` / ``StateBatch``):

1. **Perplexity** of the reply tokens, each identity played from fresh through its episode with the state
   carried and no transcript in context; also with the state reset before every turn, and for the plain
   dot-product ``twin`` if one is given (ratio model / twin).
2. **History dependence**: two identities of the same persona play two different episodes; then both take
   one common turn (message and reply of a probe turn of a third episode). Reported: the mean over the
   reply positions of KL(p_A || p_B) of the next-token distributions, averaged over pairs, and the same for
   A against A', the same history replayed in a separate pass (the determinism control, exactly 0).
3. **Reset determinism**: with ``sia.identity.turn.run_turn`` and seeded temperature sampling, a fresh identity's
   reply, new state and shock are identical to those of an identity that talked for a few turns and was
   then reset with ``IdentityState.fresh``.
4. **State-carried recall**: at every ``Probe`` every candidate value is put into the reply's slot and the
   whole reply (its closing <|end|> included) is scored by its total log-probability; the argmax is the
   prediction. Modes: ``state`` (state carried, no transcript), ``stateless`` (fresh state at the probe,
   no transcript: nothing can know the answer, so this sits at chance), ``transcript`` (state carried and
   the earlier turns in context: the upper bound). The twin is scored without and with the transcript.
5. **Plots** (matplotlib, Agg): attention maps at a probe turn with a fresh and with the accumulated state,
   the self-state trajectory, trace and metric spectra over the turns, and the shock per turn.

Attention maps are recomputed from the model's own inputs with the reference formula of
``sia.model.attention`` (see ``attention_weights``): forward hooks capture every TraceAttention's input x and its
LayerConditioning, and the weight of key j for query i is softmax_j(-(q_i - k_j)^T M (q_i - k_j)), where q
and k are the raw projections, M the stabilised metric, key 0 the self slot (raw key W_ks s + b_ks, visible
to every query) and keys 1.. the tokens, causally masked.

Results: ``out_dir/report.json`` (every figure, the model configs and the counts), ``out_dir/report.md``
(targets with pass/fail and the plots) and the PNGs. ``run_eval`` is the command-line entry point.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sia.checkpoint import NATIVE_CHECKPOINT, load_checkpoint
from sia.learn.native.corpus import Episode, make_corpus
from sia.learn.native.metrics import history_dependence, perplexity, reset_determinism
from sia.learn.native.play import encode_episodes, play_episodes
from sia.learn.native.plots import PLOT_FILES, plot_all
from sia.learn.native.recall import MODES, ProbeScore, chance, recall, recall_summary
from sia.learn.native.report import fmt, markdown, model_info, targets
from sia.model.native import SIAModel

__all__ = ["evaluate", "run_eval"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------------------


def evaluate(
    model: SIAModel,
    episodes: Sequence[Episode],
    out_dir: Path,
    *,
    twin: SIAModel | None = None,
    seed: int = 0,
    max_episodes: int | None = None,
    n_pairs: int = 64,
    batch_size: int = 32,
) -> dict[str, Any]:
    """Every figure of the module docstring on ``episodes``; writes report.md, report.json and the PNGs."""
    if not model.stateful:
        raise ValueError("evaluate needs a stateful model; pass the plain dot-product model as twin=")
    if twin is not None and twin.stateful:
        log.warning("the twin has %r attention; it is meant to be the stateless 'dot' variant", twin.config.attention)
    episodes = list(episodes[:max_episodes] if max_episodes is not None else episodes)
    if not episodes:
        raise ValueError("need at least one episode to evaluate")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = [m for m in (model, twin) if m is not None]
    training = [m.training for m in models]
    for m in models:
        m.eval()
    seconds: dict[str, float] = {}
    started = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        seconds[name] = now - started
        started = now
        log.info("%s done in %.1f s", name, seconds[name])

    try:
        with torch.no_grad():
            probes = sum(len(e.probes) for e in episodes)
            log.info("evaluating on %d episodes, %d probes", len(episodes), probes)
            at_probes = frozenset((e, p.turn) for e, episode in enumerate(episodes) for p in episode.probes)
            carried = play_episodes(
                model, encode_episodes(model, episodes, transcript=False), batch_size=batch_size, capture=at_probes
            )
            scored = {mode: recall(model, episodes, mode, batch_size=batch_size, play=carried) for mode in MODES}
            lap("recall and perplexity")
            ppl_twin = None
            twin_scored: dict[str, list[ProbeScore]] = {}
            if twin is not None:
                ppl_twin = perplexity(twin, episodes, batch_size=batch_size)
                twin_scored = {mode: recall(twin, episodes, mode, batch_size=batch_size) for mode in ("stateless", "transcript")}
                lap("twin")
            ppl_model = carried.perplexity
            figures: dict[str, Any] = {
                "seed": seed,
                "n_episodes": len(episodes),
                "n_probes": probes,
                "model": model_info(model),
                "twin": model_info(twin) if twin is not None else None,
                "perplexity": {
                    "model": ppl_model,
                    "model_stateless": perplexity(model, episodes, batch_size=batch_size, carry=False),
                    "twin": ppl_twin,
                    "ratio": ppl_model / ppl_twin if ppl_twin else None,
                    "reply_tokens": carried.reply_tokens,
                },
                "recall": {
                    **chance(episodes),
                    "model": {mode: recall_summary(s) for mode, s in scored.items()},
                    "twin": {mode: recall_summary(s) for mode, s in twin_scored.items()} or None,
                },
            }
            figures["history_dependence"] = history_dependence(model, episodes, n_pairs=n_pairs, seed=seed, batch_size=batch_size)
            lap("history dependence")
            figures["reset_determinism"] = reset_determinism(model, episodes[0], seed=seed)
            lap("reset determinism")
            figures["plot_data"] = plot_all(model, episodes, carried.shocks, out_dir)
            figures["plots"] = dict(PLOT_FILES)
            lap("plots")
    finally:
        for m, was_training in zip(models, training, strict=True):
            m.train(was_training)
    figures["targets"] = targets(figures)
    figures["seconds"] = seconds
    (out_dir / "report.json").write_text(json.dumps(figures, indent=2) + "\n")
    (out_dir / "report.md").write_text(markdown(figures) + "\n")
    for target in figures["targets"]:
        log.info("%s: %s (target %s) %s", target["name"], fmt(target["value"]), target["target"], target["pass"])
    return figures


def run_eval(
    checkpoint: Path | None,
    out_dir: Path,
    *,
    twin_checkpoint: Path | None,
    seed: int,
    n_heldout: int,
    max_episodes: int | None,
) -> dict[str, Any]:
    """Load the native model (default: the bundled one) and the optional twin, build the held-out split of
    ``make_corpus(seed, 1, n_heldout)`` (the training run's held-out episodes when seed and n_heldout match)
    and evaluate on it."""
    model = load_checkpoint(checkpoint or NATIVE_CHECKPOINT)
    twin = load_checkpoint(twin_checkpoint) if twin_checkpoint is not None else None
    episodes = make_corpus(seed, n_train=1, n_heldout=n_heldout).heldout
    return evaluate(model, episodes, Path(out_dir), twin=twin, seed=seed, max_episodes=max_episodes)
