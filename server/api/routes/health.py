"""Operations: /healthz (the process is alive), /readyz (database and model ready), /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from server.api.deps import RuntimeDep

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers. Says nothing about the database."""
    return {"status": "ok"}


def _database_ready(request: Request) -> str | None:
    """None when the database answers and is migrated to this code's schema; otherwise why not."""
    runtime = request.app.state.runtime
    try:
        with runtime.store.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            current = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except Exception as exc:  # any failure to reach or read the database means not ready
        return f"database unavailable: {str(exc).splitlines()[0]}"
    head = request.app.state.schema_head
    if current != head:
        return f"database schema is at {current}, this service needs {head}: run `sia db upgrade`"
    return None


@router.get("/readyz", responses={503: {"description": "not ready, with the reason"}})
def readyz(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """Ready to serve turns: the database answers at the right schema revision and the model is loaded."""
    problem = _database_ready(request)
    if problem is not None:
        return JSONResponse({"status": "unavailable", "reason": problem}, status_code=503)
    return JSONResponse({"status": "ready", "model": runtime.config.attention, "parameters": request.app.state.parameters})


@router.get("/metrics", response_class=Response)
def metrics(request: Request) -> Response:
    """Prometheus text format: turns, latency histograms, tokens, shock, errors, busy rejections, HTTP requests."""
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
