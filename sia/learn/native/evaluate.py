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

import itertools
import json
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sia.checkpoint import NATIVE_CHECKPOINT, load_checkpoint
from sia.identity.state import Dynamics, IdentityState, stabilised_metric
from sia.identity.turn import TurnRequest, run_turn
from sia.learn.native.corpus import Episode, Probe, make_corpus
from sia.learn.native.episodes import EncodedTurn, StateBatch, batch_turns, encode_turn, forward_turn
from sia.learn.native.train import encode_episode_turns
from sia.model.generate import SamplingParams
from sia.model.tokenizer import ByteTokenizer
from sia.model.transformer import Conditioning, LayerConditioning, SIAModel, TraceAttention
from sia.personas import persona_preamble

__all__ = [
    "MODES",
    "AttentionCapture",
    "ProbeScore",
    "attention_weights",
    "capture_attention",
    "evaluate",
    "history_dependence",
    "perplexity",
    "play_episodes",
    "recall",
    "reset_determinism",
    "run_eval",
]

log = logging.getLogger(__name__)

MODES = ("state", "stateless", "transcript")
PERPLEXITY_RATIO_TARGET = 1.05
KL_TARGET = 0.05  # nats: history must move the reply distribution at least this much
CONTROL_TOLERANCE = 1e-9  # the same history replayed must give the same distribution
RECALL_TARGET = 0.9
RESET_TURNS = 3  # turns an identity talks before it is reset
RESET_MAX_TOKENS = 32
PLOT_FILES = {
    "attention": "attention.png",
    "self_state": "self_state.png",
    "trace_spectra": "trace_spectra.png",
    "shocks": "shocks.png",
}


# ---------------------------------------------------------------------------------------------------------
# Batched play of episodes
# ---------------------------------------------------------------------------------------------------------


def _take(state: StateBatch, rows: Sequence[int]) -> StateBatch:
    """The given rows of a StateBatch, copied."""
    idx = torch.tensor(list(rows), dtype=torch.long, device=state.trace.device)
    return StateBatch(state.trace[idx], state.self_state[idx], state.shock_count[idx], state.shock_mean[idx], state.shock_m2[idx])


def _cat(states: Sequence[StateBatch]) -> StateBatch:
    """Stack StateBatches row-wise."""
    return StateBatch(
        torch.cat([s.trace for s in states]),
        torch.cat([s.self_state for s in states]),
        torch.cat([s.shock_count for s in states]),
        torch.cat([s.shock_mean for s in states]),
        torch.cat([s.shock_m2 for s in states]),
    )


def _device(model: SIAModel) -> torch.device:
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
    device = _device(model)
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


def _encode(model: SIAModel, episodes: Sequence[Episode], *, transcript: bool, slack: bool = False) -> list[list[EncodedTurn]]:
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


# ---------------------------------------------------------------------------------------------------------
# 1. Perplexity
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def perplexity(model: SIAModel, episodes: Sequence[Episode], *, batch_size: int = 32, carry: bool = True) -> float:
    """exp(mean NLL of the reply tokens), identities played from fresh with the state carried, no transcript."""
    return play_episodes(model, _encode(model, episodes, transcript=False), batch_size=batch_size, carry=carry).perplexity


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
    device = _device(model)
    dynamics = Dynamics.from_config(model.config)

    def final_states(indices: list[int]) -> StateBatch:
        encoded = _encode(model, [episodes[i] for i in indices], transcript=False)
        ends = frozenset((j, len(turns)) for j, turns in enumerate(encoded))
        play = play_episodes(model, encoded, batch_size=batch_size, capture=ends)
        return _cat([play.captured[(j, len(turns))] for j, turns in enumerate(encoded)])

    history_a, history_b = [a for a, _, _ in triples], [b for _, b, _ in triples]
    state_a, state_b, state_a2 = final_states(history_a), final_states(history_b), final_states(history_a)
    common = []
    for _, _, c in triples:
        episode = episodes[c]
        t = episode.probes[0].turn if episode.probes else len(episode.turns) - 1
        common.append(_encode(model, [episode], transcript=False)[0][t])
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


