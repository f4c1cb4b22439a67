from __future__ import annotations

import json
import math

from fastapi.testclient import TestClient

from sia.personas import DEFAULT_PERSONA
from tests.server.api.conftest import Keys, bearer


def completion(client: TestClient, user: str, content: str, **extra: object) -> dict[str, object]:
    body = {
        "model": "sia",
        "user": user,
        "messages": [{"role": "system", "content": "ignored"}, {"role": "user", "content": content}],
    }
    r = client.post("/v1/chat/completions", json={**body, **extra})
    assert r.status_code == 200, r.text
    result: dict[str, object] = r.json()
    return result


def test_completion_shape_and_logprobs(client: TestClient) -> None:
    out = completion(client, "ana", "Hello there", max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    assert out["object"] == "chat.completion" and out["model"] == "sia" and str(out["id"]).startswith("chatcmpl-")
    [choice] = out["choices"]  # type: ignore[misc]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    content = choice["logprobs"]["content"]
    assert 1 <= len(content) <= 6
    for entry in content:
        tops = entry["top_logprobs"]
        assert len(tops) == 3 and tops[0]["logprob"] == entry["logprob"]  # greedy: the chosen token is the top one
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
    visible = bytes(b for e in content if e["bytes"] for b in e["bytes"]).decode("utf-8", errors="replace")
    assert visible == choice["message"]["content"]
    assert out["usage"]["completion_tokens"] == len(content)  # type: ignore[index]
    assert out["sia"] == {"turn": 0, "shock": out["sia"]["shock"], "state_version": 2}  # type: ignore[index]
    no_lp = completion(client, "ana", "Hello there", max_tokens=3)
    assert no_lp["choices"][0]["logprobs"] is None  # type: ignore[index]


def test_history_changes_the_distribution(client: TestClient) -> None:
    for message in ("I am furious!!! Everything is awful!", "Why does nobody listen to me?", "I hate this."):
        completion(client, "angry", message, max_tokens=4, seed=1)
    probe = {"max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 5}
    angry = completion(client, "angry", "How are you today?", **probe)
    fresh = completion(client, "fresh", "How are you today?", **probe)
    a = angry["choices"][0]["logprobs"]["content"][0]["top_logprobs"]  # type: ignore[index]
    f = fresh["choices"][0]["logprobs"]["content"][0]["top_logprobs"]  # type: ignore[index]
    gap = (
        max(abs(x["logprob"] - y["logprob"]) for x, y in zip(a, f, strict=True))
        if [x["token"] for x in a] == [y["token"] for y in f]
        else math.inf
    )
    assert gap > 1e-3  # the same prompt, different histories: a different next-token distribution


def test_streaming_chunks_end_with_done(client: TestClient) -> None:
    body = {
        "model": "sia",
        "user": "s",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "max_tokens": 8,
        "seed": 3,
        "stream_options": {"include_usage": True},
        "logprobs": True,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = [line for line in "".join(r.iter_text()).split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] >= 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert usage["completion_tokens"] == sum(1 for c in chunks if c["choices"] and c["choices"][0]["logprobs"])
    replay = completion(client, "s2", "Hi", max_tokens=8, seed=3)
    assert text == replay["choices"][0]["message"]["content"]  # type: ignore[index]


def test_models_list_personas_the_default_first(client: TestClient) -> None:
    assert client.post("/admin/personas", json={"name": "aaron"}).status_code == 201  # sorts before the default
    r = client.get("/v1/models")
    assert r.status_code == 200
    ids = [m["id"] for m in r.json()["data"]]
    assert ids[0] == DEFAULT_PERSONA == "sia" and r.json()["object"] == "list"
    assert ids[1:] == sorted(ids[1:]) and "aaron" in ids


def _token_ids(client: TestClient, user: str, **extra: object) -> list[tuple[int, ...]]:
    """The reply's tokens, each as its bytes (a byte token's text may be the replacement character)."""
    out = completion(client, user, "Hello there", max_tokens=24, temperature=0, logprobs=True, top_logprobs=1, **extra)
    return [tuple(e["bytes"] or ()) for e in out["choices"][0]["logprobs"]["content"]]  # type: ignore[index]


def test_repetition_controls_are_request_fields_and_persona_defaults(client: TestClient) -> None:
    """no_repeat_ngram=1 bans every token already generated: a greedy reply that repeats tokens (the tiny model loops)
    then holds each token once, whether the request or the persona asks for it."""
    loose = _token_ids(client, "a")
    assert len(set(loose)) < len(loose)
    assert len(set(banned := _token_ids(client, "b", no_repeat_ngram=1))) == len(banned)
    assert _token_ids(client, "c", repetition_penalty=1.0, no_repeat_ngram=0) == loose  # off is off
    assert _token_ids(client, "d", repetition_penalty=3.0) != loose
    assert client.patch("/admin/personas/sia", json={"no_repeat_ngram": 1}).status_code == 200
    assert _token_ids(client, "e") == banned
    assert _token_ids(client, "f", no_repeat_ngram=0) == loose  # the request overrides the persona


def test_openai_penalties_and_logit_bias_are_request_fields(client: TestClient) -> None:
    """frequency_penalty, presence_penalty and logit_bias change the greedy reply as OpenAI defines them: a bias of -100
    keeps a token out, one of +100 makes every token it; zero penalties and an empty bias are off."""
    loose = _token_ids(client, "a")
    assert _token_ids(client, "b", frequency_penalty=0, presence_penalty=0, logit_bias={}) == loose
    assert len(set(_token_ids(client, "c", frequency_penalty=2))) > len(set(loose))  # the looping token counts against itself
    first = loose[0][0]  # the byte model's token ids 0..255 are the bytes themselves
    reply = completion(client, "d", "Hello there", max_tokens=6, temperature=0, logit_bias={"100": 100})
    assert reply["choices"][0]["message"]["content"] == "Dddddd"  # type: ignore[index]  # its first letter a capital
    banned = _token_ids(client, "e", logit_bias={str(first): -100})
    assert (first,) not in banned and banned != loose


def test_logit_bias_once_holds_a_bias_until_the_reply_holds_its_token(client: TestClient) -> None:
    """Biases of +100 on "d" and +50 on "x" (the byte model's tokens 100 and 120) make every greedy token "d"; with
    logit_bias_once "d" is said once, then "x" (its bias still holds), whether the request or the persona asks for it."""
    bias = {"100": 100, "120": 50}
    always = _token_ids(client, "a", logit_bias=bias)
    assert always == [(100,)] * 24
    once = _token_ids(client, "b", logit_bias=bias, logit_bias_once=True)
    assert once[:2] == [(100,), (120,)] and (100,) not in once[1:]
    assert _token_ids(client, "c", logit_bias=bias, logit_bias_once=False) == always  # off is off
    assert client.patch("/admin/personas/sia", json={"logit_bias": bias, "logit_bias_once": True}).status_code == 200
    assert _token_ids(client, "d") == once
    assert _token_ids(client, "e", logit_bias_once=False) == always  # the request overrides the persona


def test_bad_reply_forms_are_refused(client: TestClient) -> None:
    for extra, param in (
        ({"lowercase": "maybe"}, "lowercase"),
        ({"max_sentences": -1}, "max_sentences"),
        ({"max_words": -1}, "max_words"),
        ({"logit_bias_once": "maybe"}, "logit_bias_once"),
        ({"recall_temperature": -1}, "recall_temperature"),
        ({"exclaim": "loudly"}, "exclaim"),
        ({"address": ", 42"}, "address"),
    ):
        body = {"model": "sia", "user": "u", "messages": [{"role": "user", "content": "x"}], **extra}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 422 and r.json()["error"]["param"] == param, (extra, r.text)


def test_bad_repetition_controls_are_refused(client: TestClient) -> None:
    body = {"model": "sia", "user": "u", "messages": [{"role": "user", "content": "x"}]}
    for extra, param in (
        ({"repetition_penalty": 0.5}, "repetition_penalty"),
        ({"repetition_penalty": "lots"}, "repetition_penalty"),
        ({"no_repeat_ngram": -1}, "no_repeat_ngram"),
        ({"no_repeat_ngram": 1.5}, "no_repeat_ngram"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"logit_bias": {"12": 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ):
        r = client.post("/v1/chat/completions", json={**body, **extra})
        assert r.status_code == 422 and r.json()["error"]["param"] == param, (extra, r.text)
    r = client.post("/v1/chat/completions", json={**body, "logit_bias": {"260": 1}})  # the byte model has 260 tokens
    assert r.status_code == 400 and "not in the model's vocabulary of 260" in r.json()["error"]["message"]


def test_openai_errors(client: TestClient, keys: Keys) -> None:
    h = bearer(keys.admin)
    r = client.post(
        "/v1/chat/completions", json={"model": "nobody", "user": "u", "messages": [{"role": "user", "content": "x"}]}, headers=h
    )
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = client.post("/v1/chat/completions", json={"model": "sia", "user": "u", "messages": []}, headers=h)
    assert r.status_code == 422
    r = client.post(
        "/v1/chat/completions",
        json={"model": "sia", "user": "u", "n": 2, "messages": [{"role": "user", "content": "x"}]},
        headers=h,
    )
    assert r.status_code == 422 and r.json()["error"]["param"] == "n"
    r = client.post(
        "/v1/chat/completions",
        json={"model": "sia", "user": "u", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
        headers=h,
    )
    assert r.status_code == 400
    r = client.post("/v1/chat/completions", json={"model": "sia", "messages": [{"role": "user", "content": "x"}]}, headers=h)
    assert r.status_code == 422 and r.json()["error"]["param"] == "user"
    r = client.post(
        "/v1/chat/completions",
        json={"model": "sia", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
        headers=bearer(keys.ana),
    )
    assert r.status_code == 200  # the user key names the user
    assert client.get("/v1/models").status_code == 401
