"""The audit chain: serialised appends, tamper evidence, and append-only tables."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from deletion.domain.audit import ChainVerification, audit_append, audit_verify
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import AuditEvent
from tests.conftest import drop_database, fresh_database_url

WRITERS, EVENTS_PER_WRITER = 8, 100
# Non-text fields: the time moved by a microsecond, the row moved to another seq.
FIELD_CHANGES = (
    ("UPDATE audit_events SET at = at + interval '1 microsecond' WHERE seq = %s",
     "UPDATE audit_events SET at = at - interval '1 microsecond' WHERE seq = %s"),
    ("UPDATE audit_events SET seq = seq + 1000 WHERE seq = %s",
     "UPDATE audit_events SET seq = seq - 1000 WHERE seq = %s + 1000"),
)
TEXT_COLUMNS = ("actor", "action", "object_type", "object_ref", "details", "prev_hash", "hash")


def raw_connection(url: str) -> psycopg.Connection[tuple[object, ...]]:
    u = make_url(url)
    return psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database,
                           autocommit=True)


@pytest.fixture
def fresh_url() -> Iterator[str]:
    url = fresh_database_url("audit_test")
    yield url
    drop_database(url)


def append_events(url: str, count: int) -> None:
    engine = make_engine(url)
    for i in range(count):
        with session_scope(engine) as session:
            audit_append(session, actor=f"officer.{i % 3}", action="request.approved",
                         object_type="erasure_request", object_ref=f"ER-2026-{i:05d}",
                         details={"i": i, "ratio": i / 7, "codes": ["17(3)(a)", None, True]})
    engine.dispose()


_engines: dict[str, Engine] = {}


def verify(url: str) -> ChainVerification:
    engine = _engines.get(url) or _engines.setdefault(url, make_engine(url))
    with session_scope(engine) as session:
        return audit_verify(session)


@pytest.fixture(autouse=True)
def _dispose_engines() -> Iterator[None]:
    yield
    while _engines:
        _engines.popitem()[1].dispose()


def test_concurrent_writers_append_one_unbroken_chain(fresh_url: str) -> None:
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        engine = make_engine(fresh_url)  # its own pool: separate connections
        try:
            for n in range(EVENTS_PER_WRITER):
                with session_scope(engine) as session:
                    audit_append(session, actor=f"writer-{index}", action="test.append",
                                 object_type="test", object_ref=f"{index}-{n}", details={"n": n})
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread below
            errors.append(exc)
        finally:
            engine.dispose()

    started = time.perf_counter()
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    assert not errors, errors

    result = verify(fresh_url)
    assert result.ok, result
    assert result.checked == WRITERS * EVENTS_PER_WRITER
    engine = make_engine(fresh_url)
    with session_scope(engine) as session:
        events = session.execute(select(AuditEvent).order_by(AuditEvent.seq)).scalars().all()
    engine.dispose()
    assert [e.seq for e in events] == list(range(1, WRITERS * EVENTS_PER_WRITER + 1))
    # No fork: every hash is the prev_hash of at most one successor.
    assert len({e.prev_hash for e in events}) == len(events)
    assert {e.object_ref for e in events} == {
        f"{i}-{n}" for i in range(WRITERS) for n in range(EVENTS_PER_WRITER)
    }
    print(f"\n{WRITERS} writers appended {len(events)} events in {elapsed:.1f}s")


def test_concurrent_writers_queue_on_sqlite_too(sqlite_database_url: str) -> None:
    # The embedded mode runs web and worker processes on one SQLite file.
    threads = [threading.Thread(target=append_events, args=(sqlite_database_url, 25))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = verify(sqlite_database_url)
    assert (result.ok, result.checked) == (True, 100)


def test_every_single_byte_change_is_detected_and_the_row_named(fresh_url: str) -> None:
    append_events(fresh_url, 5)
    assert verify(fresh_url).ok
    with raw_connection(fresh_url) as conn:
        conn.execute("SET session_replication_role = replica")  # superuser: triggers off
        rows = conn.execute(f"SELECT seq, {', '.join(TEXT_COLUMNS)} FROM audit_events").fetchall()
        mutations = detected = 0
        for seq, *values in rows:
            for column, value in zip(TEXT_COLUMNS, values, strict=True):
                raw = str(value).encode("ascii")
                for position in range(len(raw)):
                    changed = bytearray(raw)
                    changed[position] ^= 0x01  # flip the lowest bit of one byte
                    conn.execute(f"UPDATE audit_events SET {column} = %s WHERE seq = %s",
                                 (changed.decode("ascii"), seq))
                    result = verify(fresh_url)
                    mutations += 1
                    detected += (not result.ok) and result.first_bad_seq == seq
                    conn.execute(f"UPDATE audit_events SET {column} = %s WHERE seq = %s",
                                 (value, seq))
            for change, undo in FIELD_CHANGES:
                conn.execute(change, (seq,))
                result = verify(fresh_url)
                mutations += 1
                detected += (not result.ok) and result.first_bad_seq == seq
                conn.execute(undo, (seq,))
    assert verify(fresh_url).ok
    print(f"\n{detected}/{mutations} single-byte and field changes detected, row named")
    assert mutations > 1000
    assert detected == mutations


def test_it_notices_rows_cut_off_the_end_or_from_the_middle(fresh_url: str) -> None:
    append_events(fresh_url, 4)
    with raw_connection(fresh_url) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("DELETE FROM audit_events WHERE seq = 4")
        result = verify(fresh_url)
        assert (result.ok, result.first_bad_seq) == (False, 4)
        conn.execute("DELETE FROM audit_events WHERE seq = 2")
        result = verify(fresh_url)
        assert (result.ok, result.first_bad_seq) == (False, 2)
        assert "missing" in (result.reason or "")


@pytest.fixture(scope="module")
def chained_rows_url() -> Iterator[str]:
    """A database holding one audit event and one certificate row (row triggers need rows)."""
    url = fresh_database_url("append_only_test")
    append_events(url, 1)
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO certificates (seq, certificate_id, payload, payload_hash, prev_hash, "
            "signature, key_id, signed_at) VALUES (1, 'C-1', '{}', :h, :h, 'sig', 'k', now())"
        ), {"h": "0" * 64})
    engine.dispose()
    yield url
    drop_database(url)


@pytest.mark.parametrize("table", ["audit_events", "certificates"])
@pytest.mark.parametrize(
    "statement",
    ["UPDATE {table} SET seq = seq", "DELETE FROM {table}", "TRUNCATE {table} CASCADE"],
)
def test_postgres_refuses_to_change_or_remove_chained_rows(
    chained_rows_url: str, table: str, statement: str
) -> None:
    engine = make_engine(chained_rows_url)
    try:
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as connection:
            connection.execute(text(statement.format(table=table)))
        with engine.connect() as connection:
            assert connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 1
    finally:
        engine.dispose()


def test_the_sqlite_chain_verifies_and_refuses_updates(sqlite_database_url: str) -> None:
    append_events(sqlite_database_url, 3)
    assert verify(sqlite_database_url).ok
    engine = make_engine(sqlite_database_url)
    try:
        for statement in ("UPDATE audit_events SET actor = 'x'", "DELETE FROM audit_events"):
            with pytest.raises(DBAPIError, match="append-only"), engine.begin() as connection:
                connection.execute(text(statement))
        with engine.begin() as connection:
            connection.execute(text("DROP TRIGGER audit_events_no_update"))
            connection.execute(text("UPDATE audit_events SET object_ref = 'ER-2026-99999' WHERE seq = 2"))
    finally:
        engine.dispose()
    result = verify(sqlite_database_url)
    assert (result.ok, result.first_bad_seq) == (False, 2)


def test_an_event_lands_only_with_its_transaction(fresh_url: str) -> None:
    engine = make_engine(fresh_url)
    with pytest.raises(RuntimeError), session_scope(engine) as session:
        audit_append(session, actor="a", action="x", object_type="t", object_ref="1")
        raise RuntimeError("the state change failed")
    with session_scope(engine) as session:
        assert session.execute(select(AuditEvent)).first() is None
        event = audit_append(session, actor="a", action="x", object_type="t", object_ref="1")
        assert event.seq == 1
    engine.dispose()
    assert verify(fresh_url).ok


def test_events_keep_their_time_to_the_microsecond(fresh_url: str) -> None:
    append_events(fresh_url, 1)
    engine = make_engine(fresh_url)
    with session_scope(engine) as session:
        event = session.execute(select(AuditEvent)).scalar_one()
        assert event.at.utcoffset() == timedelta(0)
    engine.dispose()
