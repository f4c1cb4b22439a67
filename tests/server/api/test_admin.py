from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from httpx import Response

from server.runtime.services import Services
from sia.identity.state import IdentityState, state_to_bytes
from tests.conftest import random_state, tiny_config
from tests.server.api.conftest import Keys, bearer

P = "/admin/personas"
ID = "/admin/personas/sia/identities"
GREEDY = {"max_tokens": 6, "temperature": 0}


def services_of(client: TestClient) -> Services:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    return services


def ok(r: Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json() if r.content else None


def error(r: Response, status: int, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    if param is not None:
        assert body["error"]["param"] == param
    detail: dict[str, Any] = body["error"]
    return detail


def chat(client: TestClient, user: str, message: str, persona: str = "sia", **extra: object) -> dict[str, Any]:
    body: dict[str, Any] = ok(client.post(f"/v1/personas/{persona}/chat", json={"user": user, "message": message, **extra}))
    return body


def import_random(client: TestClient, user: str, seed: int = 1, scale: float = 1.0) -> bytes:
    blob = state_to_bytes(random_state(services_of(client).identities.config, seed=seed, scale=scale))
    ok(client.put(f"{ID}/{user}/state", content=blob, headers={"content-type": "application/octet-stream"}))
    return blob


# --- access ------------------------------------------------------------------------------------------------------


def test_every_admin_route_needs_an_admin_key(client: TestClient, keys: Keys) -> None:
    paths = {p: ops for p, ops in client.app.openapi()["paths"].items() if p.startswith("/admin")}  # type: ignore[attr-defined]
    assert sum(len(ops) for ops in paths.values()) == 24
    for template, operations in paths.items():
        path = re.sub(r"\{[a-z]+\}", "x", template.replace("{persona}", "sia"))
        for method in operations:
            assert operations[method]["tags"] == ["admin"]
            error(client.request(method, path), 401, "missing_api_key")
            error(client.request(method, path, headers=bearer(keys.ana)), 403, "admin_only")
            error(client.request(method, path, headers=bearer("sia_not_a_key")), 401, "invalid_api_key")
    listed = ok(client.get(P, headers=bearer(keys.admin)))
    assert "sia" in [p["name"] for p in listed["data"]]


def test_admin_key_reaches_identity_routes(client: TestClient, keys: Keys) -> None:
    r = client.post("/v1/personas/sia/chat", json={"message": "hi", "max_tokens": 2}, headers=bearer(keys.ana))
    assert r.status_code == 200
    detail = ok(client.get(f"{ID}/ana", headers=bearer(keys.admin)))
    assert (detail["user"], detail["version"], detail["turns"]) == ("ana", 2, 1)
    error(client.get(f"{ID}/ana", headers=bearer(keys.ana)), 403, "admin_only")  # not even their own identity


# --- personas ----------------------------------------------------------------------------------------------------


def test_persona_create_read_update_delete(client: TestClient) -> None:
    created = ok(
        client.post(P, json={"name": "mara.v2", "description": "calm", "preamble": "[mara]", "decay": 0.9, "top_k": 20}),
        201,
    )
    assert created["name"] == "mara.v2" and created["decay"] == 0.9 and created["top_k"] == 20
    assert (created["alpha"], created["temperature"], created["max_tokens"], created["has_initial_state"]) == (
        None,
        0.8,
        64,
        False,
    )
    error(client.post(P, json={"name": "mara.v2"}), 409, "conflict")
    assert ok(client.get(f"{P}/mara.v2")) == created
    names = [p["name"] for p in ok(client.get(P))["data"]]
    assert "mara.v2" in names and "sia" in names and names == sorted(names)

    updated = ok(client.patch(f"{P}/mara.v2", json={"temperature": 0.0, "decay": None}))
    assert (updated["temperature"], updated["decay"], updated["top_k"], updated["description"]) == (0.0, None, 20, "calm")
    assert ok(client.patch(f"{P}/mara.v2", json={})) | {"updated_at": None} == updated | {"updated_at": None}
    error(client.patch(f"{P}/nobody", json={"temperature": 1.0}), 404, "not_found")
    assert (updated["repetition_penalty"], updated["no_repeat_ngram"]) == (1.0, 0)  # off unless set
    controlled = ok(client.patch(f"{P}/mara.v2", json={"repetition_penalty": 1.25, "no_repeat_ngram": 3}))
    assert (controlled["repetition_penalty"], controlled["no_repeat_ngram"], controlled["top_k"]) == (1.25, 3, 20)
    assert (controlled["lowercase"], controlled["max_sentences"], controlled["max_words"]) == (False, 0, 0)  # off unless set
    formed = ok(client.patch(f"{P}/mara.v2", json={"lowercase": True, "max_sentences": 2, "max_words": 9}))
    assert (formed["lowercase"], formed["max_sentences"], formed["max_words"], formed["no_repeat_ngram"]) == (True, 2, 9, 3)
    assert (formed["frequency_penalty"], formed["presence_penalty"], formed["logit_bias"]) == (0.0, 0.0, {})  # off unless set
    biased = ok(client.patch(f"{P}/mara.v2", json={"frequency_penalty": 0.5, "presence_penalty": -1, "logit_bias": {"101": 3}}))
    assert (biased["frequency_penalty"], biased["presence_penalty"], biased["logit_bias"]) == (0.5, -1.0, {"101": 3.0})
    assert ok(client.get(f"{P}/mara.v2"))["logit_bias"] == {"101": 3.0}
    error(client.patch(f"{P}/mara.v2", json={"logit_bias": {"260": 1}}), 400, "invalid_value")  # outside the vocabulary
    assert ok(client.get(f"{P}/mara.v2"))["logit_bias"] == {"101": 3.0}  # the refused change stored nothing
    assert ok(client.patch(f"{P}/mara.v2", json={"logit_bias": {}}))["logit_bias"] == {}
    assert biased["logit_bias_once"] is False  # off unless set
    assert ok(client.patch(f"{P}/mara.v2", json={"logit_bias_once": True}))["logit_bias_once"] is True
    assert ok(client.get(f"{P}/mara.v2"))["logit_bias_once"] is True
    assert ok(client.patch(f"{P}/mara.v2", json={"logit_bias_once": False}))["logit_bias_once"] is False
    assert biased["recall_temperature"] is None and biased["exclaim"] is False  # off unless set
    assert ok(client.patch(f"{P}/mara.v2", json={"exclaim": True}))["exclaim"] is True
    assert ok(client.get(f"{P}/mara.v2"))["exclaim"] is True
    assert biased["address"] == "" and ok(client.patch(f"{P}/mara.v2", json={"address": ", friend"}))["address"] == ", friend"
    assert ok(client.get(f"{P}/mara.v2"))["address"] == ", friend"
    assert ok(client.patch(f"{P}/mara.v2", json={"recall_temperature": 0.0}))["recall_temperature"] == 0.0
    assert ok(client.get(f"{P}/mara.v2"))["recall_temperature"] == 0.0
    assert ok(client.patch(f"{P}/mara.v2", json={"recall_temperature": None}))["recall_temperature"] is None  # off again
    error(client.get(f"{P}/nobody"), 404, "not_found")

    # a persona's identities go with it
    first = chat(client, "ana", "Hello there.", persona="mara.v2", max_tokens=4)
    assert first["state_version"] == 2
    assert ok(client.get("/admin/personas/mara.v2/identities"))["total"] == 1
    assert ok(client.delete(f"{P}/mara.v2"), 204) is None
    error(client.get(f"{P}/mara.v2"), 404)
    error(client.delete(f"{P}/mara.v2"), 404, "not_found")
    ok(client.post(P, json={"name": "mara.v2"}), 201)
    assert ok(client.get("/admin/personas/mara.v2/identities")) == {
        "persona": "mara.v2",
        "total": 0,
        "limit": 100,
        "offset": 0,
        "data": [],
    }


INVALID_BODIES: list[tuple[str, str, dict[str, object], str | None]] = [
    ("POST", P, {"name": ""}, "name"),
    ("POST", P, {"name": "has space"}, "name"),
    ("POST", P, {"name": "a/b"}, "name"),
    ("POST", P, {"name": "x" * 65}, "name"),
    ("POST", P, {"description": "no name"}, "name"),
    ("POST", P, {"name": "ok", "decay": 0}, "decay"),
    ("POST", P, {"name": "ok", "eta": 1.5}, "eta"),
    ("POST", P, {"name": "ok", "alpha": -1}, "alpha"),
    ("POST", P, {"name": "ok", "temperature": -0.1}, "temperature"),
    ("POST", P, {"name": "ok", "top_p": 0}, "top_p"),
    ("POST", P, {"name": "ok", "max_tokens": 0}, "max_tokens"),
    ("POST", P, {"name": "ok", "colour": "red"}, "colour"),
    ("PATCH", f"{P}/sia", {"temperature": None}, None),
    ("PATCH", f"{P}/sia", {"top_k": 0}, "top_k"),
    ("POST", P, {"name": "ok", "repetition_penalty": 0.8}, "repetition_penalty"),
    ("POST", P, {"name": "ok", "no_repeat_ngram": -1}, "no_repeat_ngram"),
    ("PATCH", f"{P}/sia", {"repetition_penalty": None}, None),
    ("PATCH", f"{P}/sia", {"no_repeat_ngram": 2.5}, "no_repeat_ngram"),
    ("POST", P, {"name": "ok", "max_sentences": -1}, "max_sentences"),
    ("POST", P, {"name": "ok", "lowercase": "maybe"}, "lowercase"),
    ("PATCH", f"{P}/sia", {"lowercase": None}, None),
    ("PATCH", f"{P}/sia", {"max_sentences": None}, None),
    ("POST", P, {"name": "ok", "max_words": -2}, "max_words"),
    ("PATCH", f"{P}/sia", {"max_words": None}, None),
    ("PATCH", f"{P}/sia", {"max_words": 1.5}, "max_words"),
    ("POST", P, {"name": "ok", "frequency_penalty": 3}, "frequency_penalty"),
    ("POST", P, {"name": "ok", "presence_penalty": -2.5}, "presence_penalty"),
    ("POST", P, {"name": "ok", "logit_bias": {"1": 200}}, "logit_bias"),
    ("POST", P, {"name": "ok", "logit_bias": {"one": 1}}, "logit_bias"),
    ("POST", P, {"name": "ok", "logit_bias": [1, 2]}, "logit_bias"),
    ("PATCH", f"{P}/sia", {"logit_bias": None}, None),
    ("POST", P, {"name": "ok", "logit_bias_once": "maybe"}, "logit_bias_once"),
    ("PATCH", f"{P}/sia", {"logit_bias_once": None}, None),
    ("POST", P, {"name": "ok", "recall_temperature": -0.1}, "recall_temperature"),
    ("POST", P, {"name": "ok", "exclaim": "loudly"}, "exclaim"),
    ("PATCH", f"{P}/sia", {"exclaim": None}, None),
    ("POST", P, {"name": "ok", "address": ", sir\n"}, "address"),
    ("PATCH", f"{P}/sia", {"address": "!!"}, "address"),
    ("PATCH", f"{P}/sia", {"address": None}, None),
    ("PATCH", f"{P}/sia", {"recall_temperature": "cold"}, "recall_temperature"),
    ("POST", f"{ID}/u/reset", {"layers": []}, "layers"),
    ("POST", f"{ID}/u/reset", {"layers": [0], "self_only": True}, None),
    ("POST", f"{ID}/u/rollback", {}, None),
    ("POST", f"{ID}/u/rollback", {"version": 1, "snapshot": "a"}, None),
    ("POST", f"{ID}/u/rollback", {"version": 0}, "version"),
    ("POST", f"{ID}/u/snapshots", {"name": ""}, "name"),
    ("POST", f"{ID}/u/cleanup", {"energy": 0}, "energy"),
    ("POST", f"{ID}/u/cleanup", {"energy": 1.5}, "energy"),
    ("POST", f"{ID}/u/counterfactual", {"message": "hi", "against": "yesterday"}, None),
    ("POST", f"{ID}/u/counterfactual", {"message": "hi", "against": {"version": 0}}, None),
    ("POST", f"{ID}/u/counterfactual", {"against": "reset"}, "message"),
]


def test_invalid_bodies_are_422_with_the_error_shape(client: TestClient) -> None:
    for method, path, body, param in INVALID_BODIES:
        detail = error(client.request(method, path, json=body), 422, "invalid_value")
        assert detail["type"] == "invalid_request_error", (path, body)
        if param is not None:
            assert detail["param"] == param, (path, body, detail)
    json_headers = {"content-type": "application/json"}
    error(client.post(P, content=b'{"name": "ok", "alpha": NaN}', headers=json_headers), 422, "invalid_value", "alpha")
    error(
        client.post(P, content=b'{"name": "ok", "repetition_penalty": Infinity}', headers=json_headers),
        422,
        "invalid_value",
        "repetition_penalty",
    )
    error(client.post(P, content=b"{not json", headers=json_headers), 422, "invalid_value")
    assert ok(client.get(f"{P}/sia"))["temperature"] == 0.8  # the refused PATCH changed nothing
    assert "ok" not in [p["name"] for p in ok(client.get(P))["data"]]
    assert not ok(client.get(ID))["data"]  # nor did the refused state operations create anything


def test_persona_initial_state(client: TestClient) -> None:
    services = services_of(client)
    ok(client.post(P, json={"name": "seeded"}), 201)
    blob = state_to_bytes(random_state(services.identities.config, seed=4))
    url = f"{P}/seeded/initial-state"
    assert ok(client.put(url, content=blob))["has_initial_state"] is True
    chat(client, "ana", "Hi!", persona="seeded", max_tokens=2)
    history = ok(client.get("/admin/personas/seeded/identities/ana/history"))
    assert [v["reason"] for v in history["data"]] == ["turn", "init"]
    r = client.get("/admin/personas/seeded/identities/ana/state", params={"version": 1})
    assert r.content == blob  # the new identity started from the uploaded state, bit for bit
    reset = ok(client.post("/admin/personas/seeded/identities/ana/reset"))
    assert client.get("/admin/personas/seeded/identities/ana/state").content == blob and reset["version"] == 3

    detail = error(client.put(url, content=b"not safetensors"), 422, "invalid_state")
    assert "safetensors" in detail["message"]
    other_model = state_to_bytes(IdentityState.fresh(tiny_config(n_layer=3)))
    assert "shape" in error(client.put(url, content=other_model), 422, "invalid_state")["message"]
    error(client.put(url, content=b""), 422, "invalid_state")
    error(client.put(f"{P}/nobody/initial-state", content=blob), 404, "not_found")
    assert ok(client.get(f"{P}/seeded"))["has_initial_state"] is True  # the bad uploads changed nothing

    assert ok(client.delete(url), 204) is None
    assert ok(client.get(f"{P}/seeded"))["has_initial_state"] is False
    chat(client, "bob", "Hi!", persona="seeded", max_tokens=2)
    fresh = client.get("/admin/personas/seeded/identities/bob/state", params={"version": 1}).content
    assert fresh == state_to_bytes(IdentityState.fresh(services.identities.config))


# --- identities --------------------------------------------------------------------------------------------------


def test_identity_list_detail_and_turns(client: TestClient) -> None:
    services = services_of(client)
    shocks = [chat(client, "ana", m, **GREEDY)["shock"] for m in ("I am furious!!!", "Tell me about cats.", "Sorry.")]
    for user in ("bob", "cy", "dee"):
        chat(client, user, "hello", max_tokens=2)

    listed = ok(client.get(ID))
    assert (listed["persona"], listed["total"]) == ("sia", 4)
    assert [i["user"] for i in listed["data"]] == ["ana", "bob", "cy", "dee"]
    page = ok(client.get(ID, params={"limit": 2, "offset": 1}))
    assert [i["user"] for i in page["data"]] == ["bob", "cy"] and (page["total"], page["limit"], page["offset"]) == (4, 2, 1)
    error(client.get(ID, params={"limit": 0}), 422, param="query.limit")
    error(client.get("/admin/personas/nobody/identities"), 404, "not_found")

    detail = ok(client.get(f"{ID}/ana"))
    record = services.store.get_identity("sia", "ana")
    assert (detail["version"], detail["state_version"], detail["turns"], detail["state_turns"]) == (4, 4, 3, 3)
    assert detail["shock"]["count"] == 3
    assert detail["shock"]["mean"] == pytest.approx(record.shock_mean)
    assert detail["shock"]["std"] == pytest.approx(math.sqrt(record.shock_m2 / 3))
    assert detail["state_sha256"] == record.state_sha256 and detail["busy"] is False
    _, state = services.identities.state("sia", "ana")
    cfg = services.identities.config
    assert detail["self_state"] == pytest.approx(state.self_state.tolist())
    assert detail["self_norm"] == pytest.approx(float(state.self_state.double().norm()))
    heads = detail["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [(i, j) for i in range(cfg.n_layer) for j in range(cfg.n_head)]
    rho = cfg.metric_max_deform
    for h in heads:
        t = state.trace[h["layer"], h["head"]].double()
        expected = torch.linalg.eigvalsh(0.5 * (t + t.T))
        assert h["eigenvalues"] == pytest.approx(expected.tolist(), abs=1e-9)
        assert h["eigenvalues"] == sorted(h["eigenvalues"]) and len(h["eigenvalues"]) == cfg.qk_dim
        assert h["trace_norm"] == pytest.approx(float(torch.linalg.matrix_norm(t)))
        p = expected.abs() / expected.abs().sum()
        entropy = float(-(p[p > 0] * p[p > 0].log()).sum())
        assert h["spectral_entropy"] == pytest.approx(entropy) and 0 < h["spectral_entropy"] <= math.log(cfg.qk_dim)
        assert all(1 - rho - 1e-9 <= e <= 1 + rho + 1e-9 for e in h["metric_eigenvalues"])
        assert h["metric_eigenvalues"] == sorted(h["metric_eigenvalues"])

    first = ok(client.get(f"{ID}/ana", params={"version": 1}))  # the fresh state: zero trace, zero self state
    assert (first["state_version"], first["state_turns"], first["version"], first["self_norm"]) == (1, 0, 4, 0.0)
    assert all(h["trace_norm"] == 0 and h["spectral_entropy"] == 0 and set(h["eigenvalues"]) == {0} for h in first["heads"])
    assert all(h["metric_eigenvalues"] == pytest.approx([1.0] * cfg.qk_dim) for h in first["heads"])
    error(client.get(f"{ID}/ana", params={"version": 99}), 404, "not_found")
    error(client.get(f"{ID}/ana", params={"version": 0}), 422, param="query.version")
    error(client.get(f"{ID}/nobody"), 404, "not_found")

    turns = ok(client.get(f"{ID}/ana/turns"))
    assert turns["total"] == 3 and [t["index"] for t in turns["data"]] == [0, 1, 2]
    assert [t["shock"] for t in turns["data"]] == pytest.approx(shocks)
    assert [t["message"] for t in turns["data"]] == ["I am furious!!!", "Tell me about cats.", "Sorry."]
    assert [(t["version_before"], t["version_after"]) for t in turns["data"]] == [(1, 2), (2, 3), (3, 4)]
    page = ok(client.get(f"{ID}/ana/turns", params={"limit": 1, "offset": 2}))
    assert [t["message"] for t in page["data"]] == ["Sorry."] and page["total"] == 3
    error(client.get(f"{ID}/nobody/turns"), 404, "not_found")


def test_plot_is_a_png(client: TestClient) -> None:
    for message in ("I am furious!!!", "Tell me about cats."):
        chat(client, "ana", message, **GREEDY)
    r = client.get(f"{ID}/ana/plot.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.content.startswith(b"\x89PNG\r\n\x1a\n") and 10_000 < len(r.content) < 1_000_000
    width, height = int.from_bytes(r.content[16:20], "big"), int.from_bytes(r.content[20:24], "big")
    assert (width, height) == (960, 640)  # 12 x 8 inches at 80 dpi
    import_random(client, "new")  # no turns yet: the shock panel is empty, the figure still draws
    assert client.get(f"{ID}/new/plot.png").content.startswith(b"\x89PNG")
    error(client.get(f"{ID}/nobody/plot.png"), 404, "not_found")


# --- state -------------------------------------------------------------------------------------------------------


def test_export_import_round_trip_is_bit_exact(client: TestClient) -> None:
    services = services_of(client)
    blob = state_to_bytes(random_state(services.identities.config, seed=3))
    r = client.put(f"{ID}/bob/state", content=blob, headers={"content-type": "application/octet-stream"})
    assert ok(r) == {"version": 2}  # created at version 1, imported as version 2
    r = client.get(f"{ID}/bob/state")
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert r.content == blob and r.headers["x-sia-state-version"] == "2"
    old = client.get(f"{ID}/bob/state", params={"version": 1})
    assert (
        old.content == state_to_bytes(IdentityState.fresh(services.identities.config))
        and old.headers["x-sia-state-version"] == "1"
    )
    # re-importing an export changes nothing but the version
    assert ok(client.put(f"{ID}/bob/state", content=r.content)) == {"version": 3}
    assert client.get(f"{ID}/bob/state").content == blob

    assert "not valid safetensors" in error(client.put(f"{ID}/bob/state", content=b"\x00" * 64), 422, "invalid_state")["message"]
    wrong = state_to_bytes(IdentityState.fresh(tiny_config(n_head=4)))
    assert "shape" in error(client.put(f"{ID}/bob/state", content=wrong), 422, "invalid_state")["message"]
    assert client.get(f"{ID}/bob/state").headers["x-sia-state-version"] == "3"  # bad imports wrote nothing
    error(client.put("/admin/personas/nobody/identities/bob/state", content=blob), 404, "not_found")
    error(client.get(f"{ID}/nobody/state"), 404, "not_found")
    error(client.get(f"{ID}/bob/state", params={"version": 42}), 404, "not_found")
    error(client.put(f"{ID}/bob/state", content=b"x" * (70 * 1024)), 413, "body_too_large")


def test_reset_then_the_same_seed_reproduces_a_fresh_identity(client: TestClient) -> None:
    chat(client, "a", "I am furious, this is the worst day ever!!", **GREEDY)
    chat(client, "a", "Tell me about cats and dogs.", **GREEDY)
    probe = {"max_tokens": 12, "temperature": 1.0, "seed": 7}
    fresh = chat(client, "fresh", "What do you know about me?", **probe)
    assert ok(client.post(f"{ID}/a/reset")) == {"version": 4}
    after = chat(client, "a", "What do you know about me?", **probe)
    assert (after["reply"], after["shock"], after["turn"]) == (fresh["reply"], fresh["shock"], 2)
    assert client.get(f"{ID}/a/state").content == client.get(f"{ID}/fresh/state").content
    error(client.post(f"{ID}/nobody/reset"), 404, "not_found")


def test_partial_resets(client: TestClient) -> None:
    services = services_of(client)
    import_random(client, "u", seed=1)
    _, before = services.identities.state("sia", "u")
    assert ok(client.post(f"{ID}/u/reset", json={"layers": [1]})) == {"version": 3}
    _, after = services.identities.state("sia", "u")
    assert torch.equal(after.trace[0], before.trace[0]) and not after.trace[1].any()
    assert torch.equal(after.self_state, before.self_state)
    assert ok(client.post(f"{ID}/u/reset", json={"self_only": True})) == {"version": 4}
    _, after_s = services.identities.state("sia", "u")
    assert not after_s.self_state.any() and torch.equal(after_s.trace, after.trace)
    detail = error(client.post(f"{ID}/u/reset", json={"layers": [5]}), 400, "invalid_value")
    assert "layers must be" in detail["message"]
    history = ok(client.get(f"{ID}/u/history"))
    assert history["current"] == 4
    assert [(v["version"], v["reason"]) for v in history["data"]] == [
        (4, "reset:self"),
        (3, "reset:layers"),
        (2, "import"),
        (1, "init"),
    ]
    assert all(len(v["state_sha256"]) == 64 and v["turn_index"] is None for v in history["data"])
    error(client.get(f"{ID}/nobody/history"), 404, "not_found")


def test_diff_rollback_and_snapshots(client: TestClient) -> None:
    services = services_of(client)
    first = chat(client, "u", "My dog is called Rex.", **GREEDY)
    snap = ok(client.post(f"{ID}/u/snapshots", json={"name": "after-dog"}), 201)
    assert (snap["name"], snap["version"]) == ("after-dog", 2)
    error(client.post(f"{ID}/u/snapshots", json={"name": "after-dog"}), 409, "conflict")
    ok(client.post(f"{ID}/u/snapshots", json={"name": "fresh", "version": 1}), 201)
    error(client.post(f"{ID}/u/snapshots", json={"name": "gone", "version": 99}), 404, "not_found")
    chat(client, "u", "I hate everything!", **GREEDY)
    chat(client, "u", "Sorry about that.", **GREEDY)

    d = ok(client.get(f"{ID}/u/diff", params={"a": first["state_version"]}))
    expected = services.identities.diff("sia", "u", 2)
    assert (d["a"], d["b"], d["turns"]) == (2, 4, 2) == (expected.a, expected.b, expected.turns)
    assert (d["trace_norm"], d["self_norm"]) == (expected.trace_norm, expected.self_norm)  # JSON floats round-trip exactly
    assert all(x > 0 for row in d["trace_norm"] for x in row)
    _, sa = services.identities.state("sia", "u", 2)
    _, sb = services.identities.state("sia", "u", 4)
    torch.testing.assert_close(
        torch.tensor(d["trace_norm"], dtype=torch.float64), torch.linalg.matrix_norm(sb.trace.double() - sa.trace.double())
    )
    same = ok(client.get(f"{ID}/u/diff", params={"a": 3, "b": 3}))
    assert same["self_norm"] == 0.0 and same["turns"] == 0 and all(x == 0 for row in same["trace_norm"] for x in row)
    error(client.get(f"{ID}/u/diff"), 422, param="query.a")
    error(client.get(f"{ID}/u/diff", params={"a": 99}), 404, "not_found")

    assert ok(client.post(f"{ID}/u/rollback", json={"version": 2})) == {"version": 5}
    assert client.get(f"{ID}/u/state").content == client.get(f"{ID}/u/state", params={"version": 2}).content
    chat(client, "u", "Again.", **GREEDY)
    assert ok(client.post(f"{ID}/u/rollback", json={"snapshot": "fresh"})) == {"version": 7}
    assert client.get(f"{ID}/u/state").content == state_to_bytes(IdentityState.fresh(services.identities.config))
    reasons = [v["reason"] for v in ok(client.get(f"{ID}/u/history"))["data"][:3]]
    assert reasons == ["rollback:fresh", "turn", "rollback:2"]
    error(client.post(f"{ID}/u/rollback", json={"version": 99}), 404, "not_found")
    error(client.post(f"{ID}/u/rollback", json={"snapshot": "nope"}), 404, "not_found")

    listed = ok(client.get(f"{ID}/u/snapshots"))["data"]
    assert [(s["name"], s["version"]) for s in listed] == [("after-dog", 2), ("fresh", 1)]
    assert ok(client.delete(f"{ID}/u/snapshots/after-dog"), 204) is None
    error(client.delete(f"{ID}/u/snapshots/after-dog"), 404, "not_found")
    assert [s["name"] for s in ok(client.get(f"{ID}/u/snapshots"))["data"]] == ["fresh"]
    error(client.get(f"{ID}/nobody/snapshots"), 404, "not_found")


def test_cleanup_reports_ranks(client: TestClient) -> None:
    services = services_of(client)
    import_random(client, "u", seed=2)
    out = ok(client.post(f"{ID}/u/cleanup", json={"energy": 0.5}))
    d = services.identities.config.qk_dim
    assert out["version"] == 3
    assert all(0 < r < d for row in out["ranks"] for r in row) and len(out["ranks"]) == services.identities.config.n_layer
    assert all(0.5 <= e <= 1 for row in out["energy_kept"] for e in row)
    _, cleaned = services.identities.state("sia", "u")
    ranks = torch.linalg.matrix_rank(cleaned.trace.double(), rtol=1e-6)
    assert ranks.tolist() == out["ranks"]
    full = ok(client.post(f"{ID}/u/cleanup"))  # default energy 0.95 on an already cleaned trace keeps no more
    assert full["version"] == 4 and all(
        r <= r0 for row, row0 in zip(full["ranks"], out["ranks"], strict=True) for r, r0 in zip(row, row0, strict=True)
    )
    error(client.post(f"{ID}/nobody/cleanup"), 404, "not_found")


def test_state_changes_of_a_busy_identity_get_409(client: TestClient) -> None:
    services = services_of(client)
    chat(client, "held", "hello", max_tokens=2)
    lease = services.store.acquire("sia", "held")  # a turn holds the identity
    try:
        assert ok(client.get(f"{ID}", params={"limit": 1}))["data"][0]["busy"] is True
        for path, body in (("reset", None), ("cleanup", {"energy": 0.9})):
            r = client.post(f"{ID}/held/{path}", json=body)
            error(r, 409, "identity_busy")
            assert r.headers["retry-after"] == "1"
        error(client.put(f"{ID}/held/state", content=client.get(f"{ID}/held/state").content), 409, "identity_busy")
    finally:
        services.store.release(lease)
    assert ok(client.get(f"{ID}/held"))["version"] == 2  # nothing was written


# --- counterfactual ----------------------------------------------------------------------------------------------


def test_counterfactual_compares_two_states_and_persists_nothing(client: TestClient) -> None:
    import_random(client, "ana", seed=1)  # a history: an imported state, then a turn
    chat(client, "ana", "I am furious!!!", max_tokens=4, seed=1)
    before = ok(client.get(f"{ID}/ana"))
    history = ok(client.get(f"{ID}/ana/history"))
    sampling: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0, "seed": 5}
    body = {"message": "How are you today?", **sampling}

    out = ok(client.post(f"{ID}/ana/counterfactual", json=body))
    assert out["seed"] == 5 and out["current"]["state_version"] == 3 and out["other"]["state_version"] is None
    assert out["current"]["reply"] != out["other"]["reply"] and out["same"] is False
    assert out["current"]["shock"] != out["other"]["shock"]
    for side in ("current", "other"):
        usage = out[side]["usage"]
        assert usage["completion_tokens"] == 8 and usage["total_tokens"] == usage["prompt_tokens"] + 8

    # nothing persisted: same version, turns, history, state bytes
    after = ok(client.get(f"{ID}/ana"))
    assert (after["version"], after["turns"], after["state_sha256"]) == (
        before["version"],
        before["turns"],
        before["state_sha256"],
    )
    assert ok(client.get(f"{ID}/ana/history")) == history
    assert ok(client.get(f"{ID}/ana/turns"))["total"] == 1

    # deterministic, and each side is what a real turn would say
    assert ok(client.post(f"{ID}/ana/counterfactual", json=body)) == out
    fresh = chat(client, "fresh", "How are you today?", **sampling)
    assert (fresh["reply"], fresh["shock"]) == (out["other"]["reply"], pytest.approx(out["other"]["shock"]))
    real = chat(client, "ana", "How are you today?", **sampling)
    assert (real["reply"], real["shock"]) == (out["current"]["reply"], pytest.approx(out["current"]["shock"]))

    # against a retained version: version 1 is the persona's initial state
    v1 = ok(client.post(f"{ID}/ana/counterfactual", json={**body, "against": {"version": 1}}))
    assert v1["other"]["state_version"] == 1 and v1["other"]["reply"] == out["other"]["reply"]
    assert v1["current"]["state_version"] == 4
    assert ok(client.get(f"{ID}/ana"))["version"] == 4

    unseeded = ok(client.post(f"{ID}/ana/counterfactual", json={"message": "hi", "max_tokens": 2}))
    assert 0 <= unseeded["seed"] < 2**63  # a random seed, reported so the pair can be replayed

    error(client.post(f"{ID}/ana/counterfactual", json={**body, "against": {"version": 99}}), 404, "not_found")
    error(client.post(f"{ID}/nobody/counterfactual", json=body), 404, "not_found")
    error(client.post("/admin/personas/nobody/identities/ana/counterfactual", json=body), 404, "not_found")
    error(client.post(f"{ID}/ana/counterfactual", json={**body, "max_tokens": 10_000}), 422, "max_tokens_too_large")


def test_counterfactual_takes_an_inference_slot_and_is_counted_like_a_turn(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = client.app.state.serving  # type: ignore[attr-defined]
    slots: list[float] = []
    counterfactual = service.turns.counterfactual

    def watched(*args: Any, **kwargs: Any) -> Any:
        slots.append(service.limiter.borrowed_tokens)  # read in the worker thread, while the slot is held
        return counterfactual(*args, **kwargs)

    monkeypatch.setattr(service.turns, "counterfactual", watched)
    turn = chat(client, "ana", "hello", max_tokens=2, seed=1)
    out = ok(client.post(f"{ID}/ana/counterfactual", json={"message": "How are you?", "max_tokens": 3, "seed": 1}))
    error(client.post(f"{ID}/nobody/counterfactual", json={"message": "hi"}), 404, "not_found")
    assert slots == [1, 1]

    metrics = client.get("/metrics").text
    assert 'sia_turns_total{outcome="ok"} 2.0' in metrics  # the turn and the counterfactual
    assert 'sia_turns_total{outcome="error"} 1.0' in metrics  # the counterfactual of an unknown identity
    assert "sia_turn_seconds_count 2.0" in metrics
    assert "sia_shock_count 1.0" in metrics  # only the turn moved a state
    [completion] = [line for line in metrics.splitlines() if line.startswith('sia_tokens_total{kind="completion"}')]
    sides = out["current"]["usage"]["completion_tokens"] + out["other"]["usage"]["completion_tokens"]
    assert float(completion.split()[-1]) == turn["usage"]["completion_tokens"] + sides
