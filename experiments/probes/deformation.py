"""How much an untrained identity state costs the pretrained backbone, and that it still matters.

An identity of persona ``sia`` talks for ``--turns`` turns (user messages from the shipped dialogue set, greedy
replies), exactly as the service would run them. Then, on held-out conversations of the same set (none of whose
messages were used to build the state), each assistant reply is scored under that state and under a fresh
identity: reply perplexity (target: with state <= 1.05x fresh) and the mean next-token KL(state || fresh) over
the reply's positions (target: > 0, the state still matters). Each ``--scale`` (the metric's c) is one row, and
a row with the self slot closed (s = 0) isolates the trace's share.

    python -m experiments.probes.deformation [--turns 20] [--scales 0.5 1 2 4 8] [--conversations 30] [--out FILE]

Writes experiments/probes/results/deformation.json (the sweep of the default scales: deformation_sweep.json) and prints
a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sia.backbones.llama import LlamaModel
from sia.checkpoint import DEFAULT_CACHE, load_model
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, run_turn
from sia.learn.dialogue import Conversation, load_dialogue
from sia.model.generate import SamplingParams
from sia.personas import PERSONAS

log = logging.getLogger("experiments.probes.deformation")
RESULTS = Path(__file__).parent / "results" / "deformation.json"


def build_state(model: LlamaModel, context: tuple[int, ...], messages: list[str]) -> IdentityState:
    state = IdentityState.fresh(model.config)
    dynamics = Dynamics.from_config(model.config)
    params = SamplingParams(max_new_tokens=32, temperature=0.0)
    for message in messages:
        state = run_turn(model, TurnRequest(state, message, dynamics, context), params).state
    return state


@torch.inference_mode()
def reply_scores(
    model: LlamaModel, context: tuple[int, ...], states: list[IdentityState], held_out: list[Conversation]
) -> dict[str, float]:
    """Per state: total reply NLL and token count; and the summed KL(states[i] || states[0]) per position."""
    tok = model.tokenizer
    nll = [0.0] * len(states)
    kl = [0.0] * len(states)
    tokens = 0
    cond = model.condition_states(states)
    for conv in held_out:
        for turn in conv.turns:
            prompt, _ = tok.turn_prompt(turn.user, context)
            reply = [*tok.encode(turn.reply), *sorted(tok.end_ids)[:1]]
            ids = torch.tensor([prompt + reply] * len(states))
            logits = model(ids, cond).logits[:, len(prompt) - 1 : -1].float()  # (S, R, V) predicting the reply
            logp = F.log_softmax(logits, dim=-1)
            target = torch.tensor(reply)
            for i in range(len(states)):
                nll[i] += float(-logp[i].gather(-1, target[:, None]).sum())
                kl[i] += float((logp[i].exp() * (logp[i] - logp[0])).sum())
            tokens += len(reply)
    out = {"tokens": float(tokens)}
    for i in range(len(states)):
        out[f"ppl_{i}"] = math.exp(nll[i] / tokens)
        out[f"kl_{i}"] = kl[i] / tokens
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--scales", type=float, nargs="+", default=None, help="metric scales c (default: the checkpoint's)")
    parser.add_argument("--conversations", type=int, default=30, help="held-out conversations scored")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)

    base = load_model(cache_dir=args.cache)
    assert isinstance(base, LlamaModel)
    dialogue = load_dialogue()
    history = [t.user for conv in dialogue[: len(dialogue) // 2] for t in conv.turns][: args.turns]
    held_out = dialogue[len(dialogue) // 2 :][: args.conversations]
    context = tuple(base.tokenizer.system_prompt(PERSONAS["sia"].system_prompt))
    rows: list[dict[str, Any]] = []
    for scale in args.scales or [base.config.metric_scale]:
        started = time.perf_counter()
        base.config = replace(base.config, metric_scale=scale)
        state = build_state(base, context, history)
        closed = replace(state, self_state=torch.zeros_like(state.self_state))
        fresh = IdentityState.fresh(base.config)
        scores = reply_scores(base, context, [fresh, state, closed], held_out)
        row = {
            "metric_scale": scale,
            "max_logit_change": 4 * scale * base.config.metric_max_deform,
            "ppl_fresh": scores["ppl_0"],
            "ppl_state": scores["ppl_1"],
            "ratio": scores["ppl_1"] / scores["ppl_0"],
            "kl_state": scores["kl_1"],
            "ppl_trace_only": scores["ppl_2"],
            "ratio_trace_only": scores["ppl_2"] / scores["ppl_0"],
            "kl_trace_only": scores["kl_2"],
            "self_norm": float(state.self_state.norm()),
            "trace_norm": float(state.trace.float().norm()),
            "reply_tokens": int(scores["tokens"]),
            "seconds": time.perf_counter() - started,
        }
        log.info("%s", json.dumps(row))
        rows.append(row)
    result = {"turns": len(history), "conversations": len(held_out), "rows": rows, "threads": args.threads}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"{'c':>6} {'max dlogit':>10} {'ppl fresh':>10} {'ppl state':>10} {'ratio':>7} {'KL':>9} {'ratio T':>8} {'KL T':>9}"]
    for r in rows:
        lines.append(
            f"{r['metric_scale']:6.2f} {r['max_logit_change']:10.2f} {r['ppl_fresh']:10.3f} {r['ppl_state']:10.3f} "
            f"{r['ratio']:7.4f} {r['kl_state']:9.2e} {r['ratio_trace_only']:8.4f} {r['kl_trace_only']:9.2e}"
        )
    sys.stdout.write("\n".join(lines) + f"\n\nwrote {args.out}\n")


if __name__ == "__main__":
    main()
