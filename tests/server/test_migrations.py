from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from server.core.config import Settings
from server.db import migrate
from server.db.engine import make_engine
from server.db.tables import Base
from server.records import Blob, NewTurn
from server.store import Store
from sia.identity.turn import TurnReply

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
    assert migrate.current_revision(settings) == migrate.head_revision(settings) == "0012"
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


def test_turns_without_text_go_back_to_empty_strings_on_downgrade(settings: Settings) -> None:
    """0003 lets a turn keep no text (NULL message and reply); downgrading below it turns them into empty strings."""
    migrate.upgrade(settings)
    store = Store(settings)
    try:
        store.create_persona("p")
        lease = store.acquire("p", "u", create=lambda _: Blob(b"state", 2, 0, 0.0, 0.0))
        answered = TurnReply(reply="", finish_reason="stop", shock=0.0, nll=1.0, prompt_tokens=3, completion_tokens=1)
        turn = NewTurn.of(answered, "said", 1.0, keep_text=False)
        store.commit(lease, Blob(b"next", 2, 0, 0.0, 0.0), reason="turn", turn=turn)
    finally:
        store.close()
    migrate.downgrade(settings, "0002")
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            assert [tuple(r) for r in conn.execute(text("SELECT message, reply FROM turns"))] == [("", "")]
        assert not any(c["nullable"] for c in inspect(engine).get_columns("turns") if c["name"] in ("message", "reply"))
    finally:
        engine.dispose()
    migrate.upgrade(settings)
    assert migrate.current_revision(settings) == "0012"


def _persona_stored_at(settings: Settings, revision: str) -> None:
    """A persona "old" stored by the schema of ``revision`` (the columns every revision has), then the upgrade to head."""
    migrate.upgrade(settings, revision)
    engine = make_engine(settings)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO personas (name, description, preamble, temperature, max_tokens, created_at, updated_at) "
                    "VALUES ('old', '', '', 0.4, 64, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
    finally:
        engine.dispose()
    migrate.upgrade(settings)


def _downgraded(settings: Settings, revision: str) -> tuple[set[str], list[str]]:
    """Downgrade to ``revision``; the personas table's columns then, and its personas' names."""
    migrate.downgrade(settings, revision)
    engine = make_engine(settings)
    try:
        columns = {c["name"] for c in inspect(engine).get_columns("personas")}
        with engine.connect() as conn:
            return columns, sorted(r[0] for r in conn.execute(text("SELECT name FROM personas")))
    finally:
        engine.dispose()


def test_personas_made_before_the_repetition_controls_get_them_off(settings: Settings) -> None:
    """0004 adds personas.repetition_penalty and personas.no_repeat_ngram: a persona stored before has them off (1, 0);
    downgrading drops the columns again."""
    _persona_stored_at(settings, "0003")
    store = Store(settings)
    try:
        old = store.get_persona("old")
        assert (old.repetition_penalty, old.no_repeat_ngram) == (1.0, 0)
        made = store.create_persona("new", repetition_penalty=1.2, no_repeat_ngram=4)
        assert (made.repetition_penalty, made.no_repeat_ngram) == (1.2, 4)
    finally:
        store.close()
    columns, _ = _downgraded(settings, "0003")
    assert "repetition_penalty" not in columns and "no_repeat_ngram" not in columns


def test_personas_made_before_the_reply_form_get_it_off(settings: Settings) -> None:
    """0005 adds personas.lowercase and personas.max_sentences: a persona stored before has them off (false, 0);
    downgrading drops the columns again and keeps the persona."""
    _persona_stored_at(settings, "0004")
    store = Store(settings)
    try:
        old = store.get_persona("old")
        assert (old.lowercase, old.max_sentences) == (False, 0)
        made = store.create_persona("new", lowercase=True, max_sentences=2)
        assert (made.lowercase, made.max_sentences) == (True, 2)
    finally:
        store.close()
    columns, names = _downgraded(settings, "0004")
    assert "lowercase" not in columns and "max_sentences" not in columns
    assert names == ["new", "old"]


def test_personas_made_before_the_defaults_release_was_recorded_have_none(settings: Settings) -> None:
    """0006 adds personas.defaults_release: a persona stored before has 0 (brought to no release's defaults yet);
    downgrading drops the column and keeps the persona."""
    _persona_stored_at(settings, "0005")
    store = Store(settings)
    try:
        assert store.get_persona("old").defaults_release == 0
        assert store.create_persona("new", defaults_release=3).defaults_release == 3
        assert store.update_persona("old", defaults_release=2).defaults_release == 2
    finally:
        store.close()
    columns, names = _downgraded(settings, "0005")
    assert "defaults_release" not in columns
    assert names == ["new", "old"]


