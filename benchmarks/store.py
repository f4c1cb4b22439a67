"""Benchmark the identity store: load, update and persist of the default state, and their share of a turn.

Run: ``python -m benchmarks.store [--repeats 200] [--postgres URL] [--out PATH]``.

For each backend (a fresh SQLite file; a fresh database on the PostgreSQL server at ``--postgres``, default
``$SIA_TEST_POSTGRES_URL`` or the local server, skipped with the reason recorded when unreachable), with the
bundled model's state size:

* ``load``: take the identity's hold (one short transaction) and parse + validate its safetensors blob.
* ``update``: the state update rules of one turn (``sia.identity.state.advance``: trace, self state, shock
  statistics) for a realistic turn summary.
* ``persist``: serialise the new state and commit it with its turn record and history row (one transaction).
* ``turn``: a whole ``TurnRunner.turn`` with the bundled model (64 new tokens, sampled), which includes all of
  the above plus shock measurement and generation.

Reported: p50 / p95 in milliseconds of ``repeats`` timed iterations after 10 warm-up ones, and the store's
overhead (load + persist) and all state work (load + update + persist) as a share of the p50 turn.
Targets: load + update + persist <= 10 ms p50 and <= 5 % of a turn. Results go to ``--out`` (JSON) and a
markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from benchmarks.machine import machine_info
from server.core.config import Settings
from server.db import migrate
from server.records import NewTurn
from server.runtime.codec import encode
from server.runtime.services import Services
from server.store import Store
from sia.checkpoint import NATIVE_CHECKPOINT, load_checkpoint
from sia.identity.state import Dynamics, TurnSummary, advance, state_from_bytes, state_to_bytes
from sia.model.generate import Sampling

DEFAULT_OUT = Path(__file__).parent / "results" / "store.json"
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=200, help="timed iterations per phase")
    p.add_argument("--turns", type=int, default=30, help="timed whole turns per backend")
    p.add_argument("--postgres", default=os.environ.get("SIA_TEST_POSTGRES_URL", LOCAL_POSTGRES))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def percentiles(samples: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in samples)
    return {
        "p50_ms": statistics.median(ms),
        "p95_ms": ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))],
        "mean_ms": statistics.fmean(ms),
    }


@contextmanager
def sqlite_database(directory: Path) -> Iterator[str]:
    yield f"sqlite:///{directory / 'bench.db'}"


@contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards."""
    admin = create_engine(make_url(admin_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    name = f"sia_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run_backend(name: str, url: str, data_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(data_dir=data_dir, database_url=url, history_retention=100)
    migrate.upgrade(settings)
    store = Store(settings)
    try:
        services = Services.over(load_checkpoint(NATIVE_CHECKPOINT), store)
        services.personas.ensure_defaults()
        config = services.identities.config
        dynamics = Dynamics.from_config(config)
        g = torch.Generator().manual_seed(0)

        def unit(*shape: int) -> torch.Tensor:
            x = torch.randn(*shape, generator=g)
            unit_rows: torch.Tensor = x / x.norm(dim=-1, keepdim=True)
            return unit_rows

        summary = TurnSummary(
            queries=unit(config.n_layer, config.n_head, config.qk_dim),
            keys=unit(config.n_layer, config.n_head, config.qk_dim),
            hidden=torch.randn(config.n_embd, generator=g),
        )
        services.turns.turn("sia", "bench", "Hello there, I am the benchmark.", Sampling(max_tokens=8, seed=0))
        blob_bytes = len(services.identities.export_state("sia", "bench")[1])
        record = NewTurn(
            reply="reply",
            finish_reason="stop",
            shock=0.1,
            nll=2.0,
            prompt_tokens=40,
            completion_tokens=64,
            message="message",
            latency_ms=100.0,
        )
        phases: dict[str, list[float]] = {"load": [], "update": [], "persist": []}
        with torch.inference_mode():
            for i in range(args.repeats + 10):
                t0 = time.perf_counter()
                lease = store.acquire("sia", "bench")
                state = state_from_bytes(lease.state, config)
                t1 = time.perf_counter()
                new_state = advance(state, summary, shock=0.5, nll=2.0, g=services.turns.model.self_update, dynamics=dynamics)
                t2 = time.perf_counter()
                store.commit(lease, encode(new_state), reason="turn", turn=record)
                t3 = time.perf_counter()
                if i >= 10:
                    phases["load"].append(t1 - t0)
                    phases["update"].append(t2 - t1)
                    phases["persist"].append(t3 - t2)
        turns = []
        for i in range(args.turns + 2):
            t0 = time.perf_counter()
            services.turns.turn(
                "sia", "turns", f"Tell me something about day {i}.", Sampling(max_tokens=64, temperature=0.8, seed=i)
            )
            if i >= 2:
                turns.append(time.perf_counter() - t0)
        result: dict[str, Any] = {"backend": name, "state_bytes": blob_bytes, "serialise_bytes": len(state_to_bytes(state))}
        for key, samples in phases.items():
            result[key] = percentiles(samples)
        result["turn"] = percentiles(turns)
        turn_p50 = result["turn"]["p50_ms"]
        store_p50 = result["load"]["p50_ms"] + result["persist"]["p50_ms"]
        state_p50 = store_p50 + result["update"]["p50_ms"]
        result["store_p50_ms"] = store_p50
        result["state_work_p50_ms"] = state_p50
        result["store_share_of_turn"] = store_p50 / turn_p50
        result["state_work_share_of_turn"] = state_p50 / turn_p50
        return result
    finally:
        store.close()


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | load p50/p95 | update p50/p95 | persist p50/p95 | turn p50/p95 | store share | state work share |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def cell(key: str, r: dict[str, Any] = r) -> str:
            return f"{r[key]['p50_ms']:.2f} / {r[key]['p95_ms']:.2f} ms"

        lines.append(
            f"| {r['backend']} | {cell('load')} | {cell('update')} | {cell('persist')} | {cell('turn')} | "
            f"{r['store_share_of_turn']:.1%} | {r['state_work_share_of_turn']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    info = machine_info(torch.get_num_threads())
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        backends: list[tuple[str, Callable[[], Any]]] = [
            ("sqlite", lambda: sqlite_database(Path(tmp))),
            ("postgresql", lambda: postgres_database(args.postgres)),
        ]
        for name, open_db in backends:
            try:
                with open_db() as url:
                    rows.append(run_backend(name, url, Path(tmp), args))
            except Exception as exc:  # an unreachable server is reported, not fatal
                if name == "sqlite":
                    raise
                skipped[name] = f"{type(exc).__name__}: {exc}"
    sys.stdout.write(table(rows))
    for name, why in skipped.items():
        sys.stdout.write(f"\n{name} skipped: {why}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": info, "repeats": args.repeats, "rows": rows, "skipped": skipped}, indent=2) + "\n")
    sys.stdout.write(f"\nwrote {args.out}\n")


if __name__ == "__main__":
    main()
