from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.errors import PermissionDenied, ValidationError
from deletion.domain.models import AuditEvent, ErasureRequest, SubjectIndex
from deletion.domain.services import (
    request_approve,
    request_cancel,
    request_deny,
    request_extend,
    request_find_earlier,
    request_get,
    request_list,
    request_purge_identifiers,
    subject_identifiers,
)
from deletion.domain.states import RequestStatus
from tests.domain.conftest import REVIEWER, SUBMITTER, audit_count, submit

pytestmark = pytest.mark.usefixtures("model")


def test_it_gives_each_request_a_yearly_reference_and_a_one_month_deadline(session: Session) -> None:
    first = submit(session)
    second = submit(session, name="Someone Else")
    assert first.reference == "ER-2026-00001"
    assert second.reference == "ER-2026-00002"
    assert first.due_at == datetime(2026, 12, 2, 9, 30, tzinfo=UTC)
    assert first.status == RequestStatus.SUBMITTED


def test_it_stores_no_identifier_in_clear(session: Session) -> None:
    request = submit(session, aliases=["M. Okafor"], emails=["mara.okafor@example.org"],
                     phones=["+44 20 7946 0123"], notes="called on Tuesday")
    session.flush()
    row = session.execute(select(ErasureRequest).where(ErasureRequest.id == request.id)).scalar_one()
    stored = repr([getattr(row, c.key) for c in ErasureRequest.__table__.columns])
    events = session.execute(select(AuditEvent)).scalars().all()
    stored += repr([(e.actor, e.action, e.object_ref, e.details) for e in events])
    for secret in ("Mara", "Okafor", "okafor", "example.org", "7946", "Tuesday"):
        assert secret not in stored
        assert secret.encode() not in (row.subject_ciphertext or b"")
    assert "Okafor" not in repr(subject_identifiers(session, request.reference))


def test_it_decrypts_the_identifiers_for_the_worker(session: Session) -> None:
    request = submit(session, aliases=["M. Okafor"], emails=["mara@example.org"])
    identifiers = subject_identifiers(session, request.reference)
    assert identifiers.name == "Mara Okafor"
    assert identifiers.aliases == ("M. Okafor",)
    assert identifiers.emails == ("mara@example.org",)


def test_it_finds_an_earlier_request_by_any_identifier_however_it_is_spelt(session: Session) -> None:
    earlier = submit(session, emails=["Mara.Okafor@Example.org"], phones=["+44 20 7946 0123"])
    assert [r.reference for r in request_find_earlier(session, name="  mara   OKAFOR ")] == [
        earlier.reference
    ]
    assert request_find_earlier(session, emails=["mara.okafor@example.ORG"])[0].id == earlier.id
    assert request_find_earlier(session, phones=["+442079460123"])[0].id == earlier.id
    assert request_find_earlier(session, name="Mara Okafor-Smith") == []
    later = submit(session, name="Mara Okafor")
    details = session.execute(
        select(AuditEvent).where(AuditEvent.object_ref == later.reference)
    ).scalar_one().details_dict
    assert details["earlier_requests"] == [earlier.reference]
    assert session.execute(select(SubjectIndex).where(SubjectIndex.request_id == later.id)).scalars().all()


def test_it_refuses_self_review(session: Session) -> None:
    request = submit(session)
    before = audit_count(session)
    with pytest.raises(PermissionDenied):
        request_approve(session, actor=SUBMITTER, reference=request.reference)
    with pytest.raises(PermissionDenied):
        request_deny(session, actor=SUBMITTER.upper(), reference=request.reference,
                     reason_code="17(3)(e)")
    assert request_get(session, reference=request.reference).status == RequestStatus.SUBMITTED
    assert request.reviewed_by is None
    assert audit_count(session) == before


def test_it_records_the_reviewer_of_an_approval(session: Session) -> None:
    request = submit(session)
    request_approve(session, actor=REVIEWER, reference=request.reference)
    assert request.status == RequestStatus.APPROVED
    assert request.reviewed_by == REVIEWER
    assert request.decided_at is not None


