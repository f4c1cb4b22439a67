"""Engines and sessions: SQLite (WAL, busy timeout, write transactions that begin immediately) or PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from server.core.config import Settings

__all__ = ["READ_ONLY", "is_sqlite", "make_engine", "make_sessionmaker", "safe_url"]

READ_ONLY = "sia_read_only"  # execution option: this engine's transactions only read


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def safe_url(url: str) -> str:
    """The URL with its password hidden, for logs."""
    return make_url(url).render_as_string(hide_password=True)


def make_engine(settings: Settings) -> Engine:
    """An engine for ``settings.url``; creates the SQLite file's directory when needed."""
    url = make_url(settings.url)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(settings)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"unsupported database {url.get_backend_name()!r}: use sqlite:/// or postgresql+psycopg://")
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")  # psycopg 3 is the driver this project installs
    return create_engine(
        url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow, pool_pre_ping=True, future=True
    )


def _sqlite_engine(settings: Settings) -> Engine:
    url = make_url(settings.url)
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": settings.sqlite_busy_timeout_ms / 1000, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # take transaction control away from the driver so "begin" below decides how a transaction starts
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(settings.sqlite_busy_timeout_ms)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # writers take the write lock at BEGIN: a transaction never upgrades from reader to writer mid-way and
        # dies with "database is locked"; transactions are short (no model inference inside one). Readers
        # (engine.execution_options(read_only=True)) begin deferred and never wait for the writer (WAL).
        read_only = connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
