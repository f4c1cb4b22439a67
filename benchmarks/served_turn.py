"""The bundled model's turn served (sections 5 and 6 of ``benchmarks.backbone``): a turn through the runtime phase by
phase and streamed (the store's share of a turn), and the time to first token over HTTP against the same turn in
process."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from benchmarks.store import percentiles
from benchmarks.turn import PHASES, phased_turn
from server.core.config import Settings
from server.db import migrate
from server.launcher import free_port, serving
from server.runtime.services import Services
from server.store import Store
from sia.backbones.llama import LlamaModel
from sia.backbones.weights import bundled_gguf, file_sha256
from sia.model.generate import Sampling

PERSONA = "sia"
HTTP_MAX_TOKENS = 8


# --- 5. a turn through the runtime ------------------------------------------------------------------------------------


def streamed_turn(services: Services, user: str, message: str, sampling: Sampling) -> tuple[float, float, int]:
    """(time to first token, total time, reply tokens) of one real turn."""
    t0 = time.perf_counter()
    turn = services.turns.stream_turn(PERSONA, user, message, sampling)
    next(turn)
    first = time.perf_counter() - t0
    outcome = turn.finish()
    return first, time.perf_counter() - t0, outcome.completion_tokens


@contextmanager
def sqlite_services(model: LlamaModel, directory: Path) -> Iterator[Services]:
    """The services over a fresh, migrated SQLite file with the default personas."""
    settings = Settings(data_dir=directory, database_url=f"sqlite:///{directory / 'bench.db'}")
    migrate.upgrade(settings)
    store = Store(settings)
    try:
        services = Services.over(model, store)
        services.personas.ensure_defaults()
        yield services
    finally:
        store.close()


def run_turns(services: Services, args: argparse.Namespace) -> dict[str, Any]:
    for user in ("phased", "real"):  # create both identities first
        services.turns.turn(PERSONA, user, "Hello.", Sampling(max_tokens=4, seed=0))
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    share, model_s, real, ttft = [], [], [], []
    for i in range(1 + args.turns):
        message = f"Tell me something about day {i} of the voyage."
        # the persona's sentence limit off: every reply runs to exactly --tokens tokens, whatever it samples
        sampling = Sampling(max_tokens=args.tokens, seed=i, max_sentences=0)
        timed, n = phased_turn(services, "phased", message, sampling)
        first, total, m = streamed_turn(services, "real", message, sampling)
        if n != args.tokens or m != args.tokens:
            raise AssertionError(f"replies of {n} and {m} tokens, not {args.tokens}")
        if i == 0:
            continue  # warm-up
        for name in PHASES:
            phases[name].append(timed[name])
        phase_sum = sum(timed.values())
        share.append((timed["load"] + timed["persist"]) / phase_sum)
        model_s.append(timed["shock"] + timed["generation"] + timed["update"])
        real.append(total)
        ttft.append(first)
    return {
        "reply_tokens": args.tokens,
        "turns": args.turns,
        "phases": {name: percentiles(t) for name, t in phases.items()},
        "model": percentiles(model_s),
        "store": percentiles([a + b for a, b in zip(phases["load"], phases["persist"], strict=True)]),
        "real_turn": percentiles(real),
        "real_turn_ttft": percentiles(ttft),
        "store_share": statistics.median(share),
    }


# --- 6. time to first token over HTTP -------------------------------------------------------------------------------


def http_ttft(services: Services, hf_dir: Path, directory: Path, args: argparse.Namespace, message: str) -> dict[str, Any]:
    """Streamed chat requests (``message``, greedy) to a real server, each followed by the same turn through
    ``services`` in this process (the server is idle meanwhile), so the two times to first token are paired under the
    same machine load."""
    models = directory / "models"
    models.mkdir(parents=True)
    (models / file_sha256(bundled_gguf())).symlink_to(hf_dir, target_is_directory=True)  # no second conversion
    port = free_port()
    extra = {
        "SIA_DATA_DIR": str(directory),
        "SIA_PORT": str(port),
        "SIA_AUTO_MIGRATE": "true",
        "SIA_TORCH_THREADS": str(args.threads),
        "OMP_NUM_THREADS": str(args.threads),
    }
    body = {"user": "bench", "message": message, "stream": True, "max_tokens": HTTP_MAX_TOKENS, "temperature": 0.0}
    same = Sampling(max_tokens=HTTP_MAX_TOKENS, temperature=0.0)
    t0 = time.perf_counter()
    with serving(extra, directory / "serve.log", port=port) as base:
        ready_s = time.perf_counter() - t0
        firsts, totals, local = [], [], []
        with httpx.Client(base_url=base, timeout=120.0) as client:
            for i in range(1 + args.requests):
                start = time.perf_counter()
                first: float | None = None
                with client.stream("POST", f"/v1/personas/{PERSONA}/chat", json=body) as response:
                    response.raise_for_status()
                    event = ""
                    for line in response.iter_lines():
                        if line.startswith("event: "):
                            event = line.removeprefix("event: ")
                        elif line.startswith("data: ") and event == "token" and first is None:
                            first = time.perf_counter() - start
                        elif event == "error":
                            raise RuntimeError(f"the server sent an error event: {line}")
                if first is None:
                    raise AssertionError("the stream carried no token event")
                total = time.perf_counter() - start
                in_process = streamed_turn(services, "bench", message, same)[0]
                if i > 0:  # the first round is the warm-up (it also creates both identities)
                    firsts.append(first)
                    totals.append(total)
                    local.append(in_process)
    return {
        "ready_s": ready_s,
        "max_tokens": HTTP_MAX_TOKENS,
        "requests": args.requests,
        "ttft": percentiles(firsts),
        "ttft_min_ms": 1000 * min(firsts),
        "ttft_max_ms": 1000 * max(firsts),
        "request": percentiles(totals),
        "in_process_ttft": percentiles(local),
        "http_minus_in_process_ms": 1000 * statistics.median(a - b for a, b in zip(firsts, local, strict=True)),
        "torch_threads": args.threads,
    }
