"""Held-out figures during training: recall of three facts (the figure training is steered by) and, during the
write stage, the training read-out's accuracy on held-out statements."""

from __future__ import annotations

import torch
from torch import Tensor

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.identity.state import Dynamics
from sia.learn.adapter import facts
from sia.learn.adapter.readout import ReadOut
from sia.learn.adapter.unroll import Carry, persona_contexts, render_turn, score_candidates, write_turn

__all__ = ["heldout_readout", "heldout_recall", "heldout_set", "probe_accuracy", "unroll_states"]


@torch.no_grad()
def unroll_states(model: LlamaModel, episodes: list[facts.Episode], contexts: list[list[int]], dynamics: Dynamics) -> Carry:
    """The state of each episode after its last turn (every row written as the service writes it)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    carry = Carry.fresh(model, len(episodes))
    for t in range(max(len(e.turns) for e in episodes)):
        rows = [b for b, e in enumerate(episodes) if t < len(e.turns)]
        turns = [render_turn(tok, contexts[b], episodes[b].turns[t].user, episodes[b].turns[t].reply) for b in rows]
        part, _, _ = write_turn(model, carry.take(rows), turns, dynamics, grad_tokens=True)
        carry = carry.put(rows, part)
    return carry


def probe_accuracy(
    model: LlamaModel, carry: Carry, episodes: list[facts.Episode], contexts: list[list[int]], chunk: int = 8
) -> Tensor:
    """(episodes, facts) bool: whether the true value ranks first among its kind's candidates under each state."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    right = torch.zeros(len(episodes), len(episodes[0].probes), dtype=torch.bool)
    jobs = [(b, j) for b, e in enumerate(episodes) for j in range(len(e.probes))]
    for start in range(0, len(jobs), chunk):
        part = jobs[start : start + chunk]
        probes = [episodes[b].probes[j] for b, j in part]
        prompts = [tok.turn_prompt(p.question, contexts[b])[0] for (b, _), p in zip(part, probes, strict=True)]
        candidates = [facts.values(p.kind, episodes[b].split) for (b, _), p in zip(part, probes, strict=True)]
        scores = score_candidates(model, carry.take([b for b, _ in part]), prompts, [p.reply_prefix for p in probes], candidates)
        for (b, j), p, sc, values in zip(part, probes, scores, candidates, strict=True):
            right[b, j] = values[int(sc.argmax())] == p.value
    return right


def heldout_set(model: LlamaModel, n: int, between: int, seed: int = 1) -> tuple[list[facts.Episode], list[list[int]]]:
    episodes = facts.episodes("heldout", n, seed, between=between, kinds=("colour", "pet", "hobby"))
    contexts = persona_contexts(model, n)
    return episodes, contexts


@torch.no_grad()
def heldout_readout(model: LlamaModel, readout: ReadOut, n: int, dynamics: Dynamics, between: int = 0) -> dict[str, float]:
    """The training read-out's accuracy on held-out statements of colour, pet and hobby (values it has seen, wordings
    it has not), from the state ``between`` unrelated turns after the statement turn; chance is 1/6."""
    episodes = facts.episodes("heldout", n, 2, between=between, kinds=("colour", "pet", "hobby"))
    carry = unroll_states(model, episodes, persona_contexts(model, n), dynamics)
    said = [f for e in episodes for f in e.facts]
    owners = torch.tensor([b for b, e in enumerate(episodes) for _ in e.facts], device=model.device)
    return {"readout": readout.loss(carry.self_state[owners], said)[1]}


def heldout_recall(model: LlamaModel, n: int, between: int, dynamics: Dynamics) -> dict[str, float]:
    episodes, contexts = heldout_set(model, n, between)
    carry = unroll_states(model, episodes, contexts, dynamics)
    right = probe_accuracy(model, carry, episodes, contexts)
    return {"per_fact": float(right.float().mean()), "all": float(right.all(dim=1).float().mean())}
