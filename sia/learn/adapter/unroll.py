"""Episodes through the model turn by turn, the identity state carried as tensors: what training and evaluation share.

A turn here is what the service runs, teacher-forced: the persona's system block, the user block, the reply and its
end-of-turn token, then the memory tokens; the message's NLL gives the shock, the trace moves by the seed's rule and
the self state by the learned write. Rows are left-padded as in generation.

Notation: B rows, L padded tokens, K memory tokens, V vocabulary, d_s self-state width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.identity.shock import standardise
from sia.identity.state import Dynamics, IdentityState, self_step, trace_step, welford_step
from sia.model.conditioning import Conditioning
from sia.model.generate import left_padded, padded_inputs
from sia.model.identity_model import ModelOutput
from sia.model.kv_cache import KVCache
from sia.personas import PERSONAS

__all__ = [
    "Carry",
    "Rendered",
    "forward_padded",
    "persona_contexts",
    "probe_logits",
    "render_turn",
    "score_candidates",
    "span",
    "transcript",
    "write_turn",
]


@dataclass(frozen=True)
class Rendered:
    """One turn as the model reads it."""

    tokens: list[int]  # context + user block + generation prompt + reply + end-of-turn
    counted: list[bool]  # tokens that count towards the trace summary: message and reply, not context, not the last
    message: tuple[int, int]  # tokens[a:b] are the message and the token closing it
    reply: tuple[int, int]  # tokens[a:b] are the reply and its end-of-turn token


def render_turn(tok: ChatTokenizer, context: Sequence[int], user: str, reply: str) -> Rendered:
    prompt, message = tok.turn_prompt(user, context)
    answer = [*tok.encode(reply), tok.end_of_turn_id]
    tokens = [*prompt, *answer]
    counted = [False] * len(context) + [True] * (len(tokens) - len(context) - 1) + [False]
    return Rendered(tokens, counted, message, (len(prompt), len(tokens)))


def persona_contexts(model: LlamaModel, n: int) -> list[list[int]]:
    """The system blocks of the default personas in turn, one per row: what evaluations open each turn with."""
    names = sorted(PERSONAS)
    return [model.tokenizer.system_prompt(PERSONAS[names[i % len(names)]].system_prompt) for i in range(n)]


def transcript(
    tok: ChatTokenizer, context: Sequence[int], exchanges: Sequence[tuple[str, str]]
) -> tuple[list[int], list[tuple[int, int]]]:
    """A whole conversation as one prompt (the transcript-in-context reading) and each reply's token span."""
    tokens = list(context)
    spans = []
    for user, reply in exchanges:
        tokens, _ = tok.turn_prompt(user, tokens)
        start = len(tokens)
        tokens += tok.reply_tokens(reply)
        spans.append((start, start + len(tok.encode(reply)) + 1))
    return tokens, spans


def forward_padded(
    model: LlamaModel,
    cond: Conditioning,
    tokens: Tensor,
    key_valid: Tensor,
    counted: Tensor,
    *,
    cache: KVCache | None = None,
    memory: bool = False,
    tail: int | None = None,
) -> ModelOutput:
    """tokens (B, n), the newest n of left-padded rows; key_valid (B, prefix + every token so far, these included).

    Logits only for the last ``tail`` positions (default: all n); read them with ``span``."""
    n = tokens.shape[1]
    positions, attn_mask = padded_inputs(key_valid, n, model.prefix_len, model.config.memory_tokens if memory else 0)
    start = 0 if tail is None else max(0, n - tail)
    out: ModelOutput = model(
        tokens,
        cond,
        cache=cache,
        positions=positions,
        attn_mask=attn_mask,
        summary_mask=counted,
        memory=memory,
        logits_from=start,
    )
    return out


def span(logits: Tensor, length: int, a: int, e: int) -> Tensor:
    """The rows of one left-padded row's logits (tail, V) that predict its tokens[a:e]; the row has ``length`` tokens."""
    start = logits.shape[0] - length + a - 1
    if start < 0:
        raise ValueError(f"logits cover the last {logits.shape[0]} positions; predicting token {a} of {length} needs more")
    return logits[start : start + e - a]


