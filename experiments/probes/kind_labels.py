"""How well does the kind tagger label the natural set's clauses, and would other training data or another target do
better? Every clause the write would consider (the tuning part's messages cut as ``message_spans`` cuts them, questions
left out), labelled with the kind whose fact it holds (the fact's accepted strings) or none, against:

- ``shipped``: the checkpoint's tagger as the write uses it (the mean of its tokens' probabilities over the clause);
- ``token``: a tagger refitted per token as ``train_kinds`` fits it, on generated messages (the phrase tables; with
  ``+new``, also the varied clauses and hard negatives of ``experiments/data/kind_phrases.json``), read by the mean of
  probabilities and by the softmax of the mean logit;
- ``clause``: a linear map of the clause's mean layer input fitted on the same generated clauses.

With ``--hidden H`` the refitted taggers are two-layer maps of width H instead of linear ones (with ``--natural``
too). With ``--natural R ...``
(and nothing else refitted): the tagger as ``train_kinds`` fits it, on the generated messages and the natural set's
training part counted R times each (0: without it), read as the write reads it.

For each threshold t: clauses holding a fact labelled with its kind (right), with another (wrong), and clauses holding
none labelled with some kind (false).

    PYTHONPATH=. python -m experiments.probes.kind_labels [--checkpoint DIR] [--messages 1200] [--hidden 256]
        [--natural 0 1 3 [--layers 10 15 20]] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.imprint import KINDS, asking, clause_breaks
from sia.learn.imprint_read import EXTRA, MAIN, ReadPhrases, _fill, natural_statements, token_kinds, train_kinds
from sia.learn.natural import TRAIN, load_users, mentions
from sia.personas import PERSONAS, persona_prompt

NEW = Path(__file__).parents[1] / "data" / "kind_phrases.json"
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
Item = tuple[str, list[int], list[int] | None, Callable[[str], int] | None]  # message, system, token labels, labeller


def _clauses(tok: Any, message: Sequence[int]) -> list[tuple[int, int]]:
    """The clauses ``message_spans`` considers: cut at ``clause_breaks``, those holding a question left out."""
    pieces = [tok.token_text(t) for t in message]
    breaks, questions = clause_breaks(pieces), asking(pieces)
    ends = [i + 1 for i in range(len(message)) if bool(breaks[i])]
    if not ends or ends[-1] != len(message):
        ends.append(len(message))
    out, start = [], 0
    for end in ends:
        if end > start and not bool(questions[start:end].any()):
            out.append((start, end))
        start = end
    return out


def _message(rng: random.Random, p: ReadPhrases, new: dict[str, Any] | None) -> tuple[str, list[tuple[int, int, str]]]:
    """A generated message of 0 to 3 of the user's facts and some clauses that state none, and its facts' spans."""
    kinds = rng.sample((*MAIN, *EXTRA), rng.randint(0, 3))
    parts: list[tuple[str, str | None]] = []
    for kind in kinds:
        pool = new["clauses"][kind] if new and rng.random() < 0.6 else p.clauses[kind]
        parts.append((_fill(rng.choice(pool), rng.choice(p.values[kind])), kind))
    for _ in range(rng.choice((0, 1, 1, 2)) if kinds else rng.randint(1, 2)):
        pick = rng.random()
        if new and pick < 0.5:
            clause = rng.choice(new["negatives"])
        elif pick < 0.7:
            clause = rng.choice(p.asides)
        elif pick < 0.85:
            kind = rng.choice(sorted(p.others))
            clause = _fill(rng.choice(p.others[kind]), rng.choice(p.values[kind]))
        else:
            clause = rng.choice(p.chitchat)
        parts.insert(rng.randint(0, len(parts)), (clause, None))
    if rng.random() < 0.3:
        parts = [(c.lower(), k) for c, k in parts]
    text = rng.choice(p.openers) + " " if rng.random() < 0.3 else ""
    spans = []
    for i, (clause, whose) in enumerate(parts):
        if i:
            text += rng.choice(p.connectors)
        if whose:
            spans.append((len(text), len(text) + len(clause), whose))
        text += clause
    if rng.random() < 0.2:
        text += " " + rng.choice(p.closers)
    return text, spans


@torch.no_grad()
def _features(model: LlamaModel, items: Sequence[Item]) -> tuple[list[Tensor], list[Tensor], list[Tensor], Tensor]:
    """Per message its tokens' tagger-layer inputs and labels (where given); per clause its inputs and label."""
    tok, layer = model.tokenizer, model.config.imprint_kinds_layer
    assert layer is not None
    token_x, token_y, clause_x, clause_y = [], [], [], []
    for at in range(0, len(items), 16):
        chunk = items[at : at + 16]
        prompts = [tok.turn_prompt(m, s) for m, s, _, _ in chunk]
        L = max(end for _, (_, end) in prompts)
        idx = torch.zeros((len(chunk), L), dtype=torch.long)
        for b, (tokens, (_, end)) in enumerate(prompts):
            idx[b, :end] = torch.tensor(tokens[:end])
        h = model.layer_inputs(idx, layer)
        for b, ((_, _, labels, labeller), (tokens, (start, end))) in enumerate(zip(chunk, prompts, strict=True)):
            message, x = tokens[start : end - 1], h[b, start : end - 1]
            if labels is not None:
                token_x.append(x)
                token_y.append(torch.tensor(labels))
            for a, e in _clauses(tok, message):
                clause_x.append(x[a:e])
                if labels is not None:
                    clause_y.append(collections.Counter(labels[a:e]).most_common(1)[0][0])
                else:
                    assert labeller is not None
                    clause_y.append(labeller(tok.decode(message[a:e])))
    return token_x, token_y, clause_x, torch.tensor(clause_y)


