"""Teacher-forced turns over batches of episodes: what training and evaluation share with serving.

Notation: B episodes (rows), L tokens of one turn after right padding, n_layer, H, d as in sia/model/native.py.

A turn is encoded exactly as serving encodes it (sia/identity/turn.py):

    [context] <|user|> message <|end|> <|assistant|> reply <|end|>

``context`` is the persona preamble, optionally followed by earlier turns of the transcript. Shock is the
mean NLL of the message bytes and their <|end|>; the summary counts the turn's tokens from <|user|> up to
the last reply token that serving would feed back (the closing <|end|> is sampled, never fed). After the
turn the state advances by the same rules as serving (sia/identity/state.py), on batched tensors: the trace
without gradient, the self state with gradient, so training can back-propagate through it across turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.identity.shock import standardise
from sia.identity.state import Dynamics, IdentityState, ShockStats, self_step, trace_step, welford_step
from sia.model.config import ModelConfig
from sia.model.native import SIAModel
from sia.model.tokenizer import ByteTokenizer

__all__ = ["EncodedTurn", "StateBatch", "TurnBatch", "TurnBatchOutput", "batch_turns", "encode_turn", "forward_turn"]


@dataclass(frozen=True)
class EncodedTurn:
    ids: list[int]
    context_len: int  # tokens before <|user|>
    message_len: int  # bytes of the message
    reply_start: int  # index of the first reply token (after <|assistant|>)
    answer: tuple[int, int] | None = None  # token range [start, end) of a recalled value inside the reply


def encode_turn(
    tok: ByteTokenizer, context: Sequence[int], message: str, reply: str, *, answer: tuple[str, str] | None = None
) -> EncodedTurn:
    """Encode one turn; ``answer`` = (reply prefix, value) marks the value's tokens (a recall probe)."""
    prompt = tok.chat_prompt(message, context)
    ids = [*prompt, *tok.encode(reply), tok.end_id]
    span = None
    if answer is not None:
        prefix, value = answer
        if not reply.startswith(prefix + value):
            raise ValueError(f"reply {reply!r} does not start with {prefix + value!r}")
        start = len(prompt) + len(tok.encode(prefix))
        span = (start, start + len(tok.encode(value)))
    message_len = len(prompt) - len(context) - 3
    return EncodedTurn(ids=ids, context_len=len(context), message_len=message_len, reply_start=len(prompt), answer=span)


@dataclass
class TurnBatch:
    tokens: Tensor  # (B, L) right-padded with <|pad|>
    reply_targets: Tensor  # (B, L-1) bool: target tokens[:, 1:] belongs to the reply (its <|end|> included)
    message_targets: Tensor  # (B, L-1) bool: target is a message byte or the message's <|end|>
    answer_targets: Tensor  # (B, L-1) bool: target is a token of a recalled value (probe turns only)
    summary_mask: Tensor  # (B, L) bool: tokens the turn summary counts
    active: Tensor  # (B,) bool: rows that have this turn


def batch_turns(turns: Sequence[EncodedTurn | None], *, pad_id: int, device: torch.device | str = "cpu") -> TurnBatch:
    """Right-pad encoded turns into one batch; ``None`` marks a row whose episode has no such turn."""
    B = len(turns)
    L = max((len(t.ids) for t in turns if t is not None), default=2)
    tokens = torch.full((B, L), pad_id, dtype=torch.long)
    reply = torch.zeros(B, L - 1, dtype=torch.bool)
    message = torch.zeros(B, L - 1, dtype=torch.bool)
    answer = torch.zeros(B, L - 1, dtype=torch.bool)
    summary = torch.zeros(B, L, dtype=torch.bool)
    active = torch.zeros(B, dtype=torch.bool)
    for b, t in enumerate(turns):
        if t is None:  # a placeholder row: one counted token keeps the batched maths defined; discarded later
            summary[b, 0] = message[b, 0] = True
            continue
        n = len(t.ids)
        tokens[b, :n] = torch.tensor(t.ids)
        # target j is tokens[j + 1]: the message bytes and their <|end|> are predicted from <|user|> onwards
        message[b, t.context_len : t.context_len + t.message_len + 1] = True
        reply[b, t.reply_start - 1 : n - 1] = True
        if t.answer is not None:
            answer[b, t.answer[0] - 1 : t.answer[1] - 1] = True
        summary[b, t.context_len : n - 1] = True
        active[b] = True
    return TurnBatch(
        tokens.to(device), reply.to(device), message.to(device), answer.to(device), summary.to(device), active.to(device)
    )


