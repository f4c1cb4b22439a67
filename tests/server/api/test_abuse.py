"""Abuse: CORS from an unlisted origin, control characters in user ids (a flood of abandoned requests against a real
server is in tests/e2e/test_abuse.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.core.config import Settings
from server.db import migrate
from server.main import create_app
from tests.conftest import tiny_model


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
