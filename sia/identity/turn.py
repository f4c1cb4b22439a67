"""One conversational turn for a batch of identities: the library half of the turn docs/architecture.md draws (no
storage here; the durable half is server.runtime.turns, docs/store.md).

measure shock on the message -> generate the reply -> summarise the turn -> advance each identity's state.
The shock is read from the same prefill pass that starts generation, and the summary from sums the model
accumulates while decoding, so a turn costs exactly one generation.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

from sia.identity.imprint import Imprint, SpanChoice, forget_words, given_up, imprint_spans, message_spans
from sia.identity.shock import standardised_shock
from sia.identity.state import Dynamics, IdentityState, TurnSummary, advance
from sia.model.config import LlamaConfig
from sia.model.generate import Generation, SamplingParams, Stream, StreamEvent, stream
from sia.model.identity_model import IdentityModel, WordsRead
from sia.model.summary_sums import SummarySums
from sia.model.tokenizer import Tokenizer, completed_texts

__all__ = [
    "TurnPrompt",
    "TurnReply",
    "TurnRequest",
    "TurnResult",
    "advance_on_model",
    "conclude_turns",
    "reply_params",
    "run_turn",
    "stream_turns",
    "turn_prompt",
    "write_imprint",
]


@dataclass(frozen=True)
class TurnRequest:
    state: IdentityState
    message: str
    dynamics: Dynamics
    context: tuple[int, ...] = ()  # tokens before this turn: the persona's prompt, a recent window (not summarised)
    keep_text: bool = True  # the imprint keeps its spans' token ids (False: keys and values only, no text)
    # how many of context's first tokens every turn of the persona begins with (its prompt, before a recent window);
    # None: all of context. The imprint's write keeps the base model's read of them instead of reading them every turn
    shared: int | None = None


@dataclass(frozen=True)
class TurnReply:
    """What a turn answered and what it cost. The one record of a turn's outcome: the service's records of a turn
    (server.records.NewTurn, TurnRecord; the runtime's CommittedTurn, CounterfactualSide) extend it."""

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


@dataclass(frozen=True)
class TurnPrompt:
    """What the model reads for one turn request, and what of it the turn summary and the shock read."""

    tokens: list[int]  # context + the message's block + the generation prompt
    counted: list[bool]  # per token: counts towards the turn summary (the message, not the context)
    scored: tuple[int, int]  # Generation.prompt_nll[a:b] score the message and the token closing it: the shock's NLL

    @property
    def message(self) -> list[int]:
        """The user's message's own tokens (what the imprint's write and the ask head read)."""
        return self.tokens[self.scored[0] + 1 : self.scored[1]]


def turn_prompt(tok: Tokenizer, request: TurnRequest) -> TurnPrompt:
    if not isinstance(request.message, str):
        raise TypeError(f"message must be str; got {type(request.message).__name__}")
    if request.shared is not None and not 0 <= request.shared <= len(request.context):
        raise ValueError(f"shared must count tokens of the context: 0..{len(request.context)}; got {request.shared}")
    prompt, (start, end) = tok.turn_prompt(request.message, request.context)
    counted = [False] * len(request.context) + [True] * (len(prompt) - len(request.context))
    return TurnPrompt(prompt, counted, (start - 1, end - 1))  # prompt_nll[j] scores prompt[j + 1]


@torch.no_grad()  # plain tensors out: the new states may later be used where autograd records
def conclude_turns(
    model: IdentityModel,
    requests: Sequence[TurnRequest],
    prompts: Sequence[TurnPrompt],
    generations: Sequence[Generation],
    tokenizer: Tokenizer | None = None,
    imprints: Sequence[Imprint | None] | None = None,
) -> list[TurnResult]:
    """The end of each turn once its reply is generated (alone, in a batch, or joined to a running batch): the
    shock from the message's NLL, the summary, the new state (its imprint too, when the model keeps one).
    ``imprints``: per turn, its new imprint where it was already written (``imprint_message`` needs only the
    prompt's prefill, so a batch writes it beside the decoding), None where this writes it."""
    tok = tokenizer or model.tokenizer
    written = imprints if imprints is not None else [None] * len(requests)
    stats = SummarySums.cat([g.stats for g in generations])
    summaries = model.summarize(stats)
    results = []
    for row, (req, prompt, gen, imprint) in enumerate(zip(requests, prompts, generations, written, strict=True)):
        a, b = prompt.scored
        nll = float(gen.prompt_nll[a:b].mean())
        shock = standardised_shock(nll, req.state.shock, model.config)
        new_state = advance_on_model(model, req.state, summaries.row(row), shock=shock, nll=nll, dynamics=req.dynamics)
        if model.config.imprint_tokens:
            imprint = imprint_message(model, tok, req, prompt, gen.prompt_nll) if imprint is None else imprint
            new_state = replace(new_state, imprint=imprint)
        results.append(
            TurnResult(
                reply=gen.text,
                finish_reason=gen.finish_reason,
                shock=shock,
                nll=nll,
                prompt_tokens=len(prompt.tokens),
                completion_tokens=len(gen.tokens),
                state=new_state,
            )
        )
    return results


def advance_on_model(
    model: IdentityModel, state: IdentityState, summary: TurnSummary, *, shock: float, nll: float, dynamics: Dynamics
) -> IdentityState:
    """``advance`` computed where the model is (its self update's weights are there), the new state on the CPU, where
    states are stored and passed around: on a CPU model, plain ``advance``."""
    device = model.device
    on_device = replace(state, trace=state.trace.to(device), self_state=state.self_state.to(device))
    new_state = advance(on_device, summary, shock=shock, nll=nll, g=model.self_update, dynamics=dynamics)
    return replace(new_state, trace=new_state.trace.cpu(), self_state=new_state.self_state.cpu())


def _turns(
    model: IdentityModel, requests: Sequence[TurnRequest], params: SamplingParams, tokenizer: Tokenizer | None
) -> Generator[StreamEvent, None, list[TurnResult]]:
    tok = tokenizer or model.tokenizer
    if not requests:
        raise ValueError("need at least one turn request")
    if not model.stateful:
        raise ValueError(f"turns need a stateful model; the {model.config.attention!r} variant keeps no identity state")
    prompts = [turn_prompt(tok, req) for req in requests]
    with torch.no_grad():
        reads_from = [len(r.context) for r in requests]  # the persona's prompt does not read the imprint
        cond = model.condition_states([r.state for r in requests], reads_from, [p.message for p in prompts])
    decoding = stream(
        model,
        [p.tokens for p in prompts],
        cond,
        [reply_params(params, req) for req in requests],
        tokenizer=tok,
        summary_masks=[p.counted for p in prompts],
        nll_from=[p.scored[0] for p in prompts],  # the shock scores the message: the persona's prompt needs no logits
    )
    yield from decoding
    return conclude_turns(model, requests, prompts, decoding.result, tok)


def reply_params(params: SamplingParams, request: TurnRequest) -> SamplingParams:
    """How a turn's reply is decoded: ``params``, the reply kept to the language of the message it answers
    (``SamplingParams.reply_to``)."""
    return replace(params, reply_to=request.message)


def imprint_message(
    model: IdentityModel, tok: Tokenizer, request: TurnRequest, prompt: TurnPrompt, prompt_nll: Tensor
) -> Imprint:
    """The identity's imprint after this turn: the clauses of the message that surprised the identity (token shock,
    read from the turn's own prefill: ``prompt_nll`` (len(prompt.tokens) - 1,), its ``Generation.prompt_nll``), as the
    base model reads them in the turn's prompt (sia.identity.imprint). The reply plays no part."""
    c = model.config
    assert isinstance(c, LlamaConfig)  # only a model that keeps an imprint calls this
    imprint = request.state.imprint or Imprint.empty(c)
    a, b = prompt.scored  # prompt_nll[a:b] scores the message's tokens and the token closing it
    start, end = a + 1, b  # the message's own tokens: prompt.tokens[start:end]
    if end <= start:
        return imprint
    surprisal = prompt_nll[a : b - 1].float().cpu()  # (n,) each message token's NLL under the identity
    shared = len(request.context) if request.shared is None else request.shared
    words = model.read_words(torch.tensor([prompt.tokens[:end]], device=model.device), shared=shared)
    imprint, _ = write_imprint(
        c, tok, imprint, prompt.tokens, surprisal, words, slice(start, end), turn=request.state.turns, keep_text=request.keep_text
    )
    return imprint


def write_imprint(
    config: LlamaConfig,
    tok: Tokenizer,
    imprint: Imprint,
    tokens: Sequence[int],
    surprisal: Tensor,
    words: WordsRead,
    at: slice,
    *,
    turn: int,
    keep_text: bool,
) -> tuple[Imprint, list[SpanChoice]]:
    """``imprint`` with the spans of one message chosen and added, and those spans: the message is ``tokens[at]``,
    ``surprisal`` (n,) its tokens' NLL under the identity, ``words`` the base model's read of ``tokens`` (up to the
    message's end at least; from its ``start``, at or before the message's). The one write a turn, the read's training
    and the probes share."""
    message = list(tokens[at])
    read = slice(at.start - words.start, at.stop - words.start)  # the message in the read
    if read.start < 0:
        raise ValueError(f"the read starts at token {words.start}, after the message's start {at.start}")
    kinds = None if words.kinds is None else words.kinds[read].cpu()
    pieces = completed_texts(tok, message)
    # "technically not Lyon": the older spans naming Lyon go, and so does the clause (it would name Lyon again)
    imprint, denied = forget_words(imprint, given_up(pieces), tok.decode, turn)
    choices = message_spans(
        surprisal,
        pieces,
        kinds,
        budget=config.imprint_per_turn,
        max_span=config.imprint_span,
        min_score=config.imprint_min_shock,
        min_label=config.imprint_label_min,
        denied=denied,
        aside_weight=config.imprint_aside_weight,
        mend_bonus=config.imprint_mend_bonus,
    )
    if not choices:
        return imprint, []
    keys, values = words.keys[:, :, read].cpu(), words.values[:, :, read].cpu()
    ids = torch.tensor(message, dtype=torch.int32) if keep_text else None
    return imprint_spans(imprint, keys, values, choices, turn=turn, tokens=ids, decode=tok.decode), choices


def run_turn(
    model: IdentityModel, request: TurnRequest, params: SamplingParams, *, tokenizer: Tokenizer | None = None
) -> TurnResult:
    """One identity, one turn, no streaming."""
    return stream_turns(model, [request], params, tokenizer=tokenizer).finish()[0]