# ---------------------------------------------------------------------------------------------------------
# 4. State-carried recall
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeScore:
    episode: int  # index into the evaluated episodes
    probe: Probe
    scores: tuple[float, ...]  # total log-probability of the reply with each candidate in the slot

    @property
    def predicted(self) -> str:
        return self.probe.candidates[max(range(len(self.scores)), key=self.scores.__getitem__)]

    @property
    def correct(self) -> bool:
        return self.predicted == self.probe.answer


def _candidate_turns(episode: Episode, probe: Probe, encoded: EncodedTurn) -> list[EncodedTurn]:
    """The probe turn with each candidate in the answer slot, in the encoded turn's own context."""
    tok = ByteTokenizer()
    turn = episode.turns[probe.turn]
    head = probe.prefix + probe.answer
    if not turn.reply.startswith(head):
        raise ValueError(f"probe reply {turn.reply!r} does not start with prefix + answer {head!r}")
    suffix = turn.reply[len(head) :]
    context = encoded.ids[: encoded.context_len]
    return [encode_turn(tok, context, turn.user, probe.prefix + c + suffix) for c in probe.candidates]


def _reply_logprobs(model: SIAModel, rows: Sequence[tuple[EncodedTurn, StateBatch]], *, batch_size: int) -> list[float]:
    """Total log-probability of each row's reply tokens (its <|end|> included) under the row's state.

    The plain form: one teacher-forced forward_turn over every whole row. The reference for the cached form.
    """
    tok = ByteTokenizer()
    device = _device(model)
    dynamics = Dynamics.from_config(model.config)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0].ids))  # similar lengths share a batch
    out = [0.0] * len(rows)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = batch_turns([rows[i][0] for i in chunk], pad_id=tok.pad_id, device=device)
        result = forward_turn(model, batch, _cat([rows[i][1] for i in chunk]), dynamics)
        logprob = -(result.token_nll.double() * batch.reply_targets).sum(1)
        for i, value in zip(chunk, logprob.tolist(), strict=True):
            out[i] = value
    return out


@dataclass(frozen=True)
class _Candidates:
    """The encoded variants of one probe turn, which agree on their first ``shared`` tokens, and its state."""

    turns: tuple[EncodedTurn, ...]
    shared: int
    state: StateBatch  # one row

    @classmethod
    def of(cls, turns: Sequence[EncodedTurn], state: StateBatch) -> _Candidates:
        first = turns[0].ids
        shared = min(len(first), *(len(t.ids) for t in turns))
        for t in turns[1:]:
            shared = next((j for j in range(shared) if t.ids[j] != first[j]), shared)
        if shared <= turns[0].reply_start or shared >= min(len(t.ids) for t in turns):
            raise ValueError("candidate replies must share their prompt and differ before their last token")
        return cls(tuple(turns), shared, state)


