"""Would a clause's kind be read better by the backbone asked what the clause tells, than by the kind tagger reading
the turn's own pass?

The tagger (a linear map of one layer's input, per token, averaged over the clause) labels the natural set's fact
clauses with their kind for about two thirds of them, and a map of the same layer fitted on the tuning clauses
themselves did little better (LOG.md 2026-11-29 (b)): that layer's input, read while the model takes in a message,
does not separate what clauses tell. Here each clause is read in a pass of its own: the message and the clause put to
the base model as a question ("In the words "...", what do I tell you about myself?") with the reply's opening
("You tell me your"), and a linear map of the last token's input at one layer (``--layers``) fitted on the training
part's clauses as the write cuts them (labelled with the kind whose value they mention, as ``kind_labels`` labels the
tuning part's) and, with ``--generated N``, N generated messages' clauses; then counted on the tuning part's clauses
as ``kind_labels`` counts the shipped tagger: for each threshold, fact clauses labelled with their kind (right), with
another (wrong), and clauses holding none labelled (false).

    PYTHONPATH=. python -m experiments.probes.prompted_kinds [--layers 15 20 25 29] [--generated 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from experiments.probes.kind_labels import Item, _clauses, _counts, _fit, _labelled_messages, _message
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.imprint import KINDS
from sia.learn.imprint_read import ReadPhrases, token_kinds
from sia.learn.natural import TRAIN, load_users
from sia.personas import PERSONAS

ASK = 'In the words "{clause}", what do I tell you about myself?'
OPENING = "You tell me your"
SYSTEM = "You read what a user tells about themself: their name, city, job, favourite colour, pet, hobby, or nothing."


def _clause_items(model: LlamaModel, items: Sequence[Item]) -> list[tuple[str, str, int]]:
    """(message, clause text, kind index) for every clause the write considers in each item's message."""
    tok, out = model.tokenizer, []
    for message, system, labels, labeller in items:
        tokens, (start, end) = tok.turn_prompt(message, system)
        own = tokens[start : end - 1]
        for a, e in _clauses(tok, own):
            text = tok.decode(own[a:e]).strip()
            if labels is not None:
                kind = max(set(labels[a:e]), key=labels[a:e].count)
            else:
                assert labeller is not None
                kind = labeller(text)
            if text:
                out.append((message, text, kind))
    return out


@torch.no_grad()
def _features(model: LlamaModel, clauses: Sequence[tuple[str, str, int]], layers: Sequence[int]) -> dict[int, Tensor]:
    """Per layer (n, C): the input of that layer's attention at the last token of each clause's question and opening
    (layer ``n_layer``: the final norm's output), the base model reading it alone."""
    tok = model.tokenizer
    system = tok.system_prompt(SYSTEM)
    rows = []
    for message, clause, _ in clauses:
        tokens, _ = tok.turn_prompt(f"{message}\n\n{ASK.format(clause=clause)}", system)
        rows.append(tokens + tok.encode(OPENING))
    out = {layer: torch.empty(len(rows), model.config.n_embd) for layer in layers}
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # rows of like length padded together
    top = min(max(layers), model.config.n_layer - 1)
    for at in range(0, len(order), 16):
        chunk = order[at : at + 16]
        L = max(len(rows[i]) for i in chunk)
        idx = torch.zeros((len(chunk), L), dtype=torch.long)
        for b, i in enumerate(chunk):
            idx[b, : len(rows[i])] = torch.tensor(rows[i])
        x = model.wte(idx)
        rope = model.rope(torch.arange(L).view(1, -1))
        at_last = (torch.arange(len(chunk)), torch.tensor([len(rows[i]) - 1 for i in chunk]))
        for n, block in enumerate(model.blocks[: top + 1]):
            x, h = block(x, None, rope, None, 0, None)
            if n in out:
                out[n][chunk] = h[at_last].float()
        if model.config.n_layer in out:
            out[model.config.n_layer][chunk] = model.norm_f(x)[at_last].float()
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--layers", type=int, nargs="*", default=[15, 20, 25, 29, 30])
    ap.add_argument("--generated", type=int, default=0, help="generated messages whose clauses are fitted on too")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--out", type=Path, default=Path("experiments/probes/results/prompted_kinds.json"))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = load_model(args.checkpoint)
    assert isinstance(model, LlamaModel)
    tok = model.tokenizer
    sia = tok.system_prompt(PERSONAS["sia"].system_prompt)
    tune = _clause_items(model, _labelled_messages(load_users("tune"), sia))
    train = _clause_items(model, _labelled_messages(load_users(TRAIN), sia))
    if args.generated:
        rng, phrases = random.Random(1), ReadPhrases.load()
        made: list[Item] = []
        for _ in range(args.generated):
            text, spans = _message(rng, phrases, None)
            made.append((text, sia, token_kinds(tok, text, tuple(spans)), None))
        train += _clause_items(model, made)
    results: dict[str, Any] = {
        "tune clauses": [len(tune), sum(k > 0 for _, _, k in tune)],
        "train clauses": [len(train), sum(k > 0 for _, _, k in train)],
        "prompt": {"system": SYSTEM, "ask": ASK, "opening": OPENING},
    }
    start = time.perf_counter()
    x_tune, x_train = _features(model, tune, args.layers), _features(model, train, args.layers)
    results["feature seconds"] = round(time.perf_counter() - start, 1)
    y_tune = torch.tensor([k for _, _, k in tune])
    y_train = torch.tensor([k for _, _, k in train])
    for layer in args.layers:
        mean, std = x_train[layer].mean(0), x_train[layer].std(0) + 1e-4
        torch.manual_seed(0)
        head = _fit((x_train[layer] - mean) / std, y_train, args.steps)
        with torch.no_grad():
            probs = torch.softmax(head((x_tune[layer] - mean) / std), -1)
        results[f"layer {layer}"] = _counts(probs, y_tune)
        fact = y_tune > 0
        results[f"layer {layer}, argmax right of fact clauses"] = int((probs.argmax(-1)[fact] == y_tune[fact]).sum())
        sys.stdout.write(f"layer {layer}: {results[f'layer {layer}']}\n")
    results["kinds"] = list(KINDS)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
