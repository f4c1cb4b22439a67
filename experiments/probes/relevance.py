"""Can a learned relevance score between the question and each imprinted span pick the span that holds the asked value
better than matching kinds (the ask head against the tagger's stored labels)?

The kind match raises the spans the tagger labelled with the asked kind and lowers the other labelled ones; with the
kinds known exactly it reaches 78.2 % on the tuning part, as shipped 64.3 % (2026-11-29 (d), 2026-12-01 (a)). This probe
scores spans directly: a low-rank bilinear form between the question's mean layer input (what the ask head reads) and
the span's mean stored key and value at ``--layers`` (what the imprint already holds; nothing new is stored), plus the
kind match's own term, fitted on the natural training part's users as the write imprints them (a softmax over each
user's spans, the spans holding the asked value the positives), then

1. ranked on the tuning part: how often the top span holds the asked value, against ranking by the kind match;
2. played end to end on the tuning part (``--play``): each span's logit moved as ``--form`` says (``two``:
   ``beta * (2 p - 1)``) with p the scorer's softmax over the user's spans divided by its largest (1 for the top span),
   where the ask head says the message asks for a fact (p(none) < 1/2), the shipped kind match off (``kind+...``: on).

    PYTHONPATH=. python -m experiments.probes.relevance [--train-users 240] [--depth 4] [--layers 15] [--extra]
        [--rank 4] [--wd 0.1] [--drop 0.3] [--play] [--form two raise kind+raise kind+two] [--beta 2] [--skip-ask]
        [--cache DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.probes import kind_match
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.imprint import KINDS
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, stream_turns
from sia.learn.natural import ASK, TALK, NaturalUser, answered, filler, load_fillers, load_users, mentions
from sia.personas import PERSONAS


@dataclass
class Asked:
    """One question of one user, with that user's imprinted spans."""

    user: str
    kind: str
    question: Tensor  # (C,) the question's mean layer input
    asked: Tensor  # (len(KINDS),) the ask head's probabilities
    spans: Tensor  # (S, F) each span's mean stored key and value at the layer
    stored: Tensor  # (S,) int64 each span's stored kind
    holds: Tensor  # (S,) bool: the span holds the asked value (any of the user's values of the asked kind)
    other: Tensor  # (S,) bool: it holds a value of another kind
    where: list[tuple[int, int]]  # (first entry, length) per span


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def play(model: LlamaModel, users: Sequence[NaturalUser], depth: int, batch: int) -> dict[str, IdentityState]:
    """Every user's messages then ``depth`` unrelated turns, as ``sia eval --natural`` plays them."""
    tok = model.tokenizer
    system = tuple(tok.system_prompt(PERSONAS["sia"].system_prompt))
    fillers = load_fillers("tune")
    dynamics = Dynamics.from_config(model.config)
    states = {u.id: IdentityState.fresh(model.config) for u in users}
    turns = [[*u.messages, *(filler(fillers, n, j) for j in range(depth))] for n, u in enumerate(users)]
    for i in range(max(len(t) for t in turns)):
        order = [u for u, t in zip(users, turns, strict=True) if i < len(t)]
        said = {u.id: t[i] for u, t in zip(users, turns, strict=True) if i < len(t)}
        requests = [TurnRequest(states[u.id], said[u.id], dynamics, system, True) for u in order]
        for a in range(0, len(requests), batch):
            for u, r in zip(
                order[a : a + batch], stream_turns(model, requests[a : a + batch], TALK, tokenizer=tok).finish(), strict=True
            ):
                states[u.id] = r.state
    return states


STORED_LAYERS = tuple(range(0, 30, 3))  # the layers whose span features are collected (``--layers`` picks among them)