@dataclass
class Carry:
    """The identity state of B rows during an unroll; ``self_state`` may carry a gradient."""

    self_state: Tensor  # (B, d_s)
    trace: Tensor  # (B, *trace_shape), never differentiated
    shock: Tensor  # (B, 3) float64: count, mean, m2 of the message NLLs so far

    @classmethod
    def fresh(cls, model: LlamaModel, rows: int) -> Carry:
        c = model.config
        device = model.device
        trace = torch.zeros(rows, *c.trace_shape, dtype=IdentityState.fresh(c).trace.dtype, device=device)
        return cls(torch.zeros(rows, c.d_self, device=device), trace, torch.zeros(rows, 3, dtype=torch.float64, device=device))

    def take(self, rows: Sequence[int] | Tensor) -> Carry:
        index = torch.as_tensor(rows, dtype=torch.long, device=self.self_state.device)
        return Carry(self.self_state[index], self.trace[index], self.shock[index])

    def put(self, rows: Sequence[int], part: Carry) -> Carry:
        """A new Carry with ``rows`` replaced by ``part`` (differentiable in both)."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.self_state.device)
        with torch.autocast(index.device.type, enabled=False):  # state tensors keep their own dtypes
            return Carry(
                self.self_state.index_copy(0, index, part.self_state.to(self.self_state.dtype)),
                self.trace.index_copy(0, index, part.trace),
                self.shock.index_copy(0, index, part.shock),
            )

    def condition(self, model: LlamaModel) -> Conditioning:
        return model.condition(self.trace, self.self_state)


def write_turn(
    model: LlamaModel,
    carry: Carry,
    turns: Sequence[Rendered],
    dynamics: Dynamics,
    *,
    grad_tokens: bool,
    read_detached: bool = False,
) -> tuple[Carry, Tensor, Tensor]:
    """Run one turn per row and advance each row's state as the service does.

    Returns the new Carry, the logits (B, tail, V) from the earliest message on (read with ``span``; differentiable only with
    ``grad_tokens``) and the validity mask (B, L). Without ``grad_tokens`` the turn's tokens run without
    recording (a stop-gradient on the state's path through them); the memory tokens, which read the turn and
    the slot, and the self update are always differentiable, so the gradient still reaches every turn's write.
    With ``read_detached`` the slots read a detached copy of the state: a loss on this turn's reply trains the read
    but not the write, and the state reaches later turns only through the self update.
    """
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    device = model.device
    idx, valid = left_padded([t.tokens for t in turns], tok.pad_id, device)
    counted, _ = left_padded([[int(c) for c in t.counted] for t in turns], 0, device)
    counted = counted.bool()
    B, L = idx.shape
    prefix = torch.ones(B, model.prefix_len, dtype=torch.bool, device=device)
    key_valid = torch.cat([prefix, valid], dim=1)
    cond = model.condition(carry.trace, carry.self_state.detach() if read_detached else carry.self_state)
    tail = max(len(t.tokens) - t.message[0] + 1 for t in turns)  # logits from the message on
    if grad_tokens:
        out = forward_padded(model, cond, idx, key_valid, counted, memory=True, tail=tail)
        logits, stats = out.logits, out.stats
    else:
        cache = model.new_cache(cond, L + model.config.memory_tokens)
        with torch.no_grad():
            first = forward_padded(model, cond, idx[:, :-1], key_valid[:, :-1], counted[:, :-1], cache=cache, tail=tail - 1)
        out = forward_padded(model, cond, idx[:, -1:], key_valid, counted[:, -1:], cache=cache, memory=True)
        logits, stats = torch.cat([first.logits, out.logits.detach()], dim=1), first.stats + out.stats
    # shock: mean NLL of each message (and the token closing it) under the pre-turn state
    with torch.no_grad():
        nll = torch.zeros(B, dtype=torch.float64, device=device)
        for b, t in enumerate(turns):
            a, e = t.message
            log_p = F.log_softmax(span(logits[b], len(t.tokens), a, e).float(), dim=-1)
            nll[b] = -log_p.gather(-1, torch.tensor(t.tokens[a:e], device=device).unsqueeze(-1)).mean()
        count, mean, m2 = carry.shock.unbind(-1)
        shock = standardise(nll, count, mean, m2, model.config).float()
        summary = model.summarize(stats)
        trace = trace_step(carry.trace, summary.keys, summary.queries, shock, alpha=dynamics.alpha, decay=dynamics.decay)
        new_shock = torch.stack(welford_step(count, mean, m2, nll), dim=-1)
    assert out.memory is not None
    z = stats.written_by(out.memory).hidden  # (B, (K+1)·C), the write's input, differentiable
    if model.training and model.self_update.proj.weight.requires_grad:  # the statistics are the write's: frozen with it
        model.self_update.observe(z)
    s = self_step(carry.self_state, z, model.self_update, eta=dynamics.eta)
    return Carry(s, trace, new_shock), logits, valid


def probe_logits(
    model: LlamaModel, carry: Carry, rows: Sequence[Sequence[int]], tail: int | None = None, grad_tail: int | None = None
) -> Tensor:
    """Logits (B, tail, V) of the last ``tail`` positions of left-padded ``rows`` read under each row's state (no
    write); read a row's with ``span``.

    With ``grad_tail`` only the last ``grad_tail`` positions are differentiated: the ones before them (the persona's
    system block) run without recording into a cache, so the state reaches the loss through the slots every later
    token reads at every layer, not through the system block's hidden states. It halves a probe's backward."""
    tok = model.tokenizer
    idx, valid = left_padded(rows, tok.pad_id, model.device)
    prefix = torch.ones(idx.shape[0], model.prefix_len, dtype=torch.bool, device=idx.device)
    key_valid, counted = torch.cat([prefix, valid], dim=1), torch.zeros_like(valid)
    cond = carry.condition(model)
    L = idx.shape[1]
    if grad_tail is None or grad_tail >= L:
        return forward_padded(model, cond, idx, key_valid, counted, tail=tail).logits
    if tail is not None and tail > grad_tail:
        raise ValueError(f"logits for the last {tail} positions need grad_tail >= {tail}; got {grad_tail}")
    cut = L - grad_tail
    cache = model.new_cache(cond, L)
    with torch.no_grad():
        forward_padded(model, cond, idx[:, :cut], key_valid[:, : model.prefix_len + cut], counted[:, :cut], cache=cache, tail=1)
    return forward_padded(model, cond, idx[:, cut:], key_valid, counted[:, cut:], cache=cache, tail=tail).logits


def score_candidates(
    model: LlamaModel, carry: Carry, prompts: Sequence[Sequence[int]], prefix: Sequence[str], candidates: Sequence[Sequence[str]]
) -> list[Tensor]:
    """Per row b: the log-likelihood of each candidate value after ``prompts[b]`` + reply prefix, under row b's state.

    A candidate's tokens are those following the prefix's own tokens in ``prefix + " " + value``. Each prompt is
    read once; its cache is then copied for the candidates that need more than their first token.
    """
    tok = model.tokenizer
    device = model.device
    heads, conts = [], []  # per row: prompt + the shared part; per row and candidate: the tokens to score
    for prompt, pre, values in zip(prompts, prefix, candidates, strict=True):
        own = tok.encode(pre)
        fulls = [tok.encode(f"{pre} {value}") for value in values]
        cut = min(
            next((i for i, (x, y) in enumerate(zip(own, full, strict=False)) if x != y), min(len(own), len(full)))
            for full in fulls
        )
        heads.append([*prompt, *fulls[0][:cut]])
        conts.append([full[cut:] for full in fulls])
    if any(not c for row in conts for c in row):
        raise ValueError("a candidate adds no tokens to its reply prefix")
    idx, valid = left_padded(heads, tok.pad_id, device)
    B, L = idx.shape
    longest = max(len(c) for row in conts for c in row)
    key_valid = torch.cat([torch.ones(B, model.prefix_len, dtype=torch.bool, device=device), valid], dim=1)
    with torch.no_grad():
        cond = carry.condition(model)
        cache = model.new_cache(cond, L + longest)
        first = F.log_softmax(
            forward_padded(model, cond, idx, key_valid, torch.zeros_like(valid), cache=cache, tail=1).logits[:, -1].float(), -1
        )
        scores = [first[b, torch.tensor([c[0] for c in conts[b]], device=device)].cpu() for b in range(B)]
        longer = [(b, j) for b in range(B) for j, c in enumerate(conts[b]) if len(c) > 1]
        if longer:
            owners = torch.tensor([b for b, _ in longer], device=device)
            rest = [conts[b][j] for b, j in longer]
            n = max(len(c) for c in rest) - 1
            feed = torch.full((len(rest), n), tok.pad_id, dtype=torch.long, device=device)
            for i, c in enumerate(rest):
                feed[i, : len(c) - 1] = torch.tensor(c[:-1], device=device)
            # right-padded continuations: a real token never sees the padding after it
            kv = torch.cat([key_valid[owners], torch.ones(len(rest), n, dtype=torch.bool, device=device)], dim=1)
            more = cond_rows(model, carry, owners)
            out = forward_padded(model, more, feed, kv, torch.zeros_like(feed, dtype=torch.bool), cache=cache.select(owners))
            log_p = F.log_softmax(out.logits.float(), -1)  # (R, n, V)
            for i, ((b, j), c) in enumerate(zip(longer, rest, strict=True)):
                target = torch.tensor(c[1:], device=device)
                scores[b][j] += float(log_p[i, : len(c) - 1].gather(-1, target.unsqueeze(-1)).sum())
    return scores


def cond_rows(model: LlamaModel, carry: Carry, rows: Tensor) -> Conditioning:
    return carry.take(rows).condition(model)
