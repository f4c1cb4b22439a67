"""One training step's losses over a batch of episodes played turn by turn from fresh identities: the answer (with
its ranking term among the kind's values), the read-out, the distillation from the transcript teacher."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.identity.state import Dynamics
from sia.learn.adapter import facts
from sia.learn.adapter.batch import Example
from sia.learn.adapter.config import TrainConfig
from sia.learn.adapter.readout import ReadOut
from sia.learn.adapter.unroll import Carry, Rendered, probe_logits, render_turn, span, transcript, write_turn

__all__ = ["episode_losses"]


def episode_losses(
    model: LlamaModel, readout: ReadOut, batch: list[Example], config: TrainConfig, dynamics: Dynamics
) -> dict[str, Tensor]:
    """The step's losses. The read's losses (the answer, the distillation) read a detached state and train the read
    only; the write learns from the read-out (and, with ``rank_to_write``, from the ranking term). The read's gradient
    would shut the write (gate closed, state constant; measured: the distillation alone took the held-out read-out
    from 89 % to 25 % in 150 steps)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    B = len(batch)
    carry = Carry.fresh(model, B)
    readout_terms: list[Tensor] = []
    readout_right: list[float] = []
    distill_terms: list[Tensor] = []
    n_turns = max(len(ex.episode.turns) for ex in batch)
    for t in range(n_turns):
        active = [b for b, ex in enumerate(batch) if t < len(ex.episode.turns)]
        for grad in (True, False):
            rows = [b for b in active if (batch[b].distill_at == t) == grad]
            if not rows:
                continue
            turns = [
                render_turn(tok, batch[b].context, batch[b].episode.turns[t].user, batch[b].episode.turns[t].reply) for b in rows
            ]
            part, logits, _ = write_turn(model, carry.take(rows), turns, dynamics, grad_tokens=grad, read_detached=True)
            carry = carry.put(rows, part)
            if grad and config.distill_weight > 0:
                examples = [batch[b] for b in rows]
                distill_terms.append(_distill(model, examples, turns, logits))
        # read-out of every stated fact from each state from the statement on
        stated = [b for b in active if t >= batch[b].episode.stated_at]
        if stated and config.readout_weight > 0:
            owners = [b for b in stated for _ in batch[b].episode.facts]
            said = [f for b in stated for f in batch[b].episode.facts]
            term, right = readout.loss(carry.self_state[torch.tensor(owners, device=model.device)], said, update=True)
            readout_terms.append(term)
            readout_right.append(right)
    reading = Carry(carry.self_state.detach(), carry.trace, carry.shock)  # the read's losses stop at the state
    zero = carry.self_state.new_zeros((), dtype=torch.float32)
    asked = any(ex.asked for ex in batch)
    answer, named_value = _answer_loss(model, reading, batch, config, ranked=not config.rank_to_write) if asked else (zero, zero)
    if asked and config.rank_to_write:
        answer = answer + config.rank_weight * _ranking_loss(model, carry, batch)
    readout_loss = torch.stack(readout_terms).mean() if readout_terms else zero
    distill = torch.stack(distill_terms).mean() if distill_terms else zero
    states = carry.self_state.detach().float()
    spread = states.std(0).mean() if states.shape[0] > 1 else zero  # how much the final states differ between users
    named = answer.new_tensor(sum(readout_right) / max(1, len(readout_right)))  # training read-out accuracy
    return {
        "answer": answer,
        "readout": readout_loss,
        "distill": distill,
        "spread": spread,
        "readout_acc": named,
        "answer_acc": named_value,
    }


