"""The authorization matrix over every route, and hostile state imports."""

from __future__ import annotations

import re

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save as st_save

from sia.identity.state import state_to_bytes
from tests.conftest import random_state
from tests.server.api.conftest import Keys, bearer

OPEN = {"/healthz", "/readyz", "/metrics"}  # operations routes answer without a key


def _routes(client: TestClient) -> list[tuple[str, str]]:
    paths = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    out = []
    for template, operations in paths.items():
        path = re.sub(r"\{[a-z_]+\}", "x", template.replace("{persona}", "sia"))
        out += [(method.upper(), path) for method in operations]
    return out


def test_every_route_with_no_key_a_wrong_key_and_a_user_key(client: TestClient, keys: Keys) -> None:
    routes = _routes(client)
    assert len(routes) >= 28
    for method, path in routes:
        if path in OPEN:
            assert client.request(method, path).status_code in (200, 503), path
            continue
        for headers, status in (({}, 401), (bearer("sia_" + "x" * 43), 401), ({"Authorization": "Basic YTpi"}, 401)):
            r = client.request(method, path, headers=headers)
            assert r.status_code == status, (method, path, headers, r.text)
            assert r.json()["error"]["type"] == "authentication_error" and r.headers["www-authenticate"] == "Bearer"
        if path.startswith("/admin"):
            r = client.request(method, path, headers=bearer(keys.ana))
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_only", (method, path)


def test_a_user_key_cannot_touch_another_users_identity(client: TestClient, keys: Keys) -> None:
    chat = {"user": "ana", "message": "hi", "max_tokens": 2}
    assert client.post("/v1/personas/sia/chat", json=chat, headers=bearer(keys.ana)).status_code == 200
    r = client.post("/v1/personas/sia/chat", json=chat, headers=bearer(keys.bob))
    assert r.status_code == 403 and r.json()["error"]["code"] == "wrong_user"
    completion = {"model": "sia", "user": "ana", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = client.post("/v1/chat/completions", json=completion, headers=bearer(keys.bob))
    assert r.status_code == 403
    for path in ("/admin/personas/sia/identities/ana", "/admin/personas/sia/identities/ana/state"):
        assert client.get(path, headers=bearer(keys.bob)).status_code == 403
        assert client.get(path, headers=bearer(keys.ana)).status_code == 403  # not even their own, through /admin
    services = client.app.state.services  # type: ignore[attr-defined]
    assert services.store.get_identity("sia", "ana").turn_count == 1  # bob's attempts changed nothing


def _blob(tensors: dict[str, torch.Tensor]) -> bytes:
    return bytes(st_save(tensors))


@pytest.mark.parametrize("kind", ["corrupt", "truncated", "nan", "inf", "oversized", "wrong_version", "wrong_dtype", "empty"])
def test_hostile_state_imports_are_refused_and_others_keep_working(client: TestClient, kind: str) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    config = services.identities.config
    good = state_to_bytes(random_state(config, seed=4))
    state = random_state(config, seed=4)
    base = {
        "trace": state.trace,
        "self_state": state.self_state,
        "counters": torch.tensor([3, 0], dtype=torch.int64),
        "shock": torch.tensor([0.0, 0.0], dtype=torch.float64),
        "format_version": torch.tensor([1], dtype=torch.int64),
    }
    if kind == "corrupt":
        blob = bytearray(good)
        blob[10:40] = b"\xff" * 30
        payload = bytes(blob)
    elif kind == "truncated":
        payload = good[: len(good) // 3]
    elif kind in ("nan", "inf"):
        trace = state.trace.clone()
        trace[0, 0, 1, 1] = float("nan") if kind == "nan" else float("inf")
        payload = _blob({**base, "trace": trace})
    elif kind == "oversized":
        payload = good + b"\x00" * (client.app.state.settings.max_body_bytes)  # type: ignore[attr-defined]
    elif kind == "wrong_version":
        payload = _blob({**base, "format_version": torch.tensor([99], dtype=torch.int64)})
    elif kind == "wrong_dtype":
        payload = _blob({**base, "trace": state.trace.double()})
    else:
        payload = b""
    client.post("/v1/personas/sia/chat", json={"user": "victim", "message": "hello", "max_tokens": 2})
    client.post("/v1/personas/sia/chat", json={"user": "bystander", "message": "hello", "max_tokens": 2})
    before = client.get("/admin/personas/sia/identities/victim/state").content
    r = client.put(
        "/admin/personas/sia/identities/victim/state", content=payload, headers={"content-type": "application/octet-stream"}
    )
    assert 400 <= r.status_code < 500, (kind, r.status_code, r.text)
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert client.get("/admin/personas/sia/identities/victim/state").content == before  # nothing written
    for user in ("victim", "bystander"):
        r = client.post("/v1/personas/sia/chat", json={"user": user, "message": "still there?", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["turn"] == 1
