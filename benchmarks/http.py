"""Benchmark the HTTP service under concurrent load: a real ``sia serve`` process and concurrent chat clients.

Run: ``python -m benchmarks.http [--quick] [--clients 16] [--duration 30] [--modes own shared] [--flood 5] [--out PATH]``.

For each backend (a fresh SQLite file; a fresh database ``sia_bench_<random>`` on the PostgreSQL server at
``--postgres``, default ``$SIA_TEST_POSTGRES_URL`` or the local server, migrated with ``sia db upgrade`` and
dropped afterwards; skipped with the reason recorded when unreachable) one ``sia serve`` subprocess is
started with the bundled model and the service's default settings (``max_concurrent_turns`` and
``torch_threads`` as recorded in the JSON; ``SIA_BUSY_TIMEOUT_S`` = ``--busy-timeout``, ``OMP_NUM_THREADS=1``),
and, once ``/readyz`` answers, one untimed warm-up turn is sent. Then, per mode:

* ``own``: ``--clients`` threads, each with its own ``httpx.Client`` (one keep-alive connection) and its own
  user id, send ``POST /v1/personas/sia/chat`` with ``max_tokens`` = ``--max-tokens`` back to back (the next
  request as soon as the reply arrives) until ``--duration`` seconds have passed; a request in flight at the
  deadline is completed and counted. The first turn of each client creates its identity.
* ``shared``: the same, but the clients share ``--clients // 4`` identities (4 clients per identity), so turns
  of one identity wait for each other's hold on it.

After the modes, ``--flood`` rounds, back to back: 60 clients at once ask for 200-token replies on 8 identities and
give up after 50 ms (the server abandons their turns), then one normal request (``--max-tokens``, an identity of
its own) is timed: how long a request takes right after a flood of abandoned ones. Reported: p50 and max of its
latency, and its errors (target: none). tests/e2e/test_abuse.py asserts what the flood must not change (the normal
request succeeds; most flood turns are abandoned, not computed); how long it takes is measured here.

Sampling is the persona's default (temperature 0.8, no seed), so replies end at ``<|end|>`` or at
``max_tokens``; the mean reply length is reported. Reported per backend and mode: turns/s (successful turns
over the time from the first request to the last reply), generated tokens/s, p50 / p95 / max client-side
latency of successful turns, and errors (any non-200 status or transport error, by kind; target: none).
The clients run in this process and share the machine's CPUs with the server. Results go to ``--out``
(JSON, with machine info and load average) and markdown tables to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.machine import machine_info
from benchmarks.store import LOCAL_POSTGRES, postgres_database
from server.core.config import Settings
from server.launcher import BIN, free_port, server_env, serving

DEFAULT_OUT = Path(__file__).parent / "results" / "http.json"
PERSONA = "sia"
CLIENTS_PER_IDENTITY = 4
FLOOD_REQUESTS, FLOOD_IDENTITIES, FLOOD_MAX_TOKENS, FLOOD_GIVE_UP_S = 60, 8, 200, 0.05
WARM_UP_TIMEOUT_S = 600.0  # on a loaded machine the first turn of a fresh server has taken over 2 minutes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5 s per run, own identities only: a sanity run")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per backend and mode")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--modes", nargs="+", choices=["own", "shared"], default=["own", "shared"])
    p.add_argument("--flood", type=int, default=5, metavar="ROUNDS", help="rounds of the flood measurement (0: none)")
    p.add_argument("--backends", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"])
    busy_default = Settings.model_fields["busy_timeout_s"].default
    p.add_argument("--busy-timeout", type=float, default=busy_default, help="SIA_BUSY_TIMEOUT_S of the server")
    p.add_argument("--postgres", default=os.environ.get("SIA_TEST_POSTGRES_URL", LOCAL_POSTGRES))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.modes, args.flood = 5.0, ["own"], 1
    return args


@dataclass
class ClientLog:
    latencies: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    last_reply: float = 0.0


def chat(client: httpx.Client, user: str, n: int, max_tokens: int) -> dict[str, Any]:
    body = {"user": user, "message": f"Tell me about day {n} of the voyage.", "max_tokens": max_tokens}
    response = client.post(f"/v1/personas/{PERSONA}/chat", json=body)
    if response.status_code != 200:
        raise httpx.HTTPStatusError(f"HTTP {response.status_code}", request=response.request, response=response)
    out: dict[str, Any] = response.json()
    return out


def client_loop(url: str, user: str, deadline: float, max_tokens: int, log: ClientLog) -> None:
    with httpx.Client(base_url=url, timeout=120.0) as client:
        n = 0
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                reply = chat(client, user, n, max_tokens)
            except httpx.HTTPStatusError as exc:
                log.errors[f"HTTP {exc.response.status_code}"] += 1
            except httpx.HTTPError as exc:
                log.errors[type(exc).__name__] += 1
            else:
                log.latencies.append(time.perf_counter() - t0)
                log.tokens.append(int(reply["usage"]["completion_tokens"]))
            log.last_reply = time.perf_counter()
            n += 1


def load(url: str, mode: str, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    logs = [ClientLog() for _ in range(args.clients)]
    n_ids = args.clients if mode == "own" else max(1, args.clients // CLIENTS_PER_IDENTITY)
    users = [f"{mode}-{c % n_ids}" for c in range(args.clients)]
    start = time.perf_counter()
    deadline = start + args.duration
    threads = [
        threading.Thread(target=client_loop, args=(url, users[c], deadline, args.max_tokens, logs[c]), daemon=True)
        for c in range(args.clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    window = max(log.last_reply for log in logs) - start
    latencies = sorted(x * 1000 for log in logs for x in log.latencies)
    tokens = [n for log in logs for n in log.tokens]
    errors: Counter[str] = Counter()
    for log in logs:
        errors.update(log.errors)
    ok = len(latencies)
    return {
        "backend": backend,
        "mode": mode,
        "clients": args.clients,
        "identities": n_ids,
        "window_s": window,
        "turns": ok,
        "turns_per_s": ok / window,
        "tokens_per_s": sum(tokens) / window,
        "mean_reply_tokens": statistics.fmean(tokens) if tokens else 0.0,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "p95_ms": latencies[min(ok - 1, round(0.95 * (ok - 1)))] if latencies else None,
        "max_ms": latencies[-1] if latencies else None,
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors),
        "per_client_turns": [len(log.latencies) for log in logs],
    }


def flood(url: str, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """``args.flood`` rounds: FLOOD_REQUESTS impatient clients at once, then one normal request, timed."""

    def impatient(i: int) -> None:
        body = {
            "user": f"flood-{i % FLOOD_IDENTITIES}",
            "message": "Tell me a very long story.",
            "max_tokens": FLOOD_MAX_TOKENS,
            "temperature": 1.0,
        }
        with contextlib.suppress(httpx.HTTPError):  # the client gives up, as intended
            httpx.post(f"{url}/v1/personas/{PERSONA}/chat", json=body, timeout=FLOOD_GIVE_UP_S)

    latencies: list[float] = []
    errors: Counter[str] = Counter()
    with httpx.Client(base_url=url, timeout=120.0) as client:
        for n in range(args.flood):
            threads = [threading.Thread(target=impatient, args=(i,), daemon=True) for i in range(FLOOD_REQUESTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            t0 = time.perf_counter()
            try:
                chat(client, "after-flood", n, args.max_tokens)
            except httpx.HTTPStatusError as exc:
                errors[f"HTTP {exc.response.status_code}"] += 1
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] += 1
            else:
                latencies.append((time.perf_counter() - t0) * 1000)
    return {
        "backend": backend,
        "rounds": args.flood,
        "flood_requests": FLOOD_REQUESTS,
        "flood_identities": FLOOD_IDENTITIES,
        "flood_max_tokens": FLOOD_MAX_TOKENS,
        "give_up_s": FLOOD_GIVE_UP_S,
        "latencies_ms": latencies,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "max_ms": max(latencies) if latencies else None,
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors),
    }


def run_backend(
    backend: str, url: str | None, tmp: Path, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The load rows of each mode, and the flood measurement (none when ``--flood 0``)."""
    data_dir = tmp / backend
    data_dir.mkdir()
    port = free_port()
    extra = {"SIA_DATA_DIR": str(data_dir), "SIA_PORT": str(port), "SIA_BUSY_TIMEOUT_S": str(args.busy_timeout)}
    if url is not None:
        extra["SIA_DATABASE_URL"] = url
        upgrade = subprocess.run(
            [str(BIN / "sia"), "db", "upgrade"], env=server_env(extra), capture_output=True, text=True, check=False
        )
        if upgrade.returncode != 0:
            raise RuntimeError(f"sia db upgrade failed:\n{upgrade.stdout[-2000:]}{upgrade.stderr[-2000:]}")
    rows = []
    with serving(extra, tmp / f"{backend}.log", port=port) as base:
        with httpx.Client(base_url=base, timeout=WARM_UP_TIMEOUT_S) as client:  # the first turn pays one-time costs
            chat(client, "warm-up", 0, args.max_tokens)
        for mode in args.modes:
            row = load(base, mode, backend, args)
            sys.stdout.write(f"{backend} {mode}: {row['turns_per_s']:.1f} turns/s, {row['errors']} errors\n")
            rows.append(row)
        floods = [flood(base, backend, args)] if args.flood > 0 else []
        for f in floods:
            sys.stdout.write(f"{backend} flood: a request after it p50 {_ms(f['p50_ms'])}, {f['errors']} errors\n")
    return rows, floods


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | mode | clients / identities | turns/s | tokens/s | reply tokens | p50 | p95 | max | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['mode']} | {r['clients']} / {r['identities']} | {r['turns_per_s']:.1f} | "
            f"{r['tokens_per_s']:.0f} | {r['mean_reply_tokens']:.1f} | {_ms(r['p50_ms'])} | {_ms(r['p95_ms'])} | "
            f"{_ms(r['max_ms'])} | {r['errors']} |"
        )
    return "\n".join(lines) + "\n"


