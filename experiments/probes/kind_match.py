"""Would a read that knows which entries hold the asked kind find them? A per-entry bias on the imprint's logits, set
once a turn from the question's kind, tried with the kind known exactly (the ceiling of matching kinds) and with the
kinds the write's tagger stored.

The natural set's tuning part is played as ``sia eval --natural tune --modes state`` plays it (the user's messages,
``--depth`` unrelated turns), then every question is asked of the same states under each condition:

- ``none``: the shipped read (this reproduces ``sia eval``'s figure);
- ``oracle+B``: the entries of every span holding a value of the asked kind (any of the user's values of that kind,
  older ones too, found by their accepted strings) get +B on their logit: a perfect span tagger and a perfect
  question classifier;
- ``oracle+-B``: the same, and the spans holding another kind's value get -B;
- ``tagger+B``: the entries whose stored kind (the write's tagger) is the asked kind get +B; the question's kind still
  known exactly;
- ``ask+B`` (``--ask B ...``, a checkpoint with an ask head): what ships, the model's own ``entry_bias`` from its ask
  head and the tagger's kinds, config.imprint_ask_bias = B.
- ``soft+B`` / ``hard+B`` (``--soft B ...``, with an ask head): the ask head's probabilities p against each span's
  mean tagger probabilities q over its tokens (re-read from the turn that imprinted it), every span moved by
  B·(2·sum_k p_k q_k − (1 − p_none)(1 − q_none)) where p_none < ½; ``hard`` puts the stored label's one-hot in q's
  place (it reproduces ``ask+B``), ``soft`` keeps the tagger's whole distribution, labelled or not.
- ``tokenT+B`` (``--token T ...``, with an ask head): the shipped bias with each entry's kind taken from its own token
  where the tagger gives that token a kind with probability T or more (the span's stored kind elsewhere).

The write can be changed first: ``--clause-fill P`` (the clause-level map labels, from P, the clauses the shipped tagger
leaves unlabelled), ``--clause-tagger`` (it replaces the tagger), ``--tokens N --bits B`` (the imprint's width).

    PYTHONPATH=. python -m experiments.probes.kind_match [--checkpoint DIR] [--users 60] [--depth 4] [--bias 3]
        [--modes oracle oracle- tagger] [--ask 2 3] [--soft 2] [--token 0.5] [--min-kind 0.3] [--min-label 0.4]
        [--raise-only] [--unlabelled-down 0.5] [--recency] [--tagger-hidden 256] [--clause-tagger | --clause-fill 0.5]
        [--clause-generated 1200] [--tokens 120 --bits 4] [--part train] [--corrected] [--skip-none] [--out FILE]

Writes the per-fact recall of each condition, per kind, and the replies; how the spans holding each asked value are
labelled (the asked kind, only another, unlabelled, not held) and the answers right in each.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.backbones import injected_attention
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity import imprint
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, stream_turns
from sia.learn.natural import ASK, TALK, NaturalUser, answered, filler, load_fillers, load_users, mentions
from sia.personas import PERSONAS

_BIAS: list[Tensor | None] = [None]  # (B, N) added to the entries' logits while set
_original = injected_attention.InjectedAttention._imprinted


def _biased(
    self: injected_attention.InjectedAttention, metric: tuple[Tensor, Tensor] | None, k: Tensor, *rest: Any
) -> tuple[Tensor, Tensor]:
    keys, values = _original(self, metric, k, *rest)
    bias = _BIAS[0]
    if bias is not None:
        col = self.d + self.mid  # the bias column, where the query holds 1
        keys = keys.clone()
        keys[..., col] += bias.to(keys.dtype).view(bias.shape[0], 1, bias.shape[1])
    return keys, values


injected_attention.InjectedAttention._imprinted = _biased  # type: ignore[method-assign,assignment]


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _spans_of(state: IdentityState, tok: Any, user: NaturalUser) -> list[tuple[int, int, set[str], str]]:
    """(first entry, length, kinds whose values the span holds, stored kind) per span."""
    out = []
    assert state.imprint is not None
    for s in state.imprint.spans():
        text = tok.decode(s.tokens or ())
        kinds = {f.kind for f in user.facts if any(mentions(text, a) for a in f.accept)}
        out.append((s.first, s.length, kinds, s.kind))
    return out


def _bias_row(N: int, spans: Sequence[tuple[int, int, set[str], str]], kind: str, mode: str, beta: float) -> Tensor:
    row = torch.zeros(N)
    for first, length, kinds, stored in spans:
        if mode == "oracle" and kind in kinds:
            row[first : first + length] = beta
        elif mode == "oracle-":
            row[first : first + length] = beta if kind in kinds else (-beta if kinds else 0.0)
        elif mode == "tagger" and stored == kind:
            row[first : first + length] = beta
    return row


def _own(tok: Any, text: str) -> tuple[int, int]:
    """Where a message's own tokens sit in its turn prompt (as ``TurnPrompt.message`` takes them)."""
    _, (start, end) = tok.turn_prompt(text, [])
    return start, end - 1


