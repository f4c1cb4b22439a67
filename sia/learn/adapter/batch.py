"""A training step's data: a batch of fact-dialogue episodes, each with its persona, the ordinary turn distilled and
the questions asked; a function of (seed, step) only, so that a resumed run sees the same data."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sia.backbones.llama import LlamaModel
from sia.learn.adapter import facts
from sia.learn.adapter.config import TrainConfig
from sia.personas import PERSONAS

__all__ = ["Example", "sample_batch"]


@dataclass(frozen=True)
class Example:
    episode: facts.Episode
    context: list[int]  # the persona's system block
    distill_at: int  # the ordinary turn whose reply is distilled from the transcript teacher (-1: none)
    asked: tuple[int, ...]  # the probes asked this step


def _kinds(rng: random.Random, config: TrainConfig) -> tuple[str, ...] | None:
    """The kinds of a training episode's facts drawn by ``config.kind_weights`` (None: make_episode draws them)."""
    return None if config.kind_weights is None else facts.draw_kinds(rng, config.n_facts, config.kind_weights)


def sample_batch(config: TrainConfig, model: LlamaModel, step: int) -> list[Example]:
    """The batch of ``step``: a function of (seed, step) only, so a resumed run sees the same data."""
    rng = random.Random(f"{config.seed}:{step}")
    tok = model.tokenizer
    top = config.max_between(step)
    batch = []
    if step < config.write_stage_steps:  # the write stage: one statement turn per episode, nothing asked
        for _ in range(config.write_stage_batch):
            episode = facts.make_episode(rng, "train", between=0, kinds=_kinds(rng, config), n_facts=config.n_facts, opening=0)
            context = tok.system_prompt(PERSONAS[rng.choice(sorted(PERSONAS))].system_prompt)
            batch.append(Example(episode, context, -1, ()))
        return batch
    for _ in range(config.batch_size):
        between = rng.randint(*config.between_range(top))  # the stage's depths, down to min_between (or half its most)
        episode = facts.make_episode(rng, "train", between=between, kinds=_kinds(rng, config), n_facts=config.n_facts)
        persona = rng.choice(sorted(PERSONAS))
        context = tok.system_prompt(PERSONAS[persona].system_prompt)
        ordinary = [t for t in range(1, len(episode.turns)) if t != episode.stated_at]
        distill_at = rng.choice(ordinary) if ordinary and step % config.distill_every == 0 else -1
        asked = tuple(sorted(rng.sample(range(len(episode.probes)), min(config.probes_per_episode, len(episode.probes)))))
        batch.append(Example(episode, context, distill_at, asked))
    return batch
