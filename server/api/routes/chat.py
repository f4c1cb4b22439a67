"""POST /v1/personas/{persona}/chat: one turn with a persona, as JSON or as Server-Sent Events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from server.api.bodies import check_limits
from server.api.deps import CallerDep, SettingsDep, TurnServiceDep, acting_user
from server.api.errors import error_body
from server.api.schemas import ERROR_RESPONSES, ChatRequest, ChatResponse, Usage
from server.errors import StoreError
from server.runtime.turns import CommittedTurn

router = APIRouter(prefix="/v1/personas", tags=["chat"])


def chat_response(out: CommittedTurn) -> ChatResponse:
    return ChatResponse(
        reply=out.reply,
        finish_reason=out.finish_reason,
        turn=out.turn,
        shock=out.shock,
        state_version=out.state_version,
        usage=Usage.of(out.prompt_tokens, out.completion_tokens),
    )


def sse(event: str, data: object) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


@router.post(
    "/{persona}/chat",
    response_model=ChatResponse,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}, "description": "the turn, or its event stream"}},
)
async def chat(
    persona: str, body: ChatRequest, caller: CallerDep, turns: TurnServiceDep, settings: SettingsDep, request: Request
) -> object:
    """Send a message to a persona as a user: the identity (persona, user) answers and is updated."""
    user = acting_user(caller, body.user)
    check_limits(settings, body.message, body.max_tokens)
    sampling = body.sampling()
    if not body.stream:
        return chat_response(await turns.turn(persona, user, body.message, sampling, gone=request.is_disconnected))

    stream = turns.stream(persona, user, body.message, sampling)
    first = await anext(stream, None)  # errors before the first token (404, 409, ...) still get a status code

    async def events() -> AsyncIterator[str]:
        event = first
        try:
            while event is not None:
                yield sse("token", {"text": event.text, "token": event.token, "logprob": event.logprob})
                event = await anext(stream, None)
            yield sse("done", chat_response(stream.outcome).model_dump())
        except (StoreError, ValueError) as exc:
            yield sse("error", error_body(str(exc), "api_error", type(exc).__name__))
        finally:
            await stream.aclose()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