def collect(model: LlamaModel, users: Sequence[NaturalUser], states: dict[str, IdentityState]) -> list[Asked]:
    """Per question, its user's spans: the mean stored key and value of every STORED_LAYERS layer, then the extras
    (the stored kind one-hot, log length, turns ago, salience)."""
    tok = model.tokenizer
    out: list[Asked] = []
    for u in users:
        held = states[u.id].imprint
        assert held is not None
        spans = held.spans()
        if not spans:
            continue
        keys, values, _ = held.entries()
        last = max(s.turn for s in spans)
        feats, stored, kinds_held, where = [], [], [], []
        for s in spans:
            parts = []
            for layer in STORED_LAYERS:
                parts.append(keys[layer, :, s.first : s.first + s.length].mean(1).flatten())  # (H_kv * d,)
                parts.append(values[layer, :, s.first : s.first + s.length].mean(1).flatten())
            extra = F.one_hot(torch.tensor(KINDS.index(s.kind)), len(KINDS)).float()
            parts.append(torch.cat([extra, torch.tensor([float(s.length), float(last - s.turn), s.score]).log1p()]))
            feats.append(torch.cat(parts))
            stored.append(KINDS.index(s.kind))
            text = tok.decode(s.tokens or ())
            kinds_held.append({f.kind for f in u.facts if any(mentions(text, a) for a in f.accept)})
            where.append((s.first, s.length))
        rows = [tok.turn_prompt(q.text, [])[0][slice(*kind_match._own(tok, q.text))] for q in u.questions]
        means = model.message_means(rows)
        asked = model.asked_kinds(rows)
        features = torch.stack(feats)
        for i, q in enumerate(u.questions):
            out.append(
                Asked(
                    u.id,
                    q.kind,
                    means[i],
                    asked[i],
                    features,
                    torch.tensor(stored),
                    torch.tensor([q.kind in k for k in kinds_held]),
                    torch.tensor([bool(k - {q.kind}) and q.kind not in k for k in kinds_held]),
                    where,
                )
            )
    return out


def chosen(data: Sequence[Asked], layers: Sequence[int], extra: bool) -> list[Asked]:
    """The same questions with only the features of ``layers`` (and the extras)."""
    width = (data[0].spans.shape[1] - len(KINDS) - 3) // len(STORED_LAYERS)
    cols = [torch.arange(STORED_LAYERS.index(l) * width, (STORED_LAYERS.index(l) + 1) * width) for l in layers]
    if extra:
        cols.append(torch.arange(len(STORED_LAYERS) * width, data[0].spans.shape[1]))
    pick = torch.cat(cols)
    return [replace(a, spans=a.spans[:, pick]) for a in data]


def kind_term(a: Asked) -> Tensor:
    """The shipped kind match per span: 2 p(stored kind) - p(any kind), 0 for an unlabelled span."""
    p = a.asked.float()
    term = 2.0 * p[a.stored] - (1.0 - p[0])
    return torch.where(a.stored > 0, term, torch.zeros_like(term))


class Scorer(nn.Module):
    q_mean: Tensor
    q_std: Tensor
    f_mean: Tensor
    f_std: Tensor

    def __init__(self, c: int, f: int, rank: int) -> None:
        super().__init__()
        self.q = nn.Linear(c, rank, bias=False)
        self.s = nn.Linear(f, rank)
        self.u = nn.Linear(f, 1)
        self.kind = nn.Parameter(torch.tensor(2.0))
        self.register_buffer("q_mean", torch.zeros(c))
        self.register_buffer("q_std", torch.ones(c))
        self.register_buffer("f_mean", torch.zeros(f))
        self.register_buffer("f_std", torch.ones(f))

    def forward(self, a: Asked) -> Tensor:
        q = (a.question - self.q_mean) / self.q_std
        f = (a.spans - self.f_mean) / self.f_std
        out: Tensor = self.s(f) @ self.q(q) + self.u(f).squeeze(-1) + self.kind * kind_term(a)  # (S,)
        return out


