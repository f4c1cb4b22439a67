"""Store and services fixtures on SQLite and on the real PostgreSQL (``postgres_url``, in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from server.core.config import Settings
from server.db import migrate
from server.runtime.identities import Identities
from server.runtime.personas import Personas
from server.runtime.services import Services
from server.runtime.turns import TurnRunner
from server.store import Store
from tests.conftest import tiny_model


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sia.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, database_url=database_url, busy_timeout_s=5.0, history_retention=10)


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    migrate.upgrade(settings)
    s = Store(settings)
    yield s
    s.close()


@pytest.fixture
def services(store: Store) -> Services:
    built = Services.over(tiny_model(), store)
    built.personas.ensure_defaults()
    return built


@pytest.fixture
def personas(services: Services) -> Personas:
    return services.personas


@pytest.fixture
def identities(services: Services) -> Identities:
    return services.identities


@pytest.fixture
def turns(services: Services) -> TurnRunner:
    return services.turns
