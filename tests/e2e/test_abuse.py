"""Abuse against a real `sia serve` process: a flood of requests whose clients give up at once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from server.launcher import free_port, serving
from tests.e2e.conftest import local_env, metric, turn_outcomes


def test_a_flood_of_abandoned_requests_does_not_starve_a_normal_one(tmp_path: Path, checkpoint_dir: Path) -> None:
    port = free_port()
    env = local_env(tmp_path, checkpoint_dir, port, MAX_TOKENS_CAP="200", MAX_CONCURRENT_TURNS="2")
    with serving(env, tmp_path / "s.log", port=port) as url:
        seen: Counter[str] = Counter()  # what each flood client saw
        lock = threading.Lock()

        def impatient(i: int) -> None:
            body = {"user": f"flood-{i % 8}", "message": "tell me a very long story", "max_tokens": 200, "temperature": 1.0}
            try:
                httpx.post(f"{url}/v1/personas/sia/chat", json=body, timeout=0.05)
                outcome = "sent"  # answered within 50 ms
            except httpx.ReadTimeout:
                outcome = "sent"  # the request went out whole; the client gave up waiting for the reply, as intended
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__  # it never went out whole (the connection or the write timed out)
            with lock:
                seen[outcome] += 1

        threads = [threading.Thread(target=impatient, args=(i,)) for i in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen.total() == 60, seen
        r = httpx.post(f"{url}/v1/personas/sia/chat", json={"user": "patient", "message": "hello", "max_tokens": 8}, timeout=60)
        assert r.status_code == 200

        # the server counts each request when it ends: wait until every request it got has ended (a hang guard)
        received = seen["sent"] + 1  # and the patient one
        deadline = time.monotonic() + 120
        while (ended := metric(url, "sia_http_requests_total", method="POST")) < received:
            assert time.monotonic() < deadline, f"{ended:.0f} of {received} requests ended; the flood is still running"
            time.sleep(0.2)
        outcomes = turn_outcomes(url)
    assert ended == received, seen  # every request that went out whole reached the server, and no other
    flood = sum(outcomes.values()) - 1  # the patient request was one turn
    assert outcomes.get("ok", 0) >= 1, outcomes
    assert 20 <= flood <= seen["sent"], (outcomes, seen)  # most flood requests reached a turn, none twice
    assert outcomes.get("abandoned", 0) >= flood / 2, outcomes  # most flood turns were dropped, not computed
