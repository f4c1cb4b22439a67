"""A learned mark of what is no longer so: can a clause that says something the user told is over ("we lost Rex in the
spring", "mustard was a phase", "I got laid off from the factory") be told from one that says what is so, better than
the write's word lists (``sia.identity.imprint.superseded``)? A logistic map of the kind tagger's layer's input (layer
15) averaged over a clause's tokens as the write cuts them (each message read after sia's prompt), fitted on:

- ``experiments/data/over_clauses.jsonl``: 126 messages written for it, each with the words of its clauses that say
  something is over (69 with one or two, 57 with none, hard cases among them: "I've had Rex since he was a puppy",
  "I left work early to walk the dog");
- the natural set's training part: in a message that replaces a fact, a clause naming a replaced value and not the
  new one is over; every other clause is not.

First fitted on half of the written messages and measured on the other half, then on all of it and measured against
the word lists on the natural set's tuning part and the late corrections probe's 28 users (a clause of a later message
naming a value the user replaced is over). Several of the written wordings were known from the late probe's failures:
there it says what the mark adds, not how it generalises. Nothing is generated. The product version (the head in the
checkpoint, the write leaving marked clauses out, the recipe stage) measured end to end in LOG.md 2026-12-07 (b) is
``over_head.patch``.

    PYTHONPATH=. python -m experiments.probes.over_marker [--min 0.9] [--l2 0.01] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.probes import late_corrections
from sia.backbones.llama import LlamaModel
from sia.checkpoint import DEFAULT_CACHE, DEFAULT_CHECKPOINT, load_llama_checkpoint
from sia.identity.imprint import _clauses, clause_breaks, superseded
from sia.learn.natural import TRAIN, NaturalUser, load_users, mentions
from sia.personas import PERSONAS

DATA = Path(__file__).resolve().parents[1] / "data" / "over_clauses.jsonl"


@dataclass
class Clauses:
    """Clauses of messages as the write cuts them: each one's mean input to the tagger's layer, whether it is over,
    whether the write's word lists leave it out as over (``superseded``) and its text."""

    features: list[Tensor]
    over: list[bool]
    listed: list[bool]
    text: list[str]

    @classmethod
    def empty(cls) -> Clauses:
        return cls([], [], [], [])

    def add(self, model: LlamaModel, system: list[int], message: str, is_over: Callable[[str], bool]) -> None:
        """Cut ``message`` (read after the persona prompt ``system``) into clauses and add each, labelled by ``is_over``
        of its text."""
        tok = model.tokenizer
        layer = model.config.imprint_kinds_layer
        if layer is None:
            raise ValueError("the over head reads the kind tagger's layer: the model has none")
        tokens, (start, end) = tok.turn_prompt(message, system)
        body = tokens[start : end - 1]
        pieces = [tok.token_text(t) for t in body]
        breaks = clause_breaks(pieces)
        said = superseded(pieces, breaks)
        device = model.wte.weight.device
        with torch.no_grad():
            h = model.layer_inputs(torch.tensor([tokens[: end - 1]], device=device), layer)[0, start:].cpu()
        for a, b in _clauses(breaks):
            text = tok.decode(body[a:b])
            if text.strip():
                self.features.append(h[a:b].mean(0))
                self.over.append(bool(is_over(text)))
                self.listed.append(bool(said[a:b].any()))
                self.text.append(text)

    def tensors(self) -> tuple[Tensor, Tensor]:
        return torch.stack(self.features), torch.tensor(self.over, dtype=torch.float32)


def written(path: Path = DATA) -> list[tuple[str, tuple[str, ...]]]:
    """The hand-written messages: (message, the words of its clauses that say something is over); ValueError for a
    malformed line or words that are not in their message."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            message, over = str(row["message"]), tuple(str(s) for s in row["over"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: not an over clause line ({exc!r})") from exc
        if not all(s and s in message for s in over):
            raise ValueError(f"{path}:{n}: the over words must be words of the message")
        out.append((message, over))
    return out


def says_over(spans: Sequence[str]) -> Callable[[str], bool]:
    """A clause's label from the words written as over: it is part of them, or holds them."""

    def is_over(text: str) -> bool:
        t = text.strip().strip(",.;:!?").lower()
        return bool(t) and any(t in s.lower() or s.lower() in text.lower() for s in spans)

    return is_over


def replaced_named(user: NaturalUser, message: int) -> Callable[[str], bool]:
    """A natural user's clause of ``message`` is over where the message replaces a fact and the clause names a replaced
    value of its kind and not the new one."""
    replacing = [f for f in user.facts if f.message == message and f.corrects is not None]
    older = [a for f in replacing for o in user.facts if o.kind == f.kind and o is not f for a in o.accept]
    newer = [a for f in replacing for a in f.accept]

    def is_over(text: str) -> bool:
        return any(mentions(text, a) for a in older) and not any(mentions(text, a) for a in newer)

    return is_over


def clauses_of(
    model: LlamaModel, system: list[int], users: Sequence[NaturalUser], extra: Sequence[tuple[str, Sequence[str]]]
) -> Clauses:
    """Every clause of the ``extra`` hand-written messages and of the natural ``users``' messages, labelled."""
    out = Clauses.empty()
    for message, over in extra:
        out.add(model, system, message, says_over(over))
    for user in users:
        for m, message in enumerate(user.messages):
            out.add(model, system, message, replaced_named(user, m))
    return out


