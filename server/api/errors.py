"""One error shape for every route: ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape).

Store and runtime errors map to statuses here, so routes never build error responses themselves.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.errors import DATABASE_UNAVAILABLE, BusyError, ConflictError, CorruptStateError, NotFoundError, OverloadedError
from server.runtime.serving import ClientGone

__all__ = ["ApiError", "error_body", "install_error_handlers"]

log = logging.getLogger("sia.api")


class ApiError(Exception):
    """An error a route raises on purpose: status, message and a machine-readable type/code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = headers


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _respond(
    request: Request,
    status: int,
    message: str,
    type: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.errors.labels(type=code or type).inc()
    return JSONResponse(error_body(message, type, code, param), status_code=status, headers=headers)


_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _respond(request, exc.status, exc.message, exc.type, exc.code, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        message = f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", "invalid request"))
        return _respond(request, 422, message, "invalid_request_error", "invalid_value", where or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = _STATUS_TYPES.get(exc.status_code, "api_error")
        return _respond(request, exc.status_code, str(exc.detail), kind, None, None, getattr(exc, "headers", None))

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> JSONResponse:
        # nobody reads this answer; 499 (client closed request) is what proxies log for it
        return _respond(request, 499, "the client disconnected; the turn was abandoned", "api_error", "client_gone")

    @app.exception_handler(NotFoundError)
    async def not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        return _respond(request, 404, str(exc), "not_found_error", "not_found")

    @app.exception_handler(BusyError)
    async def busy(request: Request, exc: BusyError) -> JSONResponse:
        request.app.state.metrics.busy.inc()
        return _respond(request, 409, str(exc), "conflict_error", "identity_busy", headers={"Retry-After": "1"})

    @app.exception_handler(OverloadedError)
    async def overloaded(request: Request, exc: OverloadedError) -> JSONResponse:
        request.app.state.metrics.overloaded.inc()
        return _respond(request, 503, str(exc), "service_unavailable", "overloaded", headers={"Retry-After": "1"})

    @app.exception_handler(ConflictError)
    async def conflict(request: Request, exc: ConflictError) -> JSONResponse:
        return _respond(request, 409, str(exc), "conflict_error", "conflict")

    @app.exception_handler(CorruptStateError)
    async def corrupt(request: Request, exc: CorruptStateError) -> JSONResponse:
        log.error("corrupt identity state: %s", exc)
        return _respond(request, 500, str(exc), "api_error", "corrupt_state")

    async def database_down(request: Request, exc: Exception) -> JSONResponse:
        log.error("database unavailable: %s", str(exc).splitlines()[0])
        return _respond(
            request,
            503,
            "the database is unavailable; retry later",
            "service_unavailable",
            "database_unavailable",
            headers={"Retry-After": "5"},
        )

    for unavailable in DATABASE_UNAVAILABLE:
        app.add_exception_handler(unavailable, database_down)

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError) -> JSONResponse:
        return _respond(request, 400, str(exc), "invalid_request_error", "invalid_value")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _respond(request, 500, "internal error; see the server log for this request id", "api_error", "internal_error")
