"""Benchmark one whole turn through the runtime on SQLite, broken down into its phases.

Run: ``python -m benchmarks.turn [--quick] [--lengths 16 64 256] [--repeats 40] [--threads 1] [--out PATH]``.

Setup: a fresh SQLite file (migrated, default personas created), ``server.runtime.services.Services`` over the bundled
model, persona ``sia`` (sampling at its default temperature, a fixed seed per turn). The bundled model ends
its replies after a few dozen tokens, so the model gets a bias of -1e4 on the ``<|end|>`` logit
(``benchmarks.generation.without_end``) and every reply has exactly the requested number of tokens.

For each reply length, ``--repeats`` iterations after 5 warm-up ones; each iteration runs, on two
identities that were created beforehand:

* a **phased turn**: the steps of ``TurnRunner.stream_turn`` and ``sia.identity.turn.stream_turns``, called directly in
  the same order and timed one by one:

  - ``load``: ``store.acquire`` (the hold, one transaction) + ``state_from_bytes`` (parse, validate), plus the
    request's sampling parameters, dynamics and persona preamble;
  - ``shock``: conditioning on the state (``condition_states``) and the prompt's prefill forward pass, which
    gives the prompt NLL and the first token (``stream`` up to its first event), plus the standardised shock;
  - ``generation``: the remaining decoding steps (first event to the finished ``Generation``);
  - ``update``: ``summarize`` the turn statistics + ``sia.identity.turn.advance_on_model`` (``advance`` where the
    model computes);
  - ``persist``: ``encode`` (serialise) + ``store.commit`` (state, turn record, history row; one transaction);

* a **real turn**: ``services.turns.turn(...)`` on the other identity, timed as a whole, as a check that the phases
  add up to a turn (``phase sum / real turn``, p50 over p50).

Reported per length and phase: p50 / p95 in ms, and the median over iterations of the share of the phased
turn taken by everything but ``generation`` (``overhead``) and by the state work alone (load + update +
persist). ``torch.set_num_threads(--threads)`` (default 1, the service's per-process setting) is set first.
Results go to ``--out`` (JSON, with machine info and load average) and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.fixed_length import without_end
from benchmarks.machine import machine_info
from benchmarks.store import percentiles
from server.core.config import Settings
from server.db import migrate
from server.records import NewTurn
from server.runtime.codec import encode
from server.runtime.services import Services
from server.store import Store
from sia.checkpoint import NATIVE_CHECKPOINT, load_checkpoint
from sia.identity.shock import standardised_shock
from sia.identity.state import state_from_bytes
from sia.identity.turn import advance_on_model
from sia.model.generate import Sampling, stream
from sia.model.summary_sums import SummarySums
from sia.model.tokenizer import ByteTokenizer

DEFAULT_OUT = Path(__file__).parent / "results" / "turn.json"
PERSONA = "sia"
PHASES = ("load", "shock", "generation", "update", "persist")
WARMUP = 5


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="lengths 16 and 64, 5 repeats: a sanity run")
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256], help="reply lengths in tokens")
    p.add_argument("--repeats", type=int, default=40, help="timed iterations per length")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.repeats = [16, 64], 5
    return args


def phased_turn(services: Services, user: str, message: str, sampling: Sampling) -> tuple[dict[str, float], int]:
    """One turn with each phase timed; returns seconds per phase and the reply's token count."""
    store, model, tok, config = services.store, services.turns.model, services.turns.tokenizer, services.identities.config
    t0 = time.perf_counter()
    lease = store.acquire(PERSONA, user)
    record = lease.persona_record
    params = services.personas.sampling_params(record, sampling)
    dynamics = services.personas.dynamics(record)
    context = tuple(tok.system_prompt(record.preamble))
    state = state_from_bytes(lease.state, config)
    t1 = time.perf_counter()

    prompt, (start, end) = tok.turn_prompt(message, context)
    mask = [False] * len(context) + [True] * (len(prompt) - len(context))
    span = (start - 1, end - 1)  # prompt_nll[j] scores prompt[j + 1]
    with torch.no_grad():
        cond = model.condition_states([state])
    events = stream(model, [prompt], cond, params, tokenizer=tok, summary_masks=[mask])
    next(events)
    t2 = time.perf_counter()
    generation = events.finish()[0]
    t3 = time.perf_counter()
    with torch.no_grad():
        nll = float(generation.prompt_nll[span[0] : span[1]].mean())
        shock = standardised_shock(nll, state.shock, config)
        t4 = time.perf_counter()
        summary = model.summarize(SummarySums.cat([generation.stats])).row(0)
        new_state = advance_on_model(model, state, summary, shock=shock, nll=nll, dynamics=dynamics)
    t5 = time.perf_counter()
    turn = NewTurn(
        reply=generation.text,
        finish_reason=generation.finish_reason,
        shock=shock,
        nll=nll,
        prompt_tokens=len(prompt),
        completion_tokens=len(generation.tokens),
        message=message,
        latency_ms=0.0,
    )
    store.commit(lease, encode(new_state), reason="turn", turn=turn)
    t6 = time.perf_counter()
    phases = {
        "load": t1 - t0,
        "shock": (t2 - t1) + (t4 - t3),
        "generation": t3 - t2,
        "update": t5 - t4,
        "persist": t6 - t5,
    }
    return phases, len(generation.tokens)


