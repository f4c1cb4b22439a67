"""State-carried recall: every candidate value scored in the reply's slot, the argmax is the prediction."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.identity.state import Dynamics
from sia.learn.native.corpus import Episode, Probe
from sia.learn.native.episodes import EncodedTurn, StateBatch, batch_turns, encode_turn, forward_turn
from sia.learn.native.play import Play, cat_states, encode_episodes, model_device, play_episodes
from sia.model.conditioning import Conditioning
from sia.model.generate import left_padded
from sia.model.native import LayerConditioning, SIAModel
from sia.model.tokenizer import ByteTokenizer

MODES = ("state", "stateless", "transcript")


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
    device = model_device(model)
    dynamics = Dynamics.from_config(model.config)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0].ids))  # similar lengths share a batch
    out = [0.0] * len(rows)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = batch_turns([rows[i][0] for i in chunk], pad_id=tok.pad_id, device=device)
        result = forward_turn(model, batch, cat_states([rows[i][1] for i in chunk]), dynamics)
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
    device = model_device(model)
    limit = model.config.block_size - 1
    state = cat_states([g.state for g in group])
    prefixes = [g.turns[0].ids[: g.shared] for g in group]
    idx, valid = left_padded(prefixes, tok.pad_id, device)  # (P, Lp)
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
    encoded = encode_episodes(model, episodes, transcript=transcript, slack=transcript)
    refs = [(e, probe) for e, episode in enumerate(episodes) for probe in episode.probes]
    if mode == "stateless" or not model.stateful:
        fresh = StateBatch.fresh(model.config, 1, model_device(model))
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


def recall_summary(scored: Sequence[ProbeScore]) -> dict[str, Any]:
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


def chance(episodes: Sequence[Episode]) -> dict[str, Any]:
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
