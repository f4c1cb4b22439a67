"""ASGI middleware: request ids, the request-body limit (chunked bodies too), access logs and HTTP metrics."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api.errors import error_body
from server.observability import Metrics, request_id

__all__ = ["RequestContext"]

log = logging.getLogger("sia.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestContext:
    """Assigns a request id (kept from a well-formed X-Request-ID), enforces ``max_body_bytes`` by counting
    what arrives (not only Content-Length), logs one line per request and records its metrics."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, metrics: Metrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get("x-request-id", "")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        token = request_id.set(rid)
        started = time.perf_counter()
        status = {"code": 500, "sent": False, "refused": False}

        async def send_with_id(message: Message) -> None:
            if status["refused"]:
                return  # the 413 already went out; whatever the app says afterwards is dropped
            if message["type"] == "http.response.start":
                status["code"], status["sent"] = message["status"], True
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            declared = headers.get("content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
                await self._too_large(send_with_id)
                return
            received = 0

            async def counting_receive() -> Message:
                nonlocal received
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > self.max_body_bytes:
                        # a chunked body past the limit: answer 413 now and tell the app the client left
                        if not status["sent"]:
                            await self._too_large(send_with_id)
                            status["refused"] = True
                        return {"type": "http.disconnect"}
                return message

            try:
                await self.app(scope, counting_receive, send_with_id)
            except Exception:
                if not status["refused"]:
                    raise
        finally:
            elapsed = time.perf_counter() - started
            route = _route(scope)
            self.metrics.requests.labels(method=scope["method"], route=route, status=str(status["code"])).inc()
            self.metrics.request_seconds.labels(method=scope["method"], route=route).observe(elapsed)
            log.info(
                "%s %s %d",
                scope["method"],
                scope.get("path", ""),
                status["code"],
                extra={"status": status["code"], "duration_ms": round(elapsed * 1000, 2), "route": route},
            )
            request_id.reset(token)

    async def _too_large(self, send: Send) -> None:
        body = json.dumps(
            error_body(f"request body exceeds {self.max_body_bytes} bytes", "request_too_large", "body_too_large")
        ).encode()
        self.metrics.errors.labels(type="body_too_large").inc()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _route(scope: Mapping[str, Any]) -> str:
    """The matched route's template (bounded label cardinality), or 'unmatched'."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"