def fit(x: Tensor, y: Tensor, l2: float, steps: int = 300) -> nn.Linear:
    """A logistic map of the features x (n, C) to the labels y (n,) (the two classes weighed alike, the features
    standardised while fitting, with an L2 penalty ``l2`` on the standardised weights), as one linear map of x."""
    if x.dim() != 2 or y.shape != (x.shape[0],) or not bool(((y == 0) | (y == 1)).all()):
        raise ValueError(f"need features (n, C) and n labels of 0 or 1; got {tuple(x.shape)}, {tuple(y.shape)}")
    if not 0 < float(y.mean()) < 1:
        raise ValueError("need clauses of both kinds, over and not")
    mean, std = x.mean(0), x.std(0) + 1e-4
    z = (x - mean) / std
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    pos = float(y.mean())
    weight = torch.where(y > 0, 0.5 / pos, 0.5 / (1 - pos))
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = (weight * F.binary_cross_entropy_with_logits(z @ w + b, y, reduction="none")).mean() + l2 * (w * w).sum()
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    opt.step(closure)  # type: ignore[no-untyped-call]
    head = nn.Linear(x.shape[1], 1)
    with torch.no_grad():
        head.weight.copy_((w / std).view(1, -1))
        head.bias.copy_((b - (w / std) @ mean).view(1))
    return head


def marks(head: nn.Linear, x: Tensor, sure: float) -> Tensor:
    """(n,) bool: the clauses (features x (n, C)) the head calls over at probability ``sure``."""
    with torch.no_grad():
        logits: Tensor = head(x.to(head.weight.dtype)).float()[:, 0]
    return logits >= math.log(sure / (1 - sure))


def counts(said: Tensor, over: Tensor) -> dict[str, int]:
    return {
        "clauses": int(over.numel()),
        "over": int(over.sum()),
        "found": int((said & over).sum()),
        "false": int((said & ~over).sum()),
    }


def _late(model, system: list[int]) -> Clauses:  # type: ignore[no-untyped-def]
    sets = (
        (late_corrections.USERS, late_corrections.OLDER),
        (late_corrections.AFTER, late_corrections.AFTER_OLDER),
        (late_corrections.LAST, late_corrections.LAST_OLDER),
    )
    out = Clauses.empty()
    for users, older in sets:
        for i, (said, _) in enumerate(users):
            replaced = [a for (u, _k), values in older.items() if u == i for a in values]
            seen: set[str] = set()
            for message in said:
                first = {a for a in replaced if a not in seen and a.lower() in message.lower()}

                def is_over(text: str, first: set[str] = first, replaced: list[str] = replaced) -> bool:
                    named = {a for a in replaced if a.lower() in text.lower()}
                    return bool(named) and not named <= first

                out.add(model, system, message, is_over)
                seen |= first
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--min", type=float, default=0.9)
    parser.add_argument("--l2", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    model = load_llama_checkpoint(DEFAULT_CHECKPOINT, DEFAULT_CACHE)
    system = model.tokenizer.system_prompt(PERSONAS["sia"].system_prompt)
    results: dict[str, object] = {"min": args.min, "l2": args.l2}
    extra = written()
    order = torch.randperm(len(extra), generator=torch.Generator().manual_seed(0)).tolist()
    half = len(order) // 2
    first = clauses_of(model, system, load_users(TRAIN), [extra[i] for i in order[:half]])
    apart = clauses_of(model, system, (), [extra[i] for i in order[half:]])
    x, y = first.tensors()
    xa, ya = apart.tensors()
    results["written, half held out"] = {
        "word lists": counts(torch.tensor(apart.listed), ya > 0),
        "head": counts(marks(fit(x, y, args.l2), xa, args.min), ya > 0),
    }
    head_all = fit(torch.cat([x, xa]), torch.cat([y, ya]), args.l2)
    parts = {"tuning part": clauses_of(model, system, load_users("tune"), ()), "late corrections": _late(model, system)}
    held = results["written, half held out"]
    sys.stdout.write(f"## written, half held out: {held}\n")
    for name, c in parts.items():
        x, y = c.tensors()
        over, listed = y > 0, torch.tensor(c.listed)
        head = marks(head_all, x, args.min)
        new = head & ~listed
        results[name] = {
            "word lists": counts(listed, over),
            "head": counts(head, over),
            "either": counts(head | listed, over),
            "marked by the head alone": [(c.text[i], bool(over[i])) for i in range(len(c.text)) if bool(new[i])],
        }
        sys.stdout.write(f"## {name}: {int(over.sum())} of {len(c.text)} clauses over\n")
        for k in ("word lists", "head", "either"):
            r = results[name][k]  # type: ignore[index]
            sys.stdout.write(f"  {k}: {r['found']} found, {r['false']} false\n")
        for text, label in results[name]["marked by the head alone"]:  # type: ignore[index]
            sys.stdout.write(f"    head alone: {text!r} ({'over' if label else 'not labelled over'})\n")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
