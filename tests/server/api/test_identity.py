"""/v1/personas/{persona}/identity: a caller reads its own identity (a user key its own user only), as /admin shows it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.server.api.conftest import Keys, bearer

OWN = "/v1/personas/sia/identity"
ADMIN = "/admin/personas/sia/identities"


def test_a_user_key_reads_its_own_identity_as_the_admin_routes_show_it(client: TestClient, keys: Keys) -> None:
    for message in ("My favourite colour is green.", "And yours?"):
        r = client.post("/v1/personas/sia/chat", json={"message": message, "max_tokens": 4, "seed": 1}, headers=bearer(keys.ana))
        assert r.status_code == 200, r.text
    admin = bearer(keys.admin)
    for suffix, query in (("", ""), ("", "?version=2"), ("/turns", "?limit=1&offset=1"), ("/history", "")):
        mine = client.get(f"{OWN}{suffix}{query}", headers=bearer(keys.ana))
        assert mine.status_code == 200, mine.text
        assert mine.json() == client.get(f"{ADMIN}/ana{suffix}{query}", headers=admin).json()
    detail = client.get(OWN, headers=bearer(keys.ana)).json()
    assert (detail["user"], detail["turns"], detail["version"], detail["state_version"]) == ("ana", 2, 3, 3)
    assert client.get(f"{OWN}?version=2", headers=bearer(keys.ana)).json()["state_version"] == 2
    turns = client.get(f"{OWN}/turns?limit=1&offset=1", headers=bearer(keys.ana)).json()
    assert (turns["total"], [t["message"] for t in turns["data"]]) == (2, ["And yours?"])
    history = client.get(f"{OWN}/history", headers=bearer(keys.ana)).json()
    assert (history["current"], [v["reason"] for v in history["data"]]) == (3, ["turn", "turn", "init"])
    assert client.get(f"{OWN}?user=ana", headers=bearer(keys.ana)).json() == detail  # naming oneself is allowed


def test_another_users_identity_is_refused_and_admin_keys_name_the_user(client: TestClient, keys: Keys) -> None:
    r = client.post("/v1/personas/sia/chat", json={"message": "hi", "max_tokens": 2}, headers=bearer(keys.bob))
    assert r.status_code == 200, r.text
    for suffix in ("", "/turns", "/history"):
        r = client.get(f"{OWN}{suffix}?user=bob", headers=bearer(keys.ana))
        assert r.status_code == 403 and r.json()["error"]["code"] == "wrong_user", r.text
        assert client.get(f"{OWN}{suffix}?user=bob").status_code == 401
        assert client.get(f"{OWN}{suffix}?user=bob", headers=bearer(keys.admin)).status_code == 200
        r = client.get(f"{OWN}{suffix}", headers=bearer(keys.admin))
        assert r.status_code == 422 and r.json()["error"]["code"] == "missing_user"  # an admin key must say whose
        r = client.get(f"{OWN}{suffix}", headers=bearer(keys.ana))  # ana has no identity with this persona yet
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert client.get(f"{OWN}?user=bob&version=99", headers=bearer(keys.admin)).status_code == 404
    assert client.get("/v1/personas/nobody/identity", headers=bearer(keys.bob)).status_code == 404


def test_in_development_mode_the_user_is_named(client: TestClient) -> None:
    assert client.post("/v1/personas/sia/chat", json={"user": "cy", "message": "hi", "max_tokens": 2}).status_code == 200
    assert client.get(f"{OWN}?user=cy").json()["turns"] == 1
    assert client.get(OWN).status_code == 422
