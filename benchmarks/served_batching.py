"""Benchmark continuous batching through HTTP: concurrent users streaming turns from a real ``sia serve``.

Run: ``python -m benchmarks.served_batching [--users 1 2 4 8 16] [--turns 3] [--max-tokens 32] [--dtype bfloat16]
[--servers unbatched batched batched-unpacked batched-1thread unbatched-bf16 batched-bf16] [--device cuda]
[--max-batch 64] [--checkpoint DIR] [--out PATH]``.

Two servers are started one after the other, each with the bundled model on a fresh SQLite file and the
service's default settings except:

* **unbatched**: ``SIA_MAX_BATCH=0``: each turn computes on its own, ``SIA_MAX_CONCURRENT_TURNS`` (default 4)
  at once in worker threads: the service as it was before batching;
* **batched**: the default ``SIA_MAX_BATCH`` (16): every turn joins one batch and all rows decode in one forward
  per step;
* **batched-unpacked** (only with ``--servers``): the batched server with ``SIA_PACKED_WEIGHTS=off``, its
  matrices multiplied unpacked, as before packing;
* **batched-1thread** (only with ``--servers``): the batched server with ``SIA_BATCH_THREADS=1``: its steps
  and a lone turn's prefill on one torch thread (the default uses every core while no prefill runs beside them);
* **unbatched-bf16**, **batched-bf16** (only with ``--servers``): the two servers with
  ``SIA_PACKED_WEIGHTS=bfloat16``, every projection multiplied with a packed bfloat16 copy of its matrix;
* **batched-float32** (only with ``--servers``): the batched server with ``SIA_PACKED_WEIGHTS=float32``, the default
  before ``auto`` (which picks bfloat16 copies on a CPU that multiplies bfloat16 natively).

``--torch-threads``, ``--dtype``, ``--device`` and ``--checkpoint`` (default: the service's defaults: the CPU, the
bundled checkpoint) are given to both, ``--max-batch`` (default: the service's 16) to the batched ones. After one
untimed warm-up turn, for each N in ``--users``: N client threads, each with its own user id (an identity of its own)
and its own connection, send ``--turns`` streamed turns back to back (``POST /v1/personas/sia/chat``, ``stream:
true``, greedy, ``max_tokens`` = ``--max-tokens``), all starting at once. Measured per N: aggregate generated tokens
per second (every token of every reply, over the time from the first request to the last ``done``), p50 / p95 time to
first token (request sent to the first ``token`` event, over all turns), errors (any non-200 status, an ``error``
event or a transport error; target: none), and the server's peak resident memory (``VmRSS`` of the process, sampled
every 20 ms). Then 8 users sharing 2 identities (4 per identity: turns of one identity are serial). The ratio batched
/ unbatched of the aggregate tokens/s and of the p95 time to first token against the same server's N = 1 (solo)
figure is reported per row.

Then, in this process with the servers stopped, the reference the served figures answer to: transformers'
``generate`` of the same users' turns on the same weights (the checkpoint's base, float32 on every core of the CPU,
bfloat16 on a GPU unless ``--dtype float32``),
each turn one left-padded batch of the N users' chat prompts (the persona's system prompt and that turn's message
through the checkpoint's chat template; the served turns may also carry a recent window, so these prompts are if
anything shorter), greedy, exactly ``--max-tokens`` new tokens a row; its tokens/s over the sum of the turns'
generate times, and each batched row's aggregate tokens/s over it (``over_hf``; target: >= 1.0x at 8 users).
``--no-hf`` skips it. Results go to ``--out`` (JSON, with machine info) and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from benchmarks.backbone import checkpoint_base, hf_decode, load_hf
from benchmarks.machine import machine_info
from server.core.config import Settings
from server.launcher import free_port, server_process
from server.runtime.services import serving_device, serving_dtype
from sia.backbones.chat_tokenizer import ChatTokenizer
from sia.checkpoint import load_model
from sia.model.config import STATE_DTYPES
from sia.personas import PERSONAS

DEFAULT_OUT = Path(__file__).parent / "results" / "served_batching.json"
PERSONA = "sia"
MESSAGES = [
    "Tell me about the sea.",
    "What is a good book to read on a train?",
    "How do bees make honey?",
    "Describe a quiet morning in a small town.",
    "What should I cook tonight?",
    "Why is the sky blue?",
    "Give me advice for a long walk.",
    "What do you like about music?",
]
SERVERS = {
    "unbatched": {"SIA_MAX_BATCH": "0"},
    "batched": {},
    "batched-unpacked": {"SIA_PACKED_WEIGHTS": "off"},  # the batched server without the packed matrices
    "batched-1thread": {"SIA_BATCH_THREADS": "1"},  # the batched server decoding on one thread, as before
    "unbatched-bf16": {"SIA_MAX_BATCH": "0", "SIA_PACKED_WEIGHTS": "bfloat16"},  # the two with bfloat16 copies of
    "batched-bf16": {"SIA_PACKED_WEIGHTS": "bfloat16"},  # the matrices: every projection's product in bfloat16
    "batched-float32": {"SIA_PACKED_WEIGHTS": "float32"},  # float32 copies, whatever SIA_PACKED_WEIGHTS=auto picks
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = Settings.model_fields
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--turns", type=int, default=3, help="turns per user, back to back")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--shared", type=int, nargs=2, default=[8, 2], metavar=("USERS", "IDENTITIES"))
    p.add_argument("--torch-threads", type=int, default=defaults["torch_threads"].default)
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default=defaults["dtype"].default)
    p.add_argument("--servers", nargs="+", choices=sorted(SERVERS), default=["unbatched", "batched"])
    p.add_argument("--device", default=defaults["device"].default, help="SIA_DEVICE of the servers and the reference's")
    p.add_argument("--max-batch", type=int, default=defaults["max_batch"].default, help="SIA_MAX_BATCH of batched servers")
    p.add_argument("--checkpoint", type=Path, default=None, help="SIA_CHECKPOINT (default: the bundled one)")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' batched generate of the same turns")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


@dataclass
class UserLog:
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    turns: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    last: float = 0.0


def streamed_turn(client: httpx.Client, user: str, message: str, max_tokens: int, log: UserLog) -> None:
    body = {"user": user, "message": message, "stream": True, "temperature": 0, "max_tokens": max_tokens}
    sent = time.perf_counter()
    first = None
    try:
        with client.stream("POST", f"/v1/personas/{PERSONA}/chat", json=body) as r:
            if r.status_code != 200:
                r.read()
                log.errors[f"HTTP {r.status_code}"] += 1
                return
            event = ""
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                    if event == "token" and first is None:
                        first = time.perf_counter() - sent
                    if event == "error":
                        log.errors["error event"] += 1
                elif line.startswith("data: ") and event == "done":
                    log.tokens += int(json.loads(line.removeprefix("data: "))["usage"]["completion_tokens"])
                    log.turns += 1
    except httpx.HTTPError as exc:
        log.errors[type(exc).__name__] += 1
    finally:
        log.last = time.perf_counter()
    if first is not None:
        log.ttft.append(first)


class PeakRSS:
    """The peak resident memory of a process, sampled on a thread while in use."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.02)

    def __enter__(self) -> PeakRSS:
        self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def load(url: str, pid: int, server: str, users: int, identities: int, args: argparse.Namespace) -> dict[str, Any]:
    logs = [UserLog() for _ in range(users)]
    names = [f"{server}-{users}x{identities}-{u % identities}" for u in range(users)]

    def run(u: int) -> None:
        with httpx.Client(base_url=url, timeout=600.0) as client:
            for t in range(args.turns):
                streamed_turn(client, names[u], MESSAGES[(u + t) % len(MESSAGES)], args.max_tokens, logs[u])

    threads = [threading.Thread(target=run, args=(u,), daemon=True) for u in range(users)]
    with PeakRSS(pid) as rss:
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    window = max(log.last for log in logs) - start
    ttft = sorted(x * 1000 for log in logs for x in log.ttft)
    errors: Counter[str] = Counter()
    for log in logs:
        errors.update(log.errors)
    tokens = sum(log.tokens for log in logs)
    return {
        "server": server,
        "users": users,
        "identities": identities,
        "turns": sum(log.turns for log in logs),
        "window_s": window,
        "tokens": tokens,
        "tokens_per_s": tokens / window,
        "ttft_p50_ms": statistics.median(ttft) if ttft else None,
        "ttft_p95_ms": ttft[min(len(ttft) - 1, round(0.95 * (len(ttft) - 1)))] if ttft else None,
        "peak_rss_mb": rss.peak / 2**20,
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors),
    }


