from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, inspect

from server.core.config import Settings
from server.db import migrate
from server.db.engine import make_engine
from server.db.tables import Base

TABLES = {"personas", "identities", "turns", "state_versions", "snapshots", "api_keys"}


def _tables(settings: Settings) -> set[str]:
    engine = make_engine(settings)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_and_downgrade(settings: Settings) -> None:
    assert migrate.current_revision(settings) is None
    migrate.upgrade(settings)
    assert migrate.current_revision(settings) == migrate.head_revision(settings) == "0002"
    assert _tables(settings) == TABLES
    migrate.downgrade(settings, "base")
    assert migrate.current_revision(settings) is None
    assert _tables(settings) == set()
    migrate.upgrade(settings)  # and up again, from empty
    assert _tables(settings) == TABLES


def test_migrated_schema_matches_the_orm_tables(settings: Settings) -> None:
    """Every ORM column exists in the migrated database with the same nullability."""
    migrate.upgrade(settings)
    engine = make_engine(settings)
    try:
        inspector = inspect(engine)
        for table in Base.metadata.sorted_tables:
            columns = {c["name"]: c for c in inspector.get_columns(table.name)}
            assert set(columns) == {c.name for c in table.columns}, table.name
            for column in table.columns:
                assert columns[column.name]["nullable"] == column.nullable, (table.name, column.name)
            uniques = {tuple(u["column_names"]) for u in inspector.get_unique_constraints(table.name)}
            for constraint in table.constraints:
                if constraint.__class__.__name__ == "UniqueConstraint":
                    assert tuple(c.name for c in constraint.columns) in uniques, (table.name, constraint.name)
    finally:
        engine.dispose()


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "nested" / "dir")
    assert settings.url == f"sqlite:///{tmp_path / 'nested' / 'dir' / 'sia.db'}"
    migrate.upgrade(settings)
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == settings.sqlite_busy_timeout_ms
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_unsupported_database_is_refused(tmp_path: Path) -> None:
    import pytest

    with pytest.raises(ValueError, match="unsupported database"):
        make_engine(Settings(data_dir=tmp_path, database_url="mysql://root@localhost/test"))


def test_db_commands(tmp_path: Path) -> None:
    env = {"SIA_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def sia(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "server.cli", *args], env=env, capture_output=True, text=True, check=True)

    assert sia("db", "current").stdout.startswith("empty (no revision)")
    sia("db", "upgrade")
    assert sia("db", "current").stdout.strip() == "0002 (up to date)"
    engine = create_engine(f"sqlite:///{tmp_path / 'sia.db'}")
    try:
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()
    sia("db", "downgrade", "base")
    assert sia("db", "current").stdout.startswith("empty")
