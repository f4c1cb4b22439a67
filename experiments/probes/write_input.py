"""Diagnostic: what the write reads. How much of the self update's input z is the turn's content, how much the state?

The write's input z is the memory tokens' final hidden states and the turn's pooled hidden state, standardised as the
self update standardises them. Those tokens run through the model under the state being written: the self slots
inject it at every layer, into the turn's tokens and the memory tokens alike. This writes ``--turns`` unrelated
held-out turns under each of ``--users`` held-out users' states (each user's three facts stated ``--between``
unrelated turns before), every turn under every state, and splits the variance of z over that grid into a part that
depends on the turn alone, a part that depends on the state alone, and the rest (two-way analysis of variance).
A write that summarises what a turn says has most of its variance in the turn's part.

    python -m experiments.probes.write_input [--checkpoint DIR] [--users 16] [--turns 8] [--between 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.state import Dynamics
from sia.learn.adapter import facts
from sia.learn.adapter.evaluate import CLOSED_TRIO, play
from sia.learn.adapter.unroll import Carry, persona_contexts, render_turn, write_turn
from sia.learn.dialogue import Exchange

RESULTS = Path(__file__).parent / "results" / "write_input.json"


def variance_shares(z: Tensor) -> dict[str, float]:
    """z (turns, states, F): the shares of its total variance in the turn means, the state means and the rest."""
    z = z.double()
    mean = z.mean((0, 1))
    total = (z - mean).square().sum()
    turns = (z.mean(1) - mean).square().sum() * z.shape[1]
    states = (z.mean(0) - mean).square().sum() * z.shape[0]
    return {"turn": float(turns / total), "state": float(states / total), "rest": float(1 - (turns + states) / total)}


@torch.no_grad()
def write_inputs(model: LlamaModel, carry: Carry, turns: list[Exchange], contexts: list[list[int]]) -> Tensor:
    """(turns, rows, F): the standardised z of each turn written under each row's state."""
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    update = model.self_update
    seen: list[Tensor] = []
    forward = update.forward

    def keep(z: Tensor, s: Tensor) -> Tensor:
        seen.append(update.inputs(z).float())
        return forward(z, s)

    update.forward = keep  # type: ignore[method-assign]
    try:
        dynamics = Dynamics.from_config(model.config)
        rows = carry.self_state.shape[0]
        for turn in turns:
            rendered = [render_turn(tok, contexts[b], turn.user, turn.reply) for b in range(rows)]
            write_turn(model, carry, rendered, dynamics, grad_tokens=True)
    finally:
        del update.forward
    return torch.stack(seen)


def measure(model: LlamaModel, users: int, turns: int, between: int) -> dict[str, Any]:
    if not model.config.memory_tokens:
        raise SystemExit("write_input measures a write with memory tokens")
    dynamics = Dynamics.from_config(model.config)
    episodes = facts.episodes("heldout", users, 11, between=between, kinds=CLOSED_TRIO)
    contexts = persona_contexts(model, users)
    with torch.no_grad():
        final = play(model, episodes, contexts, dynamics)[-1]
    talk = list(facts.chitchat("heldout")[-turns:])
    z = write_inputs(model, final, talk, contexts)
    parts = model.self_update.parts
    per_part = [variance_shares(z.reshape(*z.shape[:2], parts, -1)[:, :, k]) for k in range(parts)]
    fresh = write_inputs(model, Carry.fresh(model, users), talk[:1], contexts)[0]
    own = z[0]
    cosine = torch.nn.functional.cosine_similarity
    return {
        "users": users,
        "turns": turns,
        "between": between,
        "all": variance_shares(z),
        "memory_tokens": per_part[:-1],
        "pooled": per_part[-1],
        "same_turn_own_vs_fresh_state_cosine": float(cosine(own, fresh).mean()),
        "same_turn_two_users_cosine": float(cosine(own, own.roll(1, 0)).mean()),
        "same_user_two_turns_cosine": float(cosine(z[0], z[1]).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="a SIA checkpoint of a pretrained backbone (default: bundled)")
    parser.add_argument("--users", type=int, default=16, help="held-out users whose states the turns are written under")
    parser.add_argument("--turns", type=int, default=8, help="unrelated held-out turns written under every state")
    parser.add_argument("--between", type=int, default=4, help="unrelated turns since each user stated their facts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.users < 2 or args.turns < 2:
        parser.error("--users and --turns must be >= 2")
    model = load_model(args.checkpoint).eval()
    if not isinstance(model, LlamaModel):
        raise SystemExit("write_input measures a model over a pretrained backbone")
    result = {"checkpoint": args.checkpoint or "bundled", **measure(model, args.users, args.turns, args.between)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    a, p = result["all"], result["pooled"]
    sys.stdout.write(
        f"variance of z: turn {a['turn']:.1%}, state {a['state']:.1%}, rest {a['rest']:.1%}; "
        f"pooled part: turn {p['turn']:.1%}, state {p['state']:.1%}\n"
        f"cosine of one turn's z: own state vs a fresh one {result['same_turn_own_vs_fresh_state_cosine']:.2f}, "
        f"two users {result['same_turn_two_users_cosine']:.2f}; one user, two turns {result['same_user_two_turns_cosine']:.2f}\n"
    )


if __name__ == "__main__":
    main()
