"""Alembic from Python: ``sia db upgrade`` / ``sia db current`` and the service's start-up use these."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from server.core.config import Settings
from server.db.engine import make_engine

__all__ = ["MIGRATIONS_DIR", "alembic_config", "current_revision", "downgrade", "head_revision", "upgrade"]

logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line per plugin otherwise

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = ROOT / "migrations"


def alembic_config(settings: Settings) -> Config:
    """An Alembic config pointing at migrations/ whose env.py uses ``settings`` (logging left to the caller)."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise RuntimeError(f"migrations not found at {MIGRATIONS_DIR}; run from a source checkout or the container image")
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["settings"] = settings
    config.attributes["configure_logging"] = False
    return config


def upgrade(settings: Settings, revision: str = "head") -> None:
    command.upgrade(alembic_config(settings), revision)


def downgrade(settings: Settings, revision: str) -> None:
    command.downgrade(alembic_config(settings), revision)


def head_revision(settings: Settings) -> str | None:
    return ScriptDirectory.from_config(alembic_config(settings)).get_current_head()


def current_revision(settings: Settings) -> str | None:
    """The revision the database is at, or None for an empty database."""
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