def _answer_loss(
    model: LlamaModel, carry: Carry, batch: list[Example], config: TrainConfig, ranked: bool = True
) -> tuple[Tensor, Tensor]:
    """The probes' reply cross-entropy (value tokens weighted ``value_weight``; with ``rank_weight`` and ``ranked``,
    plus the ranking term among the kind's values), and the share of probes whose value's first token is the model's
    most likely next token there (the training-side twin of held-out recall)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    rows, owners, spans, asking, choices = [], [], [], [], []
    for b, ex in enumerate(batch):
        for probe in (ex.episode.probes[j] for j in ex.asked):
            turn = render_turn(tok, ex.context, probe.question, probe.reply)
            head = len(tok.encode(probe.reply_prefix))
            if ranked and config.rank_weight > 0:
                choices.append(_value_choices(tok, ex, probe, turn, head))
            rows.append(turn.tokens)
            asking.append(len(turn.tokens) - turn.message[0])  # the question and the reply: what is differentiated
            owners.append(b)
            spans.append(
                (
                    turn.reply[0],
                    turn.reply[1],
                    turn.reply[0] + head,
                    turn.reply[0] + len(tok.encode(f"{probe.reply_prefix} {probe.value}")),
                )
            )
    tail = max(len(r) - sp[0] + 1 for r, sp in zip(rows, spans, strict=True))
    logits = probe_logits(model, carry.take(owners), rows, tail=tail, grad_tail=max(tail, *asking))
    total, weight, named = logits.new_zeros((), dtype=torch.float32), 0.0, 0
    at_value = []
    for i, (row, (a, e, va, ve)) in enumerate(zip(rows, spans, strict=True)):
        target = torch.tensor(row[a:e], device=logits.device)
        predicted = span(logits[i], len(row), a, e).float()  # (n, V)
        ce = F.cross_entropy(predicted, target, reduction="none")  # (n,)
        w = torch.ones_like(ce)
        w[va - a : ve - a] = config.value_weight
        total = total + (ce * w).sum()
        weight += float(w.sum())
        named += int(int(predicted[va - a].argmax()) == row[va])
        at_value.append(predicted[va - a])
    answer = total / weight
    if choices:
        answer = answer + config.rank_weight * _ranking(torch.stack(at_value), choices)
    return answer, total.new_tensor(named / len(rows))


def _ranking_loss(model: LlamaModel, carry: Carry, batch: list[Example]) -> Tensor:
    """The ranking term alone (``rank_to_write``): each probe's turn cut before its value, read under ``carry`` as
    given (its gradient reaches whatever made the state), the cross-entropy among the first tokens of the kind's
    values at the last position, averaged over the probes. The same figure as ``_answer_loss``'s term."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    rows, owners, asking, choices = [], [], [], []
    for b, ex in enumerate(batch):
        for probe in (ex.episode.probes[j] for j in ex.asked):
            turn = render_turn(tok, ex.context, probe.question, probe.reply)
            head = len(tok.encode(probe.reply_prefix))
            value_at = turn.reply[0] + head
            choices.append(_value_choices(tok, ex, probe, turn, head))
            rows.append(turn.tokens[:value_at])
            asking.append(value_at - turn.message[0])
            owners.append(b)
    logits = probe_logits(model, carry.take(owners), rows, tail=1, grad_tail=max(asking))[:, -1].float()  # (probes, V)
    return _ranking(logits, choices)


def _ranking(at_value: Tensor, choices: Sequence[tuple[list[int], int]]) -> Tensor:
    """The ranking term: the mean over probes of a cross-entropy among each probe's value choices (``_value_choices``),
    from its logits (probes, V) where the value begins."""
    terms = [
        F.cross_entropy(row[torch.tensor(ids, device=row.device)].unsqueeze(0), torch.tensor([truth], device=row.device))
        for row, (ids, truth) in zip(at_value, choices, strict=True)
    ]
    return torch.stack(terms).mean()


def _value_choices(tok: ChatTokenizer, ex: Example, probe: facts.Probe, turn: Rendered, head: int) -> tuple[list[int], int]:
    """The distinct tokens each value of ``probe``'s kind (in ``ex``'s split) begins with after the reply's prefix
    (``head`` tokens of ``turn``'s reply), and the index among them of the token the reply's own value begins with
    (added where no value's encoding began so)."""
    prefix, values = probe.reply_prefix, facts.values(probe.kind, ex.episode.split)
    true_id = turn.tokens[turn.reply[0] + head]
    firsts = (tok.encode(f"{prefix} {value}") for value in values)
    ids = list(dict.fromkeys(enc[head] for enc in firsts if len(enc) > head))
    if true_id not in ids:
        ids.append(true_id)
    return ids, ids.index(true_id)


def _distill(model: LlamaModel, examples: list[Example], turns: list[Any], student: Tensor) -> Tensor:
    """KL(teacher || student) per reply token of each example's turn ``distill_at``; the teacher is the base model
    (a fresh state) reading the whole transcript up to that turn."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    rows, spans = [], []
    for ex in examples:
        exchanges = [(x.user, x.reply) for x in ex.episode.turns[: ex.distill_at + 1]]
        tokens, reply_spans = transcript(tok, ex.context, exchanges)
        rows.append(tokens)
        spans.append(reply_spans[-1])
    with torch.no_grad():
        tail = max(len(r) - a + 1 for r, (a, _) in zip(rows, spans, strict=True))
        teacher = probe_logits(model, Carry.fresh(model, len(rows)), rows, tail=tail)
    terms = []
    for i, (row, (a, e), turn) in enumerate(zip(rows, spans, turns, strict=True)):
        p = F.log_softmax(span(teacher[i], len(row), a, e).float(), dim=-1)  # (n, V)
        q = F.log_softmax(span(student[i], len(turn.tokens), *turn.reply).float(), dim=-1)
        terms.append(F.kl_div(q, p, log_target=True, reduction="batchmean"))
    return torch.stack(terms).mean()