@torch.no_grad()
def _token_kinds(model: LlamaModel, system: Sequence[int], state: IdentityState, said: Sequence[str]) -> list[Any]:
    """Per imprinted span: its first entry, its stored kind's index and the tagger's probabilities of each of its
    tokens (length, len(KINDS)) as the write read them (the turn's message after the persona's prompt)."""
    tok, layer, tagger = model.tokenizer, model.config.imprint_kinds_layer, model.imprint_kind
    assert layer is not None and tagger is not None and state.imprint is not None
    out = []
    for s in state.imprint.spans():
        tokens, (start, end) = tok.turn_prompt(said[s.turn], list(system))
        h = model.layer_input(torch.tensor([tokens[: end - 1]], device=model.device), layer)[start:]
        probs = torch.softmax(tagger(h[s.offset : s.offset + s.length].to(next(tagger.parameters()).dtype)).float(), -1)
        out.append((s.first, imprint.KINDS.index(s.kind), probs.cpu()))
    return out


def _span_kinds(model: LlamaModel, system: Sequence[int], state: IdentityState, said: Sequence[str]) -> list[Any]:
    """Per imprinted span: its first entry, its length, the tagger's mean probabilities over its tokens as the write
    read them and its stored label's one-hot."""
    return [
        (first, probs.shape[0], probs.mean(0), F.one_hot(torch.tensor(stored), len(imprint.KINDS)).float())
        for first, stored, probs in _token_kinds(model, system, state, said)
    ]


def _token_row(N: int, spans: Sequence[tuple[int, int, Tensor]], p: Tensor, beta: float, least: float) -> Tensor:
    """The shipped ask bias with each entry's kind taken from its own token where the tagger gives that token a kind
    with at least ``least`` (the span's stored kind elsewhere): a clause holding a job and a city is raised for
    either, on the tokens of each."""
    row = torch.zeros(N)
    if float(p[0]) >= 0.5:
        return row
    for first, stored, probs in spans:
        top, which = probs[:, 1:].max(-1)
        kinds = torch.where(top >= least, which + 1, torch.full_like(which, stored))
        bias = beta * (2.0 * p[kinds] - (1.0 - float(p[0])))
        row[first : first + len(kinds)] = torch.where(kinds > 0, bias, torch.zeros_like(bias))
    return row


def _held_labels(spans: Sequence[tuple[int, int, set[str], str]], kind: str) -> str:
    """How the spans holding the asked kind's value are labelled: the asked kind, only another, only none, or not held."""
    labels = {s for _, _, k, s in spans if kind in k}
    if not labels:
        return "not held"
    if kind in labels:
        return "asked kind"
    return "another kind" if labels - {"unknown"} else "unlabelled"


def _soft_row(N: int, spans: Sequence[tuple[int, int, Tensor, Tensor]], p: Tensor, mode: str, beta: float) -> Tensor:
    """The bias of every entry for a question whose kinds the ask head gives as ``p`` (``--soft``)."""
    row = torch.zeros(N)
    if float(p[0]) >= 0.5:
        return row
    for first, length, q_soft, q_hard in spans:
        q = q_soft if mode == "soft" else q_hard
        row[first : first + length] = beta * (2.0 * float((p[1:] * q[1:]).sum()) - (1.0 - float(p[0])) * (1.0 - float(q[0])))
    return row


