"""What several routes share about request bodies: the limits a message is checked against, and the raw
octet-stream body (a serialised state) as OpenAPI describes it."""

from __future__ import annotations

from typing import Any

from server.api.errors import ApiError
from server.core.config import Settings

__all__ = ["OCTET_STREAM_BODY", "check_limits"]

OCTET_STREAM_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def check_limits(settings: Settings, message: str, max_tokens: int | None) -> None:
    """422 for a message longer than the settings allow or holding NUL, or a max_tokens above the cap."""
    if len(message) > settings.max_message_chars:
        raise ApiError(
            422, f"message: longer than {settings.max_message_chars} characters", code="message_too_long", param="message"
        )
    if "\x00" in message:
        raise ApiError(422, "message: must not contain NUL characters", code="invalid_value", param="message")
    if max_tokens is not None and max_tokens > settings.max_tokens_cap:
        raise ApiError(422, f"max_tokens: at most {settings.max_tokens_cap}", code="max_tokens_too_large", param="max_tokens")
