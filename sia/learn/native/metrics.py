"""Language and identity figures of the native model: perplexity, history dependence, reset determinism."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, run_turn
from sia.learn.native.corpus import Episode
from sia.learn.native.episodes import StateBatch, batch_turns, forward_turn
from sia.learn.native.play import cat_states, encode_episodes, model_device, play_episodes
from sia.model.generate import SamplingParams
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer
from sia.personas import persona_preamble

log = logging.getLogger(__name__)

RESET_TURNS = 3  # turns an identity talks before it is reset
RESET_MAX_TOKENS = 32


# ---------------------------------------------------------------------------------------------------------
# 1. Perplexity
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def perplexity(model: SIAModel, episodes: Sequence[Episode], *, batch_size: int = 32, carry: bool = True) -> float:
    """exp(mean NLL of the reply tokens), identities played from fresh with the state carried, no transcript."""
    return play_episodes(model, encode_episodes(model, episodes, transcript=False), batch_size=batch_size, carry=carry).perplexity


# ---------------------------------------------------------------------------------------------------------
# 2. History dependence
# ---------------------------------------------------------------------------------------------------------


def _triples(episodes: Sequence[Episode], n_pairs: int, seed: int) -> list[tuple[int, int, int]]:
    """(history A, history B, common turn) episode indices, of one persona where possible."""
    order = list(range(len(episodes)))
    random.Random(seed).shuffle(order)
    buckets: dict[str, list[int]] = {}
    for i in order:
        buckets.setdefault(episodes[i].persona, []).append(i)
    grouped = [bucket[j : j + 3] for bucket in buckets.values() for j in range(0, len(bucket) - 2, 3)]
    triples = [(g[0], g[1], g[2]) for g in grouped]
    if not triples:  # too few episodes per persona: mixed personas
        triples = [(order[j], order[j + 1], order[j + 2]) for j in range(0, len(order) - 2, 3)]
    random.Random(seed + 1).shuffle(triples)
    return triples[:n_pairs]


def _reply_kl(logits_p: Tensor, logits_q: Tensor, reply_targets: Tensor) -> Tensor:
    """Per row, the mean over reply positions of KL(p || q) of the next-token distributions (nats)."""
    logp = F.log_softmax(logits_p[:, :-1].double(), dim=-1)  # (B, L-1, V)
    logq = F.log_softmax(logits_q[:, :-1].double(), dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)  # (B, L-1)
    mask = reply_targets.double()
    return (kl * mask).sum(1) / mask.sum(1).clamp_min(1.0)


@torch.no_grad()
def history_dependence(
    model: SIAModel, episodes: Sequence[Episode], *, n_pairs: int = 64, seed: int = 0, batch_size: int = 32
) -> dict[str, Any]:
    """KL(p_A || p_B) on a common turn after two different histories, and the replay control KL(p_A || p_A')."""
    triples = _triples(episodes, n_pairs, seed)
    if not triples:
        log.warning("history dependence needs at least 3 episodes; skipped")
        return {"pairs": 0, "kl_mean": None, "control_kl": None}
    tok = ByteTokenizer()
    device = model_device(model)
    dynamics = Dynamics.from_config(model.config)

    def final_states(indices: list[int]) -> StateBatch:
        encoded = encode_episodes(model, [episodes[i] for i in indices], transcript=False)
        ends = frozenset((j, len(turns)) for j, turns in enumerate(encoded))
        play = play_episodes(model, encoded, batch_size=batch_size, capture=ends)
        return cat_states([play.captured[(j, len(turns))] for j, turns in enumerate(encoded)])

    history_a, history_b = [a for a, _, _ in triples], [b for _, b, _ in triples]
    state_a, state_b, state_a2 = final_states(history_a), final_states(history_b), final_states(history_a)
    common = []
    for _, _, c in triples:
        episode = episodes[c]
        t = episode.probes[0].turn if episode.probes else len(episode.turns) - 1
        common.append(encode_episodes(model, [episode], transcript=False)[0][t])
    batch = batch_turns(common, pad_id=tok.pad_id, device=device)
    logits_a = forward_turn(model, batch, state_a, dynamics).logits
    logits_b = forward_turn(model, batch, state_b, dynamics).logits
    logits_a2 = forward_turn(model, batch, state_a2, dynamics).logits
    kl = _reply_kl(logits_a, logits_b, batch.reply_targets)
    control = _reply_kl(logits_a, logits_a2, batch.reply_targets)
    same_persona = sum(episodes[a].persona == episodes[b].persona == episodes[c].persona for a, b, c in triples)
    return {
        "pairs": len(triples),
        "same_persona_pairs": int(same_persona),
        "kl_mean": float(kl.mean()),
        "kl_median": float(kl.median()),
        "kl_min": float(kl.min()),
        "kl_max": float(kl.max()),
        "control_kl": float(control.abs().max()),
        "logits_replay_identical": bool(torch.equal(logits_a, logits_a2)),
        "per_pair_kl": [float(v) for v in kl],
    }


# ---------------------------------------------------------------------------------------------------------
# 3. Reset determinism
# ---------------------------------------------------------------------------------------------------------


def reset_determinism(model: SIAModel, episode: Episode, *, seed: int = 0) -> dict[str, Any]:
    """A fresh identity's sampled turn equals that of an identity that talked for a while and was reset."""
    if not model.stateful:
        raise ValueError("reset determinism needs a stateful model")
    tok = ByteTokenizer()
    config = model.config
    dynamics = Dynamics.from_config(config)
    context = tuple(tok.encode(persona_preamble(episode.persona)))
    longest = max(len(tok.chat_prompt(turn.user, context)) for turn in episode.turns)
    max_new = min(RESET_MAX_TOKENS, config.block_size - longest)
    if max_new < 1:
        raise ValueError(f"block_size {config.block_size} leaves no room for a reply after a {longest}-token prompt")
    params = SamplingParams(max_new_tokens=max_new, temperature=0.8, seed=seed)
    message = episode.turns[0].user

    first = run_turn(model, TurnRequest(IdentityState.fresh(config), message, dynamics, context), params)
    talked = IdentityState.fresh(config)
    for turn in episode.turns[1 : 1 + RESET_TURNS]:
        talked = run_turn(model, TurnRequest(talked, turn.user, dynamics, context), params).state
    reset = IdentityState.fresh(config)
    changed = not (torch.equal(talked.trace, reset.trace) and torch.equal(talked.self_state, reset.self_state))
    again = run_turn(model, TurnRequest(reset, message, dynamics, context), params)
    state_equal = (
        torch.equal(first.state.trace, again.state.trace)
        and torch.equal(first.state.self_state, again.state.self_state)
        and first.state.shock == again.state.shock
        and first.state.turns == again.state.turns
    )
    return {
        "reply_equal": first.reply == again.reply,
        "state_equal": bool(state_equal),
        "shock_equal": first.shock == again.shock,
        "history_turns": talked.turns,
        "history_changed_state": bool(changed),
        "reply": first.reply,
        "shock": first.shock,
    }