def _clause_map(model: LlamaModel, generated: int = 0) -> torch.nn.Linear:
    """A linear map of a clause's mean layer input to its kind, fitted on the natural training part's clauses as the
    write cuts them (``kind_labels --clause-natural``); with ``generated`` > 0, that many generated messages' clauses
    join its data."""
    import random

    from experiments.probes.kind_labels import _features, _fit, _labelled_messages, _message
    from sia.learn.imprint_read import ReadPhrases, token_kinds
    from sia.learn.natural import TRAIN

    sia = model.tokenizer.system_prompt(PERSONAS["sia"].system_prompt)
    _, _, xs, ys = _features(model, _labelled_messages(load_users(TRAIN), sia))
    if generated:
        rng, phrases, items = random.Random(1), ReadPhrases.load(), []
        for _ in range(generated):
            text, spans = _message(rng, phrases, None)
            items.append((text, sia, token_kinds(model.tokenizer, text, tuple(spans)), None))
        _, _, more_x, more_y = _features(model, items)
        xs, ys = xs + more_x, torch.cat([ys, more_y])
    torch.manual_seed(0)
    fitted = _fit(torch.stack([c.mean(0) for c in xs]), ys, 500)
    assert isinstance(fitted, torch.nn.Linear)
    _say(f"clause map fitted on {len(ys)} clauses ({int((ys > 0).sum())} holding a fact)")
    return fitted


def _pooled(kinds: Tensor) -> Tensor:
    """A clause's kind probabilities from its tokens' (n, K): the softmax of their mean log-probability (for a linear
    map, the clause-level map of their mean input)."""
    return torch.softmax(kinds.float().clamp_min(1e-30).log().mean(0), -1)


def _clause_tagger(model: LlamaModel, generated: int = 0) -> None:
    """Replace the tagger by the clause-level map (``_clause_map``), and make the write label a clause by the softmax of
    its tokens' mean logit, which for a linear map is that clause-level map exactly."""
    tagger = model.imprint_kind
    assert tagger is not None
    fitted = _clause_map(model, generated)
    with torch.no_grad():
        tagger.weight.copy_(fitted.weight)
        tagger.bias.copy_(fitted.bias)
    shipped = imprint.select_spans

    def by_clause(surprisal: Tensor, breaks: Tensor, *, kinds: Tensor | None = None, **rest: Any) -> Any:
        if kinds is not None:
            kinds = kinds.clone()
            for a, b in imprint._clauses(breaks):
                kinds[a:b] = _pooled(kinds[a:b]).to(kinds.dtype)
        return shipped(surprisal, breaks, kinds=kinds, **rest)

    imprint.select_spans = by_clause


class _Both(torch.nn.Module):
    """The shipped tagger's logits beside the clause map's, (…, 2K): a softmax over both keeps each half's ratios."""

    def __init__(self, shipped: torch.nn.Linear, clause: torch.nn.Linear) -> None:
        super().__init__()
        self.shipped, self.clause = shipped, clause
        self.weight = shipped.weight

    def forward(self, h: Tensor) -> Tensor:
        return torch.cat([self.shipped(h), self.clause(h)], -1)


def _clause_fill(model: LlamaModel, generated: int, least: float) -> None:
    """Keep the shipped tagger's labels, and label a clause it leaves unlabelled with the clause map's kind where that
    reaches ``least`` (stored, not sure: it replaces nothing, except in a correcting message, as any label there)."""
    shipped_tagger = model.imprint_kind
    assert isinstance(shipped_tagger, torch.nn.Linear)
    model.imprint_kind = _Both(shipped_tagger, _clause_map(model, generated))  # type: ignore[assignment]
    shipped, K = imprint.select_spans, len(imprint.KINDS)

    def filled(surprisal: Tensor, breaks: Tensor, *, kinds: Tensor | None = None, **rest: Any) -> Any:
        if kinds is not None:
            own = kinds[:, :K] / kinds[:, :K].sum(-1, keepdim=True)
            label = rest.get("min_label") or rest.get("min_kind", 0.5)
            for a, b in imprint._clauses(breaks):
                if b > a and float(own[a:b, 1:].mean(0).max()) < label:
                    clause = _pooled(kinds[a:b, K:])
                    if float(clause[1:].max()) >= least:
                        row = torch.zeros(K, dtype=own.dtype)
                        row[int(clause[1:].argmax()) + 1], row[0] = (label + 0.5) / 2, 1 - (label + 0.5) / 2
                        own[a:b] = row
            kinds = own
        return shipped(surprisal, breaks, kinds=kinds, **rest)

    imprint.select_spans = filled


def _unlabelled_down(share: float) -> None:
    """Patch the ask bias so that, in a row whose imprint holds an entry labelled with the kind its message most likely
    asks for, the unlabelled entries get -share·beta (greetings, relatives' names, asides no longer compete at 0)."""
    shipped_bias = LlamaModel.entry_bias

    def lowered(self: LlamaModel, kind: Tensor, asked: Tensor) -> Tensor | None:
        bias = shipped_bias(self, kind, asked)
        if bias is None:
            return None
        p = asked.float().to(bias.device)
        kind = kind.to(bias.device)
        top = p[:, 1:].argmax(-1, keepdim=True) + 1  # (B, 1)
        held = ((kind == top) & (p[:, :1] < 0.5)).any(-1, keepdim=True)  # (B, 1)
        down = torch.full_like(bias, -share * self.config.imprint_ask_bias)
        return torch.where(held & (kind == 0), down, bias)

    LlamaModel.entry_bias = lowered  # type: ignore[method-assign]