def _left_padded(prefixes: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(P, Lp) token ids left-padded with pad_id, and the (P, Lp) mask of real tokens."""
    width = max(len(p) for p in prefixes)
    idx = torch.full((len(prefixes), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros(len(prefixes), width, dtype=torch.bool, device=device)
    for p, prefix in enumerate(prefixes):
        idx[p, width - len(prefix) :] = torch.tensor(list(prefix), dtype=torch.long)
        valid[p, width - len(prefix) :] = True
    return idx, valid


def _visible(key_valid: Tensor, n: int) -> Tensor:
    """(B, 1, n, Lk) boolean mask: the last n of Lk keys are this call's queries (causal), earlier keys are
    visible where valid; every query also sees itself, so a padding query never has an empty row."""
    Lk = key_valid.shape[1]
    causal = torch.ones(n, Lk, dtype=torch.bool, device=key_valid.device).tril(diagonal=Lk - n)  # (n, Lk)
    itself = torch.zeros(n, Lk, dtype=torch.bool, device=key_valid.device)
    itself[:, Lk - n :] = torch.eye(n, dtype=torch.bool, device=key_valid.device)
    return ((causal & key_valid[:, None, :]) | itself).unsqueeze(1)


def _index_conditioning(cond: Conditioning, rows: Tensor) -> Conditioning:
    """The given batch rows of a Conditioning (rows may repeat): no second eigen-decomposition of the metric."""
    layers = [
        None if lc is None else LayerConditioning(*(getattr(lc, f.name)[rows] for f in fields(LayerConditioning)))
        for lc in cond.layers
    ]
    return Conditioning(layers=layers, self_state=cond.self_state[rows])


def _score_group(model: SIAModel, group: Sequence[_Candidates]) -> list[tuple[float, ...]]:
    """Reply log-probabilities of every candidate of a few probes, the shared tokens run once.

    Pass 1 runs each probe's shared tokens (left-padded) into a KV cache; pass 2 copies that cache once per
    candidate and runs the candidates' own tokens (right-padded) after it.
    """
    tok = ByteTokenizer()
    device = _device(model)
    limit = model.config.block_size - 1
    state = _cat([g.state for g in group])
    prefixes = [g.turns[0].ids[: g.shared] for g in group]
    idx, valid = _left_padded(prefixes, tok.pad_id, device)  # (P, Lp)
    P, Lp = idx.shape
    rows = [p for p, g in enumerate(group) for _ in g.turns]  # probe of each candidate row
    conts = [t.ids[g.shared :] for g in group for t in g.turns]
    Lc = max(len(c) for c in conts)
    key_valid = torch.cat([torch.ones(P, model.prefix_len, dtype=torch.bool, device=device), valid], dim=1)
    shared_cond = model.condition(state.trace, state.self_state)
    cache = model.new_cache(shared_cond, Lp + Lc)
    positions = (valid.long().cumsum(1) - 1).clamp(0, limit)
    pre = model(idx, shared_cond, cache=cache, positions=positions, attn_mask=_visible(key_valid, Lp))
    pre_lp = F.log_softmax(pre.logits.double(), dim=-1)  # (P, Lp, V)

    # shared reply tokens: prefix position q >= (Lp - len) + reply_start is predicted at q - 1
    token_lp = pre_lp[:, :-1].gather(-1, idx[:, 1:, None]).squeeze(-1)  # (P, Lp-1)
    first_reply = torch.tensor([Lp - g.shared + g.turns[0].reply_start for g in group], device=device)
    in_reply = torch.arange(1, Lp, device=device)[None, :] >= first_reply[:, None]
    shared_lp = (token_lp * in_reply).sum(1)  # (P,)

    row_idx = torch.tensor(rows, dtype=torch.long, device=device)
    cond = _index_conditioning(shared_cond, row_idx)
    expanded = model.new_cache(cond, Lp + Lc)
    for layer in range(model.config.n_layer):
        expanded.keys[layer][:, :, : cache.length] = cache.keys[layer][row_idx, :, : cache.length]
        expanded.values[layer][:, :, : cache.length] = cache.values[layer][row_idx, :, : cache.length]
    expanded.length = cache.length
    cont = torch.full((len(conts), Lc), tok.pad_id, dtype=torch.long, device=device)
    cont_valid = torch.zeros(len(conts), Lc, dtype=torch.bool, device=device)
    for r, ids in enumerate(conts):
        cont[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        cont_valid[r, : len(ids)] = True
    start = torch.tensor([group[p].shared for p in rows], device=device)
    cont_positions = (start[:, None] + torch.arange(Lc, device=device)[None, :]).clamp_max(limit)
    all_valid = torch.cat([key_valid[row_idx], torch.ones(len(conts), Lc, dtype=torch.bool, device=device)], dim=1)
    out = model(cont, cond, cache=expanded, positions=cont_positions, attn_mask=_visible(all_valid, Lc))
    cont_lp = F.log_softmax(out.logits.double(), dim=-1)  # (R, Lc, V)
    first = pre_lp[row_idx, -1].gather(-1, cont[:, :1]).squeeze(-1)  # (R,) first own token, from the shared part
    rest = (cont_lp[:, :-1].gather(-1, cont[:, 1:, None]).squeeze(-1) * cont_valid[:, 1:]).sum(1)  # (R,)
    total = (shared_lp[row_idx] + first + rest).tolist()
    scores: list[tuple[float, ...]] = []
    offset = 0
    for g in group:
        scores.append(tuple(total[offset : offset + len(g.turns)]))
        offset += len(g.turns)
    return scores


def _score_candidates(model: SIAModel, items: Sequence[_Candidates], *, max_rows: int = 64) -> list[tuple[float, ...]]:
    """_score_group over groups of probes of similar length, at most ``max_rows`` candidates per group."""
    order = sorted(range(len(items)), key=lambda i: len(items[i].turns[0].ids))
    out: list[tuple[float, ...]] = [() for _ in items]
    group: list[int] = []
    for i in [*order, -1]:
        if group and (i < 0 or sum(len(items[j].turns) for j in group) + len(items[i].turns) > max_rows):
            for j, scores in zip(group, _score_group(model, [items[j] for j in group]), strict=True):
                out[j] = scores
            group = []
        if i >= 0:
            group.append(i)
    return out


@torch.no_grad()
def recall(
    model: SIAModel,
    episodes: Sequence[Episode],
    mode: str,
    *,
    batch_size: int = 32,
    play: Play | None = None,
    cached: bool = True,
) -> list[ProbeScore]:
    """Score every candidate of every probe in ``mode`` (one of MODES); one ProbeScore per probe, in order.

    ``play``: a finished play of the episodes (no transcript) that captured the state entering every probe
    turn, reused in the "state" mode. ``cached=False`` scores every candidate reply by a whole forward pass
    (the slow reference) instead of sharing the common tokens through the KV cache.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    transcript = mode == "transcript"
    encoded = _encode(model, episodes, transcript=transcript, slack=transcript)
    refs = [(e, probe) for e, episode in enumerate(episodes) for probe in episode.probes]
    if mode == "stateless" or not model.stateful:
        fresh = StateBatch.fresh(model.config, 1, _device(model))
        states = {(e, p.turn): fresh for e, p in refs}
    elif play is not None and mode == "state":
        states = play.captured
    else:
        capture = frozenset((e, p.turn) for e, p in refs)
        states = play_episodes(model, encoded, batch_size=batch_size, capture=capture).captured
    items = [_Candidates.of(_candidate_turns(episodes[e], p, encoded[e][p.turn]), states[(e, p.turn)]) for e, p in refs]
    if cached:
        scores = _score_candidates(model, items, max_rows=2 * batch_size)
    else:
        rows = [(turn, item.state) for item in items for turn in item.turns]
        flat = _reply_logprobs(model, rows, batch_size=2 * batch_size)
        bounds = list(itertools.accumulate((len(item.turns) for item in items), initial=0))
        scores = [tuple(flat[a:b]) for a, b in itertools.pairwise(bounds)]
    return [ProbeScore(e, probe, s) for (e, probe), s in zip(refs, scores, strict=True)]


def _recall_summary(scored: Sequence[ProbeScore]) -> dict[str, Any]:
    by_fact: dict[str, list[bool]] = {}
    for s in scored:
        by_fact.setdefault(s.probe.fact, []).append(s.correct)
    correct = sum(s.correct for s in scored)
    return {
        "accuracy": correct / len(scored) if scored else None,
        "correct": int(correct),
        "scored": len(scored),
        "by_fact": {fact: {"accuracy": sum(v) / len(v), "n": len(v)} for fact, v in sorted(by_fact.items())},
    }


def _chance(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Expected accuracy of a uniform guess, overall and per fact, and its standard deviation over the probes."""
    probes = [p for e in episodes for p in e.probes]
    p = [1.0 / len(probe.candidates) for probe in probes]
    by_fact: dict[str, list[float]] = {}
    for probe, value in zip(probes, p, strict=True):
        by_fact.setdefault(probe.fact, []).append(value)
    n = max(len(p), 1)
    return {
        "chance": sum(p) / n,
        "chance_std": math.sqrt(sum(v * (1 - v) for v in p)) / n,
        "chance_by_fact": {fact: sum(v) / len(v) for fact, v in sorted(by_fact.items())},
    }


# ---------------------------------------------------------------------------------------------------------
# 5. Attention maps
# ---------------------------------------------------------------------------------------------------------


@dataclass
class AttentionCapture:
    """One TraceAttention call: its normalised input, the turn's conditioning, and its output (after o_proj)."""

    x: Tensor  # (B, L, C)
    lc: LayerConditioning
    output: Tensor  # (B, L, C)


@contextmanager
def capture_attention(model: SIAModel) -> Iterator[list[AttentionCapture]]:
    """Within the block, every TraceAttention forward appends an AttentionCapture (layer order per forward)."""
    captures: list[AttentionCapture] = []

    def hook(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        captures.append(AttentionCapture(args[0].detach(), args[1], output.detach()))

    handles = [attn.register_forward_hook(hook) for attn in model.attentions if isinstance(attn, TraceAttention)]
    try:
        yield captures
    finally:
        for handle in handles:
            handle.remove()


def attention_weights(attn: TraceAttention, capture: AttentionCapture) -> Tensor:
    """Attention weights (B, H, L, 1 + L) by the reference formula; key 0 is the self slot, key j + 1 token j.

    weight_ij = softmax_j(-(q_i - k_j)^T M (q_i - k_j)) with raw q = W_q x + b_q, k = W_k x + b_k, the
    slot's raw key W_ks s + b_ks (the first d columns of the augmented slot key) and M the stabilised metric;
    query i sees the slot and tokens 0..i. For one unpadded row this is exactly what the fast form computes.
    """
    x, lc = capture.x, capture.lc
    B, L, _ = x.shape
    H, d = attn.n_head, attn.d
    q = attn.q_proj(x).view(B, L, H, d).transpose(1, 2)  # (B, H, L, d)
    k = attn.k_proj(x).view(B, L, H, d).transpose(1, 2)
    keys = torch.cat([lc.slot_key[..., :d], k], dim=2)  # (B, H, 1+L, d)
    diff = (q.unsqueeze(3) - keys.unsqueeze(2)).double()  # (B, H, L, 1+L, d)
    dist = torch.einsum("bhijd,bhde,bhije->bhij", diff, lc.metric.double(), diff)  # (B, H, L, 1+L)
    visible = torch.ones(L, L + 1, dtype=torch.bool, device=x.device).tril(diagonal=1)
    return torch.softmax((-dist).masked_fill(~visible, float("-inf")), dim=-1).to(x.dtype)


def _attention_maps(model: SIAModel, turn: EncodedTurn, state: StateBatch) -> Tensor:
    """(2, n_layer, H, L, 1+L): the turn under a fresh state (row 0) and under ``state`` (row 1)."""
    tok = ByteTokenizer()
    device = _device(model)
    states = _cat([StateBatch.fresh(model.config, 1, device), state])
    batch = batch_turns([turn, turn], pad_id=tok.pad_id, device=device)
    with capture_attention(model) as captures:
        forward_turn(model, batch, states, Dynamics.from_config(model.config))
    traces = [a for a in model.attentions if isinstance(a, TraceAttention)]
    return torch.stack([attention_weights(a, c) for a, c in zip(traces, captures, strict=True)], dim=1)


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


def _spectra(traces: Tensor, model: SIAModel) -> tuple[Tensor, Tensor]:
    """Eigenvalues of sym(T) and of M(T) / c: (turns + 1, n_layer, H, d) each."""
    sym = 0.5 * (traces + traces.transpose(-1, -2))
    metric = stabilised_metric(traces, model.config) / model.config.metric_base
    return torch.linalg.eigvalsh(sym.double()), torch.linalg.eigvalsh(metric.double())


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
    """Shock per turn for a few episodes; designed shock turns (Turn.shock) are marked with a red cross."""
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


def _plots(model: SIAModel, episodes: Sequence[Episode], shocks: Sequence[Sequence[float]], out_dir: Path) -> dict[str, Any]:
    """All four plots; returns the data behind the per-episode ones."""
    index = _plot_episode(episodes)
    episode = episodes[index]
    encoded = _encode(model, [episode], transcript=False)[0]
    capture = frozenset((0, t) for t in range(len(encoded) + 1))
    play = play_episodes(model, [encoded], capture=capture)
    states = [play.captured[(0, t)] for t in range(len(encoded) + 1)]
    selves = torch.cat([s.self_state for s in states])  # (turns + 1, d_s)
    traces = torch.cat([s.trace for s in states])  # (turns + 1, n_layer, H, d, d)
    trace_eigs, metric_eigs = _spectra(traces, model)
    _plot_self_state(selves, episode, out_dir / PLOT_FILES["self_state"])
    _plot_spectra(trace_eigs, metric_eigs, model.config.metric_max_deform, episode, out_dir / PLOT_FILES["trace_spectra"])

    probe = episode.probes[0] if episode.probes else None
    t = probe.turn if probe is not None else len(encoded) - 1
    maps = _attention_maps(model, encoded[t], states[t])
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


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------


def _targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    hist, reset, rec = figures["history_dependence"], figures["reset_determinism"], figures["recall"]
    state_acc, stateless_acc = rec["model"]["state"]["accuracy"], rec["model"]["stateless"]["accuracy"]
    ceiling = rec["chance"] + 2 * rec["chance_std"]

    def check(value: Any, ok: bool | None) -> bool | None:
        return None if value is None else ok

    kl, control = hist["kl_mean"], hist["control_kl"]
    ratio = figures["perplexity"].get("ratio")
    return [
        {
            "name": "reply perplexity relative to the plain-attention twin",
            "value": ratio,
            "target": f"<= {PERPLEXITY_RATIO_TARGET}",
            "pass": check(ratio, ratio is not None and ratio <= PERPLEXITY_RATIO_TARGET),
        },
        {
            "name": "history dependence: mean KL(p_A ‖ p_B) on a common turn (nats)",
            "value": kl,
            "target": f">= {KL_TARGET}",
            "pass": check(kl, kl is not None and kl >= KL_TARGET),
        },
        {
            "name": "determinism control: KL(p_A ‖ p_A') for the same history replayed",
            "value": control,
            "target": f"<= {CONTROL_TOLERANCE:g} (exactly 0)",
            "pass": check(control, control is not None and control <= CONTROL_TOLERANCE),
        },
        {
            "name": "reset determinism: reply, state and shock equal to a fresh identity's",
            "value": reset["reply_equal"] and reset["state_equal"] and reset["shock_equal"],
            "target": "true",
            "pass": reset["reply_equal"] and reset["state_equal"] and reset["shock_equal"],
        },
        {
            "name": "recall, state carried (no transcript)",
            "value": state_acc,
            "target": f">= {RECALL_TARGET}",
            "pass": check(state_acc, state_acc is not None and state_acc >= RECALL_TARGET),
        },
        {
            "name": "recall, stateless (fresh state at the probe): at chance",
            "value": stateless_acc,
            "target": f"<= chance + 2 sd = {ceiling:.3f}",
            "pass": check(stateless_acc, stateless_acc is not None and stateless_acc <= ceiling),
        },
    ]


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _markdown(figures: dict[str, Any]) -> str:
    ppl, hist, rec = figures["perplexity"], figures["history_dependence"], figures["recall"]
    verdict = {True: "pass", False: "**FAIL**", None: "n/a"}
    lines = [
        "# SIA evaluation",
        "",
        f"{figures['n_episodes']} held-out episodes, {figures['n_probes']} probes, seed {figures['seed']}; "
        f"model: {figures['model']['config']['attention']} attention, {figures['model']['parameters']:,} parameters"
        + (f"; twin: {figures['twin']['parameters']:,} parameters" if figures["twin"] else "")
        + ". All figures teacher-forced.",
        "",
        "## Targets",
        "",
        "| figure | value | target | result |",
        "|---|---|---|---|",
    ]
    lines += [f"| {t['name']} | {_fmt(t['value'])} | {t['target']} | {verdict[t['pass']]} |" for t in figures["targets"]]
    lines += [
        "",
        "## Perplexity of the replies",
        "",
        "| model | perplexity |",
        "|---|---|",
        f"| SIA, state carried | {_fmt(ppl['model'])} |",
        f"| SIA, state reset before every turn | {_fmt(ppl['model_stateless'])} |",
        f"| twin (dot attention, no state) | {_fmt(ppl['twin'])} |",
        f"| ratio SIA / twin | {_fmt(ppl['ratio'])} |",
        "",
        f"History dependence over {hist['pairs']} pairs ({hist.get('same_persona_pairs', 0)} of one persona): "
        f"KL median {_fmt(hist.get('kl_median'))}, min {_fmt(hist.get('kl_min'))}, max {_fmt(hist.get('kl_max'))} nats.",
        "",
        "## Recall of stated facts",
        "",
    ]
    facts = list(rec["chance_by_fact"])
    header = ["model", "mode", "overall", *facts]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.append("| chance | | " + " | ".join(_fmt(v) for v in [rec["chance"], *rec["chance_by_fact"].values()]) + " |")
    for who in ("model", "twin"):
        for mode, summary in (rec.get(who) or {}).items():
            cells = [_fmt(summary["by_fact"].get(f, {}).get("accuracy")) for f in facts]
            lines.append(f"| {who} | {mode} | {_fmt(summary['accuracy'])} | " + " | ".join(cells) + " |")
    lines += ["", "## Plots", ""]
    captions = {
        "attention": "Attention at a probe turn, head 0, first and last layer: fresh vs accumulated state ('self' = self slot)",
        "self_state": "Self-state trajectory over one episode",
        "trace_spectra": "Spectra of the stored trace and of the stabilised metric over the turns of one episode",
        "shocks": "Shock per turn; red crosses mark the corpus's shock turns",
    }
    for key, name in figures["plots"].items():
        lines += [f"### {captions[key]}", "", f"![{key}]({name})", ""]
    return "\n".join(lines)


def _model_info(model: SIAModel) -> dict[str, Any]:
    return {"config": model.config.to_dict(), "parameters": model.num_parameters()}


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
            carried = play_episodes(model, _encode(model, episodes, transcript=False), batch_size=batch_size, capture=at_probes)
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
                "model": _model_info(model),
                "twin": _model_info(twin) if twin is not None else None,
                "perplexity": {
                    "model": ppl_model,
                    "model_stateless": perplexity(model, episodes, batch_size=batch_size, carry=False),
                    "twin": ppl_twin,
                    "ratio": ppl_model / ppl_twin if ppl_twin else None,
                    "reply_tokens": carried.reply_tokens,
                },
                "recall": {
                    **_chance(episodes),
                    "model": {mode: _recall_summary(s) for mode, s in scored.items()},
                    "twin": {mode: _recall_summary(s) for mode, s in twin_scored.items()} or None,
                },
            }
            figures["history_dependence"] = history_dependence(model, episodes, n_pairs=n_pairs, seed=seed, batch_size=batch_size)
            lap("history dependence")
            figures["reset_determinism"] = reset_determinism(model, episodes[0], seed=seed)
            lap("reset determinism")
            figures["plot_data"] = _plots(model, episodes, carried.shocks, out_dir)
            figures["plots"] = dict(PLOT_FILES)
            lap("plots")
    finally:
        for m, was_training in zip(models, training, strict=True):
            m.train(was_training)
    figures["targets"] = _targets(figures)
    figures["seconds"] = seconds
    (out_dir / "report.json").write_text(json.dumps(figures, indent=2) + "\n")
    (out_dir / "report.md").write_text(_markdown(figures) + "\n")
    for target in figures["targets"]:
        log.info("%s: %s (target %s) %s", target["name"], _fmt(target["value"]), target["target"], target["pass"])
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
