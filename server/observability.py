"""JSON logs with a request id, and Prometheus metrics.

Log lines are one JSON object each: user-supplied text (messages, user ids, paths) is escaped by the JSON
encoder, so it can never start a forged log line.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics", "configure_logging", "request_id"]

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id.get(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # repr-escape the message so a CR/LF inside user text cannot begin a new line
        message = record.getMessage().encode("unicode_escape").decode("ascii")
        return f"{record.levelname} {record.name} [{request_id.get()}]: {message}"


def configure_logging(level: str = "INFO", *, json_lines: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # the service logs each request itself
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


class Metrics:
    """The service's Prometheus metrics, in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sia_http_requests", "HTTP requests", ["method", "route", "status"], registry=r)
        self.request_seconds = Histogram("sia_http_request_seconds", "HTTP request latency", ["method", "route"], registry=r)
        self.turns = Counter("sia_turns", "turns by outcome (ok, busy, error, abandoned)", ["outcome"], registry=r)
        self.turn_seconds = Histogram(
            "sia_turn_seconds", "whole-turn latency", buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r
        )
        self.tokens = Counter("sia_tokens", "tokens processed", ["kind"], registry=r)
        self.shock = Histogram("sia_shock", "standardised shock of turns", buckets=(-4, -2, -1, 0, 1, 2, 4, 8), registry=r)
        self.errors = Counter("sia_errors", "error responses by type", ["type"], registry=r)
        self.busy = Counter("sia_busy_rejections", "turns refused because their identity stayed busy", registry=r)
        self.overloaded = Counter("sia_overloaded_rejections", "turns refused because the batch queue was full", registry=r)
        self.batch_size = Histogram(
            "sia_batch_size", "rows in each batched decode step", buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64), registry=r
        )
        self.batch_step_seconds = Histogram(
            "sia_batch_step_seconds",
            "time of one batched decode step (tokens/s: rate(sia_batch_tokens) or rows / step time)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.batch_tokens = Counter("sia_batch_tokens", "tokens decoded by the batch", registry=r)
        self.batch_queue = Gauge("sia_batch_queue_depth", "turns waiting for a place in the batch", registry=r)
        self.batch_rows = Gauge("sia_batch_rows", "rows decoding in the batch now", registry=r)
