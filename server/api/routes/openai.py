"""The OpenAI-compatible API: POST /v1/chat/completions and GET /v1/models.

``model`` is the persona's name and ``user`` the user id; only the last user message is read (the identity,
not the transcript, carries the history; system messages are ignored: the persona's preamble plays that
part). Streaming uses OpenAI's chunk format and ends with ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from server.api.bodies import check_limits
from server.api.deps import CallerDep, PersonasDep, SettingsDep, TurnServiceDep, acting_user
from server.api.errors import ApiError, error_body
from server.api.schemas import (
    ERROR_RESPONSES,
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ModelCard,
    ModelList,
    SiaTurnInfo,
    TokenLogprob,
    TopLogprob,
    Usage,
    requested_bias,
)
from server.errors import StoreError
from server.runtime.turns import CommittedTurn
from sia.model.generate import Sampling, StreamEvent
from sia.model.tokenizer import Tokenizer
from sia.personas import DEFAULT_PERSONA

router = APIRouter(prefix="/v1", tags=["openai"])


def _token(tok: Tokenizer, token_id: int, logprob: float) -> TopLogprob:
    """A token as OpenAI reports it: its text and its UTF-8 bytes (a token may hold part of a character)."""
    raw = tok.token_bytes(token_id)
    return TopLogprob(token=tok.token_text(token_id), logprob=logprob, bytes=None if raw is None else list(raw))


def _logprob(tok: Tokenizer, event: StreamEvent) -> TokenLogprob:
    top = [_token(tok, t, lp) for t, lp in event.top_logprobs]
    first = _token(tok, event.token, event.logprob)
    return TokenLogprob(token=first.token, logprob=first.logprob, bytes=first.bytes, top_logprobs=top)


def _request(body: ChatCompletionRequest, caller: CallerDep, settings: SettingsDep) -> tuple[str, str, Sampling]:
    user = acting_user(caller, body.user)
    users = [m for m in body.messages if m.role == "user"]
    if not users or body.messages[-1].role != "user":
        raise ApiError(400, "messages: the last message must be the user's new message", code="invalid_value", param="messages")
    message = users[-1].text()
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    check_limits(settings, message, max_tokens)
    stops = body.stop if isinstance(body.stop, list) else []
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        repetition_penalty=body.repetition_penalty,
        no_repeat_ngram=body.no_repeat_ngram,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        logit_bias=requested_bias(body.logit_bias),
        logit_bias_once=body.logit_bias_once,
        lowercase=body.lowercase,
        max_sentences=body.max_sentences,
        max_words=body.max_words,
        wind_down=body.wind_down,
        exclaim=body.exclaim,
        address=body.address,
        recall_temperature=body.recall_temperature,
        stop=tuple(stops),
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
    )
    return user, message, sampling


@router.get("/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(caller: CallerDep, personas: PersonasDep) -> ModelList:
    """Every persona, as an OpenAI model: the default persona first (a client that takes the first model talks to it),
    then the others by name."""
    listed = sorted(personas.list_personas(), key=lambda p: (p.name != DEFAULT_PERSONA, p.name))
    return ModelList(data=[ModelCard(id=p.name, created=int(p.created_at.timestamp())) for p in listed])


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}, "description": "the completion or its chunks"}},
)
async def chat_completions(
    body: ChatCompletionRequest, caller: CallerDep, turns: TurnServiceDep, settings: SettingsDep, request: Request
) -> object:
    """One turn of the identity (model, user), in OpenAI's format."""
    user, message, sampling = _request(body, caller, settings)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    want_logprobs = body.logprobs
    tok = turns.tokenizer
    stream = turns.stream(body.model, user, message, sampling, gone=None if body.stream else request.is_disconnected)
    first = await anext(stream, None)  # errors before the first token still get their status code

    if not body.stream:
        events = [] if first is None else [first]
        events += [event async for event in stream]
        return _completion(tok, completion_id, created, body.model, stream.outcome, events if want_logprobs else None)

    include_usage = body.stream_options is not None and body.stream_options.include_usage

    def chunk(
        delta: dict[str, object],
        finish: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
        usage: Usage | None = None,
        choices: bool = True,
    ) -> str:
        data: dict[str, object] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": body.model,
            "system_fingerprint": None,
            "choices": [],
        }
        if choices:
            lp = {"content": [x.model_dump() for x in logprobs]} if logprobs is not None else None
            data["choices"] = [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]
        if include_usage:
            data["usage"] = usage.model_dump() if usage is not None else None
        return f"data: {json.dumps(data)}\n\n"

    async def chunks() -> AsyncIterator[str]:
        event = first
        try:
            yield chunk({"role": "assistant", "content": ""})
            while event is not None:
                if event.text or want_logprobs:
                    yield chunk({"content": event.text}, logprobs=[_logprob(tok, event)] if want_logprobs else None)
                event = await anext(stream, None)
            out = stream.outcome
            yield chunk({}, finish=out.finish_reason)
            if include_usage:
                yield chunk({}, usage=_usage(out), choices=False)
            yield "data: [DONE]\n\n"
        except (StoreError, ValueError) as exc:
            yield f"data: {json.dumps(error_body(str(exc), 'api_error', type(exc).__name__))}\n\n"
        finally:
            await stream.aclose()

    return StreamingResponse(chunks(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _usage(out: CommittedTurn) -> Usage:
    return Usage.of(out.prompt_tokens, out.completion_tokens)


def _completion(
    tok: Tokenizer, cid: str, created: int, model: str, out: CommittedTurn, events: list[StreamEvent] | None
) -> ChatCompletion:
    logprobs = ChoiceLogprobs(content=[_logprob(tok, e) for e in events]) if events is not None else None
    return ChatCompletion(
        id=cid,
        created=created,
        model=model,
        choices=[Choice(message=AssistantMessage(content=out.reply), logprobs=logprobs, finish_reason=out.finish_reason)],
        usage=_usage(out),
        sia=SiaTurnInfo(turn=out.turn, shock=out.shock, state_version=out.state_version),
    )
