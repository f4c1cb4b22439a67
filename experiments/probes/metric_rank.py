"""How many of the metric's eigenpairs a trace layer must carry (config.metric_rank), and what carrying fewer saves.

An identity of persona ``sia`` talks for ``--turns`` turns (user messages of the shipped dialogue set's first half,
greedy replies of 32 tokens), as the service runs them. After turns 1, 2, 4, 8, 16, 32 and 48:

* **Spectrum**: per trace layer and key/value head, the metric M's eigenvalues by magnitude; reported over all of them:
  the largest, the largest left out when r are kept (the bound on a logit's move is 4 times it), and how many exceed
  1e-6 ... 1e-3.
* **Effect** (turns 8, 16, 32, 48): the held-out dialogue's replies (``--conversations``) scored under the state with M
  whole and with M cut to its r largest eigenpairs (the others' eigenvalues set to 0, so the kernel's width is the
  same): the largest |logit change|, the mean KL(whole || cut) per reply token, and how often the argmax agrees.

Then the fused kernel alone at the width each r gives a trace layer, a decoding step's one query per row against 366
keys, at 1 and 8 rows, float32 (the best of 5 × 200 calls); and whole decoding at 1 and 8 rows under the 48-turn
state (``benchmarks.backbone``'s prompts and decoder, 32 tokens, the end tokens banned, round-robin, medians of
``--repeats``): the checkpoint carrying every eigenpair, carrying ``--decode-rank``, and its state-off twin.

    python -m experiments.probes.metric_rank [--turns 48] [--ranks 5 13 21 29] [--conversations 10] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import sia.backbones.llama as llama
from benchmarks.backbone import MESSAGES, Decode, checkpoint_base, dot_twin, sia_decode, timed_rounds
from benchmarks.fixed_length import endless
from sia.checkpoint import DEFAULT_CACHE, DEFAULT_CHECKPOINT, load_llama_checkpoint
from sia.identity.state import Dynamics, IdentityState, metric_factors
from sia.identity.turn import TurnRequest, run_turn
from sia.learn.dialogue import load_dialogue
from sia.model.attention import attend
from sia.model.generate import SamplingParams
from sia.personas import PERSONAS

RESULTS = Path(__file__).parent / "results" / "metric_rank.json"
CHECKPOINTS = (1, 2, 4, 8, 16, 32, 48)
SCORED = (8, 16, 32, 48)


def spectrum(state: IdentityState, config: Any, ranks: list[int]) -> dict[str, Any]:
    _, values = metric_factors(state.trace, config)
    mags = values.double().abs().sort(dim=-1, descending=True).values  # (n_trace, H, d)
    row: dict[str, Any] = {"largest": float(mags[..., 0].max())}
    row["left_out"] = {str(r): float(mags[..., r].max()) for r in ranks}
    row["above"] = {f"{tol:g}": int((mags > tol).sum(-1).max()) for tol in (1e-6, 1e-5, 1e-4, 1e-3)}
    return row


def cut_to(rank: int | None) -> Any:
    """metric_factors with every eigenvalue but the ``rank`` largest in magnitude set to 0 (all d pairs kept)."""

    def factors(trace: torch.Tensor, config: Any, _: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        basis, values = metric_factors(trace, config)
        if rank is not None:
            kept = values.abs().topk(rank, dim=-1).indices
            values = torch.zeros_like(values).scatter(-1, kept, values.gather(-1, kept))
        return basis, values

    return factors


@torch.inference_mode()
def effect(model: Any, context: tuple[int, ...], state: IdentityState, ranks: list[int], held: list[Any]) -> dict[str, Any]:
    tok = model.tokenizer
    rows = [
        (tok.turn_prompt(t.user, context)[0], [*tok.encode(t.reply), *sorted(tok.end_ids)[:1]]) for c in held for t in c.turns
    ]

    def logits(rank: int | None) -> list[torch.Tensor]:
        llama.metric_factors = cut_to(rank)  # type: ignore[attr-defined]
        try:
            cond = model.condition_states([state])
            return [model(torch.tensor([p + r]), cond).logits[0, len(p) - 1 : -1].float() for p, r in rows]
        finally:
            llama.metric_factors = metric_factors  # type: ignore[attr-defined]

    whole = logits(None)
    out: dict[str, Any] = {"tokens": sum(len(r) for _, r in rows)}
    for rank in ranks:
        cut = logits(rank)
        moved = max(float((a - b).abs().max()) for a, b in zip(whole, cut, strict=True))
        kl = sum(
            float((F.log_softmax(a, -1).exp() * (F.log_softmax(a, -1) - F.log_softmax(b, -1))).sum())
            for a, b in zip(whole, cut, strict=True)
        )
        agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(whole, cut, strict=True))
        out[str(rank)] = {"max_logit_change": moved, "kl_per_token": kl / out["tokens"], "argmax_agrees": agree / out["tokens"]}
    return out


def kernel_us(width: int, rows: int, calls: int = 200, rounds: int = 5) -> float:
    q, k, v = torch.randn(rows, 9, 1, width), torch.randn(rows, 3, 366, width), torch.randn(rows, 3, 366, width)
    for _ in range(20):
        attend(q, k, v, causal=True, enable_gqa=True)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            attend(q, k, v, causal=True, enable_gqa=True)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def carrying(rank: int | None) -> Any:
    """The bundled checkpoint, its trace layers carrying ``rank`` eigenpairs (None: all)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "checkpoint"
        shutil.copytree(DEFAULT_CHECKPOINT, copy)
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, "metric_rank": rank}))
        return load_llama_checkpoint(copy, DEFAULT_CACHE)


