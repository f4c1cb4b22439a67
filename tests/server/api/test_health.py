from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.server.api.conftest import Keys


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_readiness_fails_on_an_unmigrated_database(client: TestClient) -> None:
    engine = client.app.state.services.store.engine  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0001'"))
    r = client.get("/readyz")
    assert r.status_code == 503 and "sia db upgrade" in r.json()["reason"]


def test_metrics_count_turns_tokens_and_errors(client: TestClient, keys: Keys) -> None:
    client.post(
        "/v1/personas/sia/chat",
        json={"user": "ana", "message": "hi", "max_tokens": 3},
        headers={"Authorization": f"Bearer {keys.ana}"},
    )
    client.post("/v1/personas/sia/chat", json={"user": "ana", "message": "hi"})  # 401
    text_ = client.get("/metrics").text
    assert 'sia_turns_total{outcome="ok"} 1.0' in text_
    assert 'sia_errors_total{type="missing_api_key"} 1.0' in text_
    assert 'sia_http_requests_total{method="POST",route="/v1/personas/{persona}/chat",status="200"} 1.0' in text_
    assert "sia_turn_seconds_bucket" in text_ and "sia_shock_count 1.0" in text_
    completion = [line for line in text_.splitlines() if line.startswith('sia_tokens_total{kind="completion"}')]
    assert completion and 1 <= float(completion[0].split()[-1]) <= 3


def test_request_ids_are_kept_or_made(client: TestClient) -> None:
    assert client.get("/healthz", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    made = client.get("/healthz", headers={"X-Request-ID": "bad\tid"}).headers["x-request-id"]
    assert made != "bad\tid" and len(made) == 32
