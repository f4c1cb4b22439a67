"""Playing native-model episodes in batches: every identity from fresh, turn by turn, the state carried."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sia.identity.state import Dynamics
from sia.learn.native.corpus import Episode
from sia.learn.native.episodes import EncodedTurn, StateBatch, batch_turns, forward_turn
from sia.learn.native.train import encode_episode_turns
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer

# ---------------------------------------------------------------------------------------------------------
# Batched play of episodes
# ---------------------------------------------------------------------------------------------------------


def _take(state: StateBatch, rows: Sequence[int]) -> StateBatch:
    """The given rows of a StateBatch, copied."""
    idx = torch.tensor(list(rows), dtype=torch.long, device=state.trace.device)
    return StateBatch(state.trace[idx], state.self_state[idx], state.shock_count[idx], state.shock_mean[idx], state.shock_m2[idx])


def cat_states(states: Sequence[StateBatch]) -> StateBatch:
    """Stack StateBatches row-wise."""
    return StateBatch(
        torch.cat([s.trace for s in states]),
        torch.cat([s.self_state for s in states]),
        torch.cat([s.shock_count for s in states]),
        torch.cat([s.shock_mean for s in states]),
        torch.cat([s.shock_m2 for s in states]),
    )


def model_device(model: SIAModel) -> torch.device:
    return model.wte.weight.device


@dataclass
class Play:
    """What playing a set of episodes teacher-forced leaves behind."""

    reply_nll: float  # summed NLL of every reply target (its <|end|> included)
    reply_tokens: int
    shocks: list[list[float]]  # per episode, per turn
    captured: dict[tuple[int, int], StateBatch]  # (episode, t) -> one-row state entering turn t (t = #turns: the end)

    @property
    def perplexity(self) -> float:
        return math.exp(self.reply_nll / max(self.reply_tokens, 1))


@torch.no_grad()
def play_episodes(
    model: SIAModel,
    encoded: Sequence[Sequence[EncodedTurn]],
    *,
    batch_size: int = 32,
    carry: bool = True,
    capture: frozenset[tuple[int, int]] = frozenset(),
) -> Play:
    """Play encoded episodes from fresh identities, ``batch_size`` at a time, turn by turn.

    With ``carry=False`` every turn starts from a fresh state. ``capture`` names (episode, turn) pairs whose
    entering state is kept (turn = number of turns: the state after the last turn).
    """
    tok = ByteTokenizer()
    device = model_device(model)
    dynamics = Dynamics.from_config(model.config)
    nll, count = 0.0, 0
    shocks: list[list[float]] = [[] for _ in encoded]
    captured: dict[tuple[int, int], StateBatch] = {}
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start : start + batch_size]
        state = StateBatch.fresh(model.config, len(chunk), device)
        n_turns = max(len(turns) for turns in chunk)
        for t in range(n_turns + 1):
            for b in range(len(chunk)):
                if (start + b, t) in capture:
                    captured[(start + b, t)] = _take(state, [b])
            if t == n_turns:
                break
            if not carry:
                state = StateBatch.fresh(model.config, len(chunk), device)
            batch = batch_turns([turns[t] if t < len(turns) else None for turns in chunk], pad_id=tok.pad_id, device=device)
            out = forward_turn(model, batch, state, dynamics)
            targets = batch.reply_targets & batch.active.view(-1, 1)
            nll += float((out.token_nll.double() * targets).sum())
            count += int(targets.sum())
            for b in range(len(chunk)):
                if bool(batch.active[b]):
                    shocks[start + b].append(float(out.shock[b]))
            state = out.state
    return Play(nll, count, shocks, captured)


def encode_episodes(
    model: SIAModel, episodes: Sequence[Episode], *, transcript: bool, slack: bool = False
) -> list[list[EncodedTurn]]:
    """encode_episode_turns for every episode. With ``slack`` the transcript leaves room in block_size for the
    longest candidate value of the episode's probes, so that every candidate reply fits."""
    tok = ByteTokenizer()
    out = []
    for episode in episodes:
        room = _candidate_slack(episode) if slack else 0
        out.append(encode_episode_turns(tok, episode, transcript=transcript, block_size=model.config.block_size - room))
    return out


def _candidate_slack(episode: Episode) -> int:
    tok = ByteTokenizer()
    slack = [len(tok.encode(c)) - len(tok.encode(p.answer)) for p in episode.probes for c in p.candidates]
    return max([0, *slack])
