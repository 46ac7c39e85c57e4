"""The web's pool pings a connection before use only after it sat idle (issue 15: a
round trip per API call saved), and still replaces one the server dropped meanwhile."""
from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text

from deletion.domain.db import make_engine

IDLE = 0.2


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url, ping_after_idle=IDLE, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


def _pings(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    seen: list[object] = []
    original = engine.dialect.do_ping

    def do_ping(dbapi_connection: object) -> bool:
        seen.append(dbapi_connection)
        return original(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", do_ping)
    return seen


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_connection_returned_a_moment_ago_is_not_pinged(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    pings = _pings(engine, monkeypatch)
    _backend_pid(engine)
    assert len(pings) == 1  # a new connection has no idle time on record: pinged once
    _backend_pid(engine)
    _backend_pid(engine)
    assert len(pings) == 1


def test_a_connection_idle_past_the_limit_is_pinged_first(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    pings = _pings(engine, monkeypatch)
    first = _backend_pid(engine)
    time.sleep(IDLE * 1.5)
    assert _backend_pid(engine) == first
    assert len(pings) == 2


def test_an_idle_connection_the_server_dropped_is_replaced_without_an_error(
        engine: Engine, database_url: str) -> None:
    dropped = _backend_pid(engine)
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (dropped,))
    time.sleep(IDLE * 1.5)
    assert _backend_pid(engine) != dropped
