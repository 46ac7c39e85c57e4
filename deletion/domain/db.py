"""Engines and transactions.

The caller owns the transaction: services only add to the session they are given, and
``session_scope`` commits once at the end or rolls everything back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, Result, create_engine, event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def normalise_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 here (psycopg2 is not installed)."""
    parsed = make_url(url)
    if parsed.drivername in {"postgresql", "postgres"}:
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def make_engine(url: str, *, ping_after_idle: float | None = None, **kwargs: Any) -> Engine:
    """An engine whose pooled connections are tested before use, so a database restart
    costs no request an error: every checkout (``pool_pre_ping``) by default, or with
    ``ping_after_idle`` only a connection that sat in the pool at least that many seconds
    (the web: a round trip per request saved under load, where connections come back
    within milliseconds)."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, **kwargs)
        _configure_sqlite(engine)
        return engine
    if ping_after_idle is None:
        kwargs.setdefault("pool_pre_ping", True)
        return create_engine(url, **kwargs)
    engine = create_engine(url, **kwargs)
    _ping_idle_connections(engine, after=ping_after_idle)
    return engine


def _ping_idle_connections(engine: Engine, *, after: float) -> None:
    """``pool_pre_ping`` for connections idle ``after`` seconds or more.  A ping that finds
    the connection dead raises ``DisconnectionError``: the pool then discards it and
    checks out another (SQLAlchemy's pessimistic disconnect handling)."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is not None and time.monotonic() - idle_since < after:
            return
        dialect = engine.dialect
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as error:
            if dialect.is_disconnect(error, dbapi_connection, None):
                raise exc.DisconnectionError(f"pooled connection is gone: {error}") from error
            raise


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # BEGIN IMMEDIATE takes the write lock up front.  A deferred transaction that
        # reads the audit chain head and later writes can deadlock with another one
        # doing the same (SQLITE_BUSY at once, the busy timeout does not apply); taking
        # the lock first makes concurrent appends simply queue.
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One transaction: commit when the block ends normally, roll back when it raises."""
    session = Session(engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def rows_changed(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE changed (``Session.execute`` is typed as a plain Result)."""
    return int(cast(CursorResult[Any], result).rowcount)
