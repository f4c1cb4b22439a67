"""What a fresh write costs a turn: one turn of the bundled model with its write after the reply (as shipped) and
with ``fresh_write`` (the memory tokens read the whole turn in a pass of their own with a fresh identity).

Both run the same turn through ``sia.identity.turn.stream_turns`` (persona ``sia``'s prompt, one held-out chit-chat
message, a reply of exactly ``--tokens`` tokens: the end-of-turn logit is pushed down), on one user's state (after a
turn that stated a colour and a pet), alternating, ``--repeats`` times after 3 warm-ups each; the fresh-write model is
the same weights with the config flag set (its write is not trained for it: this measures time, not memory). Also
timed alone: ``write_input``, the fresh pass itself. ``torch.set_num_threads(--threads)`` first (default 1, the
service's per-process setting).

    python -m benchmarks.fresh_write [--tokens 32] [--repeats 20] [--threads 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, stream_turns, turn_prompt
from sia.learn.adapter import facts
from sia.model.generate import SamplingParams
from sia.personas import PERSONAS

RESULTS = Path(__file__).parent / "results" / "fresh_write.json"


def _timed(run: Any) -> float:
    began = time.perf_counter()
    run()
    return (time.perf_counter() - began) * 1000


def measure(model: LlamaModel, tokens: int, repeats: int) -> dict[str, Any]:
    tok = model.tokenizer
    assert isinstance(tok, ChatTokenizer)
    bias = torch.zeros(model.config.vocab_size)
    bias[list(tok.end_ids)] = -1e4  # every reply runs to exactly ``tokens`` tokens
    model.lm_head.bias = nn.Parameter(bias, requires_grad=False)
    fresh = copy.copy(model)  # the same modules and weights; only the config differs
    fresh.config = replace(model.config, fresh_write=True)
    dynamics = Dynamics.from_config(model.config)
    context = tuple(tok.system_prompt(PERSONAS["sia"].system_prompt))
    message = facts.chitchat("heldout")[0].user
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0)
    said = TurnRequest(IdentityState.fresh(model.config), "Hi! My favourite colour is green and I have a cat.", dynamics, context)
    run = stream_turns(model, [said], params)
    for _ in run:
        pass
    assert run.result is not None
    request = TurnRequest(state=run.result[0].state, message=message, dynamics=dynamics, context=context)  # a user's state

    def turn(m: LlamaModel) -> list[int]:
        run = stream_turns(m, [request], params)
        out = [event.token for event in run]
        assert run.result is not None
        return out

    generated = turn(model)
    prompt = turn_prompt(tok, request)
    rows, counted = [[*prompt.tokens, *generated]], [[*prompt.counted, *[True] * (len(generated) - 1), False]]
    times: dict[str, list[float]] = {"after_reply": [], "fresh_write": [], "write_input": []}
    for i in range(3 + repeats):
        spent = {
            "after_reply": _timed(lambda: turn(model)),
            "fresh_write": _timed(lambda: turn(fresh)),
            "write_input": _timed(lambda: fresh.write_input(rows, counted)),
        }
        if i >= 3:
            for name, ms in spent.items():
                times[name].append(ms)
    p50 = {name: statistics.median(v) for name, v in times.items()}
    return {
        "tokens": len(generated),
        "turn_tokens": len(rows[0]),
        "repeats": repeats,
        "p50_ms": p50,
        "p95_ms": {name: sorted(v)[int(0.95 * (len(v) - 1))] for name, v in times.items()},
        "ratio": p50["fresh_write"] / p50["after_reply"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="reply length in tokens")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model().eval()
    if not isinstance(model, LlamaModel) or not model.config.memory_tokens:
        raise SystemExit("fresh_write needs a bundled model that writes through memory tokens")
    with torch.inference_mode():
        result = {"threads": args.threads, **measure(model, args.tokens, args.repeats)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    p = result["p50_ms"]
    sys.stdout.write(
        f"turn of {result['turn_tokens']} tokens ({result['tokens']} generated), p50 over {args.repeats}: "
        f"write after the reply {p['after_reply']:.0f} ms, fresh write {p['fresh_write']:.0f} ms "
        f"({result['ratio']:.2f}x); the fresh pass alone {p['write_input']:.0f} ms\n"
    )


if __name__ == "__main__":
    main()