def _padded(data: Sequence[Asked]) -> tuple[Tensor, ...]:
    """The questions as one batch: (Q, C) questions, (Q, S, F) spans, (Q, S) kind terms, holds and present masks."""
    S = max(len(a.holds) for a in data)
    F_ = data[0].spans.shape[1]
    spans = torch.zeros(len(data), S, F_)
    kinds = torch.zeros(len(data), S)
    holds = torch.zeros(len(data), S, dtype=torch.bool)
    present = torch.zeros(len(data), S, dtype=torch.bool)
    for i, a in enumerate(data):
        n = len(a.holds)
        spans[i, :n], kinds[i, :n], holds[i, :n], present[i, :n] = a.spans, kind_term(a), a.holds, True
    return torch.stack([a.question for a in data]), spans, kinds, holds, present


def _batch_logits(scorer: Scorer, q: Tensor, spans: Tensor, kinds: Tensor, drop: float = 0.0) -> Tensor:
    qn = (q - scorer.q_mean) / scorer.q_std
    fn = (spans - scorer.f_mean) / scorer.f_std
    if drop:
        fn = F.dropout(fn, drop)
        qn = F.dropout(qn, drop)
    out: Tensor = (scorer.s(fn) * scorer.q(qn).unsqueeze(1)).sum(-1) + scorer.u(fn).squeeze(-1) + scorer.kind * kinds
    return out


def fit(data: Sequence[Asked], rank: int, steps: int, wd: float, seed: int, drop: float = 0.0, val_users: int = 48) -> Scorer:
    """Listwise: a softmax over each question's spans, the spans holding the asked value the target; the last
    ``val_users`` users' questions kept aside to choose the step (the best ranking on them)."""
    torch.manual_seed(seed)
    usable = [a for a in data if a.holds.any() and len(a.holds) > 1]
    users = sorted({a.user for a in usable})
    aside = set(users[len(users) - val_users :]) if val_users else set()
    train = [a for a in usable if a.user not in aside]
    val = [a for a in data if a.user in aside]
    scorer = Scorer(data[0].question.shape[0], data[0].spans.shape[1], rank)
    q, spans, kinds, holds, present = _padded(train)
    scorer.q_mean.copy_(q.mean(0))
    scorer.q_std.copy_(q.std(0) + 1e-6)
    flat = spans[present]
    scorer.f_mean.copy_(flat.mean(0))
    scorer.f_std.copy_(flat.std(0) + 1e-6)
    opt = torch.optim.AdamW(scorer.parameters(), lr=3e-3, weight_decay=wd)
    best, best_state, best_step = -1.0, None, 0
    for step in range(steps):
        scorer.train()
        logits = _batch_logits(scorer, q, spans, kinds, drop).masked_fill(~present, -1e9)
        loss = -(torch.logsumexp(logits.masked_fill(~holds, -1e9), 1) - torch.logsumexp(logits, 1)).mean()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if val and (step % 10 == 9 or step == steps - 1):
            scorer.eval()
            with torch.no_grad():
                got = ranked(val, scorer)["top_holds"]
            if got > best:
                best, best_step = got, step
                best_state = {k: v.clone() for k, v in scorer.state_dict().items()}
    if best_state is not None:
        scorer.load_state_dict(best_state)
    _say(f"fitted: last loss {loss.item():.3f}; kept step {best_step} (held-aside users' top span holds {best:.3f})")
    scorer.eval()
    return scorer


