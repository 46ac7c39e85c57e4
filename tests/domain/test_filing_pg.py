"""The PostgreSQL filing path of request_submission (issue 15, the service under load):
it must write what the ORM path writes, keep the audit chain whole, and leave nothing
behind when it refuses."""
from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session

from deletion.domain.audit import audit_verify, canonical_json_flat
from deletion.domain.canonical import CanonicalError, canonical_json
from deletion.domain.db import make_engine, session_scope
from deletion.domain.errors import ValidationError
from deletion.domain.models import (
    AuditEvent,
    ChainHead,
    ErasureRequest,
    Model,
    ReferenceCounter,
    SubjectIndex,
)
from deletion.domain.services.requests import request_submission, subject_identifiers
from tests.conftest import drop_database, fresh_database_url
from tests.domain.conftest import SUBMITTER, register_model, submit

flat_scalars = st.one_of(st.text(), st.integers(), st.booleans(), st.none())
flat_objects = st.dictionaries(
    st.text(alphabet=st.characters(max_codepoint=127)),
    st.one_of(flat_scalars, st.lists(flat_scalars, max_size=4), st.tuples(st.text(), st.integers())),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(flat_objects)
def test_the_flat_writer_is_canonical_json_byte_for_byte(value: dict[str, object]) -> None:
    try:
        expected = canonical_json(value)
    except CanonicalError:
        with pytest.raises(CanonicalError):
            canonical_json_flat(value)
        return
    assert canonical_json_flat(value) == expected


@pytest.mark.parametrize("value", [
    {"a": 1.5}, {"é": "x"}, {"nested": {"a": 1}}, {"b": [1.0]}, {"a\U0001f600": 1, "a\ue000": 2},
])
def test_anything_not_flat_goes_to_the_general_writer(value: dict[str, object]) -> None:
    assert canonical_json_flat(value) == canonical_json(value)


def test_a_lone_surrogate_is_refused_as_the_general_writer_refuses_it() -> None:
    with pytest.raises(CanonicalError):
        canonical_json_flat({"name": "\ud800"})


pytestmark = pytest.mark.usefixtures("model")


@pytest.fixture
def model(session: Session, tmp_path: Path) -> object:
    return register_model(session, tmp_path)


def test_a_filing_writes_the_row_its_index_and_one_chained_event(session: Session) -> None:
    assert session.get_bind().dialect.name == "postgresql"
    filed = request_submission(session, actor=SUBMITTER, actor_id=7, name="Mara  Okafor",
                               aliases=["M. Okafor"], emails=["mara@example.org"], ground="17(1)(b)",
                               received_at=datetime(2026, 11, 2, 9, 30, tzinfo=UTC), model_name="demo",
                               notes=" call first ", now=datetime(2026, 11, 3, tzinfo=UTC))
    row = filed.request
    session.expire(row)  # read back what the database holds
    assert (row.reference, row.status, row.submitted_by_id, row.model.name) == (
        filed.request.reference, "submitted", 7, "demo")
    assert row.due_at == datetime(2026, 12, 2, 9, 30, tzinfo=UTC)
    identifiers = subject_identifiers(session, row.reference)
    assert (identifiers.name, identifiers.aliases, identifiers.emails, identifiers.notes) == (
        "Mara Okafor", ("M. Okafor",), ("mara@example.org",), "call first")
    kinds = sorted(session.execute(select(SubjectIndex.kind).where(SubjectIndex.request_id == row.id)).scalars())
    assert kinds == ["alias", "email", "name"]
    event = session.execute(select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(1)).scalar_one()
    assert (event.action, event.object_ref) == ("request.submitted", row.reference)
    assert "Mara" not in event.details and "mara@" not in event.details
    assert audit_verify(session).ok


def test_the_filed_row_is_the_persistent_image_of_what_was_written(session: Session) -> None:
    """The row comes back without a read (its state filled as the ORM's loading fills it):
    persistent in the session, every column what the database now holds, nothing pending."""
    filed = request_submission(session, actor=SUBMITTER, actor_id=7, name="Mara Okafor",
                               emails=["mara@example.org"], ground="17(1)(b)",
                               received_at=datetime(2026, 11, 2, 9, 30, tzinfo=UTC), model_name="demo",
                               now=datetime(2026, 11, 3, tzinfo=UTC))
    row = filed.request
    state = inspect(row)
    assert state.persistent and row in session and not session.dirty and not session.new
    columns = [c.key for c in ErasureRequest.__table__.columns]
    assert not set(columns) & state.unloaded
    held = {key: getattr(row, key) for key in columns}
    session.expire(row)
    assert {key: getattr(row, key) for key in columns} == held
    assert row.model.name == "demo"


def test_a_filing_logs_its_audit_event_once_and_a_refused_one_none(
        session: Session, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="deletion.domain.audit"):
        row = submit(session)
        with pytest.raises(ValidationError):
            submit(session, model_name="no-such-model")
    seq = session.execute(select(AuditEvent.seq).where(AuditEvent.object_ref == row.reference)).scalar_one()
    assert [r.getMessage() for r in caplog.records if r.name == "deletion.domain.audit"] == [
        f"audit {SUBMITTER} request.submitted erasure_request:{row.reference} seq={seq}"]


def test_a_second_filing_for_the_same_subject_names_the_first(session: Session) -> None:
    first = submit(session)
    again = request_submission(session, actor=SUBMITTER, name="mara okafor", ground="17(1)(b)",
                               received_at=datetime(2026, 11, 2, tzinfo=UTC), model_name="demo",
                               now=datetime(2026, 11, 3, tzinfo=UTC))
    assert [r.reference for r in again.earlier] == [first.reference]
    assert first.reference in session.execute(
        select(AuditEvent.details).where(AuditEvent.object_ref == again.request.reference)).scalar_one()


def test_an_unknown_model_takes_no_number_and_writes_nothing(session: Session) -> None:
    submit(session)
    counters = session.execute(select(ReferenceCounter.prefix, ReferenceCounter.last)).all()
    events = session.execute(select(func.count()).select_from(AuditEvent)).scalar_one()
    with pytest.raises(ValidationError) as refused:
        submit(session, model_name="no-such-model")
    assert refused.value.field == "model_name"
    assert session.execute(select(ReferenceCounter.prefix, ReferenceCounter.last)).all() == counters
    assert session.execute(select(func.count()).select_from(AuditEvent)).scalar_one() == events


def test_a_filing_asked_to_commit_is_committed_with_its_writes(tmp_path: Path) -> None:
    """commit=True (the API's filing): the COMMIT goes with the writes, so the row locks
    are released by the server; the caller's own commit afterwards has nothing to do, and
    a refused filing still writes nothing."""
    url = fresh_database_url("erasure_filing_commit")
    engine = make_engine(url)
    try:
        with session_scope(engine) as session:
            register_model(session, tmp_path / "own")  # tmp_path holds the module's model
        with session_scope(engine) as session:
            filed = request_submission(session, actor=SUBMITTER, name="Mara Okafor", ground="17(1)(b)",
                                       received_at=datetime(2026, 11, 2, tzinfo=UTC), model_name="demo",
                                       now=datetime(2026, 11, 3, tzinfo=UTC), commit=True)
            driver = session.connection().connection.driver_connection
            assert driver is not None and driver.info.transaction_status.name == "IDLE"
            with engine.connect() as other:  # another connection sees it before the block ends
                from sqlalchemy import text

                assert other.execute(text("SELECT count(*) FROM erasure_requests")).scalar_one() == 1
                assert other.execute(text("SELECT seq FROM chain_heads WHERE name = 'audit'")).scalar_one() == 4
            assert filed.request.reference == "ER-2026-00001" and filed.request.status == "submitted"
        with session_scope(engine) as session, pytest.raises(ValidationError):
            request_submission(session, actor=SUBMITTER, name="Someone", ground="17(1)(b)",
                               received_at=datetime(2026, 11, 2, tzinfo=UTC), model_name="no-such-model",
                               now=datetime(2026, 11, 3, tzinfo=UTC), commit=True)
        with session_scope(engine) as session:
            assert session.execute(select(func.count()).select_from(AuditEvent)).scalar_one() == 4
            assert session.execute(select(ReferenceCounter.last)).scalar_one() == 1
            verdict = audit_verify(session)
            assert verdict.ok and verdict.checked == 4
    finally:
        engine.dispose()
        drop_database(url)


def test_the_very_first_event_of_a_fresh_database_starts_the_chain() -> None:
    url = fresh_database_url("erasure_filing")
    engine = make_engine(url)
    try:
        with session_scope(engine) as session:
            # A model row written without the registry, so no audit event exists yet.
            session.add(Model(name="first", description=""))
        with session_scope(engine) as session:
            assert session.get(ChainHead, "audit") is None
            filed = submit(session, model_name="first")
        assert filed.reference == "ER-2026-00001"
        with session_scope(engine) as session:
            head = session.get(ChainHead, "audit")
            assert head is not None and head.seq == 1
            verdict = audit_verify(session)
            assert verdict.ok and verdict.checked == 1
    finally:
        engine.dispose()
        drop_database(url)


def test_a_filing_waits_for_a_model_locked_by_the_scheduler_before_it_takes_the_audit_head(
        tmp_path: Path) -> None:
    """The scheduler locks the model FOR UPDATE, then appends to the audit chain.  A filing
    that held the audit head while its INSERT waited on the model deadlocked with it."""
    import threading
    import time

    from sqlalchemy import text

    from deletion.domain.audit import audit_append

    url = fresh_database_url("erasure_filing")
    engine = make_engine(url)
    try:
        with session_scope(engine) as session:
            register_model(session, tmp_path, name="locked")
        errors: list[BaseException] = []
        with session_scope(engine) as scheduler:
            scheduler.execute(select(Model).where(Model.name == "locked").with_for_update())

            def file() -> None:
                try:
                    with session_scope(engine) as session:
                        submit(session, model_name="locked")
                except BaseException as error:  # noqa: BLE001 - reported below
                    errors.append(error)

            filing = threading.Thread(target=file)
            filing.start()
            for _ in range(600):  # until the filing waits on a lock (or has finished)
                waiting = scheduler.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()")).scalar_one()
                if waiting or not filing.is_alive():
                    break
                time.sleep(0.05)
            audit_append(scheduler, actor="system:scheduler", action="batch.scheduled",
                         object_type="model", object_ref="locked")
        filing.join(timeout=60)
        assert not filing.is_alive() and errors == []
        with session_scope(engine) as session:
            assert audit_verify(session).ok
    finally:
        engine.dispose()
        drop_database(url)


def test_a_filing_committing_its_own_transaction_chains_names_earlier_ones_and_restores_the_mode() -> None:
    """commit=True on a connection with nothing sent yet: BEGIN and COMMIT go in the
    pipeline with the connection in autocommit mode meanwhile.  The genesis head, a match
    with an earlier request and a refusal all take that path; the connection always goes
    back to the pool in its transactional mode, a refused filing's transaction rolled back."""
    from sqlalchemy import text

    url = fresh_database_url("erasure_filing_own")
    engine = make_engine(url)

    def file(name: str, model_name: str = "first") -> object:
        with session_scope(engine) as session:
            filed = request_submission(session, actor=SUBMITTER, name=name, ground="17(1)(b)",
                                       received_at=datetime(2026, 11, 2, tzinfo=UTC), model_name=model_name,
                                       now=datetime(2026, 11, 3, tzinfo=UTC), commit=True)
            driver = session.connection().connection.driver_connection
            assert driver is not None and driver.autocommit is False
            return filed

    try:
        with session_scope(engine) as session:
            session.add(Model(name="first", description=""))  # no audit event, no chain head yet
        first = file("Mara Okafor")
        again = file("mara  okafor")
        assert [r.reference for r in again.earlier] == [first.request.reference]  # type: ignore[attr-defined]
        assert again.earlier[0].status == "submitted"  # type: ignore[attr-defined]
        with pytest.raises(ValidationError):
            file("Someone Else", model_name="no-such-model")
        with engine.connect() as connection:
            driver = connection.connection.driver_connection
            assert driver is not None and driver.autocommit is False
            assert driver.info.transaction_status.name in ("IDLE", "INTRANS")
            assert connection.execute(text("SELECT count(*) FROM erasure_requests")).scalar_one() == 2
        with session_scope(engine) as session:
            details = session.execute(select(AuditEvent.details).where(
                AuditEvent.object_ref == again.request.reference)).scalar_one()  # type: ignore[attr-defined]
            assert first.request.reference in details  # type: ignore[attr-defined]
            verdict = audit_verify(session)
            assert verdict.ok and verdict.checked == 2
            assert session.execute(select(ReferenceCounter.last)).scalar_one() == 2
    finally:
        engine.dispose()
        drop_database(url)


def test_the_filings_first_statement_runs_on_its_generic_plan() -> None:
    """PostgreSQL re-planned the filing's first statement on every call while it matched
    the blind-index digests as one array parameter (a generic plan reckons with ten
    elements in it, so it always looked dearer than a custom one): bound one by one, the
    prepared statement runs on its generic plan once PostgreSQL has compared the two (after
    five custom plans).  Counted from pg_prepared_statements, not timed."""
    from sqlalchemy import text

    url = fresh_database_url("erasure_filing_plans")
    engine = make_engine(url, pool_size=1, max_overflow=0)  # one connection: its prepared statements

    def file(name: str, *, commit: bool, aliases: tuple[str, ...] = ()) -> object:
        with session_scope(engine) as session:
            return request_submission(session, actor=SUBMITTER, name=name, aliases=aliases, ground="17(1)(b)",
                                      received_at=datetime(2026, 11, 2, tzinfo=UTC), model_name="first",
                                      now=datetime(2026, 11, 3, tzinfo=UTC), commit=commit)

    try:
        with session_scope(engine) as session:
            session.add(Model(name="first", description=""))
        for i in range(16):  # psycopg prepares a statement on its sixth execution
            file(f"Subject {i}", commit=i % 2 == 0)
        with engine.connect() as connection:
            plans = connection.execute(text(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE 'WITH model AS%'")).one()
        assert plans.generic_plans >= 5 and plans.custom_plans <= 5, plans
        # Two digests (a name and an alias): another text, matching on either.
        again = file("Someone New", aliases=("Subject 3",), commit=True)
        assert [r.reference for r in again.earlier] == ["ER-2026-00004"]  # type: ignore[attr-defined]
        with session_scope(engine) as session:
            assert audit_verify(session).ok
            assert session.execute(select(func.count()).select_from(ErasureRequest)).scalar_one() == 17
    finally:
        engine.dispose()
        drop_database(url)


class _RecordingGate:
    """Stands in for the process's filing gate: counts acquisitions and releases; answers
    ``granted`` to each acquire (False: the bounded wait ran out)."""

    def __init__(self, granted: bool = True) -> None:
        self.granted, self.acquired, self.released = granted, 0, 0
        self.timeouts: list[float] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.acquired += 1
        self.timeouts.append(timeout)
        return self.granted

    def release(self) -> None:
        self.released += 1


def test_a_filing_of_its_own_transaction_passes_the_process_gate_and_leaves_it_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Filings that run their own transaction go to the database one at a time per process
    (they serialize on the counter and head locks there anyway); the gate is released after
    a refused filing too, a filing in a caller's transaction never takes it, and a wait that
    runs out files all the same, without the gate."""
    from deletion.domain.services import requests as requests_module

    url = fresh_database_url("erasure_filing_gate")
    engine = make_engine(url)

    def file(name: str, *, commit: bool = True, model_name: str = "first") -> object:
        with session_scope(engine) as session:
            return request_submission(session, actor=SUBMITTER, name=name, ground="17(1)(b)",
                                      received_at=datetime(2026, 11, 2, tzinfo=UTC), model_name=model_name,
                                      now=datetime(2026, 11, 3, tzinfo=UTC), commit=commit)

    try:
        with session_scope(engine) as session:
            session.add(Model(name="first", description=""))
        real = requests_module._FILING_GATE
        gate = _RecordingGate()
        monkeypatch.setattr(requests_module, "_FILING_GATE", gate)
        file("Mara Okafor")
        with pytest.raises(ValidationError):
            file("Someone Else", model_name="no-such-model")
        assert (gate.acquired, gate.released) == (2, 2)
        assert gate.timeouts == [requests_module.FILING_GATE_WAIT_S] * 2
        file("In A Callers Transaction", commit=False)
        assert (gate.acquired, gate.released) == (2, 2)
        busy = _RecordingGate(granted=False)
        monkeypatch.setattr(requests_module, "_FILING_GATE", busy)
        file("Filed Past A Busy Gate")
        assert (busy.acquired, busy.released) == (1, 0)
        with session_scope(engine) as session:
            assert session.execute(select(func.count()).select_from(ErasureRequest)).scalar_one() == 3
            assert audit_verify(session).ok
        assert not real.locked()
    finally:
        engine.dispose()
        drop_database(url)


def test_request_file_files_on_a_pooled_connection_without_a_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """request_file (the API's filing): the same rows, chained event and log line as
    request_submission, on a pooled connection without an ORM Session; the row comes back
    detached with every column as stored, earlier requests by reference; a refusal writes
    nothing; the connection goes back to the pool in its transactional mode, the gate open."""
    from sqlalchemy import event, text

    from deletion.domain.services import requests as requests_module
    from deletion.domain.services.requests import request_file

    url = fresh_database_url("erasure_request_file")
    engine = make_engine(url, pool_size=1, max_overflow=0)
    sessions: list[object] = []

    def file(name: str, model_name: str = "first", **extra: object) -> requests_module.Filing:
        return request_file(engine, actor=SUBMITTER, actor_id=7, name=name, ground="17(1)(b)",  # type: ignore[arg-type]
                            received_at=datetime(2026, 11, 2, tzinfo=UTC), model_name=model_name,
                            now=datetime(2026, 11, 3, tzinfo=UTC), **extra)

    try:
        with session_scope(engine) as session:
            session.add(Model(name="first", description=""))  # no chain head yet: the genesis path
        gate = _RecordingGate()
        monkeypatch.setattr(requests_module, "_FILING_GATE", gate)
        def began(session: Session, *_: object) -> None:
            sessions.append(session)

        event.listen(Session, "after_begin", began)
        try:
            with caplog.at_level(logging.INFO, logger="deletion.domain.audit"):
                first = file("Mara  Okafor", aliases=["M. Okafor"], emails=["mara@example.org"], notes=" call ")
                again = file("m. okafor")
                with pytest.raises(ValidationError) as refused:
                    file("Someone Else", model_name="no-such-model")
        finally:
            event.remove(Session, "after_begin", began)
        assert sessions == [], "the filing opened an ORM session"
        assert refused.value.field == "model_name"
        assert (gate.acquired, gate.released) == (3, 3)
        assert (first.request.reference, again.request.reference) == ("ER-2026-00001", "ER-2026-00002")
        assert first.earlier == () and again.earlier == ("ER-2026-00001",)
        state = inspect(first.request)
        assert state.detached and not {c.key for c in ErasureRequest.__table__.columns} & state.unloaded
        assert [r.getMessage() for r in caplog.records if r.name == "deletion.domain.audit"] == [
            f"audit {SUBMITTER} request.submitted erasure_request:ER-2026-0000{n} seq={n}" for n in (1, 2)]
        with engine.connect() as connection:  # the pool's one connection
            driver = connection.connection.driver_connection
            assert driver is not None and driver.autocommit is False
            assert connection.execute(text("SELECT 1")).scalar_one() == 1
        with session_scope(engine) as session:
            columns = [c.key for c in ErasureRequest.__table__.columns]
            stored = session.execute(select(ErasureRequest).where(ErasureRequest.reference == "ER-2026-00001")).scalar_one()
            assert {k: getattr(stored, k) for k in columns} == {k: getattr(first.request, k) for k in columns}
            assert (stored.status, stored.submitted_by_id, stored.priority) == ("submitted", 7, "batch")
            identifiers = subject_identifiers(session, "ER-2026-00001")
            assert (identifiers.name, identifiers.aliases, identifiers.emails, identifiers.notes) == (
                "Mara Okafor", ("M. Okafor",), ("mara@example.org",), "call")
            kinds = sorted(session.execute(select(SubjectIndex.kind).where(SubjectIndex.request_id == stored.id)).scalars())
            assert kinds == ["alias", "email", "name"]
            details = session.execute(select(AuditEvent.details).where(
                AuditEvent.object_ref == "ER-2026-00002")).scalar_one()
            assert "ER-2026-00001" in details
            assert session.execute(select(ReferenceCounter.last)).scalar_one() == 2
            verdict = audit_verify(session)
            assert verdict.ok and verdict.checked == 2
    finally:
        engine.dispose()
        drop_database(url)


def test_request_file_on_sqlite_files_through_a_session(sqlite_database_url: str) -> None:
    """The embedded backend: request_file runs request_submission in a transaction of its own."""
    from deletion.domain.services.requests import request_file

    engine = make_engine(sqlite_database_url)
    try:
        with session_scope(engine) as session:
            session.add(Model(name="first", description=""))
        filed = [request_file(engine, actor=SUBMITTER, name=name, ground="17(1)(b)", model_name="first",
                              received_at=datetime(2026, 11, 2, tzinfo=UTC), now=datetime(2026, 11, 3, tzinfo=UTC))
                 for name in ("Mara Okafor", "mara okafor")]
        assert [f.request.reference for f in filed] == ["ER-2026-00001", "ER-2026-00002"]
        assert filed[1].earlier == ("ER-2026-00001",) and filed[0].request.status == "submitted"
        with pytest.raises(ValidationError):
            request_file(engine, actor=SUBMITTER, name="  ", ground="17(1)(b)", model_name="first",
                         received_at=datetime(2026, 11, 2, tzinfo=UTC))
        with session_scope(engine) as session:
            assert session.execute(select(func.count()).select_from(ErasureRequest)).scalar_one() == 2
            assert audit_verify(session).ok
    finally:
        engine.dispose()


def _file_in_threads(engine: object, names: list[tuple[str, dict[str, object]]], monkeypatch: pytest.MonkeyPatch,
                     model_name: str = "first") -> tuple[list[object], list[int]]:
    """File ``names`` from a thread each while the first filing's group is held in the
    database until all the others are queued behind it: they then go as one group.  The
    outcomes (a Filing or the exception raised) in ``names``' order, and each group's size."""
    import threading
    import time

    from deletion.domain.services import requests as requests_module

    sizes: list[int] = []
    real = requests_module._file_pg_group
    in_hand = threading.Event()

    def held(driver: object, group: list[object], **kwargs: object) -> None:
        if not in_hand.is_set():  # the first group: wait until every other filing is queued
            in_hand.set()
            for _ in range(1000):
                if sum(len(q) for q in requests_module._QUEUES.values()) >= len(names) - 1:
                    break
                time.sleep(0.01)
        sizes.append(len(group))
        real(driver, group, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(requests_module, "_file_pg_group", held)
    outcomes: list[object] = [None] * len(names)

    def file(i: int) -> None:
        name, extra = names[i]
        values: dict[str, object] = {"actor": SUBMITTER, "actor_id": 7, "ground": "17(1)(b)",
                                     "received_at": datetime(2026, 11, 2, tzinfo=UTC), "model_name": model_name,
                                     "now": datetime(2026, 11, 3, tzinfo=UTC)}
        values.update(extra)
        try:
            outcomes[i] = requests_module.request_file(engine, name=name, **values)  # type: ignore[arg-type]
        except Exception as error:  # noqa: BLE001 - the outcome under test
            outcomes[i] = error

    first = threading.Thread(target=file, args=(0,))
    first.start()
    assert in_hand.wait(timeout=60)  # the first filing's group is in hand
    others = [threading.Thread(target=file, args=(i,)) for i in range(1, len(names))]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(timeout=60)
    assert not requests_module._QUEUES and not requests_module._SENDING
    return outcomes, sizes


def test_filings_sent_while_one_is_in_the_database_go_together_each_its_own(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Filings a process's threads send while another's is in the database are filed in one
    transaction (one WAL flush for them all): each with its own number, rows, answer, log
    line and chained event, the group's events consecutive; a filing matches an earlier one
    of its own group as it matches a stored one, and says so in its event."""
    from deletion.domain.services.requests import Filing

    url = fresh_database_url("erasure_filing_group")
    engine = make_engine(url)
    try:
        with session_scope(engine) as session:
            session.add(Model(name="first", description=""))
        names: list[tuple[str, dict[str, object]]] = [
            ("Ada First", {}), ("Mara Okafor", {"emails": ["mara@example.org"]}), ("Ben Third", {}),
            ("Someone Else", {"emails": ["MARA@example.org "]}), ("mara okafor", {})]
        with caplog.at_level(logging.INFO, logger="deletion.domain.audit"):
            outcomes, sizes = _file_in_threads(engine, names, monkeypatch)
        assert sizes == [1, 4], sizes
        assert all(isinstance(o, Filing) for o in outcomes), outcomes
        filed: list[Filing] = outcomes  # type: ignore[assignment]
        assert filed[0].request.reference == "ER-2026-00001"
        references = sorted(f.request.reference for f in filed)
        assert references == [f"ER-2026-0000{n}" for n in range(1, 6)]
        by_name = {name: f for (name, _), f in zip(names, filed, strict=True)}
        # Mara's name is refiled in other spelling, and her e-mail address under another name:
        # whichever order the group took them in, each names those filed before it (by number).
        shared = {frozenset(("Mara Okafor", "mara okafor")), frozenset(("Mara Okafor", "Someone Else"))}
        for name, f in by_name.items():
            expected = sorted(g.request.reference for other, g in by_name.items()
                              if frozenset((name, other)) in shared and g.request.reference < f.request.reference)
            assert list(f.earlier) == expected, (name, f.earlier, expected)
        messages = [r.getMessage() for r in caplog.records if r.name == "deletion.domain.audit"]
        assert [m.rsplit("seq=", 1)[1] for m in messages] == ["1", "2", "3", "4", "5"]
        with session_scope(engine) as session:
            columns = [c.key for c in ErasureRequest.__table__.columns]
            for f in filed:
                stored = session.execute(select(ErasureRequest).where(
                    ErasureRequest.reference == f.request.reference)).scalar_one()
                assert {k: getattr(stored, k) for k in columns} == {k: getattr(f.request, k) for k in columns}
                event = session.execute(select(AuditEvent).where(
                    AuditEvent.object_ref == f.request.reference)).scalar_one()
                assert all(e in event.details for e in f.earlier), (event.details, f.earlier)
                assert f"seq={event.seq}" in messages[event.seq - 1] and f.request.reference in messages[event.seq - 1]
            for name, _ in names:
                identifiers = subject_identifiers(session, by_name[name].request.reference)
                assert identifiers.name == " ".join(name.split())
            assert session.execute(select(ReferenceCounter.last)).scalar_one() == 5
            verdict = audit_verify(session)
            assert verdict.ok and verdict.checked == 5
    finally:
        engine.dispose()
        drop_database(url)


def test_a_group_the_database_refuses_is_filed_again_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """One filing the database refuses (an actor too long for its column) aborts its group's
    transaction: the others are filed again alone and succeed, and the refused one gets its
    own error, as it would have alone; the counter and the chain have no gap.  A group for a
    model that does not exist: each filing its ValidationError, nothing written."""
    from sqlalchemy.exc import DataError

    from deletion.domain.services.requests import Filing

    url = fresh_database_url("erasure_filing_group_refused")
    engine = make_engine(url)
    try:
        with session_scope(engine) as session:
            session.add(Model(name="first", description=""))
        names: list[tuple[str, dict[str, object]]] = [
            ("Ada First", {}), ("Ben Second", {}), ("Cy Third", {"actor": "x" * 200}), ("Di Fourth", {})]
        outcomes, sizes = _file_in_threads(engine, names, monkeypatch)
        assert sizes[:2] == [1, 3] and sorted(sizes[2:]) == [1, 1, 1], sizes
        assert isinstance(outcomes[2], DataError), outcomes[2]
        filed = [o for i, o in enumerate(outcomes) if i != 2]
        assert all(isinstance(o, Filing) for o in filed), outcomes
        assert sorted(f.request.reference for f in filed) == [  # type: ignore[attr-defined]
            "ER-2026-00001", "ER-2026-00002", "ER-2026-00003"]
        refused, sizes = _file_in_threads(engine, [(f"Nobody {i}", {}) for i in range(3)], monkeypatch,
                                          model_name="no-such-model")
        assert sizes == [1, 2]
        assert all(isinstance(o, ValidationError) and o.field == "model_name" for o in refused), refused
        assert len({id(o) for o in refused}) == 3
        with session_scope(engine) as session:
            assert session.execute(select(func.count()).select_from(ErasureRequest)).scalar_one() == 3
            assert session.execute(select(ReferenceCounter.last)).scalar_one() == 3
            verdict = audit_verify(session)
            assert verdict.ok and verdict.checked == 3
    finally:
        engine.dispose()
        drop_database(url)


def test_a_group_whose_commit_may_have_been_taken_is_not_filed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group that failed after its COMMIT was sent (the connection lost, say) may have been
    committed: filing it again could file its subjects twice, so each filing gets the error,
    an exception object of its own, as one filing alone would; a group that failed before
    (or that the server refused) is filed again one by one."""
    from sqlalchemy.exc import OperationalError

    from deletion.domain.services import requests as requests_module

    calls: list[list[object]] = []
    lost = OperationalError("COMMIT", None, Exception("server closed the connection unexpectedly"))

    class Pooled:
        driver_connection = type("Driver", (), {"info": type("Info", (), {"transaction_status": None})()})()

        def close(self) -> None:
            pass

    class Engine:
        def raw_connection(self) -> Pooled:
            return Pooled()

    def failing(driver: object, group: list[object], **kwargs: object) -> None:
        calls.append(group)
        raise requests_module._GroupFailed(rolled_back=rolled_back, error=lost)

    monkeypatch.setattr(requests_module, "_file_pg_group", failing)
    now = datetime(2026, 11, 3, tzinfo=UTC)

    def pending(name: str) -> requests_module._Pending:
        return requests_module._pending(actor=SUBMITTER, actor_id=7, identifiers=requests_module.SubjectIdentifiers(
            name=name), ground="17(1)(b)", received_at=now, model_name="first", priority="batch", now=now)

    rolled_back = False
    group = [pending("Ada"), pending("Ben"), pending("Cy")]
    requests_module._file_on_pooled(Engine(), group)  # type: ignore[arg-type]
    assert [p.alone for p in group] == [False] * 3
    assert all(isinstance(p.error, OperationalError) and str(p.error) == str(lost) for p in group)
    assert group[0].error is lost and len({id(p.error) for p in group}) == 3
    rolled_back = True
    group = [pending("Ada"), pending("Ben")]
    requests_module._file_on_pooled(Engine(), group)  # type: ignore[arg-type]
    assert [(p.alone, p.error) for p in group] == [(True, None)] * 2
    alone = [pending("Ada")]
    requests_module._file_on_pooled(Engine(), alone)  # type: ignore[arg-type]
    assert (alone[0].alone, alone[0].error) == (False, lost)
