"""Continuous batching through the API: concurrent users of different identities share decode steps and each gets
the reply and state it gets without batching; a full queue is a 503 that loses nothing; the metrics report it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.core.config import Settings
from server.db import migrate
from server.main import create_app
from server.runtime.batcher import Batcher
from sia.identity.state import Dynamics, IdentityState
from sia.identity.turn import TurnRequest
from sia.model.generate import SamplingParams
from tests.conftest import tiny_model

USERS = [f"user{i}" for i in range(6)]
MESSAGES = ["Hi, I'm {u}. My pet is a cat.", "Tell me something about rivers.", "What is my pet?"]


def served(settings: Settings, **changes: object) -> TestClient:
    own = settings.model_copy(update=changes)
    migrate.upgrade(own)
    return TestClient(create_app(own, model=tiny_model()))


@pytest.fixture
def unbatched(app_settings: Settings, tmp_path: Path) -> Iterator[TestClient]:
    (tmp_path / "off").mkdir()
    off = tmp_path / "off"  # a database of its own
    with served(app_settings, data_dir=off, database_url=f"sqlite:///{off / 'sia.db'}", max_batch=0) as c:
        yield c


def conversation(client: TestClient, user: str, seed: int | None) -> list[dict[str, object]]:
    """Three turns of one user, each read to its end; greedy, or sampled with a fixed seed."""
    out = []
    for message in MESSAGES:
        extra = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        r = client.post(
            "/v1/personas/sia/chat", json={"user": user, "message": message.format(u=user), "max_tokens": 12, **extra}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        out.append({k: body[k] for k in ("reply", "finish_reason", "turn", "state_version", "usage", "shock")})
    return out


def self_states(client: TestClient) -> dict[str, list[float]]:
    out = {}
    for user in USERS:
        r = client.get(f"/admin/personas/sia/identities/{user}")
        assert r.status_code == 200, r.text
        out[user] = r.json()["self_state"]
    return out


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_concurrent_users_get_in_a_batch_what_they_get_alone(client: TestClient, unbatched: TestClient, seeded: bool) -> None:
    seeds = {u: (17 + i if seeded else None) for i, u in enumerate(USERS)}
    alone = {u: conversation(unbatched, u, seeds[u]) for u in USERS}  # one turn at a time, no batch
    with ThreadPoolExecutor(len(USERS)) as pool:
        together = dict(zip(USERS, pool.map(lambda u: conversation(client, u, seeds[u]), USERS), strict=True))
    for user in USERS:
        for got, want in zip(together[user], alone[user], strict=True):
            assert got == want | {"shock": pytest.approx(want["shock"], abs=1e-4)}
    batched_states, alone_states = self_states(client), self_states(unbatched)
    for user in USERS:
        assert batched_states[user] == pytest.approx(alone_states[user], abs=1e-4)
    metrics = client.get("/metrics").text
    count = float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("sia_batch_size_count")))
    total = float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("sia_batch_size_sum")))
    completions = sum(t["usage"]["completion_tokens"] for turns in together.values() for t in turns)  # type: ignore[index]
    assert total == completions  # every token decoded in a batch step
    assert count < total  # some steps carried several users
    assert 'sia_turns_total{outcome="ok"} 18.0' in metrics


def test_a_full_queue_is_503_and_nothing_is_lost(app_settings: Settings) -> None:
    with served(app_settings, max_batch=1, max_queued_turns=1) as client:
        batcher: Batcher = client.app.state.serving.batcher  # type: ignore[attr-defined]
        model = batcher.model
        before = client.post("/v1/personas/sia/chat", json={"user": "kept", "message": "hello", "max_tokens": 4}).json()
        gate, holding = threading.Event(), threading.Event()

        def hold(item: object) -> None:  # a turn whose reader stalls the batch: the one row stays taken
            holding.set()
            gate.wait(30)

        request = TurnRequest(state=IdentityState.fresh(model.config), message="x", dynamics=Dynamics.from_config(model.config))
        batcher.submit(request, SamplingParams(max_new_tokens=2), hold)
        assert holding.wait(30)
        batcher.submit(request, SamplingParams(max_new_tokens=2), lambda item: None)  # the queue's one place
        r = client.post("/v1/personas/sia/chat", json={"user": "kept", "message": "again", "max_tokens": 4})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        error = r.json()["error"]
        assert error["code"] == "overloaded" and "waiting" in error["message"]
        state = client.get("/admin/personas/sia/identities/kept").json()
        assert state["version"] == before["state_version"] and state["turns"] == 1  # the refused turn wrote nothing
        gate.set()
        deadline = time.monotonic() + 30
        while batcher.queued and time.monotonic() < deadline:  # the queued turn takes the freed row
            time.sleep(0.01)
        after = client.post("/v1/personas/sia/chat", json={"user": "kept", "message": "again", "max_tokens": 4})
        assert after.status_code == 200 and after.json()["turn"] == 1  # the identity was let go
        metrics = client.get("/metrics").text
        assert "sia_overloaded_rejections_total 1.0" in metrics and 'sia_turns_total{outcome="overloaded"} 1.0' in metrics
