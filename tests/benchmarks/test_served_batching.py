"""The served batching benchmark's ratios: against the unbatched server, the solo TTFT, and transformers' generate."""

from __future__ import annotations

from typing import Any

from benchmarks.report import served_batching
from benchmarks.served_batching import compare, table


def row(server: str, users: int, identities: int, tokens_per_s: float, p50: float, p95: float) -> dict[str, Any]:
    return {
        "server": server,
        "users": users,
        "identities": identities,
        "tokens_per_s": tokens_per_s,
        "ttft_p50_ms": p50,
        "ttft_p95_ms": p95,
        "peak_rss_mb": 1000.0,
        "errors": 0,
    }


def test_each_row_is_set_against_the_unbatched_server_its_solo_turn_and_transformers_at_as_many_users() -> None:
    rows = [
        row("unbatched", 1, 1, 20.0, 100.0, 110.0),
        row("batched", 1, 1, 25.0, 80.0, 90.0),
        row("unbatched", 8, 8, 20.0, 400.0, 800.0),
        row("batched", 8, 8, 60.0, 300.0, 600.0),
        row("batched", 8, 2, 30.0, 900.0, 1000.0),
    ]
    compare(rows, [{"users": 8, "turns": 24, "tokens": 768, "seconds": 10.0, "tokens_per_s": 76.8}])
    batched8 = rows[3]
    assert batched8["speedup"] == 3.0
    assert batched8["ttft_p95_vs_solo"] == 600.0 / 80.0
    assert batched8["over_hf"] == 60.0 / 76.8
    assert rows[0]["over_hf"] is None  # no reference at one user
    assert rows[4]["over_hf"] is None  # users sharing identities are not the reference's turns
    assert "| 8 / 8 | batched | 60.0 | 3.00× | 0.78× |" in table(rows)
    text, targets = served_batching({"rows": rows, "setup": {"turns_per_user": 3, "max_tokens": 32}, "hf_generate": []})
    generate = [t for t in targets if "transformers" in t.what]
    assert len(generate) == 1 and not generate[0].met and generate[0].measured == "0.78x"
    assert "transformers' `generate`" not in text  # no reference figures recorded: no sentence about them


def test_a_gpu_run_is_held_to_the_gpus_targets_without_an_unbatched_server() -> None:
    from benchmarks.report import served_batching_gpu

    rows = [row("batched", 1, 1, 10.0, 100.0, 120.0), row("batched", 8, 8, 60.0, 300.0, 150.0)]
    rows.append(row("batched", 64, 64, 250.0, 900.0, 1000.0))
    compare(rows, [{"users": 8, "turns": 24, "tokens": 768, "seconds": 3.0, "tokens_per_s": 256.0}])
    setup = {"turns_per_user": 3, "max_tokens": 32, "weights": "random, of the base's shapes"}
    text, targets = served_batching_gpu({"rows": rows, "setup": setup, "hf_generate": []})
    verdicts = {t.what: (t.measured, t.met) for t in targets}
    assert verdicts == {
        "on a GPU, served: tokens/s at 64 users >= 20x one user's": ("25.0x", True),
        "on a GPU, served: TTFT p95 at 8 users <= 2x solo": ("1.50x", True),
        "on a GPU, served: tokens/s at 8 users >= 1.0x transformers' batched generate": ("0.23x", False),
    }
    assert text.startswith("Weights: random, of the base's shapes.") and "| batched | 64 / 64 | 250.0 | – |" in text
