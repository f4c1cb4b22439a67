"""The imprint's cost per turn outside decoding: the write (the base model's read of the turn's prompt, the choice of
spans, their quantisation) and the ask head's pass, against a whole turn of the bundled SmolLM2 model.

Run: ``python -m benchmarks.imprint_write [--quick] [--threads 2] [--tokens 24] [--messages 12] [--out PATH]``.

Per persona (``sia``, and ``bolt``, whose prompt with its worked examples is the longest), the natural set's tuning
messages said to an identity holding a full imprint (``benchmarks.imprint_read.full_imprint``, so the ask head runs),
greedy, ``--tokens`` new tokens a reply (the end tokens banned: ``benchmarks.fixed_length.endless``), CPU float32.
Each message is timed four ways, round-robin after one untimed warm-up message:

* ``turn``: the whole turn as the service runs it (``run_turn``: conditioning with the ask pass, prefill, decoding,
  the state's update and the write, the persona's prompt kept by the write: ``TurnRequest.shared``);
* ``write``: the write alone as the turn runs it (``imprint_message``), the persona's prompt's read kept;
* ``write_whole``: the same write reading the whole prompt again (the write before the prompt's read was kept);
* ``ask``: the ask head's pass alone (``LlamaModel.asked_kinds`` of the message).

Reported: medians in ms, and each part's share of the turn. Target (the open-memory issue): the write <= 10 % of a
turn's time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.fixed_length import endless
from benchmarks.imprint_read import full_imprint
from benchmarks.machine import machine_info
from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.checkpoint import load_model
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest, imprint_message, run_turn, turn_prompt
from sia.learn.natural import load_users
from sia.model.generate import Generation, SamplingParams, stream
from sia.personas import PERSONAS

DEFAULT_OUT = Path(__file__).parent / "results" / "imprint_write.json"
TARGET = 0.10


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return 1000 * (time.perf_counter() - started)


def _generation(model: LlamaModel, request: TurnRequest, params: SamplingParams) -> Generation:
    """The turn's decoding alone (what the write reads its surprisal from)."""
    prompt = turn_prompt(model.tokenizer, request)
    cond = model.condition_states([request.state], [len(request.context)], [prompt.message])
    decoding = stream(model, [prompt.tokens], cond, params, summary_masks=[prompt.counted], nll_from=[prompt.scored[0]])
    for _ in decoding:
        pass
    return decoding.result[0]


def persona_costs(model: LlamaModel, persona: str, state: IdentityState, messages: list[str], tokens: int) -> dict[str, Any]:
    tok = model.tokenizer
    system = tuple(tok.system_prompt(PERSONAS[persona].system_prompt))
    dynamics, params = Dynamics.from_config(model.config), SamplingParams(max_new_tokens=tokens, temperature=0.0)
    samples: dict[str, list[float]] = {"turn": [], "write": [], "write_whole": [], "ask": []}
    for i, message in enumerate(messages):
        kept = TurnRequest(state, message, dynamics, system)
        whole = replace(kept, shared=0)
        prompt = turn_prompt(tok, kept)
        generation = _generation(model, kept, params)
        calls: dict[str, Callable[[], object]] = {
            "turn": partial(run_turn, model, kept, params),
            "write": partial(imprint_message, model, tok, kept, prompt, generation.prompt_nll),
            "write_whole": partial(imprint_message, model, tok, whole, prompt, generation.prompt_nll),
            "ask": partial(model.asked_kinds, [prompt.message]),
        }
        times = {name: _timed(call) for name, call in calls.items()}
        if i:  # the first message warms up (and reads the persona's prompt for the kept write)
            for name, ms in times.items():
                samples[name].append(ms)
    medians = {name: statistics.median(v) for name, v in samples.items()}
    return {
        "prompt_tokens": len(system),
        "messages": len(samples["turn"]),
        "ms": medians,
        "share_of_turn": {name: medians[name] / medians["turn"] for name in ("write", "write_whole", "ask")},
        "samples_ms": samples,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 messages, 8 tokens: a sanity run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=24, help="new tokens a reply")
    p.add_argument("--messages", type=int, default=12, help="messages a persona (the first one warms up)")
    p.add_argument("--checkpoint", type=Path, default=None, help="default: the bundled one")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.messages = 8, 4
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    result: dict[str, Any] = {"machine": info, "personas": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(args.checkpoint, cache_dir=Path(tmp) / "models")
        if not isinstance(model, LlamaModel) or not model.config.imprint_tokens:
            raise SystemExit("the checkpoint keeps no imprint")
        tok = model.tokenizer
        assert isinstance(tok, ChatTokenizer)
        imprint = full_imprint(model, tok.system_prompt(PERSONAS["sia"].system_prompt))
        model.tokenizer = endless(tok)
        state = replace(IdentityState.fresh(model.config), imprint=imprint)
        messages = [m for u in load_users("tune") for m in u.messages][: args.messages]
        for persona in ("sia", "bolt"):
            sys.stdout.write(f"{persona}...\n")
            result["personas"][persona] = persona_costs(model, persona, state, messages, args.tokens)
    info["loadavg_end"] = list(os.getloadavg())
    result["setup"] = {"checkpoint": str(args.checkpoint or "bundled"), "tokens": args.tokens, "target": TARGET}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write("| persona | prompt tokens | turn ms | write ms (share) | write reading the whole prompt | ask ms |\n")
    sys.stdout.write("|---|---|---|---|---|---|\n")
    for persona, r in result["personas"].items():
        ms, share = r["ms"], r["share_of_turn"]
        sys.stdout.write(
            f"| {persona} | {r['prompt_tokens']} | {ms['turn']:.0f} | {ms['write']:.0f} ({share['write']:.1%}) |"
            f" {ms['write_whole']:.0f} ({share['write_whole']:.1%}) | {ms['ask']:.0f} ({share['ask']:.1%}) |\n"
        )


if __name__ == "__main__":
    main()
