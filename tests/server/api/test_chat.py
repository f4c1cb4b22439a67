from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.server.api.conftest import Keys, bearer


def chat(client: TestClient, user: str, message: str, **extra: object) -> dict[str, object]:
    r = client.post("/v1/personas/sia/chat", json={"user": user, "message": message, **extra})
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def test_chat_turns_advance_the_identity(client: TestClient) -> None:
    first = chat(client, "ana", "Hi, I'm Ana. My favourite colour is green.", max_tokens=8, temperature=0)
    assert (first["turn"], first["state_version"]) == (0, 2)
    assert set(first) == {"reply", "finish_reason", "turn", "shock", "state_version", "usage"}
    usage = first["usage"]
    assert isinstance(usage, dict) and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 8
    second = chat(client, "ana", "What's my favourite colour?", max_tokens=8, temperature=0)
    assert (second["turn"], second["state_version"]) == (1, 3)
    assert r"x-request-id" in client.post("/v1/personas/sia/chat", json={"user": "x", "message": "hi"}).headers


def test_same_seed_same_reply_and_reset_reproduces_a_fresh_identity(client: TestClient) -> None:
    a = chat(client, "u1", "Tell me a story.", max_tokens=12, temperature=1.0, seed=5)
    b = chat(client, "u2", "Tell me a story.", max_tokens=12, temperature=1.0, seed=5)
    assert (a["reply"], a["shock"]) == (b["reply"], b["shock"])


def test_a_bias_once_holds_until_the_reply_holds_its_token(client: TestClient) -> None:
    """Biases of +100 on "d" and +50 on "x" make every greedy token "d"; with logit_bias_once "d" holds its bias only
    until said, and "x" follows. (The reply's first letter is written as a capital: it is not written in lower case.)"""
    biased = {"max_tokens": 6, "temperature": 0, "logit_bias": {"100": 100, "120": 50}}
    assert chat(client, "a", "Hello there", **biased)["reply"] == "Dddddd"
    assert chat(client, "a2", "Hello there", **biased, lowercase=True)["reply"] == "dddddd"
    once = chat(client, "b", "Hello there", **biased, logit_bias_once=True)["reply"]
    assert isinstance(once, str) and once.startswith("Dx") and "d" not in once[1:].lower()


def test_streaming_sends_tokens_then_done(client: TestClient) -> None:
    with client.stream(
        "POST", "/v1/personas/sia/chat", json={"user": "s", "message": "Hello!", "stream": True, "max_tokens": 10, "seed": 1}
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    events = [block.split("\n", 1) for block in text.strip().split("\n\n")]
    kinds = [e[0].removeprefix("event: ") for e in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"token"} and len(kinds) >= 2
    tokens = [json.loads(e[1].removeprefix("data: ")) for e in events[:-1]]
    done = json.loads(events[-1][1].removeprefix("data: "))
    assert "".join(t["text"] for t in tokens) == done["reply"]
    assert all(t["logprob"] <= 0 for t in tokens)
    assert done["turn"] == 0 and done["state_version"] == 2 and done["usage"]["completion_tokens"] == len(tokens)


def test_streaming_errors_before_the_first_token_keep_their_status(client: TestClient) -> None:
    r = client.post("/v1/personas/nobody/chat", json={"user": "s", "message": "Hello!", "stream": True})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"user": "u", "message": "x", "temperature": -1}, "temperature"),
        ({"user": "u", "message": "x", "max_tokens": 0}, "max_tokens"),
        ({"user": "u"}, "message"),
        ({"user": "", "message": "x"}, "user"),
        ({"user": "a\r\nb", "message": "x"}, "user"),
        ({"user": "u", "message": "x", "unknown": 1}, "unknown"),
        ({"user": "u", "message": 5}, "message"),
        ({"user": "u", "message": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"user": "u", "message": "x", "repetition_penalty": 0.9}, "repetition_penalty"),
        ({"user": "u", "message": "x", "no_repeat_ngram": -2}, "no_repeat_ngram"),
        ({"user": "u", "message": "x", "presence_penalty": 2.1}, "presence_penalty"),
        ({"user": "u", "message": "x", "logit_bias": {"1": -100.5}}, "logit_bias"),
        ({"user": "u", "message": "x", "logit_bias_once": "maybe"}, "logit_bias_once"),
        ({"user": "u", "message": "x", "recall_temperature": 5.5}, "recall_temperature"),
        ({"user": "u", "message": "x", "exclaim": "loudly"}, "exclaim"),
        ({"user": "u", "message": "x", "address": "x" * 41}, "address"),
    ],
)
def test_invalid_bodies_are_422_with_the_error_shape(client: TestClient, body: dict[str, object], param: str) -> None:
    r = client.post("/v1/personas/sia/chat", json=body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_limits(client: TestClient) -> None:
    settings = client.app.state.settings  # type: ignore[attr-defined]
    too_long = "x" * (settings.max_message_chars + 1)
    r = client.post("/v1/personas/sia/chat", json={"user": "u", "message": too_long})
    assert r.status_code == 422 and r.json()["error"]["code"] == "message_too_long"
    r = client.post("/v1/personas/sia/chat", json={"user": "u", "message": "x", "max_tokens": settings.max_tokens_cap + 1})
    assert r.status_code == 422 and r.json()["error"]["code"] == "max_tokens_too_large"
    r = client.post("/v1/personas/sia/chat", json={"user": "u", "message": "a\u0000b"})
    assert r.status_code == 422
    big = b'{"user": "u", "message": "' + b"x" * settings.max_body_bytes + b'"}'
    r = client.post("/v1/personas/sia/chat", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"user": "u", "message": "'
        for _ in range(settings.max_body_bytes // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    r = client.post("/v1/personas/sia/chat", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413  # no Content-Length: counted as it arrives
    r = client.post("/v1/personas/sia/chat", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert client.get("/v1/personas/sia/chat").status_code == 405


def test_busy_identity_gets_409(client: TestClient) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    chat(client, "held", "hello", max_tokens=2)
    lease = services.store.acquire("sia", "held")  # another turn holds the identity
    try:
        r = client.post("/v1/personas/sia/chat", json={"user": "held", "message": "hi"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "identity_busy" and r.headers["retry-after"]
    finally:
        services.store.release(lease)
    assert "sia_busy_rejections_total 1.0" in client.get("/metrics").text


def test_user_keys_act_only_as_their_user(client: TestClient, keys: Keys) -> None:
    url = "/v1/personas/sia/chat"
    assert client.post(url, json={"user": "ana", "message": "hi"}).status_code == 401
    r = client.post(url, json={"user": "ana", "message": "hi"}, headers=bearer("sia_wrong"))
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = client.post(url, json={"user": "ana", "message": "hi", "max_tokens": 2}, headers=bearer(keys.ana))
    assert r.status_code == 200
    r = client.post(url, json={"message": "hi", "max_tokens": 2}, headers=bearer(keys.ana))  # the key names the user
    assert r.status_code == 200 and r.json()["turn"] == 1
    r = client.post(url, json={"user": "ana", "message": "hi"}, headers=bearer(keys.bob))
    assert r.status_code == 403 and r.json()["error"]["code"] == "wrong_user"
    r = client.post(url, json={"user": "bob", "message": "hi", "max_tokens": 2}, headers=bearer(keys.admin))
    assert r.status_code == 200  # an admin may act as anyone
    ring = client.app.state.services.keys  # type: ignore[attr-defined]
    [bob_key] = [k for k in ring.list() if k.user_id == "bob"]
    ring.revoke(bob_key.id)
    assert client.post(url, json={"message": "hi"}, headers=bearer(keys.bob)).status_code == 401
