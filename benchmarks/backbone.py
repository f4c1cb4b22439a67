"""Benchmark the SmolLM2-135M backbone SIA serves: against its stateless twin and Hugging Face on the same weights.

Run: ``python -m benchmarks.backbone [--quick] [--threads 2] [--tokens 32] [--repeats 7] [--out PATH]``.

Three decoders share one set of weights, the bundled GGUF dequantised once into a temporary cache directory:

* ``sia``: the shipped SIA checkpoint (``load_model()``: SmolLM2 with its trained adapter, weights as shipped),
  conditioned on the state its own 5 greedy turns left (non-zero trace and self state), so the self slot adds to
  every layer's attention output as it does in service.
* ``dot``: the same code with ``attention="dot"``: plain grouped-query attention, no state, no self slot.
* ``hf``: ``transformers.LlamaForCausalLM.from_pretrained`` on the dequantised directory (SDPA attention),
  ``generate(do_sample=False, min_new_tokens=max_new_tokens)``.

Every decoder makes exactly ``--tokens`` tokens per row (checked): SIA's decoders (and the runtime's turns) decode
with ``benchmarks.fixed_length.endless`` (the end tokens banned, as the special tokens are), HF's
``min_new_tokens`` masks them. The 5 turns that make the state run with the tokenizer as shipped. Greedy decoding
throughout.

Measured, CPU, ``torch.set_num_threads(--threads)``, float32 and bfloat16 (``model.to(torch.bfloat16)``):

1. **Decode**: one ~40-token chat prompt (``system_prompt`` + ``turn_prompt``) at batch 1, and 8 different
   prompts left-padded into one batch. Time to first token (conditioning + prefill + first pick) and decode rate
   = generated tokens after the first ones / time from the first token event to the last (``sia.model.generate.stream``
   events; for HF, the calls of a ``BaseStreamer``). One untimed warm-up call each, then ``--repeats`` rounds in
   which the three run round-robin; medians. Targets: ``sia`` >= 0.9x ``dot``, ``sia`` >= 1.0x ``hf``.
2. **Prefill**: one forward pass over a 256-token prompt with a fresh KV cache (all 256 logits in all three:
   SIA needs them for the prompt's NLL), and SIA's time to first token through ``stream`` on that prompt
   (conditioning + prefill + the prompt NLL + the first pick).
3. **Load**: ``load_model`` in a fresh subprocess with an empty cache directory (includes the GGUF conversion)
   and again with the converted directory (cached); ``LlamaForCausalLM.from_pretrained`` of that directory for
   comparison. Reported: the load itself, the whole process (start-up = interpreter and imports, the load,
   generating ``--tokens`` tokens), resident memory (``VmRSS``) before loading, after it and after generating,
   and the peak (``VmHWM``). The files read may sit in the page cache (the GGUF was read before, the converted
   directory was just written), so these are warm-disk figures.
4. **State size**: ``len(state_to_bytes(state))`` fresh and after the 5 turns.
5. **Store share**: ``server.runtime.services.Services`` over a fresh SQLite file, persona ``sia`` (default temperature,
   a fixed seed per turn), replies of exactly ``--tokens`` tokens. Each iteration runs one turn phase by phase
   (``benchmarks.turn.phased_turn``: load = hold + parse, shock = conditioning + prefill + first token,
   generation, update, persist = serialise + commit) and one real ``TurnRunner.stream_turn`` (its time to first
   token and its total). Store share = (load + persist) / phase sum, median over iterations.
6. **HTTP**: ``sia serve`` as a real uvicorn subprocess (SQLite, auto-migrate, its model cache a symlink to the
   converted directory, ``SIA_TORCH_THREADS`` = ``--threads``), one untimed warm-up turn, then streamed
   ``POST /v1/personas/sia/chat`` requests (``max_tokens`` 8, greedy): time from sending to the first ``token``
   event, median. Each request is followed by the same turn through the in-process runtime of 5 (its time to
   first token), so the HTTP path's own cost is a paired difference under the same machine load.
7. **Where a decoding step goes** (per dtype, batch 1 and 8, a mid-reply step): the SDPA kernel timed alone at
   every width the models use (SIA: wider in its trace layers and by the self slot's bias column elsewhere),
   called with ``enable_gqa`` (as ``sia.model.attention.attend`` calls it in float32) and with each key/value head's
   query heads folded into the query length (as it calls it in a bfloat16 step on a CPU, and transformers for a padded
   batch), summed over the layers; and a
   ``torch.profiler`` count of ATen ops per step of ``sia`` and ``dot`` with their self time by kind.

Results go to ``--out`` (JSON, with machine info and load average) and markdown tables to stdout. Nothing here
is a test: a missed target is reported, not raised.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks.fixed_length import endless
from benchmarks.machine import machine_info
from benchmarks.served_turn import http_ttft, run_turns, sqlite_services
from benchmarks.step_causes import run_causes
from benchmarks.turn import PHASES
from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.backbones.llama import LlamaModel
from sia.backbones.weights import bundled_gguf, read_hf, resolve_base
from sia.checkpoint import BASE_FILE, BaseRef, load_model
from sia.identity.state import Dynamics, IdentityState, state_to_bytes
from sia.identity.turn import TurnRequest, run_turn
from sia.model.generate import SamplingParams, stream

DEFAULT_OUT = Path(__file__).parent / "results" / "backbone.json"
SYSTEM = "You are Sia, a warm and attentive companion."
MESSAGES = (  # row 0 is the batch-1 prompt; the rest make a left-padded batch of 8
    "Tell me about the sea, the ships on it and the people who sail them.",
    "What should I cook tonight?",
    "Explain how a bicycle stays upright when it moves.",
    "I had a long day at work and I feel tired.",
    "Can you recommend a book about the history of mathematics?",
    "Why is the sky blue?",
    "Write a short poem about autumn leaves falling in the park near my house.",
    "How do I keep my plants alive in winter?",
)
HISTORY = (  # the 5 turns that give the SIA decoder its state
    "Hi, I'm Ana and I love sailing.",
    "My cat is called Pepper.",
    "I live in Lisbon, near the river.",
    "What do you know about me?",
    "Tell me a short story.",
)
LONG_TEXT = (
    "Summarise this for me. The harbour wakes before the town does: nets are checked, engines coughed into life, "
    "and the gulls argue over whatever the night boats brought in. By seven the market is loud with prices and "
    "weather, and by nine the tourists arrive to photograph the boats they will never sail. "
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
VARIANTS = ("sia", "dot", "hf")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 tokens, 2 rounds, a 64-token prefill: a sanity run")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (and the server's SIA_TORCH_THREADS)")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per row in every decode and turn")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (each calls every decoder once)")
    p.add_argument("--prefill-tokens", type=int, default=256)
    p.add_argument("--turns", type=int, default=5, help="timed runtime turns (after one warm-up)")
    p.add_argument("--requests", type=int, default=5, help="timed HTTP requests (after one warm-up)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--probe", choices=["sia", "hf"], help=argparse.SUPPRESS)  # internal: one load in this process
    p.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats, args.prefill_tokens, args.turns, args.requests = 8, 2, 64, 2, 2
    return args


# --- helpers ------------------------------------------------------------------------------------------------


def memory_mib() -> dict[str, float]:
    """This process's resident memory now (VmRSS) and at its peak (VmHWM), MiB."""
    out: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def checkpoint_base(checkpoint: Path | None, cache: Path) -> Path:
    """The HF directory of a SIA checkpoint's base weights (default: the bundled GGUF's conversion, under ``cache``)."""
    if checkpoint is None:
        return resolve_base(bundled_gguf(), cache)
    return resolve_base(BaseRef.read(checkpoint / BASE_FILE).locate(checkpoint), cache)


