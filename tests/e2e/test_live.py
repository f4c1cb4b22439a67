"""A real uvicorn process (`sia serve`): streaming, the official OpenAI client, concurrency, disconnects, logs."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from server.core.config import Settings
from server.launcher import free_port, serving
from server.store import Store
from tests.e2e.conftest import local_env, metric


@dataclass
class Live:
    url: str
    settings: Settings
    log_path: Path


@pytest.fixture
def live(tmp_path: Path, checkpoint_dir: Path) -> Iterator[Live]:
    port = free_port()
    env = local_env(tmp_path, checkpoint_dir, port, BUSY_TIMEOUT_S="30", MAX_TOKENS_CAP="64")
    log_path = tmp_path / "server.log"
    with serving(env, log_path, port=port) as url:
        yield Live(url, Settings(data_dir=tmp_path / "data"), log_path)


def test_the_official_openai_client_works_unmodified(live: Live) -> None:
    client = OpenAI(base_url=f"{live.url}/v1", api_key="not-needed-in-development-mode")
    assert "sia" in [m.id for m in client.models.list()]
    out = client.chat.completions.create(
        model="sia",
        user="ana",
        messages=[{"role": "user", "content": "Hi, I'm Ana."}],
        max_tokens=8,
        seed=1,
        logprobs=True,
        top_logprobs=2,
    )
    choice = out.choices[0]
    assert choice.message.role == "assistant" and out.usage is not None and out.usage.completion_tokens >= 1
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)

    stream = client.chat.completions.create(
        model="sia",
        user="bea",
        messages=[{"role": "user", "content": "Hi, I'm Ana."}],
        max_tokens=8,
        seed=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(pieces) == choice.message.content  # same seed, fresh identities: the same reply, streamed
    assert finish == choice.finish_reason and usage is not None and usage.completion_tokens == out.usage.completion_tokens

    from openai import NotFoundError, UnprocessableEntityError

    with pytest.raises(NotFoundError) as err:
        client.chat.completions.create(model="nobody", user="u", messages=[{"role": "user", "content": "x"}])
    assert "does not exist" in str(err.value)
    with pytest.raises(UnprocessableEntityError):
        client.chat.completions.create(model="sia", user="u", messages=[{"role": "user", "content": "x"}], temperature=-1)


def test_concurrent_turns_on_shared_and_separate_identities(live: Live) -> None:
    results: list[tuple[str, int, int]] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client(worker: int) -> None:
        user = "shared" if worker % 2 == 0 else f"solo-{worker}"
        with httpx.Client(base_url=live.url, timeout=60) as http:
            for i in range(3):
                r = http.post("/v1/personas/sia/chat", json={"user": user, "message": f"turn {i}", "max_tokens": 4, "seed": i})
                with lock:
                    if r.status_code == 200:
                        results.append((user, r.json()["turn"], r.json()["state_version"]))
                    else:
                        failures.append(f"{r.status_code} {r.text}")

    threads = [threading.Thread(target=client, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    shared = sorted(turn for user, turn, _ in results if user == "shared")
    assert shared == list(range(12))  # 4 workers x 3 turns, serial: every index exactly once
    store = Store(live.settings)
    try:
        assert store.get_identity("sia", "shared").turn_count == 12
        for w in range(1, 8, 2):
            assert store.get_identity("sia", f"solo-{w}").turn_count == 3
    finally:
        store.close()


def test_a_client_that_disconnects_mid_stream_changes_nothing(live: Live) -> None:
    httpx.post(f"{live.url}/v1/personas/sia/chat", json={"user": "d", "message": "hello", "max_tokens": 4}, timeout=60)
    store = Store(live.settings)
    try:
        before = store.get_identity("sia", "d")
        with httpx.stream(
            "POST",
            f"{live.url}/v1/personas/sia/chat",
            timeout=60,
            json={"user": "d", "message": "tell me everything", "max_tokens": 64, "temperature": 1.0, "seed": 1, "stream": True},
        ) as r:
            first = next(r.iter_lines())
            assert first.startswith("event: token")
        # the connection is closed; the server notices, abandons the turn and lets go of the identity
        deadline = time.monotonic() + 30
        while store.get_identity("sia", "d").busy and time.monotonic() < deadline:
            time.sleep(0.05)
        after = store.get_identity("sia", "d")
        assert (after.version, after.turn_count, after.state_sha256, after.busy) == (
            before.version,
            before.turn_count,
            before.state_sha256,
            False,
        )
        metrics = httpx.get(f"{live.url}/metrics").text
        assert 'sia_turns_total{outcome="abandoned"} 1.0' in metrics
    finally:
        store.close()
    r = httpx.post(f"{live.url}/v1/personas/sia/chat", json={"user": "d", "message": "again", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["turn"] == 1


def test_logs_are_json_lines_that_user_text_cannot_forge(live: Live) -> None:
    httpx.get(f"{live.url}/healthz%0D%0A%7B%22level%22%3A%22CRITICAL%22%7D", headers={"X-Request-ID": "trace-me"})
    httpx.post(f"{live.url}/v1/personas/sia/chat", json={"user": "x\r\ny", "message": "hi"})

    def records() -> list[dict[str, object]]:
        lines = live.log_path.read_text().split("\n")[:-1]  # whole lines: the last may still be being written
        return [json.loads(line) for line in lines if line.strip()]  # every line is one JSON object

    deadline = time.monotonic() + 30  # each request is logged once it has ended: wait for both (a hang guard)
    while not (any(r.get("request_id") == "trace-me" for r in records()) and any(r.get("status") == 422 for r in records())):
        assert time.monotonic() < deadline, f"the requests were not logged:\n{live.log_path.read_text()[-3000:]}"
        time.sleep(0.05)
    assert not any(r.get("level") == "CRITICAL" for r in records())


@pytest.mark.parametrize("max_batch", ["0", "1"], ids=["unbatched", "batch-of-one"])
def test_waiting_for_a_busy_identity_does_not_take_an_inference_slot(
    tmp_path: Path, checkpoint_dir: Path, max_batch: str
) -> None:
    """One inference slot (or a batch of one row), six clients on one held identity: waiting must leave the slot free,
    for the turns of other identities and for the turn that holds theirs."""
    port = free_port()
    env = local_env(tmp_path, checkpoint_dir, port, MAX_CONCURRENT_TURNS="1", MAX_BATCH=max_batch, BUSY_TIMEOUT_S="120")
    statuses: list[int] = []
    lock = threading.Lock()
    with serving(env, tmp_path / "s.log", port=port) as url:
        chat = {"user": "one", "message": "hello", "max_tokens": 8}
        assert httpx.post(f"{url}/v1/personas/sia/chat", json=chat, timeout=60).status_code == 200
        store = Store(Settings(data_dir=tmp_path / "data"))
        try:
            lease = store.acquire("sia", "one")  # held by the test, as by a turn on another replica

            def client(worker: int) -> None:
                with httpx.Client(base_url=url, timeout=180) as http:
                    for i in range(2):
                        r = http.post("/v1/personas/sia/chat", json={"user": "one", "message": f"{worker}/{i}", "max_tokens": 8})
                        with lock:
                            statuses.append(r.status_code)

            threads = [threading.Thread(target=client, args=(w,)) for w in range(6)]
            for t in threads:
                t.start()
            # while six turns wait for the held identity, the one slot stays free for turns of other identities; a
            # waiter inside the slot would block these until its busy timeout (then 409), so they would come after it
            for i in range(3):
                other = {"user": "two", "message": f"{i}", "max_tokens": 8}
                try:
                    r = httpx.post(f"{url}/v1/personas/sia/chat", json=other, timeout=60)  # a hang guard
                except httpx.ReadTimeout:
                    pytest.fail("a turn of another identity got no inference slot while turns waited for a held identity")
                assert r.status_code == 200
            with lock:
                assert statuses == []  # the waiters are still waiting
            store.release(lease)
            for t in threads:
                t.join()
            assert statuses == [200] * 12  # then all twelve turns on the identity went through, one at a time
            assert store.get_identity("sia", "one").turn_count == 13
            assert [t.index for t in store.turns("sia", "one", limit=100)] == list(range(13))
        finally:
            store.close()
        assert metric(url, "sia_busy_rejections_total") == 0
        assert metric(url, "sia_turns_total", outcome="ok") == 1 + 3 + 12
