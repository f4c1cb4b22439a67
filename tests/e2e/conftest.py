"""End-to-end tests: real `sia serve` processes (started by server/launcher.py) spoken to over HTTP.

What a server did is read from its /metrics, its log or its database, never from how long it took.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


def local_env(tmp_path: Path, checkpoint_dir: Path, port: int, **settings: str) -> dict[str, str]:
    """A server's settings on the embedded database under ``tmp_path``, the test checkpoint and ``port``; the other
    settings as SIA_<NAME>=value (e.g. MAX_TOKENS_CAP="64")."""
    env = {"SIA_DATA_DIR": str(tmp_path / "data"), "SIA_CHECKPOINT": str(checkpoint_dir), "SIA_PORT": str(port)}
    return {**env, **{f"SIA_{name}": value for name, value in settings.items()}}


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` in the server's /metrics whose labels include ``labels``; 0 if none."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def turn_outcomes(url: str) -> dict[str, float]:
    """The server's turns so far, by outcome (ok, busy, error, abandoned)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sia_turns_total"
    }