def run_server(server: str, tmp: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    data_dir = tmp / server
    data_dir.mkdir()
    port = free_port()
    env = {
        "SIA_DATA_DIR": str(data_dir),
        "SIA_PORT": str(port),
        "SIA_TORCH_THREADS": str(args.torch_threads),
        "SIA_DTYPE": args.dtype,
        "SIA_LOG_LEVEL": "WARNING",
        "SIA_DEVICE": args.device,
        "SIA_MAX_BATCH": str(args.max_batch),
        **({"SIA_CHECKPOINT": str(args.checkpoint.resolve())} if args.checkpoint else {}),
        **SERVERS[server],
    }
    rows = []
    with server_process(env, tmp / f"{server}.log", port=port) as proc:
        with httpx.Client(base_url=proc.url, timeout=600.0) as client:
            streamed_turn(client, "warm-up", MESSAGES[0], args.max_tokens, UserLog())
        shapes = [(n, n) for n in args.users] + [tuple(args.shared)]
        for users, identities in shapes:
            row = load(proc.url, proc.process.pid, server, users, identities, args)
            sys.stdout.write(
                f"{server} {users} users / {identities} identities: {row['tokens_per_s']:.1f} tokens/s, "
                f"TTFT p95 {row['ttft_p95_ms']:.0f} ms, {row['errors']} errors\n"
            )
            rows.append(row)
    return rows


def reference_dtype(args: argparse.Namespace) -> torch.dtype:
    """The reference's weights in the dtype the servers decode in (``SIA_DTYPE`` on ``SIA_DEVICE``)."""
    return STATE_DTYPES[serving_dtype(args.dtype, serving_device(args.device))]


def hf_reference(users: Sequence[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    """transformers' ``generate`` of N users' turns, for each N in ``users``: per turn one batch of the N chat prompts
    (each user's message of that turn, as ``load`` sends them), ``--max-tokens`` new tokens a row; tokens/s over the
    sum of the turns' times (prompt to last token)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "models"
        hf_dir = checkpoint_base(args.checkpoint, cache)
        tok = load_model(args.checkpoint, cache_dir=cache).tokenizer
        assert isinstance(tok, ChatTokenizer)
        system = tok.system_prompt(PERSONAS[PERSONA].system_prompt)
        hf = load_hf(hf_dir, str(serving_device(args.device)), reference_dtype(args))
        hf_decode(hf, [tok.turn_prompt(MESSAGES[0], system)[0]], tok.pad_id, args.max_tokens)  # warm-up
        for n in users:
            seconds, tokens = 0.0, 0
            for t in range(args.turns):
                prompts = [tok.turn_prompt(MESSAGES[(u + t) % len(MESSAGES)], system)[0] for u in range(n)]
                run = hf_decode(hf, prompts, tok.pad_id, args.max_tokens)
                seconds += run.ttft_s + run.decode_s
                tokens += sum(len(row) for row in run.tokens)
            out.append(
                {"users": n, "turns": n * args.turns, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
            )
            sys.stdout.write(f"transformers generate, {n} users: {tokens / seconds:.1f} tokens/s\n")
    return out


def compare(rows: list[dict[str, Any]], hf: list[dict[str, Any]]) -> None:
    """Per row: batched / unbatched aggregate tokens/s, the p95 TTFT against the same server's solo p50, and the
    aggregate tokens/s over transformers' batched generate of as many users' turns (where measured)."""
    by = {(r["server"], r["users"], r["identities"]): r for r in rows}
    reference = {h["users"]: h for h in hf}
    for r in rows:
        solo = by.get((r["server"], 1, 1))
        r["ttft_p95_vs_solo"] = r["ttft_p95_ms"] / solo["ttft_p50_ms"] if solo and r["ttft_p95_ms"] else None
        base = by.get(("unbatched", r["users"], r["identities"]))
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"] if base else None
        h = reference.get(r["users"]) if r["users"] == r["identities"] else None
        r["over_hf"] = r["tokens_per_s"] / h["tokens_per_s"] if h else None


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| users / identities | server | tokens/s | × unbatched | × HF generate | TTFT p50 | TTFT p95 | p95 / solo p50 "
        "| peak RSS | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(x: float | None) -> str:
        return "–" if x is None else f"{x:.2f}×"

    for r in sorted(rows, key=lambda r: (r["users"] != r["identities"], r["users"], r["server"] != "unbatched")):
        lines.append(
            f"| {r['users']} / {r['identities']} | {r['server']} | {r['tokens_per_s']:.1f} | {ratio(r['speedup'])} | "
            f"{ratio(r['over_hf'])} | "
            f"{r['ttft_p50_ms']:.0f} ms | {r['ttft_p95_ms']:.0f} ms | {ratio(r['ttft_p95_vs_solo'])} | "
            f"{r['peak_rss_mb']:.0f} MB | {r['errors']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    info = machine_info(args.torch_threads)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for server in args.servers:
            rows += run_server(server, Path(tmp), args)
    hf = [] if args.no_hf else hf_reference(args.users, args)
    compare(rows, hf)
    info["loadavg_end"] = list(os.getloadavg())
    batched = {r["users"]: r for r in rows if r["server"] == "batched" and r["users"] == r["identities"]}
    per_row = None
    if len(batched) >= 2:
        lo, hi = min(batched), max(batched)
        per_row = (batched[hi]["peak_rss_mb"] - batched[lo]["peak_rss_mb"]) / (hi - lo)
    sys.stdout.write("\n" + table(rows))
    if per_row is not None:
        sys.stdout.write(f"\nresident memory per extra batched row: {per_row:.1f} MB\n")
    setup = {
        "persona": PERSONA,
        "turns_per_user": args.turns,
        "max_tokens": args.max_tokens,
        "decoding": "greedy",
        "torch_threads": args.torch_threads,
        "dtype": args.dtype,
        "device": args.device,
        "max_batch": args.max_batch,
        "checkpoint": str(args.checkpoint) if args.checkpoint else "bundled",
        "reference_dtype": str(reference_dtype(args)).removeprefix("torch."),
        "servers": {name: SERVERS[name] for name in args.servers},
        "defaults": {k: Settings.model_fields[k].default for k in ("max_batch", "max_concurrent_turns", "batch_wait_ms")},
    }
    payload = {"machine": info, "setup": setup, "rows": rows, "hf_generate": hf, "rss_mb_per_extra_row": per_row}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    sys.stdout.write(f"\nwrote {args.out}\n")


if __name__ == "__main__":
    main()