def _recency() -> None:
    """Patch the read so that, in each row, the entries of a kind that a later turn's span also holds are stored as
    -kind and the ask bias treats them as another kind's (-beta where that kind is asked): the newest value wins."""
    stack, shipped_bias = imprint.ImprintEntries.stack, LlamaModel.entry_bias

    def stale_kinds(held: imprint.Imprint) -> Tensor:
        kind, turn = held.kind.long().clone(), held.turn.long()
        for k in set(kind[held.span >= 0].tolist()) - {0}:
            at = (kind == k) & (held.span >= 0)
            kind[at & (turn < int(turn[at].max()))] = -k
        return kind

    def stacked(cls: Any, imprints: Sequence[Any], shape: Any, dtype: torch.dtype) -> imprint.ImprintEntries:
        out: imprint.ImprintEntries = stack.__func__(cls, imprints, shape, dtype)  # type: ignore[attr-defined]
        kinds = [stale_kinds(i) if i is not None else torch.zeros(shape[2], dtype=torch.long) for i in imprints]
        return replace(out, kind=torch.stack(kinds))

    def biased(self: LlamaModel, kind: Tensor, asked: Tensor) -> Tensor | None:
        bias = shipped_bias(self, kind.abs(), asked)
        if bias is None:
            return None
        p_none = asked.float()[:, :1].to(bias.device)
        other = torch.where(p_none < 0.5, -self.config.imprint_ask_bias * (1.0 - p_none), torch.zeros_like(p_none))
        return torch.where(kind.to(bias.device) < 0, other.expand_as(bias), bias)

    imprint.ImprintEntries.stack = classmethod(stacked)  # type: ignore[method-assign,assignment]
    LlamaModel.entry_bias = biased  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=None)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--bias", type=float, nargs="+", default=[3.0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--modes", nargs="*", default=["oracle", "oracle-", "tagger"])
    ap.add_argument("--ask", type=float, nargs="*", default=[])
    ap.add_argument("--tagger-hidden", type=int, default=0, help="refit the tagger as a two-layer map of this width first")
    ap.add_argument(
        "--clause-tagger", action="store_true", help="a clause-level tagger fitted on the training part's clauses first"
    )
    ap.add_argument("--clause-generated", type=int, default=0, help="the clause map's data: this many generated messages too")
    ap.add_argument("--clause-fill", type=float, default=None, help="the clause map labels what the tagger leaves, from this")
    ap.add_argument("--tokens", type=int, default=None, help="imprint entries (config.imprint_tokens)")
    ap.add_argument("--bits", type=int, default=None, help="imprint bits a number (config.imprint_bits)")
    ap.add_argument("--skip-none", action="store_true", help="leave out the unbiased read")
    ap.add_argument("--soft", type=float, nargs="*", default=[], help="soft and hard kind matches at these biases")
    ap.add_argument("--token", type=float, nargs="*", default=[], help="per-token kinds from these tagger probabilities")
    ap.add_argument("--token-bias", type=float, default=2.0, help="beta of the --token conditions")
    ap.add_argument("--min-kind", type=float, default=None, help="the write's kind threshold (select_spans' min_kind)")
    ap.add_argument("--min-label", type=float, default=None, help="the write's label threshold (config.imprint_label_min)")
    ap.add_argument("--raise-only", action="store_true", help="the ask head's bias only raises (no -beta for other kinds)")
    ap.add_argument(
        "--unlabelled-down",
        type=float,
        default=0.0,
        help="-share*beta on unlabelled entries where the asked kind is held",
    )
    ap.add_argument(
        "--recency", action="store_true", help="an entry whose kind a later turn's span also has reads as another kind's"
    )
    ap.add_argument("--part", default="tune", help="the natural set's part played (tune, or train)")
    ap.add_argument("--corrected", action="store_true", help="only the users who correct a fact they stated")
    ap.add_argument("--out", type=Path, default=Path("experiments/probes/results/kind_match.json"))
    args = ap.parse_args(argv)
    if args.min_kind is not None:
        imprint.select_spans = functools.partial(imprint.select_spans, min_kind=args.min_kind)  # message_spans calls it
    torch.manual_seed(0)
    model = load_model(args.checkpoint)
    assert isinstance(model, LlamaModel)
    shipped_ask, shipped_untold = model.config.imprint_ask_bias, model.config.imprint_untold
    # the conditions below set them (the untold reply needs the ask head)
    model.config = replace(model.config, imprint_ask_bias=0.0, imprint_untold=None)
    if args.min_label is not None:
        model.config = replace(model.config, imprint_label_min=args.min_label)
    if args.tokens is not None:
        model.config = replace(model.config, imprint_tokens=args.tokens)
    if args.bits is not None:
        model.config = replace(model.config, imprint_bits=args.bits)
    if args.raise_only:
        shipped_bias = LlamaModel.entry_bias

        def raising(self: LlamaModel, kind: Tensor, asked: Tensor) -> Tensor | None:
            bias = shipped_bias(self, kind, asked)
            return None if bias is None else bias.clamp(min=0.0)

        LlamaModel.entry_bias = raising  # type: ignore[method-assign]
    if args.unlabelled_down:
        _unlabelled_down(args.unlabelled_down)
    if args.recency:
        _recency()
    if args.clause_tagger:
        _clause_tagger(model, args.clause_generated)
    if args.clause_fill is not None:
        _clause_fill(model, args.clause_generated, args.clause_fill)
    if args.tagger_hidden:  # a two-layer tagger fitted as the recipe's eighth stage fits the linear one
        from experiments.probes.kind_labels import _TwoLayer
        from sia.learn.imprint_read import ReadPhrases, natural_statements, train_kinds
        from sia.learn.natural import TRAIN
        from sia.personas import persona_prompt

        torch.manual_seed(0)
        model.imprint_kind = _TwoLayer(model.config.n_embd, args.tagger_hidden)  # type: ignore[assignment]
        prompts = [model.tokenizer.system_prompt(persona_prompt(model, name)) for name in sorted(PERSONAS)]
        fit = train_kinds(model, prompts, ReadPhrases.load(), natural=natural_statements(load_users(TRAIN)))
        _say(f"two-layer tagger: {fit}")
    tok = model.tokenizer
    system = tuple(tok.system_prompt(PERSONAS["sia"].system_prompt))
    if args.part not in ("tune", "train"):
        raise SystemExit("--part is tune or train: the held-out part is never played by a probe")
    users = [u for u in load_users(args.part) if not args.corrected or any(f.corrects for f in u.facts)][: args.users]
    fillers = load_fillers("tune")  # the training part has no unrelated turns of its own: the tuning part's
    dynamics = Dynamics.from_config(model.config)
    states = {u.id: IdentityState.fresh(model.config) for u in users}

    def run(requests: list[TurnRequest], params: Any, bias: Tensor | None = None) -> list[tuple[str, IdentityState]]:
        out: list[tuple[str, IdentityState]] = []
        for a in range(0, len(requests), args.batch):
            _BIAS[0] = None if bias is None else bias[a : a + args.batch]
            results = stream_turns(model, requests[a : a + args.batch], params, tokenizer=tok).finish()
            out.extend((r.reply, r.state) for r in results)
        _BIAS[0] = None
        return out

    started = time.perf_counter()
    turns = [[*u.messages, *(filler(fillers, n, j) for j in range(args.depth))] for n, u in enumerate(users)]
    for i in range(max(len(t) for t in turns)):
        order = [u for u, t in zip(users, turns, strict=True) if i < len(t)]
        said = {u.id: t[i] for u, t in zip(users, turns, strict=True) if i < len(t)}
        requests = [TurnRequest(states[u.id], said[u.id], dynamics, system, True) for u in order]
        for u, (_, state) in zip(order, run(requests, TALK), strict=True):
            states[u.id] = state
    _say(f"talked in {time.perf_counter() - started:.0f} s")
    pairs = [(u, q) for u in users for q in u.questions]
    spans = {u.id: _spans_of(states[u.id], tok, u) for u in users}
    soft: dict[str, list[tuple[int, int, Tensor, Tensor]]] = {}  # per user: (first, length, q soft, q hard) per span
    asked_p = None
    by_token: dict[str, list[tuple[int, int, Tensor]]] = {}
    if args.soft or args.token:
        if not shipped_ask or model.imprint_ask is None:
            raise SystemExit("--soft and --token need a checkpoint with an ask head")
        if args.soft:
            soft = {u.id: _span_kinds(model, system, states[u.id], t) for u, t in zip(users, turns, strict=True)}
        if args.token:
            by_token = {u.id: _token_kinds(model, system, states[u.id], t) for u, t in zip(users, turns, strict=True)}
        asked_p = torch.cat([model.asked_kinds([tok.turn_prompt(q.text, [])[0][slice(*_own(tok, q.text))]]) for _, q in pairs])
    N = model.config.imprint_tokens
    conditions = [] if args.skip_none else [("none", "", 0.0)]
    conditions += [
        (f"{mode}{'+-' if mode == 'oracle-' else '+'}{b:g}".replace("oracle-+-", "oracle+-"), mode, b)
        for b in args.bias
        for mode in args.modes
    ]
    if args.ask and not shipped_ask:
        raise SystemExit("--ask needs a checkpoint with an ask head (config.imprint_ask_bias > 0)")
    conditions += [(f"ask+{b:g}", "ask", b) for b in args.ask]
    conditions += [(f"{mode}+{b:g}", mode, b) for b in args.soft for mode in ("hard", "soft")]
    conditions += [(f"token{t:g}+{args.token_bias:g}", f"token{t:g}", args.token_bias) for t in args.token]
    results: dict[str, Any] = {"depth": args.depth, "users": len(users), "questions": len(pairs), "conditions": {}}
    labels = [_held_labels(spans[u.id], q.kind) for u, q in pairs]
    for name, mode, beta in conditions:
        started = time.perf_counter()
        asking = mode == "ask"
        untold = shipped_untold if asking else None
        model.config = replace(model.config, imprint_ask_bias=beta if asking else 0.0, imprint_untold=untold)
        bias = None
        if mode in ("hard", "soft"):
            assert asked_p is not None
            bias = torch.stack([_soft_row(N, soft[u.id], asked_p[i], mode, beta) for i, (u, _) in enumerate(pairs)])
        elif mode.startswith("token"):
            assert asked_p is not None
            least = float(mode[len("token") :])
            bias = torch.stack([_token_row(N, by_token[u.id], asked_p[i], beta, least) for i, (u, _) in enumerate(pairs)])
        elif mode and mode != "ask":
            bias = torch.stack([_bias_row(N, spans[u.id], q.kind, mode, beta) for u, q in pairs])
        requests = [TurnRequest(states[u.id], q.text, dynamics, system, True) for u, q in pairs]
        replies = [r for r, _ in run(requests, ASK, bias)]
        right = [answered(r, u, q.kind) for (u, q), r in zip(pairs, replies, strict=True)]
        by_kind: dict[str, list[bool]] = {}
        for (_, q), ok in zip(pairs, right, strict=True):
            by_kind.setdefault(q.kind, []).append(ok)
        fixed = [ok for (u, q), ok in zip(pairs, right, strict=True) if u.newest(q.kind).corrects is not None]
        results["conditions"][name] = {
            "per_fact": sum(right) / len(right),
            "corrections": [sum(fixed), len(fixed)],
            "by_kind": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_kind.items())},
            "right_by_label": {k: sum(ok for ok, x in zip(right, labels, strict=True) if x == k) for k in sorted(set(labels))},
            "replies": [[u.id, q.kind, r] for (u, q), r in zip(pairs, replies, strict=True)],
        }
        seconds = time.perf_counter() - started
        _say(f"{name}: {sum(right) / len(right):.3f}, corrections {sum(fixed)} of {len(fixed)} ({seconds:.0f} s)")
    held = [any(q.kind in k for _, _, k, _ in spans[u.id]) for u, q in pairs]
    tagged = [any(s == q.kind for _, _, _, s in spans[u.id]) for u, q in pairs]
    results["asked_value_labels"] = {k: labels.count(k) for k in ("asked kind", "another kind", "unlabelled", "not held")}
    results["asked_value_labels_by_kind"] = {
        kind: {k: sum(1 for (_, q), x in zip(pairs, labels, strict=True) if q.kind == kind and x == k) for k in set(labels)}
        for kind in sorted({q.kind for _, q in pairs})
    }
    _say(f"the asked value's spans are labelled: {results['asked_value_labels']}")
    results["asked_kind_held"] = sum(held) / len(held)
    results["asked_kind_tagged"] = sum(tagged) / len(tagged)
    _say(
        f"a span holds the asked kind's value: {results['asked_kind_held']:.3f}; the tagger stored the asked kind:"
        f" {results['asked_kind_tagged']:.3f}"
    )
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
