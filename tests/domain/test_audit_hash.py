"""The audit event hash written with one format string equals the general RFC 8785
encoder's, byte for byte, whatever the text holds; the walk can start at a verified point."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append, audit_event_hash, audit_verify
from deletion.domain.canonical import CanonicalError, canonical_hash, canonical_time
from deletion.domain.db import make_engine, session_scope
from tests.conftest import drop_database, fresh_database_url

AWKWARD = [
    "", "plain", 'quote " and backslash \\', "slash / stays", "tab\tnew\nline\rreturn",
    "\b\f\x00\x01\x1f\x7f", "é ø ß ﬁ Ǆ", "\u2028\u2029 line separators", "עברית\u200f\u200b",
    "emoji 🧪 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", '{"nested": "json", "n": [1, 2.5, null]}', "\ufeff\ufffd\uffff",
    "".join(chr(c) for c in range(0x00, 0x300)),  # every control, Latin and combining character
]


def reference(**fields: object) -> str:
    """The general canonical encoder, as an auditor's JCS library would compute it."""
    at = fields.pop("at")
    assert isinstance(at, datetime)
    return canonical_hash({**fields, "at": canonical_time(at)})


@pytest.mark.parametrize("text", AWKWARD)
def test_the_event_hash_equals_the_general_canonical_hash(text: str) -> None:
    at = datetime(2026, 11, 3, 9, 30, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    for field in ("actor", "action", "object_type", "object_ref", "details", "prev_hash"):
        fields: dict[str, object] = {"seq": 7, "at": at, "actor": "user:a", "action": "x.y",
                                     "object_type": "t", "object_ref": "r", "details": "{}",
                                     "prev_hash": "0" * 64}
        fields[field] = text
        assert audit_event_hash(**fields) == reference(**fields)  # type: ignore[arg-type]


def test_a_lone_surrogate_has_no_canonical_form() -> None:
    with pytest.raises(CanonicalError):
        audit_event_hash(seq=1, at=datetime(2026, 1, 1, tzinfo=UTC), actor="\ud800", action="a",
                         object_type="t", object_ref="r", details="{}", prev_hash="0" * 64)
    with pytest.raises(CanonicalError):
        audit_event_hash(seq=True, at=datetime(2026, 1, 1, tzinfo=UTC), actor="a", action="a",  # type: ignore[arg-type]
                         object_type="t", object_ref="r", details="{}", prev_hash="0" * 64)


@pytest.fixture
def session() -> Iterator[Session]:
    url = fresh_database_url("audit_hash_test")
    engine = make_engine(url)
    try:
        with session_scope(engine) as db:
            for i in range(25):
                audit_append(db, actor="system:test", action="t.e", object_type="t", object_ref=str(i))
        with session_scope(engine) as db:
            yield db
    finally:
        engine.dispose()
        drop_database(url)


def test_the_walk_starts_after_a_verified_point_and_reads_only_the_tail(session: Session) -> None:
    whole = audit_verify(session, batch_size=7)
    assert (whole.ok, whole.checked) == (True, 25)
    from deletion.domain.models import AuditEvent

    at_20 = session.get(AuditEvent, 20)
    assert at_20 is not None
    tail = audit_verify(session, after=(20, at_20.hash), batch_size=2)
    assert (tail.ok, tail.checked) == (True, 5)
    bounded = audit_verify(session, after=(20, at_20.hash), until_seq=22)
    assert (bounded.ok, bounded.checked) == (True, 2)
    wrong = audit_verify(session, after=(20, "f" * 64))
    assert (wrong.ok, wrong.first_bad_seq) == (False, 21)


def test_the_walk_agrees_with_the_hash_in_any_session_zone_and_for_early_years() -> None:
    url = fresh_database_url("audit_zone_test")
    engine = make_engine(url)
    try:
        with session_scope(engine) as db:
            for at in (datetime(999, 12, 31, 23, 59, 59, 5, tzinfo=UTC),
                       datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=-7))),
                       datetime(2026, 11, 3, 9, 30, 0, 123456, tzinfo=UTC)):
                audit_append(db, actor="system:test", action="t.e", object_type="t", object_ref="z", at=at)
        for zone in ("UTC", "Europe/Berlin", "America/St_Johns"):
            with session_scope(engine) as db:
                from sqlalchemy import text

                db.execute(text(f"SET LOCAL TimeZone = '{zone}'"))
                verdict = audit_verify(db)
                assert (verdict.ok, verdict.checked) == (True, 3), (zone, verdict)
    finally:
        engine.dispose()
        drop_database(url)


