"""How well does the ask head tell what a natural question asks, fitted on generated messages alone or with the natural
set's training part too? The tuning part's questions, messages and unrelated turns, read as the head reads them
(``ask_features``), against the head as the checkpoint ships it and as ``train_asks`` fits it afresh with and without
``natural_asks(load_users("train"))``:

- questions of a kind the tagger knows: given that kind, taken for none (no bias), taken for another kind;
- the users' own messages and the unrelated turns: taken for a question (a false ask moves the entries).

    PYTHONPATH=. python -m experiments.probes.ask_labels [--checkpoint DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.imprint import KINDS
from sia.learn.imprint_read import ReadPhrases, ask_features, natural_asks, train_asks
from sia.learn.natural import TRAIN, load_fillers, load_users


def _measure(model: LlamaModel, questions: list[tuple[str, int]], told: list[str], fillers: list[str]) -> dict[str, Any]:
    head = model.imprint_ask
    assert head is not None
    with torch.no_grad():
        asked = head(ask_features(model, [q for q, _ in questions])).softmax(-1).cpu()
        false = {
            name: int((head(ask_features(model, texts)).softmax(-1)[:, 0] < 0.5).sum())  # the bias acts where p(none) < 1/2
            for name, texts in (("own messages", told), ("unrelated turns", fillers))
        }
    truth = torch.tensor([k for _, k in questions])
    acting = asked[:, 0] < 0.5
    kind = asked[:, 1:].argmax(-1) + 1
    per_kind: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for k, right in zip(truth.tolist(), (acting & (kind == truth)).tolist(), strict=True):
        per_kind[KINDS[k]][0] += int(right)
        per_kind[KINDS[k]][1] += 1
    return {
        "questions": len(questions),
        "given their kind": int((acting & (kind == truth)).sum()),
        "taken for none": int((~acting).sum()),
        "another kind": int((acting & (kind != truth)).sum()),
        "per kind (right, of)": dict(per_kind),
        "taken for a question": {**false, "of": {"own messages": len(told), "unrelated turns": len(fillers)}},
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("experiments/probes/results/ask_labels.json"))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = load_model(args.checkpoint)
    assert isinstance(model, LlamaModel) and model.imprint_ask is not None
    tune = load_users("tune")
    questions = [(q.text, KINDS.index(q.kind)) for u in tune for q in u.questions if q.kind in KINDS]
    told, fillers = [m for u in tune for m in u.messages], load_fillers("tune")
    results = {"shipped": _measure(model, questions, told, fillers)}
    phrases, own = ReadPhrases.load(), natural_asks(load_users(TRAIN))
    for name, natural in (("refitted, generated only", ()), ("refitted, with the natural training part", own)):
        results[name] = {"fit": train_asks(model, phrases, natural=natural), **_measure(model, questions, told, fillers)}
    for name, figures in results.items():
        sys.stdout.write(f"{name}: {json.dumps(figures)}\n")
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
