"""Abuse: CORS from an unlisted origin, control characters in user ids, a flood of abandoned requests."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from server.core.config import Settings
from server.db import migrate
from server.main import create_app
from tests.conftest import tiny_model
from tests.live import free_port, serving


@pytest.fixture
def cors_client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path, cors_origins=["https://app.example"])
    migrate.upgrade(settings)
    with TestClient(create_app(settings, model=tiny_model())) as c:
        yield c


def test_cors_preflight_only_for_listed_origins(cors_client: TestClient) -> None:
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    good = cors_client.options("/v1/chat/completions", headers={"Origin": "https://app.example", **ask})
    assert good.status_code == 200 and good.headers["access-control-allow-origin"] == "https://app.example"
    bad = cors_client.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **ask})
    assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers
    simple = cors_client.get("/healthz", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in simple.headers


def test_no_cors_unless_configured(client: TestClient) -> None:
    r = client.options("/v1/chat/completions", headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("user", ["a\r\nb", "a\nb", "tab\there", "nul\x00", "\x1b[31m"])
def test_control_characters_in_user_ids_are_refused(client: TestClient, user: str) -> None:
    r = client.post("/v1/personas/sia/chat", json={"user": user, "message": "hi"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "user"
    r = client.post("/v1/chat/completions", json={"model": "sia", "user": user, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "user"
    services = client.app.state.services  # type: ignore[attr-defined]
    assert services.store.count_identities("sia") == 0


def test_a_flood_of_abandoned_requests_does_not_starve_a_normal_one(tmp_path: Path, checkpoint_dir: Path) -> None:
    port = free_port()
    env = {
        "SIA_DATA_DIR": str(tmp_path / "data"),
        "SIA_CHECKPOINT": str(checkpoint_dir),
        "SIA_PORT": str(port),
        "SIA_MAX_TOKENS_CAP": "200",
        "SIA_MAX_CONCURRENT_TURNS": "2",
    }
    with serving(env, tmp_path / "s.log", port=port) as url:

        def impatient(i: int) -> None:
            body = {"user": f"flood-{i % 8}", "message": "tell me a very long story", "max_tokens": 200, "temperature": 1.0}
            with contextlib.suppress(httpx.HTTPError):  # the client gives up, as intended
                httpx.post(f"{url}/v1/personas/sia/chat", json=body, timeout=0.05)

        threads = [threading.Thread(target=impatient, args=(i,)) for i in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        started = time.monotonic()
        r = httpx.post(f"{url}/v1/personas/sia/chat", json={"user": "patient", "message": "hello", "max_tokens": 8}, timeout=60)
        elapsed = time.monotonic() - started
        assert r.status_code == 200
        assert elapsed < 10, f"a normal request took {elapsed:.1f} s after the flood"
        deadline = time.monotonic() + 60
        seen, stable_since = -1.0, time.monotonic()
        while time.monotonic() < deadline:  # until every flood request that reached a turn has ended
            outcomes = _turn_outcomes(httpx.get(f"{url}/metrics").text)
            if sum(outcomes.values()) != seen:
                seen, stable_since = sum(outcomes.values()), time.monotonic()
            elif time.monotonic() - stable_since > 2:
                break
            time.sleep(0.2)
    flood = sum(outcomes.values()) - 1  # the patient request was one turn
    assert 20 <= flood <= 60, outcomes
    assert outcomes.get("abandoned", 0) >= flood / 2, outcomes  # most flood turns were dropped, not computed


def _turn_outcomes(metrics: str) -> dict[str, float]:
    prefix = 'sia_turns_total{outcome="'
    return {
        line[len(prefix) :].split('"', 1)[0]: float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(prefix)
    }
