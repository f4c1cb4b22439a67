"""Dependencies routes declare: the settings, the services, the metrics, and who the caller is."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.api.errors import ApiError
from server.core.config import Settings
from server.observability import Metrics
from server.runtime.health import Health
from server.runtime.identities import Identities
from server.runtime.keys import Principal
from server.runtime.personas import Personas
from server.runtime.services import Services
from server.runtime.serving import TurnService

__all__ = [
    "AdminDep",
    "CallerDep",
    "HealthDep",
    "IdentitiesDep",
    "MetricsDep",
    "PersonasDep",
    "SettingsDep",
    "TurnServiceDep",
    "acting_user",
    "require_admin",
]


def get_app_settings(request: Request) -> Settings:
    """The settings the app was built with."""
    settings: Settings = request.app.state.settings
    return settings


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def get_turn_service(request: Request) -> TurnService:
    turns: TurnService = request.app.state.serving
    return turns


def get_identities(request: Request) -> Identities:
    return _services(request).identities


def get_personas(request: Request) -> Personas:
    return _services(request).personas


def get_health(request: Request) -> Health:
    return _services(request).health


def get_caller(request: Request) -> Principal:
    """The principal of the request's API key (``Authorization: Bearer <key>``); in development mode, anyone."""
    keys = _services(request).keys
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


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
TurnServiceDep = Annotated[TurnService, Depends(get_turn_service)]
IdentitiesDep = Annotated[Identities, Depends(get_identities)]
PersonasDep = Annotated[Personas, Depends(get_personas)]
HealthDep = Annotated[Health, Depends(get_health)]
CallerDep = Annotated[Principal, Depends(get_caller)]
AdminDep = Annotated[Principal, Depends(require_admin)]