# The PostgreSQL walk reads each event's time as text the database writes (to_char in
# UTC) for years 1000-9999 and as a timestamp otherwise: both must give canonical_time's
# bytes, at the range's edges too.
EDGE_TIMES = (
    datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),  # the last moment read as a timestamp
    datetime(1000, 1, 1, tzinfo=UTC),  # the first moment read as text
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2024, 2, 29, 23, 59, 59, 1, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(2026, 10, 25, 2, 30, 0, 100000, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
)


def test_the_database_writes_each_time_as_canonical_time_does() -> None:
    from sqlalchemy import text

    from deletion.domain.audit import _PG_BATCH

    url = fresh_database_url("audit_time_text_test")
    engine = make_engine(url)
    try:
        with session_scope(engine) as db:
            for at in EDGE_TIMES:
                audit_append(db, actor="system:test", action="t.e", object_type="t", object_ref="edge", at=at)
        for zone in ("UTC", "Pacific/Chatham"):
            with session_scope(engine) as db:
                db.execute(text(f"SET LOCAL TimeZone = '{zone}'"))
                driver = db.connection().connection.driver_connection
                rows = driver.execute(_PG_BATCH, (1, 100, 100)).fetchall()
                written = [(at_text, at) for _, at_text, at, *_ in rows]
                assert [t if t is not None else canonical_time(a) for t, a in written] == [
                    canonical_time(at) for at in EDGE_TIMES]
                assert written[0][0] is None and all(t is not None for t, _ in written[1:])
                verdict = audit_verify(db, batch_size=2)
                assert (verdict.ok, verdict.checked) == (True, len(EDGE_TIMES)), (zone, verdict)
    finally:
        engine.dispose()
        drop_database(url)


def test_a_walk_that_stops_early_leaves_the_session_usable(session: Session) -> None:
    """A walk that finds a bad row has asked for the next batch already (PostgreSQL); the
    session must be out of the driver's pipeline and usable when the verdict comes back."""
    from sqlalchemy import text

    session.execute(text("SET LOCAL session_replication_role = replica"))  # superuser: triggers off
    session.execute(text("UPDATE audit_events SET object_ref = 'moved' WHERE seq = 3"))
    for size in (2, 5, 100):
        verdict = audit_verify(session, batch_size=size)
        assert (verdict.ok, verdict.first_bad_seq, verdict.checked) == (False, 3, 2), size
        assert session.execute(text("SELECT count(*) FROM audit_events")).scalar_one() == 25
        driver = session.connection().connection.driver_connection
        assert driver is not None and driver.info.pipeline_status.name == "OFF"
    session.rollback()
    assert audit_verify(session, batch_size=4).ok


def test_a_gap_longer_than_a_batch_is_named_where_it_starts(session: Session) -> None:
    """The PostgreSQL walk asks each batch for a range of seqs; rows missing for longer than a
    batch must still be reported at the first missing seq, not as rows missing at the end."""
    from sqlalchemy import text

    session.execute(text("SET LOCAL session_replication_role = replica"))  # superuser: triggers off
    session.execute(text("DELETE FROM audit_events WHERE seq BETWEEN 5 AND 16"))
    for size in (2, 3, 5, 12, 100):
        verdict = audit_verify(session, batch_size=size)
        assert (verdict.ok, verdict.first_bad_seq, verdict.checked) == (False, 5, 4), size
        assert verdict.reason == "expected seq 5, found 17 (a row is missing or moved)", size


def test_rows_cut_off_the_end_are_named_whatever_the_batch(session: Session) -> None:
    from sqlalchemy import text

    session.execute(text("SET LOCAL session_replication_role = replica"))
    session.execute(text("DELETE FROM audit_events WHERE seq > 21"))
    for size in (2, 3, 7, 21, 100):
        verdict = audit_verify(session, batch_size=size)
        assert (verdict.ok, verdict.first_bad_seq, verdict.checked) == (False, 22, 21), size
        bounded = audit_verify(session, until_seq=21, batch_size=size)
        assert (bounded.ok, bounded.checked) == (True, 21), size


def test_every_batch_size_walks_the_whole_chain(session: Session) -> None:
    for size in (1, 2, 3, 4, 5, 24, 25, 26, 1000):
        verdict = audit_verify(session, batch_size=size)
        assert (verdict.ok, verdict.checked) == (True, 25), size