def test_personas_made_before_the_openai_penalties_get_them_off(settings: Settings) -> None:
    """0007 adds personas.frequency_penalty, personas.presence_penalty and personas.logit_bias: a persona stored before
    has them off (0, 0, {}); a bias is stored as given and read back; downgrading drops the columns, keeps the persona."""
    _persona_stored_at(settings, "0006")
    store = Store(settings)
    try:
        old = store.get_persona("old")
        assert (old.frequency_penalty, old.presence_penalty, old.logit_bias) == (0.0, 0.0, {})
        made = store.create_persona("new", frequency_penalty=0.5, presence_penalty=-0.25, logit_bias={"38061": 2.5})
        assert store.get_persona("new").logit_bias == {"38061": 2.5} == made.logit_bias
        assert (made.frequency_penalty, made.presence_penalty) == (0.5, -0.25)
        assert store.update_persona("old", logit_bias={"17": -100.0}).logit_bias == {"17": -100.0}
    finally:
        store.close()
    columns, names = _downgraded(settings, "0006")
    assert not {"frequency_penalty", "presence_penalty", "logit_bias"} & columns
    assert names == ["new", "old"]


def test_personas_made_before_logit_bias_once_get_it_off(settings: Settings) -> None:
    """0008 adds personas.logit_bias_once: a persona stored before has it off (false); a new or changed one keeps it
    on; downgrading drops the column and keeps the persona."""
    _persona_stored_at(settings, "0007")
    store = Store(settings)
    try:
        assert store.get_persona("old").logit_bias_once is False
        assert store.create_persona("new", logit_bias={"38061": 2.5}, logit_bias_once=True).logit_bias_once is True
        assert store.get_persona("new").logit_bias_once is True
        assert store.update_persona("old", logit_bias_once=True).logit_bias_once is True
    finally:
        store.close()
    columns, names = _downgraded(settings, "0007")
    assert "logit_bias_once" not in columns and "logit_bias" in columns
    assert names == ["new", "old"]


def test_personas_made_before_the_recall_temperature_have_it_off(settings: Settings) -> None:
    """0009 adds personas.recall_temperature: a persona stored before has it off (NULL); a new or changed one keeps the
    value it is given; downgrading drops the column and keeps the persona."""
    _persona_stored_at(settings, "0008")
    store = Store(settings)
    try:
        assert store.get_persona("old").recall_temperature is None
        assert store.create_persona("new", recall_temperature=0.0).recall_temperature == 0.0
        assert store.get_persona("new").recall_temperature == 0.0
        assert store.update_persona("old", recall_temperature=0.25).recall_temperature == 0.25
    finally:
        store.close()
    columns, names = _downgraded(settings, "0008")
    assert "recall_temperature" not in columns and "logit_bias_once" in columns
    assert names == ["new", "old"]


def test_personas_made_before_the_reply_marks_have_them_off(settings: Settings) -> None:
    """0010 adds personas.exclaim and personas.address: a persona stored before has them off (false, ""); a new or
    changed one keeps the values it is given; downgrading drops the columns and keeps the persona."""
    _persona_stored_at(settings, "0009")
    store = Store(settings)
    try:
        old = store.get_persona("old")
        assert (old.exclaim, old.address) == (False, "")
        made = store.create_persona("new", exclaim=True, address=", madam")
        assert (made.exclaim, made.address) == (True, ", madam")
        assert store.get_persona("new").address == ", madam"
        assert store.update_persona("old", exclaim=True).exclaim is True
    finally:
        store.close()
    columns, names = _downgraded(settings, "0009")
    assert not {"exclaim", "address"} & columns and "recall_temperature" in columns
    assert names == ["new", "old"]


@pytest.mark.parametrize(
    ("before", "column", "given", "changed", "kept"),
    [("0010", "max_words", 8, 12, {"exclaim", "address"}), ("0011", "wind_down", 32, 16, {"max_words"})],
)
def test_personas_made_before_a_reply_limit_have_it_off(
    settings: Settings, before: str, column: str, given: int, changed: int, kept: set[str]
) -> None:
    """0011 adds personas.max_words (the word limit), 0012 personas.wind_down: a persona stored before has it off (0);
    a new or changed one keeps the value it is given; downgrading drops the column (the one before it stays) and keeps
    the persona."""
    _persona_stored_at(settings, before)
    store = Store(settings)
    try:
        assert getattr(store.get_persona("old"), column) == 0
        assert getattr(store.create_persona("new", **{column: given}), column) == given
        assert getattr(store.get_persona("new"), column) == given
        assert getattr(store.update_persona("old", **{column: changed}), column) == changed
    finally:
        store.close()
    columns, names = _downgraded(settings, before)
    assert column not in columns and kept <= columns
    assert names == ["new", "old"]


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
    assert sia("db", "current").stdout.strip() == "0012 (up to date)"
    engine = create_engine(f"sqlite:///{tmp_path / 'sia.db'}")
    try:
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()
    sia("db", "downgrade", "base")
    assert sia("db", "current").stdout.startswith("empty")
