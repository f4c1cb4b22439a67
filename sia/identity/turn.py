"""One conversational turn for a batch of identities (DESIGN §2, the library half; no storage here).

measure shock on the message -> generate the reply -> summarise the turn -> advance each identity's state.
The shock is read from the same prefill pass that starts generation, and the summary from sums the model
accumulates while decoding, so a turn costs exactly one generation.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from sia.identity.shock import standardised_shock
from sia.identity.state import Dynamics, IdentityState, advance
from sia.model.generate import SamplingParams, Stream, StreamEvent, stream
from sia.model.tokenizer import Tokenizer
from sia.model.transformer import IdentityModel, TurnStats

__all__ = ["TurnReply", "TurnRequest", "TurnResult", "run_turn", "stream_turns"]


@dataclass(frozen=True)
class TurnRequest:
    state: IdentityState
    message: str
    dynamics: Dynamics
    context: tuple[int, ...] = ()  # tokens before this turn: the persona's prompt, a recent window (not summarised)


@dataclass(frozen=True)
class TurnReply:
    """What a turn answered and what it cost. The one record of a turn's outcome: the service's records of a turn
    (server.records.NewTurn, TurnRecord; the runtime's TurnOutcome, CounterfactualSide) extend it."""

    reply: str
    finish_reason: str
    shock: float  # standardised shock that gated the trace update
    nll: float  # mean token NLL of the message (and the token closing it) under the pre-turn state
    prompt_tokens: int
    completion_tokens: int

    def reply_fields(self) -> dict[str, Any]:
        """This record's TurnReply fields by name: what a record that extends it is built from."""
        return {f.name: getattr(self, f.name) for f in fields(TurnReply)}


@dataclass(frozen=True)
class TurnResult(TurnReply):
    state: IdentityState  # the identity after this turn; the input state is untouched


def stream_turns(
    model: IdentityModel, requests: Sequence[TurnRequest], params: SamplingParams, *, tokenizer: Tokenizer | None = None
) -> Stream[list[TurnResult]]:
    """StreamEvents while replies are generated; the result is the list of TurnResults (one per request)."""
    return Stream(_turns(model, requests, params, tokenizer))


def _turns(
    model: IdentityModel, requests: Sequence[TurnRequest], params: SamplingParams, tokenizer: Tokenizer | None
) -> Generator[StreamEvent, None, list[TurnResult]]:
    tok = tokenizer or model.tokenizer
    if not requests:
        raise ValueError("need at least one turn request")
    if not model.stateful:
        raise ValueError(f"turns need a stateful model; the {model.config.attention!r} variant keeps no identity state")
    prompts, masks, spans = [], [], []
    for req in requests:
        if not isinstance(req.message, str):
            raise TypeError(f"message must be str; got {type(req.message).__name__}")
        prompt, (start, end) = tok.turn_prompt(req.message, req.context)
        prompts.append(prompt)
        masks.append([False] * len(req.context) + [True] * (len(prompt) - len(req.context)))
        # prompt_nll[j] scores prompt[j + 1], so the message's tokens (and the token closing it) are [start-1, end-1)
        spans.append((start - 1, end - 1))
    with torch.no_grad():
        cond = model.condition_states([r.state for r in requests])
    decoding = stream(model, prompts, cond, params, tokenizer=tok, summary_masks=masks)
    yield from decoding
    generations = decoding.result
    results = []
    with torch.no_grad():  # plain tensors out: the new states may later be used where autograd records
        summaries = model.summarize(TurnStats.cat([g.stats for g in generations]))
        for row, (req, gen, (a, b), prompt) in enumerate(zip(requests, generations, spans, prompts, strict=True)):
            summary = summaries.row(row)
            nll = float(gen.prompt_nll[a:b].mean())
            shock = standardised_shock(nll, req.state.shock, model.config)
            new_state = advance(req.state, summary, shock=shock, nll=nll, g=model.self_update, dynamics=req.dynamics)
            results.append(
                TurnResult(
                    reply=gen.text,
                    finish_reason=gen.finish_reason,
                    shock=shock,
                    nll=nll,
                    prompt_tokens=len(prompt),
                    completion_tokens=len(gen.tokens),
                    state=new_state,
                )
            )
    return results


def run_turn(
    model: IdentityModel, request: TurnRequest, params: SamplingParams, *, tokenizer: Tokenizer | None = None
) -> TurnResult:
    """One identity, one turn, no streaming."""
    return stream_turns(model, [request], params, tokenizer=tokenizer).finish()[0]
