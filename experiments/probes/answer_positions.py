"""Diagnostic: can a layer's input tell where a reply names a user's fact from ordinary reply text?

What a per-token read gate (``slot_gate``) would have to learn: open the read where the reply is about to name a
value the user stated, shut it elsewhere. For each of a few layers, the normalised layer input (what the gate reads)
of the bundled model with a fresh state is taken at two kinds of positions of the fact corpus: the token after which
a probe's reply names the value ("Your favourite colour is" -> " blue"), and three random positions of each ordinary
(chit-chat) reply. A logistic regression per layer is fitted on the training split and tested on the held-out split
(other wordings, chit-chat and users). Reported: the share of held-out answer positions it finds and of ordinary
positions it rejects.

    python -m experiments.probes.answer_positions [--episodes 40] [--layers 3 9 15 21 27] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.state import IdentityState
from sia.learn.adapter import facts
from sia.learn.adapter.unroll import render_turn
from sia.personas import PERSONAS

RESULTS = Path(__file__).parent / "results" / "answer_positions.json"


def positions(model: LlamaModel, split: str, n: int, seed: int, layers: list[int]) -> tuple[dict[int, Tensor], Tensor]:
    """Layer inputs (rows, C) per layer at answer positions (label 1) and ordinary reply positions (label 0)."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    context = tok.system_prompt(PERSONAS["sia"].system_prompt)
    seen: dict[int, Tensor] = {}
    hooks = [
        model.blocks[layer]
        .get_submodule("attn_norm")
        .register_forward_hook(lambda _m, _i, out, layer=layer: seen.__setitem__(layer, out[0]))
        for layer in layers
    ]
    rng = random.Random(seed)
    inputs: dict[int, list[Tensor]] = {layer: [] for layer in layers}
    labels: list[int] = []
    fresh = model.condition_states([IdentityState.fresh(model.config)])
    try:
        for episode in facts.episodes(split, n, seed, between=2, kinds=("colour", "pet", "hobby")):
            items = []
            for probe in episode.probes:
                turn = render_turn(tok, context, probe.question, probe.reply)
                items.append((turn.tokens, [turn.reply[0] + len(tok.encode(probe.reply_prefix)) - 1], 1))
            for t, exchange in enumerate(episode.turns):
                if t == episode.stated_at or t == 0:
                    continue
                turn = render_turn(tok, context, exchange.user, exchange.reply)
                a, b = turn.reply
                items.append((turn.tokens, rng.sample(range(a, b - 1), min(3, b - 1 - a)), 0))
            for tokens, where, label in items:
                with torch.no_grad():
                    model(torch.tensor([tokens]), fresh)
                for layer in layers:
                    inputs[layer].extend(seen[layer][p].float() for p in where)
                labels.extend([label] * len(where))
    finally:
        for hook in hooks:
            hook.remove()
    return {layer: torch.stack(rows) for layer, rows in inputs.items()}, torch.tensor(labels, dtype=torch.float32)


def separate(train: Tensor, y: Tensor, test: Tensor, y_test: Tensor, steps: int = 400) -> dict[str, float]:
    """A logistic regression (positives weighted to balance) fitted on ``train``; its held-out rates on ``test``."""
    mu, sd = train.mean(0), train.std(0) + 1e-3
    a, b = (train - mu) / sd, (test - mu) / sd
    w = torch.zeros(a.shape[1], requires_grad=True)
    c = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.Adam([w, c], lr=0.01)
    balance = (1 - y.mean()) / y.mean()
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(a @ w + c, y, pos_weight=balance) + 1e-3 * w.square().sum()
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    with torch.no_grad():
        said = (b @ w + c) > 0
        answers, ordinary = y_test > 0, y_test == 0
        return {
            "answers_found": float((said & answers).sum() / answers.sum()),
            "ordinary_rejected": float((~said & ordinary).sum() / ordinary.sum()),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=40, help="training episodes (held out: 3/5 as many)")
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 9, 15, 21, 27])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = load_model(None).eval()
    if not isinstance(model, LlamaModel):
        raise SystemExit("the bundled model is not a LLaMA-family model")
    x_train, y_train = positions(model, "train", args.episodes, 3, args.layers)
    x_test, y_test = positions(model, "heldout", max(2, args.episodes * 3 // 5), 4, args.layers)
    rows = [{"layer": layer, **separate(x_train[layer], y_train, x_test[layer], y_test)} for layer in args.layers]
    result = {
        "train_positions": len(y_train),
        "heldout_positions": len(y_test),
        "answer_share": float(y_test.mean()),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write("| layer | held-out answer positions found | ordinary positions rejected |\n|---|---|---|\n")
    for row in rows:
        sys.stdout.write(f"| {row['layer']} | {row['answers_found']:.1%} | {row['ordinary_rejected']:.1%} |\n")


if __name__ == "__main__":
    main()