def run_length(services: Services, length: int, repeats: int) -> dict[str, Any]:
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    totals: list[float] = []
    real: list[float] = []
    overhead: list[float] = []
    state_work: list[float] = []
    for i in range(WARMUP + repeats):
        message = f"Tell me something about day {i}."
        sampling = Sampling(max_tokens=length, seed=i)
        timed, n = phased_turn(services, f"phased-{length}", message, sampling)
        if n != length:
            raise AssertionError(f"the reply has {n} tokens, not {length}")
        t0 = time.perf_counter()
        outcome = services.turns.turn(PERSONA, f"real-{length}", message, sampling)
        elapsed = time.perf_counter() - t0
        if outcome.completion_tokens != length:
            raise AssertionError(f"the real turn's reply has {outcome.completion_tokens} tokens, not {length}")
        if i < WARMUP:
            continue
        total = sum(timed.values())
        for name in PHASES:
            phases[name].append(timed[name])
        totals.append(total)
        real.append(elapsed)
        overhead.append((total - timed["generation"]) / total)
        state_work.append((timed["load"] + timed["update"] + timed["persist"]) / total)
    row: dict[str, Any] = {"reply_tokens": length, "repeats": repeats}
    for name in PHASES:
        row[name] = percentiles(phases[name])
    row["phase_sum"] = percentiles(totals)
    row["real_turn"] = percentiles(real)
    row["sum_over_real"] = row["phase_sum"]["p50_ms"] / row["real_turn"]["p50_ms"]
    row["overhead_share"] = statistics.median(overhead)
    row["state_work_share"] = statistics.median(state_work)
    row["generation_ms_per_token"] = row["generation"]["p50_ms"] / max(1, length - 1)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = " | ".join(PHASES)
    lines = [
        "p50 / p95 in ms",
        "",
        f"| reply tokens | {head} | phase sum | real turn | sum / real | overhead share | state work share |",
        "|---" * (len(PHASES) + 6) + "|",
    ]
    for r in rows:

        def cell(key: str, r: dict[str, Any] = r) -> str:
            return f"{r[key]['p50_ms']:.2f} / {r[key]['p95_ms']:.2f}"

        cells = " | ".join(cell(name) for name in PHASES)
        lines.append(
            f"| {r['reply_tokens']} | {cells} | {cell('phase_sum')} | {cell('real_turn')} | {r['sum_over_real']:.2f} | "
            f"{r['overhead_share']:.1%} | {r['state_work_share']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), database_url=f"sqlite:///{Path(tmp) / 'bench.db'}", history_retention=100)
        migrate.upgrade(settings)
        store = Store(settings)
        try:
            services = Services.over(without_end(load_checkpoint(NATIVE_CHECKPOINT), ByteTokenizer()), store)
            services.personas.ensure_defaults()
            for length in args.lengths:
                for user in (f"phased-{length}", f"real-{length}"):  # create both identities up front
                    services.turns.turn(PERSONA, user, "Hello.", Sampling(max_tokens=4, seed=0))
                rows.append(run_length(services, length, args.repeats))
        finally:
            store.close()
    info["loadavg_end"] = list(os.getloadavg())
    sys.stdout.write(table(rows))
    setup = {
        "backend": "sqlite",
        "persona": PERSONA,
        "sampling": "persona default temperature, seed = iteration",
        "end_logit_bias": "-1e4 (every reply has exactly the requested length)",
        "warmup": WARMUP,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": info, "setup": setup, "rows": rows}, indent=2) + "\n")
    sys.stdout.write(f"\nwrote {args.out}\n")


if __name__ == "__main__":
    main()