@dataclass
class StateBatch:
    """Identity states of B rows as tensors (what IdentityState holds, batched)."""

    trace: Tensor  # (B, n_layer, H, d, d)
    self_state: Tensor  # (B, d_s)
    shock_count: Tensor  # (B,) float64
    shock_mean: Tensor  # (B,) float64
    shock_m2: Tensor  # (B,) float64

    @classmethod
    def fresh(cls, config: ModelConfig, batch: int, device: torch.device | str = "cpu") -> StateBatch:
        d = config.qk_dim
        zeros = torch.zeros(batch, dtype=torch.float64, device=device)
        return cls(
            trace=torch.zeros(batch, config.n_layer, config.n_head, d, d, device=device),
            self_state=torch.zeros(batch, config.d_self, device=device),
            shock_count=zeros,
            shock_mean=zeros.clone(),
            shock_m2=zeros.clone(),
        )

    def row(self, b: int, turns: int = 0) -> IdentityState:
        """Row b as an IdentityState (detached)."""
        return IdentityState(
            trace=self.trace[b].detach().clone(),
            self_state=self.self_state[b].detach().clone(),
            turns=turns,
            shock=ShockStats(int(self.shock_count[b]), float(self.shock_mean[b]), float(self.shock_m2[b])),
        )

    def where(self, keep: Tensor, other: StateBatch) -> StateBatch:
        """Rows where ``keep`` is true from self, the others from ``other``."""
        k5, k1 = keep.view(-1, 1, 1, 1, 1), keep.view(-1, 1)
        return StateBatch(
            trace=torch.where(k5, self.trace, other.trace),
            self_state=torch.where(k1, self.self_state, other.self_state),
            shock_count=torch.where(keep, self.shock_count, other.shock_count),
            shock_mean=torch.where(keep, self.shock_mean, other.shock_mean),
            shock_m2=torch.where(keep, self.shock_m2, other.shock_m2),
        )


@dataclass
class TurnBatchOutput:
    logits: Tensor  # (B, L, V)
    token_nll: Tensor  # (B, L-1) NLL of every target token
    message_nll: Tensor  # (B,) mean NLL of the message (0 for inactive rows)
    shock: Tensor  # (B,)
    state: StateBatch  # after the turn (inactive rows unchanged)


def forward_turn(model: SIAModel, batch: TurnBatch, state: StateBatch, dynamics: Dynamics) -> TurnBatchOutput:
    """One teacher-forced turn for every row: logits, shock, and the advanced state (sia.identity.turn's steps)."""
    cond = model.condition(state.trace, state.self_state)
    out = model(batch.tokens, cond, summary_mask=batch.summary_mask)
    logits = out.logits  # (B, L, V)
    token_nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch.tokens[:, 1:], reduction="none")  # (B, L-1)
    counts = batch.message_targets.sum(1).clamp_min(1)
    message_nll = ((token_nll.detach() * batch.message_targets).sum(1) / counts).double()  # (B,)
    shock = standardise(message_nll, state.shock_count, state.shock_mean, state.shock_m2, model.config)
    if not model.stateful:
        return TurnBatchOutput(logits, token_nll, message_nll, shock, state)
    summary = model.summarize(out.stats)
    trace = trace_step(
        state.trace, summary.keys.detach(), summary.queries.detach(), shock.float(), alpha=dynamics.alpha, decay=dynamics.decay
    )
    self_state = self_step(state.self_state, summary.hidden, model.self_update, eta=dynamics.eta)
    count, mean, m2 = welford_step(state.shock_count, state.shock_mean, state.shock_m2, message_nll)
    new = StateBatch(trace, self_state, count, mean, m2)
    return TurnBatchOutput(logits, token_nll, message_nll, shock, new.where(batch.active, state))
