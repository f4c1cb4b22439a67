"""Operations: /healthz (the process is alive), /readyz (database and model ready), /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.api.deps import HealthDep, MetricsDep

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers. Says nothing about the database."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "not ready, with the reason"}})
def readyz(health: HealthDep) -> JSONResponse:
    """Ready to serve turns: the database answers at the right schema revision and the model is loaded."""
    readiness = health.readiness()
    if not readiness.ready:
        return JSONResponse({"status": "unavailable", "reason": readiness.reason}, status_code=503)
    return JSONResponse({"status": "ready", "model": readiness.model, "parameters": readiness.parameters})


@router.get("/metrics", response_class=Response)
def metrics(recorded: MetricsDep) -> Response:
    """Prometheus text format: turns, latency histograms, tokens, shock, errors, busy rejections, HTTP requests."""
    return Response(generate_latest(recorded.registry), media_type=CONTENT_TYPE_LATEST)