def _counts(probs: Tensor, truth: Tensor) -> dict[str, list[int]]:
    """(right, wrong, false) per threshold for clause probabilities (n, len(KINDS))."""
    fact, arg, conf = truth > 0, probs[:, 1:].argmax(-1) + 1, probs[:, 1:].max(-1).values
    out = {}
    for t in THRESHOLDS:
        label = torch.where(conf >= t, arg, torch.zeros_like(arg))
        right = int(((label == truth) & fact).sum())
        wrong = int(((label != truth) & (label > 0) & fact).sum())
        out[f"{t:g}"] = [right, wrong, int(((label > 0) & ~fact).sum())]
    return out


def _fit(x: Tensor, y: Tensor, steps: int, hidden: int = 0) -> torch.nn.Module:
    """A linear map over the features, or with ``hidden`` > 0 a two-layer one (GELU) of that width."""
    head: torch.nn.Module = torch.nn.Linear(x.shape[1], len(KINDS))
    if hidden:
        head = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.GELU(), torch.nn.Linear(hidden, len(KINDS)))
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2, weight_decay=1e-4)
    for _ in range(steps):
        loss = F.cross_entropy(head(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return head


class _TwoLayer(torch.nn.Sequential):
    """A two-layer tagger (GELU) that ``train_kinds`` can fit in the linear one's place (it asks for ``weight``)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__(torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, len(KINDS)))

    @property
    def weight(self) -> Tensor:
        first: torch.nn.Linear = self[0]  # type: ignore[assignment]
        return first.weight


def _labelled_messages(users: Sequence[Any], system: list[int]) -> list[Item]:
    """Every message of these natural-set users, its clauses labelled with the kind whose value they mention."""
    items: list[Item] = []
    for u in users:
        for i, message in enumerate(u.messages):

            def holds(text: str, u: Any = u, i: int = i) -> int:
                kinds = [
                    f.kind for f in u.facts if f.message == i and f.kind in KINDS and any(mentions(text, a) for a in f.accept)
                ]
                return KINDS.index(kinds[0]) if kinds else 0

            items.append((message, system, None, holds))
    return items


def _clause_natural(
    model: LlamaModel, system: list[int], clauses: list[Tensor], truth: Tensor, messages: int, results: dict[str, Any]
) -> None:
    """Clause-level maps (the mean of a clause's layer input -> its kind) fitted on the training part's clauses as the
    write cuts them, labelled as the tuning part's are, with and without generated clauses beside them."""
    tok, phrases = model.tokenizer, ReadPhrases.load()
    _, _, own_x, own_y = _features(model, _labelled_messages(load_users(TRAIN), system))
    rng = random.Random(1)
    generated: list[Item] = []
    for _ in range(messages):
        text, spans = _message(rng, phrases, None)
        generated.append((text, system, token_kinds(tok, text, tuple(spans)), None))
    _, _, gen_x, gen_y = _features(model, generated)
    results["training part clauses"] = [len(own_y), int((own_y > 0).sum())]
    means = torch.stack([c.mean(0) for c in clauses])
    for name, xs, ys in (
        ("clause, natural", own_x, own_y),
        ("clause, natural + generated", own_x + gen_x, torch.cat([own_y, gen_y])),
    ):
        for hidden in (0, 256):
            torch.manual_seed(0)
            whole = _fit(torch.stack([c.mean(0) for c in xs]), ys, 500, hidden)
            with torch.no_grad():
                results[f"{name}{', hidden 256' if hidden else ''}"] = _counts(torch.softmax(whole(means), -1), truth)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--messages", type=int, default=1200)
    ap.add_argument("--hidden", type=int, default=0, help="refit two-layer taggers of this width instead of linear ones")
    ap.add_argument("--natural", type=int, nargs="*", default=None, help="train_kinds with the training part this often")
    ap.add_argument(
        "--clause-natural", action="store_true", help="also fit clause-level maps on the training part's clauses as cut"
    )
    ap.add_argument("--layers", type=int, nargs="*", default=None, help="with --natural: fit taggers reading these layers")
    ap.add_argument("--out", type=Path, default=Path("experiments/probes/results/kind_labels.json"))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = load_model(args.checkpoint)
    assert isinstance(model, LlamaModel) and model.imprint_kind is not None
    tok = model.tokenizer
    systems = [tok.system_prompt(p.system_prompt) for p in PERSONAS.values()]
    sia = tok.system_prompt(PERSONAS["sia"].system_prompt)
    natural = _labelled_messages(load_users("tune"), sia)
    _, _, clauses, truth = _features(model, natural)
    results: dict[str, Any] = {"clauses": len(truth), "holding_a_fact": int((truth > 0).sum())}
    if args.clause_natural:
        _clause_natural(model, sia, clauses, truth, args.messages, results)
        for name, counts in results.items():
            sys.stdout.write(f"{name}: {counts}\n")
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        return
    shipped = model.imprint_kind
    with torch.no_grad():
        results["shipped"] = _counts(torch.stack([torch.softmax(shipped(c), -1).mean(0) for c in clauses]), truth)
    phrases, new = ReadPhrases.load(), json.loads(NEW.read_text())
    if args.natural is not None:
        own = natural_statements(load_users(TRAIN))
        systems = [tok.system_prompt(persona_prompt(model, name)) for name in sorted(PERSONAS)]  # as the recipe's
        for layer in args.layers or [model.config.imprint_kinds_layer]:
            named = f", layer {layer}" if args.layers else ""
            if args.layers:  # the tuning part's clauses as that layer's input holds them
                model.add_kind_tagger(layer)
                _, _, clauses, _ = _features(model, natural)
            for repeat in args.natural:
                model.add_kind_tagger(layer)  # a fresh one, fitted as the recipe fits it
                if args.hidden:  # or a two-layer one in its place, fitted the same way
                    model.imprint_kind = _TwoLayer(model.config.n_embd, args.hidden)  # type: ignore[assignment]
                    named = f"{named}, hidden {args.hidden}" if "hidden" not in named else named
                fit = train_kinds(model, systems, phrases, natural=own if repeat else (), natural_repeat=max(repeat, 1))
                fitted = model.imprint_kind
                assert fitted is not None
                with torch.no_grad():
                    probs = torch.stack([torch.softmax(fitted(c), -1).mean(0) for c in clauses])
                results[f"train_kinds, natural x{repeat}{named}"] = _counts(probs, truth)
                results[f"train_kinds, natural x{repeat}{named}, fit"] = fit
        for name, counts in results.items():
            sys.stdout.write(f"{name}: {counts}\n")
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        return
    for name, extra in (("", None), ("+new", new)):
        rng = random.Random(1)
        items: list[Item] = []
        for _ in range(args.messages):
            text, spans = _message(rng, phrases, extra)
            items.append((text, rng.choice(systems), token_kinds(tok, text, tuple(spans)), None))
        token_x, token_y, clause_x, clause_y = _features(model, items)
        tagger = _fit(torch.cat(token_x), torch.cat(token_y), 300, args.hidden)
        whole = _fit(torch.stack([c.mean(0) for c in clause_x]), clause_y, 500, args.hidden)
        with torch.no_grad():
            results[f"token{name}, mean probability"] = _counts(
                torch.stack([torch.softmax(tagger(c), -1).mean(0) for c in clauses]), truth
            )
            results[f"token{name}, softmax of the mean logit"] = _counts(
                torch.stack([torch.softmax(tagger(c).mean(0), -1) for c in clauses]), truth
            )
            results[f"clause{name}"] = _counts(torch.stack([torch.softmax(whole(c.mean(0)), -1) for c in clauses]), truth)
    for name, counts in results.items():
        sys.stdout.write(f"{name}: {counts}\n")
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
