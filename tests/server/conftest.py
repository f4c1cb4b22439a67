"""Store and runtime fixtures on SQLite and on the real PostgreSQL.

PostgreSQL tests use the server named by SIA_TEST_POSTGRES_URL (.ci/run sets it to the local server); each
test gets a database of its own, dropped afterwards. Without a reachable server those tests skip, saying why.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from server.core.config import Settings
from server.db import migrate
from server.runtime import Runtime
from server.store import Store
from sia.checkpoint import save_checkpoint
from sia.model import SIAModel
from tests.conftest import sharpen, tiny_config

POSTGRES_ENV = "SIA_TEST_POSTGRES_URL"


def _postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set; set it to a PostgreSQL server URL to run the PostgreSQL tests")
    return url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test."""
    admin_url = make_url(_postgres_admin_url()).set(drivername="postgresql+psycopg")
    name = f"sia_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # no server reachable: the PostgreSQL half of the suite cannot run here
        admin.dispose()
        pytest.skip(f"PostgreSQL at {admin_url.render_as_string(hide_password=True)} is not usable: {exc}")
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


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


def tiny_model() -> SIAModel:
    torch.manual_seed(0)
    return sharpen(SIAModel(tiny_config(block_size=256)).eval())


@pytest.fixture
def runtime(store: Store) -> Runtime:
    rt = Runtime(tiny_model(), store)
    rt.ensure_default_personas()
    return rt


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> Path:
    """The tiny model saved as a checkpoint, for subprocesses."""
    return save_checkpoint(tiny_model(), tmp_path / "checkpoint")