def test_it_denies_only_with_a_coded_reason(session: Session) -> None:
    request = submit(session)
    with pytest.raises(ValidationError) as error:
        request_deny(session, actor=REVIEWER, reference=request.reference, reason_code="because")
    assert error.value.field == "reason_code"
    request_deny(session, actor=REVIEWER, reference=request.reference,
                 reason_code="identity_not_verified", note="no ID supplied")
    assert request.status == RequestStatus.DENIED
    assert request.reason_code == "identity_not_verified"


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("name", {"name": "   "}),
        ("ground", {"ground": "17(1)(z)"}),
        ("priority", {"priority": "urgent"}),
        ("model_name", {"model_name": "nope"}),
        ("received_at", {"received_at": datetime(2027, 1, 1, tzinfo=UTC)}),
        ("received_at", {"received_at": datetime(2026, 11, 2)}),
    ],
)
def test_it_names_the_field_of_a_bad_submission(session: Session, field: str, values: dict) -> None:
    with pytest.raises(ValidationError) as error:
        submit(session, **values)
    assert error.value.field == field


def test_it_extends_once_from_receipt_while_inside_the_first_month(session: Session) -> None:
    request = submit(session, received_at=datetime(2026, 1, 31, 12, tzinfo=UTC),
                     now=datetime(2026, 2, 1, tzinfo=UTC))
    assert request.due_at == datetime(2026, 2, 28, 12, tzinfo=UTC)
    request_extend(session, actor=REVIEWER, reference=request.reference, months=2,
                   reason="complex request", now=datetime(2026, 2, 10, tzinfo=UTC))
    assert request.due_at == datetime(2026, 4, 30, 12, tzinfo=UTC)
    with pytest.raises(ValidationError, match="already been extended"):
        request_extend(session, actor=REVIEWER, reference=request.reference, months=1,
                       reason="again", now=datetime(2026, 2, 11, tzinfo=UTC))


def test_it_refuses_an_extension_after_the_first_month(session: Session) -> None:
    request = submit(session, received_at=datetime(2026, 1, 31, 12, tzinfo=UTC),
                     now=datetime(2026, 2, 1, tzinfo=UTC))
    before = audit_count(session)
    with pytest.raises(ValidationError, match="too late"):
        request_extend(session, actor=REVIEWER, reference=request.reference, months=1,
                       reason="late", now=datetime(2026, 2, 28, 12, tzinfo=UTC))
    assert request.due_at == datetime(2026, 2, 28, 12, tzinfo=UTC)
    assert request.extension_months is None
    assert audit_count(session) == before


@pytest.mark.parametrize(("months", "reason"), [(0, "x"), (3, "x"), (1, "  ")])
def test_it_refuses_an_extension_beyond_two_months_or_without_reasons(
    session: Session, months: int, reason: str
) -> None:
    request = submit(session)
    with pytest.raises(ValidationError):
        request_extend(session, actor=REVIEWER, reference=request.reference, months=months,
                       reason=reason, now=datetime(2026, 11, 5, tzinfo=UTC))


def test_it_refuses_to_extend_a_closed_request(session: Session) -> None:
    request = submit(session)
    request_cancel(session, actor=SUBMITTER, reference=request.reference, reason="withdrawn")
    with pytest.raises(ValidationError):
        request_extend(session, actor=REVIEWER, reference=request.reference, months=1,
                       reason="x", now=datetime(2026, 11, 5, tzinfo=UTC))


def test_it_lists_requests_earliest_deadline_first(session: Session) -> None:
    late = submit(session, received_at=datetime(2026, 11, 2, tzinfo=UTC))
    early = submit(session, name="B", received_at=datetime(2026, 10, 20, tzinfo=UTC))
    refs = [r.reference for r in request_list(session, status=RequestStatus.SUBMITTED)]
    assert refs == [early.reference, late.reference]
    assert [r.reference for r in request_list(session, due_before=datetime(2026, 11, 25, tzinfo=UTC))] == [early.reference]


def test_it_purges_identifiers_of_closed_requests_after_retention(session: Session) -> None:
    closed = submit(session)
    open_request = submit(session, name="Still Open")
    request_cancel(session, actor=SUBMITTER, reference=closed.reference)
    session.flush()
    purged = request_purge_identifiers(session, actor="beat", retention_days=30,
                                       now=datetime(2099, 1, 1, tzinfo=UTC))
    assert purged == [closed.reference]
    assert closed.subject_ciphertext is None and open_request.subject_ciphertext is not None
    # The blind index survives, so a repeated request is still recognised.
    assert request_find_earlier(session, name="Mara Okafor")[0].id == closed.id
