"""The alembic migrations and the models agree, on PostgreSQL and on SQLite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import inspect, text

from deletion.domain.config import REPO_ROOT
from deletion.domain.db import make_engine
from deletion.domain.migrate import downgrade, drift, upgrade
from deletion.domain.models import Base
from tests.conftest import drop_database, fresh_database_url


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_the_postgres_schema_matches_the_models(database_url: str) -> None:
    assert set(Base.metadata.tables) <= tables(database_url)
    assert drift(database_url) == []


def test_the_sqlite_schema_matches_the_models(sqlite_database_url: str) -> None:
    assert set(Base.metadata.tables) <= tables(sqlite_database_url)
    assert drift(sqlite_database_url) == []


def test_drift_is_noticed_and_djangos_tables_are_left_alone() -> None:
    url = fresh_database_url("drift_test")
    try:
        engine = make_engine(url)
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE auth_user (id serial PRIMARY KEY)"))
            connection.execute(text("ALTER TABLE outbox ADD COLUMN stray integer"))
        engine.dispose()
        changes = drift(url)
        assert [c[0] for c in changes] == ["remove_column"]
        assert "auth_user" not in repr(changes)
    finally:
        drop_database(url)


def test_downgrade_and_upgrade_round_trip_on_both_backends(tmp_path: Path) -> None:
    url = fresh_database_url("roundtrip_test")
    try:
        downgrade(url)
        assert not set(Base.metadata.tables) & tables(url)
        upgrade(url)
        assert drift(url) == []
    finally:
        drop_database(url)
    sqlite_url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    upgrade(sqlite_url)
    downgrade(sqlite_url)
    upgrade(sqlite_url)
    assert drift(sqlite_url) == []


def test_the_alembic_command_line_upgrades_an_empty_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "-x", f"url={url}", "upgrade", "head"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert set(Base.metadata.tables) <= tables(url)