def decode_rates(state: IdentityState, rank: int, repeats: int, tokens: int = 32) -> dict[str, Any]:
    """Decode tokens/s at 1 and 8 rows: the checkpoint with every eigenpair ("whole"), with ``rank`` ("cut"), state off."""
    models = {"whole": carrying(None), "cut": carrying(rank)}
    models["dot"] = dot_twin(models["whole"], checkpoint_base(None, DEFAULT_CACHE))
    system = models["whole"].tokenizer.system_prompt(PERSONAS["sia"].system_prompt)
    prompts = [models["whole"].tokenizer.turn_prompt(m, system)[0] for m in MESSAGES]
    for model in models.values():
        model.tokenizer = endless(model.tokenizer)
    out: dict[str, Any] = {}
    for rows in (1, 8):
        calls: dict[str, Callable[[], Decode]] = {
            name: partial(sia_decode, m, prompts[:rows], [state] * rows, tokens) for name, m in models.items()
        }
        samples = timed_rounds(calls, repeats, tokens)
        rates = {name: statistics.median(r.decode_tokens / r.decode_s for r in runs) for name, runs in samples.items()}
        same = all(a == b for a, b in zip(samples["whole"][-1].tokens, samples["cut"][-1].tokens, strict=True))
        out[str(rows)] = {
            "tokens_per_s": rates,
            "cut_over_whole": rates["cut"] / rates["whole"],
            "whole_over_dot": rates["whole"] / rates["dot"],
            "cut_over_dot": rates["cut"] / rates["dot"],
            "same_tokens": same,
        }
        sys.stdout.write(f"decode, {rows} rows: {json.dumps(out[str(rows)])}\n")
        sys.stdout.flush()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=48)
    parser.add_argument("--ranks", type=int, nargs="+", default=[5, 13, 21, 29])
    parser.add_argument("--conversations", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-rank", type=int, default=13)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = carrying(None)  # the effect is measured against the whole metric
    c = model.config
    dialogue = load_dialogue()
    history = [t.user for conv in dialogue[: len(dialogue) // 2] for t in conv.turns][: args.turns]
    held = dialogue[len(dialogue) // 2 :][: args.conversations]
    context = tuple(model.tokenizer.system_prompt(PERSONAS["sia"].system_prompt))
    state, dynamics = IdentityState.fresh(c), Dynamics.from_config(c)
    params = SamplingParams(max_new_tokens=32, temperature=0.0)
    result: dict[str, Any] = {"turns": {}, "kernel_us": {}}
    for turn, message in enumerate(history, 1):
        state = run_turn(model, TurnRequest(state, message, dynamics, context), params).state
        if turn in CHECKPOINTS:
            row = spectrum(state, c, args.ranks)
            if turn in SCORED:
                row["effect"] = effect(model, context, state, args.ranks, held)
            result["turns"][str(turn)] = row
            sys.stdout.write(f"turn {turn}: {json.dumps(row)}\n")
            sys.stdout.flush()
    d, gated = c.head_dim, int(c.slot_gate)
    for rank in [*args.ranks, d]:
        width = (d + rank + 2 + gated + 7) // 8 * 8
        result["kernel_us"][str(rank)] = {"width": width, **{str(rows): kernel_us(width, rows) for rows in (1, 8)}}
        sys.stdout.write(f"rank {rank}: {json.dumps(result['kernel_us'][str(rank)])}\n")
    result["decode"] = decode_rates(state, args.decode_rank, args.repeats)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
