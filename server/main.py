"""The FastAPI application: ``create_app(settings)``; the model, the store and the services over them are built
once, in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from server.api.errors import install_error_handlers
from server.api.middleware import RequestContext
from server.api.routes import admin, chat, health, identity, openai, web
from server.core.config import Settings, get_settings
from server.observability import Metrics
from server.runtime.batcher import Batcher, available_cores
from server.runtime.services import Services, served_model
from server.runtime.serving import TurnService
from server.store import Store
from sia.model.identity_model import IdentityModel

__all__ = ["create_app"]

log = logging.getLogger("sia.server")


def create_app(settings: Settings | None = None, *, model: IdentityModel | None = None) -> FastAPI:
    """The service. ``model`` replaces the checkpoint named by the settings (tests pass a tiny one)."""
    settings = settings or get_settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        torch.set_num_threads(settings.torch_threads)
        services = Services.over(served_model(settings, model), Store(settings))
        app.state.services = services
        batcher = None
        if settings.max_batch:
            batcher = Batcher(
                services.turns.model,
                max_batch=settings.max_batch,
                max_queue=settings.max_queued_turns,
                wait_s=settings.batch_wait_ms / 1000,
                threads=settings.batch_threads or available_cores(),
                metrics=metrics,
            ).start()
        serving = TurnService(services.turns, metrics, settings.max_concurrent_turns, batcher)
        app.state.serving = serving
        try:
            if services.health.at_schema_head():
                created = services.personas.ensure_defaults()
                if created:
                    log.info("created the default personas: %s", ", ".join(created))
                if services.keys.dev_mode():
                    log.warning("development mode: no API key exists, so every request is allowed (`sia keys create`)")
            else:
                log.error("the database is not migrated to %s; /readyz fails until `sia db upgrade`", services.health.schema_head)
        except Exception as exc:  # the database may come up later; /readyz reports it meanwhile
            log.error("database unavailable at start-up: %s", str(exc).splitlines()[0])
        try:
            yield
        finally:
            serving.close()
            services.close()

    app = FastAPI(
        title="SIA",
        summary="The stateful identity-attention runtime: per-identity Trace Tensor Attention state behind a chat API.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(openai.router)
    app.include_router(health.router)
    app.include_router(identity.router)
    app.include_router(admin.router)
    app.include_router(web.router)
    app.mount("/web", web.assets, name="web")
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            allow_headers=["authorization", "content-type", "x-request-id"],
        )
    app.add_middleware(RequestContext, max_body_bytes=settings.max_body_bytes, metrics=metrics)
    return app