def flood_table(floods: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | rounds | flood: requests / identities, give up after | request after it: p50 | max | errors |",
        "|---|---|---|---|---|---|",
    ]
    for f in floods:
        lines.append(
            f"| {f['backend']} | {f['rounds']} | {f['flood_requests']} / {f['flood_identities']}, "
            f"{f['give_up_s'] * 1000:.0f} ms | {_ms(f['p50_ms'])} | {_ms(f['max_ms'])} | {f['errors']} |"
        )
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} ms"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    defaults = {name: f.default for name, f in Settings.model_fields.items()}  # the server gets no SIA_* variables but ours
    info = machine_info(defaults["torch_threads"])
    rows: list[dict[str, Any]] = []
    floods: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            database: AbstractContextManager[str | None]
            database = postgres_database(args.postgres) if backend == "postgresql" else _no_url()
            try:
                with database as url:
                    backend_rows, backend_floods = run_backend(backend, url, Path(tmp), args)
                rows += backend_rows
                floods += backend_floods
            except Exception as exc:  # an unreachable PostgreSQL server is reported, not fatal
                if backend == "sqlite":
                    raise
                skipped[backend] = f"{type(exc).__name__}: {exc}"
    info["loadavg_end"] = list(os.getloadavg())
    sys.stdout.write("\n" + table(rows))
    if floods:
        sys.stdout.write("\n" + flood_table(floods))
    for name, why in skipped.items():
        sys.stdout.write(f"\n{name} skipped: {why}\n")
    setup = {
        "persona": PERSONA,
        "max_tokens": args.max_tokens,
        "duration_s": args.duration,
        "clients": args.clients,
        "clients_per_shared_identity": CLIENTS_PER_IDENTITY,
        "server": {
            "max_concurrent_turns": defaults["max_concurrent_turns"],
            "torch_threads": defaults["torch_threads"],
            "busy_timeout_s": args.busy_timeout,
            "db_pool_size": defaults["db_pool_size"],
            "log_level": defaults["log_level"],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": info, "setup": setup, "rows": rows, "flood": floods, "skipped": skipped}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    sys.stdout.write(f"\nwrote {args.out}\n")


@contextmanager
def _no_url() -> Iterator[str | None]:
    yield None


if __name__ == "__main__":
    main()