def ranked(data: Sequence[Asked], score: Any) -> dict[str, float]:
    """Of the questions whose value a span holds: the top span holds it; and it beats every span of another fact."""
    usable = [a for a in data if a.holds.any()]
    top = sum(bool(a.holds[int(score(a).argmax())]) for a in usable)
    beats = 0
    for a in usable:
        s = score(a)
        best = s[a.holds].max()
        beats += bool((s[a.other] < best).all()) if a.other.any() else 1
    return {"questions": len(usable), "top_holds": top / len(usable), "beats_other_facts": beats / len(usable)}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-users", type=int, default=None)
    ap.add_argument("--tune-users", type=int, default=None)
    ap.add_argument("--depth", type=int, default=4, help="unrelated turns after the user's messages (both parts)")
    ap.add_argument("--layers", type=int, nargs="+", default=[15], help=f"the span features' layers, among {STORED_LAYERS}")
    ap.add_argument("--extra", action="store_true", help="the span's stored kind, length, turns ago and salience too")
    ap.add_argument("--rank", type=int, nargs="+", default=[16])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--wd", type=float, nargs="+", default=[0.1])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--drop", type=float, default=0.0, help="dropout on the normalised features while fitting")
    ap.add_argument("--val-users", type=int, default=48, help="training-part users kept aside to choose the step")
    ap.add_argument("--play", action="store_true", help="ask the tuning part's questions with the scorer's bias")
    ap.add_argument("--beta", type=float, nargs="+", default=[2.0])
    ap.add_argument(
        "--form", nargs="+", default=["two"], help="how the scores move the spans: two, raise, kind+raise, kind+two, fallback"
    )
    ap.add_argument("--skip-ask", action="store_true", help="leave out the shipped kind match's condition")
    ap.add_argument("--cache", type=Path, default=Path("runs/relevance"))
    ap.add_argument("--out", type=Path, default=Path("experiments/probes/results/relevance.json"))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = load_model(None)
    assert isinstance(model, LlamaModel)
    beta_shipped = model.config.imprint_ask_bias
    parts = {"train": load_users("train")[: args.train_users], "tune": load_users("tune")[: args.tune_users]}
    states: dict[str, dict[str, IdentityState]] = {}
    args.cache.mkdir(parents=True, exist_ok=True)
    data: dict[str, list[Asked]] = {}
    for part, users in parts.items():
        started = time.perf_counter()
        cached = args.cache / f"{part}-{len(users)}-d{args.depth}-all.pt"
        if cached.exists() and not (args.play and part == "tune"):
            data[part] = [Asked(**row) for row in torch.load(cached, weights_only=True)]
        else:
            states[part] = play(model, users, args.depth, args.batch)
            with torch.no_grad():
                data[part] = collect(model, users, states[part])
            torch.save([vars(a) for a in data[part]], cached)
        _say(f"{part}: {len(users)} users, {len(data[part])} questions ({time.perf_counter() - started:.0f} s)")
    data = {part: chosen(d, args.layers, args.extra) for part, d in data.items()}
    result: dict[str, Any] = {"depth": args.depth, "layers": args.layers, "extra": args.extra}
    result["kind_match_rank"] = {p: ranked(d, kind_term) for p, d in data.items()}
    _say(f"kind match: {result['kind_match_rank']}")
    result["scorer_rank"] = {}
    for rank in args.rank:
        for wd in args.wd:
            scorer = fit(data["train"], rank, args.steps, wd, 0, args.drop, args.val_users)
            with torch.no_grad():
                result["scorer_rank"][f"rank{rank}-wd{wd:g}-drop{args.drop:g}"] = got = {
                    p: ranked(d, scorer) for p, d in data.items()
                }
            _say(f"scorer, rank {rank}, wd {wd:g}: {got}")
    torch.save(scorer.state_dict(), args.cache / "scorer.pt")
    if args.play:
        result["play"] = play_questions(model, parts["tune"], states["tune"], data["tune"], scorer, args, beta_shipped)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


