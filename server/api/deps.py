"""Dependencies routes declare: the settings, the runtime, the turn service, and who the caller is."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.api.errors import ApiError
from server.auth import KeyRing, Principal
from server.core.config import Settings
from server.runtime import Runtime
from server.serving import TurnService

__all__ = ["AdminDep", "CallerDep", "RuntimeDep", "SettingsDep", "TurnsDep", "acting_user"]


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_turns(request: Request) -> TurnService:
    turns: TurnService = request.app.state.turns
    return turns


def get_caller(request: Request) -> Principal:
    """The principal of the request's API key (``Authorization: Bearer <key>``); in development mode, anyone."""
    keys: KeyRing = request.app.state.keys
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if keys.dev_mode():
        return Principal(role="dev")
    if not header:
        raise ApiError(
            401,
            "an API key is required: send 'Authorization: Bearer <key>'",
            type="authentication_error",
            code="missing_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = keys.verify(key.strip()) if scheme.lower() == "bearer" else None
    if principal is None:
        raise ApiError(
            401,
            "the API key is not valid",
            type="authentication_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


def require_admin(caller: Annotated[Principal, Depends(get_caller)]) -> Principal:
    if not caller.is_admin:
        raise ApiError(403, "this route needs an admin key", type="permission_error", code="admin_only")
    return caller


def acting_user(caller: Principal, user: str | None) -> str:
    """The user a request acts as: the key's own user, or the one named (admin keys and development mode)."""
    if caller.role == "user":
        assert caller.user_id is not None
        if user is not None and user != caller.user_id:
            raise ApiError(403, "this key may only act as its own user", type="permission_error", code="wrong_user", param="user")
        return caller.user_id
    if user is None:
        raise ApiError(422, "user: required (the user id whose identity this turn belongs to)", code="missing_user", param="user")
    return user


SettingsDep = Annotated[Settings, Depends(get_settings)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
TurnsDep = Annotated[TurnService, Depends(get_turns)]
CallerDep = Annotated[Principal, Depends(get_caller)]
AdminDep = Annotated[Principal, Depends(require_admin)]
