"""Schema fuzzing of the whole OpenAPI spec: no server errors, and every response matches the schema."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from server.core.config import Settings
from server.db import migrate
from server.main import create_app
from tests.conftest import tiny_model

DATA = Path(tempfile.mkdtemp(prefix="sia-fuzz-"))
CONFIG = Settings(data_dir=DATA, max_tokens_cap=8, max_message_chars=500, busy_timeout_s=0.2)
APP = create_app(CONFIG, model=tiny_model())
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def running_app() -> Iterator[None]:
    """Migrate, then run the app's lifespan (model, store, default personas) around the whole module."""
    migrate.upgrade(CONFIG)
    with TestClient(APP):
        yield
    shutil.rmtree(DATA, ignore_errors=True)


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_responses_match_the_schema(case: schemathesis.Case) -> None:
    if "persona" in (case.path_parameters or {}):
        case.path_parameters["persona"] = "sia"  # reach the routes' logic, not only their 404
    case.call_and_validate(
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_headers_conformance,
            response_schema_conformance,
        ]
    )