def _form(form: str, p: Tensor, kind: Tensor, beta: float, beta_kind: float) -> Tensor:
    """Each span's logit shift: ``two`` beta·(2p − 1); ``raise`` beta·p; ``kind+raise`` the shipped kind match plus
    beta·p; ``kind+two`` the kind match plus beta·(2p − 1) where the kind match leaves the span at 0 (unlabelled);
    ``fallback`` the kind match where it raises some span, the scorer's beta·p where it raises none."""
    if form == "two":
        return beta * (2.0 * p - 1.0)
    if form == "raise":
        return beta * p
    if form == "kind+raise":
        return beta_kind * kind + beta * p
    if form == "kind+two":
        return beta_kind * kind + torch.where(kind == 0, beta * (2.0 * p - 1.0), beta * p)
    if form == "fallback":  # the kind match where it raises some span, else the scorer's raise
        return beta_kind * kind if bool((kind > 0).any()) else beta * p
    raise SystemExit(f"unknown form {form!r}")


def play_questions(
    model: LlamaModel,
    users: Sequence[NaturalUser],
    states: dict[str, IdentityState],
    data: Sequence[Asked],
    scorer: Scorer,
    args: argparse.Namespace,
    beta_shipped: float,
) -> dict[str, Any]:
    tok = model.tokenizer
    system = tuple(tok.system_prompt(PERSONAS["sia"].system_prompt))
    dynamics = Dynamics.from_config(model.config)
    N = model.config.imprint_tokens
    by_user = {u.id: u for u in users}
    pairs = [(u, q) for u in users for q in u.questions]
    index = {(a.user, a.kind): a for a in data}
    out: dict[str, Any] = {}
    untold_shipped = model.config.imprint_untold
    conditions = ([("ask", beta_shipped)] if not args.skip_ask else []) + [
        (f"{form}+{b:g}", b) for form in args.form for b in args.beta
    ]
    for name, beta in conditions:
        started = time.perf_counter()
        bias = None
        if name == "ask":
            model.config = replace(model.config, imprint_ask_bias=beta, imprint_untold=untold_shipped)
        else:  # the untold reply needs the ask head
            model.config = replace(model.config, imprint_ask_bias=0.0, imprint_untold=None)
            rows = []
            for u, q in pairs:
                row = torch.zeros(N)
                a = index.get((u.id, q.kind))
                if a is not None and float(a.asked[0]) < 0.5:
                    with torch.no_grad():
                        logits = scorer(a)
                        p = torch.exp(logits - logits.max())  # the softmax over spans over its largest value: 1 on top
                        shift = _form(name.rsplit("+", 1)[0], p, kind_term(a), beta, beta_shipped)
                    for (first, length), b in zip(a.where, shift.tolist(), strict=True):
                        row[first : first + length] = b
                rows.append(row)
            bias = torch.stack(rows)
        replies: list[str] = []
        requests = [TurnRequest(states[u.id], q.text, dynamics, system, True) for u, q in pairs]
        for a0 in range(0, len(requests), args.batch):
            kind_match._BIAS[0] = None if bias is None else bias[a0 : a0 + args.batch]
            replies += [r.reply for r in stream_turns(model, requests[a0 : a0 + args.batch], ASK, tokenizer=tok).finish()]
        kind_match._BIAS[0] = None
        right = [answered(r, by_user[u.id], q.kind) for (u, q), r in zip(pairs, replies, strict=True)]
        by_kind: dict[str, list[bool]] = {}
        for (_, q), ok in zip(pairs, right, strict=True):
            by_kind.setdefault(q.kind, []).append(ok)
        fixed = [ok for (u, q), ok in zip(pairs, right, strict=True) if u.newest(q.kind).corrects is not None]
        out[name] = {
            "per_fact": sum(right) / len(right),
            "corrections": [sum(fixed), len(fixed)],
            "by_kind": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_kind.items())},
            "replies": [[u.id, q.kind, r] for (u, q), r in zip(pairs, replies, strict=True)],
        }
        seconds = time.perf_counter() - started
        _say(f"{name}: {sum(right) / len(right):.3f}, corrections {sum(fixed)} of {len(fixed)} ({seconds:.0f} s)")
    model.config = replace(model.config, imprint_ask_bias=beta_shipped, imprint_untold=untold_shipped)
    return out


if __name__ == "__main__":
    main()