def dot_twin(model: LlamaModel, hf_dir: Path) -> LlamaModel:
    """The same backbone weights with attention="dot": no state, no self slot."""
    _, tensors = read_hf(hf_dir)
    twin = LlamaModel(dataclasses.replace(model.config, attention="dot"), model.tokenizer)  # the same (endless) tokenizer
    twin.load_base(tensors)
    return twin.eval()


def load_hf(hf_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Any:
    """transformers' LlamaForCausalLM (typed Any: its annotations do not check under mypy strict). transformers is
    imported here, not at the top, so that the SIA load probe's process never imports it."""
    from transformers import LlamaForCausalLM, logging

    logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # no generation-config notices in the table
    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model: Any = LlamaForCausalLM.from_pretrained(hf_dir, dtype=dtype)
    return model.to(device).eval()


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(B, L) ids and attention mask, left-padded (what sia.model.generate.stream does inside)."""
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), L, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p) :] = torch.tensor(list(p))
        mask[b, L - len(p) :] = 1
    return ids, mask


def median_ms(samples: list[float]) -> float:
    return 1000 * statistics.median(samples)


# --- 1. decoding ----------------------------------------------------------------------------------------------


@dataclass
class Decode:
    """One decoding call: time to the first token, then the decode window after it."""

    ttft_s: float
    decode_s: float  # first token event to last token event
    decode_tokens: int  # tokens produced in that window (all rows)
    steps: int  # forward passes in that window
    tokens: list[list[int]]  # per row


def sia_decode(model: LlamaModel, prompts: list[list[int]], states: list[IdentityState], n: int) -> Decode:
    t0 = time.perf_counter()
    cond = model.condition_states(states)
    params = SamplingParams(max_new_tokens=n, temperature=0.0)
    decoding = stream(model, prompts, cond, params)
    times = [time.perf_counter() for _ in decoding]
    gens = decoding.result
    tokens = [g.tokens for g in gens]
    total = sum(len(t) for t in tokens)
    return Decode(times[0] - t0, times[-1] - times[0], total - len(prompts), max(map(len, tokens)) - 1, tokens)


def hf_decode(hf: Any, prompts: list[list[int]], pad_id: int, n: int) -> Decode:
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):  # generate() calls put() with the prompt, then with each step's tokens
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Tensor) -> None:
            if value.is_cuda:  # the step's token is there when the clock reads
                torch.cuda.synchronize(value.device)
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    ids, mask = (t.to(hf.device) for t in left_pad(prompts, pad_id))
    clock = Clock()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(
            ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad_id, streamer=clock
        )
    new = out[:, ids.shape[1] :]
    if new.shape[1] != n:
        raise AssertionError(f"transformers generated {new.shape[1]} tokens, not {n}")
    steps = len(clock.times) - 2  # the prompt's put, the first token's, then one per further step
    return Decode(clock.times[1] - t0, clock.times[-1] - clock.times[1], steps * len(prompts), steps, new.tolist())


def timed_rounds(calls: dict[str, Callable[[], Decode]], repeats: int, n: int) -> dict[str, list[Decode]]:
    """One untimed warm-up call of each decoder, then ``repeats`` rounds calling them round-robin; every row of every
    call must have generated exactly ``n`` tokens."""
    for call in calls.values():  # warm-up
        call()
    samples: dict[str, list[Decode]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            samples[name].append(call())
    for name, runs in samples.items():
        if any(len(t) != n for run in runs for t in run.tokens):
            raise AssertionError(f"{name}: a row did not generate exactly {n} tokens")
    return samples


def run_decode(calls: dict[str, Callable[[], Decode]], repeats: int, n: int, rows: int) -> dict[str, Any]:
    samples = timed_rounds(calls, repeats, n)
    out: dict[str, Any] = {}
    for name, runs in samples.items():
        rates = [r.decode_tokens / r.decode_s for r in runs]
        out[name] = {
            "decode_tokens_per_s": statistics.median(rates),
            "decode_ms_per_step": median_ms([r.decode_s / r.steps for r in runs]),
            "ttft_ms": median_ms([r.ttft_s for r in runs]),
            "decode_tokens_per_s_samples": rates,
            "ttft_s_samples": [r.ttft_s for r in runs],
        }
    last = {name: runs[-1].tokens for name, runs in samples.items()}
    out["rows_equal_dot_hf"] = sum(a == b for a, b in zip(last["dot"], last["hf"], strict=True))
    out["rows_equal_sia_dot"] = sum(a == b for a, b in zip(last["sia"], last["dot"], strict=True))
    out["rows"] = rows
    out["sia_over_dot"] = out["sia"]["decode_tokens_per_s"] / out["dot"]["decode_tokens_per_s"]
    out["sia_over_hf"] = out["sia"]["decode_tokens_per_s"] / out["hf"]["decode_tokens_per_s"]
    return out


# --- 2. prefill -----------------------------------------------------------------------------------------------


def sia_prefill(model: LlamaModel, idx: Tensor, states: list[IdentityState]) -> Callable[[], float]:
    with torch.inference_mode():
        cond = model.condition_states(states)

    def call() -> float:
        with torch.inference_mode():
            cache = model.new_cache(cond, idx.shape[1])
            t0 = time.perf_counter()
            model(idx, cond, cache=cache)
            return time.perf_counter() - t0

    return call


def hf_prefill(hf: Any, idx: Tensor) -> Callable[[], float]:
    def call() -> float:
        with torch.inference_mode():
            t0 = time.perf_counter()
            hf(input_ids=idx, use_cache=True)
            return time.perf_counter() - t0

    return call


def sia_stream_ttft(model: LlamaModel, prompt: list[int], states: list[IdentityState]) -> Callable[[], float]:
    def call() -> float:
        t0 = time.perf_counter()
        cond = model.condition_states(states)
        events = stream(model, [prompt], cond, SamplingParams(max_new_tokens=1, temperature=0.0))
        next(events)
        elapsed = time.perf_counter() - t0
        for _ in events:
            pass
        return elapsed

    return call


def run_prefill(calls: dict[str, Callable[[], float]], repeats: int, n: int) -> dict[str, Any]:
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(call())
    out: dict[str, Any] = {
        name: {"ms": median_ms(t), "tokens_per_s": n / statistics.median(t), "samples_s": t} for name, t in times.items()
    }
    out["sia_over_dot"] = out["sia"]["tokens_per_s"] / out["dot"]["tokens_per_s"]
    out["sia_over_hf"] = out["sia"]["tokens_per_s"] / out["hf"]["tokens_per_s"]
    return out


# --- 3. load time and memory, each in a fresh process --------------------------------------------------------------


def probe(args: argparse.Namespace) -> None:
    """Load once in this (fresh) process, generate, and write what it cost as one JSON line."""
    torch.set_num_threads(args.threads)
    if args.probe == "hf":
        import transformers  # noqa: F401  # imported before the clock starts, as sia already is
    before = memory_mib()
    t0 = time.perf_counter()
    if args.probe == "sia":
        model = load_model(cache_dir=args.cache)
        assert isinstance(model, LlamaModel)
        tok = model.tokenizer
        assert isinstance(tok, ChatTokenizer)
        model.tokenizer = endless(tok)

        def generate(prompt: list[int]) -> Decode:
            return sia_decode(model, [prompt], [IdentityState.fresh(model.config)], args.tokens)

    else:
        hf_dir = resolve_base(bundled_gguf(), args.cache)
        hf = load_hf(hf_dir)
        tok = ChatTokenizer.from_dir(hf_dir)

        def generate(prompt: list[int]) -> Decode:
            return hf_decode(hf, [prompt], tok.pad_id, args.tokens)

    load_s = time.perf_counter() - t0
    after_load = memory_mib()
    prompt, _ = tok.turn_prompt(MESSAGES[0], tok.system_prompt(SYSTEM))
    t1 = time.perf_counter()
    generate(prompt)
    generate_s = time.perf_counter() - t1
    after = memory_mib()
    result = {
        "load_s": load_s,
        "generate_s": generate_s,
        "rss_before_load_mib": before["VmRSS"],
        "rss_after_load_mib": after_load["VmRSS"],
        "rss_after_generate_mib": after["VmRSS"],
        "peak_rss_mib": after["VmHWM"],
    }
    sys.stdout.write(json.dumps(result) + "\n")


def run_probe(kind: str, cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.backbone", "--probe", kind, "--cache", str(cache)]
    argv += ["--threads", str(args.threads), "--tokens", str(args.tokens)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=Path(__file__).parent.parent)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} load probe failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "process_s": wall, "startup_s": wall - result["load_s"] - result["generate_s"]}


# --- report ------------------------------------------------------------------------------------------------------


def verdict(value: float, target: float) -> str:
    return f"met (+{value - target:.3f})" if value >= target else f"missed by {target - value:.3f}"


def table(result: dict[str, Any]) -> str:
    lines = [f"decode: {result['setup']['tokens']} new tokens per row, greedy; median of {result['setup']['repeats']}", ""]
    lines += [
        "| dtype | rows | SIA tok/s | dot tok/s | HF tok/s | SIA / dot | SIA / HF | TTFT SIA / dot / HF ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, d in result["decode"].items():
        dtype, rows = key.split("/")
        rates = " | ".join(f"{d[v]['decode_tokens_per_s']:.1f}" for v in VARIANTS)
        ttft = " / ".join(f"{d[v]['ttft_ms']:.0f}" for v in VARIANTS)
        lines.append(f"| {dtype} | {rows} | {rates} | {d['sia_over_dot']:.2f} | {d['sia_over_hf']:.2f} | {ttft} |")
    n = result["setup"]["prefill_tokens"]
    lines += [
        "",
        f"prefill: one {n}-token prompt, batch 1",
        "",
        "| dtype | SIA tok/s | dot tok/s | HF tok/s | SIA / dot | SIA / HF | SIA stream TTFT ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for dtype, d in result["prefill"].items():
        rates = " | ".join(f"{d[v]['tokens_per_s']:.0f}" for v in VARIANTS)
        lines.append(f"| {dtype} | {rates} | {d['sia_over_dot']:.2f} | {d['sia_over_hf']:.2f} | {d['sia_stream']['ms']:.0f} |")
    lines += [
        "",
        "| load (fresh process) | load s | process s (start-up) | RSS MiB before load / after / after generating | peak |",
        "|---|---|---|---|---|",
    ]
    for name, r in result["load"].items():
        lines.append(
            f"| {name} | {r['load_s']:.2f} | {r['process_s']:.2f} ({r['startup_s']:.2f}) | {r['rss_before_load_mib']:.0f} / "
            f"{r['rss_after_load_mib']:.0f} / {r['rss_after_generate_mib']:.0f} | {r['peak_rss_mib']:.0f} |"
        )
    s, t, h = result["state_bytes"], result["turn"], result["http"]
    lines += [
        "",
        f"stored identity: {s['fresh']} bytes fresh, {s['after_5_turns']} after 5 turns",
        "",
        f"turn ({t['reply_tokens']} tokens, SQLite, p50 ms): "
        + ", ".join(f"{name} {t['phases'][name]['p50_ms']:.1f}" for name in PHASES)
        + f"; model {t['model']['p50_ms']:.0f}, store {t['store']['p50_ms']:.1f} ({t['store_share']:.1%} of the turn); "
        f"real turn {t['real_turn']['p50_ms']:.0f}, its TTFT {t['real_turn_ttft']['p50_ms']:.0f}",
        "",
        f"HTTP: ready after {h['ready_s']:.1f} s; time to first token p50 {h['ttft']['p50_ms']:.0f} ms "
        f"({h['ttft_min_ms']:.0f}–{h['ttft_max_ms']:.0f}) over {h['requests']} streamed requests; the same turn in "
        f"process {h['in_process_ttft']['p50_ms']:.0f} ms; HTTP - in process (paired median) "
        f"{h['http_minus_in_process_ms']:.0f} ms",
        "",
    ]
    lines += [
        "where a decoding step goes (mid-reply, batch 1 and 8): the attention kernel over all layers with enable_gqa (sia's "
        "float32 form) and folded (its bfloat16 form on a CPU); ATen ops per step and their self time under the profiler "
        "(matmul / kernel / other)",
        "",
        "| dtype | rows | kernel ms SIA / dot | folded ms SIA / dot | ops SIA / dot | SIA ms | dot ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for dtype, c in result["causes"].items():
        for rows, k in c["kernel"].items():
            ps, prof = k["per_step"], c["profile"][rows]

            def split(name: str, prof: dict[str, Any] = prof) -> str:
                return " / ".join(f"{v:.1f}" for v in prof[name]["self_ms_per_step"].values())

            lines.append(
                f"| {dtype} | {rows} | {ps['sia_gqa_ms']:.2f} / {ps['dot_gqa_ms']:.2f} | {ps['sia_folded_ms']:.2f} / "
                f"{ps['dot_folded_ms']:.2f} | {prof['sia']['ops_per_step']:.0f} / {prof['dot']['ops_per_step']:.0f} | "
                f"{split('sia')} | {split('dot')} |"
            )
    lines.append("")
    for key, d in result["decode"].items():
        lines.append(
            f"{key}: SIA / dot {d['sia_over_dot']:.3f} (target >= 0.9: {verdict(d['sia_over_dot'], 0.9)}); "
            f"SIA / HF {d['sia_over_hf']:.3f} (target >= 1.0: {verdict(d['sia_over_hf'], 1.0)})"
        )
    return "\n".join(lines) + "\n"


# --- main ----------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.probe is not None:
        probe(args)
        return
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    result: dict[str, Any] = {"machine": info}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cache = tmp / "models"
        sys.stdout.write("loading in fresh processes...\n")
        result["load"] = {
            "SIA, cold (GGUF conversion)": run_probe("sia", cache, args),
            "SIA, cached": run_probe("sia", cache, args),
            "transformers from_pretrained": run_probe("hf", cache, args),
        }
        hf_dir = resolve_base(bundled_gguf(), cache)
        model = load_model(cache_dir=cache)
        assert isinstance(model, LlamaModel)
        tok = model.tokenizer
        assert isinstance(tok, ChatTokenizer)
        hf = load_hf(hf_dir)

        sys.stdout.write("five turns for a state...\n")
        system = tok.system_prompt(SYSTEM)
        state = IdentityState.fresh(model.config)
        fresh_bytes = len(state_to_bytes(state))
        for message in HISTORY:
            request = TurnRequest(state, message, Dynamics.from_config(model.config), tuple(system))
            state = run_turn(model, request, SamplingParams(max_new_tokens=16, temperature=0.0)).state
        result["state_bytes"] = {"fresh": fresh_bytes, "after_5_turns": len(state_to_bytes(state))}
        result["state"] = {
            "trace_norm": float(state.trace.float().norm()),
            "self_state_norm": float(state.self_state.norm()),
        }
        model.tokenizer = endless(tok)  # from here on every reply has exactly --tokens tokens
        twin = dot_twin(model, hf_dir)

        with sqlite_services(model, tmp / "store") as services:  # float32, as the service runs
            sys.stdout.write("turns through the runtime...\n")
            result["turn"] = run_turns(services, args)
            sys.stdout.write("time to first token over HTTP...\n")
            result["http"] = http_ttft(services, hf_dir, tmp / "http", args, MESSAGES[0])

        prompts = [tok.turn_prompt(m, system)[0] for m in MESSAGES]
        long_prompt = tok.turn_prompt(LONG_TEXT * 8, system)[0][: args.prefill_tokens]
        if len(long_prompt) != args.prefill_tokens:
            raise AssertionError(f"the long prompt has {len(long_prompt)} tokens, not {args.prefill_tokens}")
        idx = torch.tensor([long_prompt])
        result["decode"], result["prefill"], result["causes"] = {}, {}, {}
        for dtype_name, dtype in DTYPES.items():
            for m in (model, twin, hf):
                m.to(dtype)
            for rows in (1, 8):
                sys.stdout.write(f"decoding, {dtype_name}, {rows} rows...\n")
                batch, states = prompts[:rows], [state] * rows
                calls: dict[str, Callable[[], Decode]] = {
                    "sia": partial(sia_decode, model, batch, states, args.tokens),
                    "dot": partial(sia_decode, twin, batch, states, args.tokens),
                    "hf": partial(hf_decode, hf, batch, tok.pad_id, args.tokens),
                }
                result["decode"][f"{dtype_name}/{rows}"] = run_decode(calls, args.repeats, args.tokens, rows)
            sys.stdout.write(f"prefill, {dtype_name}...\n")
            prefill_calls = {
                "sia": sia_prefill(model, idx, [state]),
                "dot": sia_prefill(twin, idx, [state]),
                "hf": hf_prefill(hf, idx),
                "sia_stream": sia_stream_ttft(model, long_prompt, [state]),
            }
            result["prefill"][dtype_name] = run_prefill(prefill_calls, args.repeats, args.prefill_tokens)
            sys.stdout.write(f"attention kernel and step profile, {dtype_name}...\n")
            result["causes"][dtype_name] = run_causes(model, twin, prompts[0], state, args.tokens)
    info["loadavg_end"] = list(os.getloadavg())
    result["setup"] = {
        "tokens": args.tokens,
        "repeats": args.repeats,
        "prefill_tokens": args.prefill_tokens,
        "prompt_tokens": [len(p) for p in prompts],
        "system_prompt": SYSTEM,
        "end_tokens": "banned (benchmarks.fixed_length.endless); transformers: min_new_tokens",
        "torch_interop_threads": torch.get_num_interop_threads(),
    }
    result["summary"] = {
        key: {
            "sia_over_dot": d["sia_over_dot"],
            "sia_over_dot_met": d["sia_over_dot"] >= 0.9,
            "sia_over_hf": d["sia_over_hf"],
            "sia_over_hf_met": d["sia_over_hf"] >= 1.0,
        }
        for key, d in result["decode"].items()
    }
    sys.stdout.write("\n" + table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(f"\nwrote {args.out}\n")


if __name__ == "__main__":
    main()
