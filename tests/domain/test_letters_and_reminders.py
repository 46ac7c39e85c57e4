"""Reply letters in both shipped languages, template validation, and the deadline
reminders under a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from deletion.domain.errors import DomainError, ValidationError
from deletion.domain.models import AuditEvent, Certificate, Job, JobRequest, LetterTemplate, Model
from deletion.domain.services import request_get, request_transition
from deletion.domain.services.letters import (
    letter_issue_record,
    letter_render,
    letter_template_get,
    letter_template_save,
)
from deletion.domain.services.notices import reminder_kind, reminder_record, reminders_due
from deletion.domain.services.requests import request_deny
from deletion.domain.states import RequestStatus
from tests.domain.conftest import REVIEWER, submit, submit_approved

CONTROLLER = "Acme Ltd"


@pytest.fixture(autouse=True)
def _shipped_templates(session: Session) -> None:
    """Start from the shipped templates (edits made elsewhere roll back with the test)."""
    session.execute(delete(LetterTemplate))


def _completed(session: Session, model: Model, *, name: str = "Zoë Müller-Łukasz") -> str:
    request = submit_approved(session, name=name)
    job = Job(model_id=model.id, method="asu", hparams={}, base_checkpoint_id=model.serving_checkpoint_id,
              stage="done", created_by="t", timings={})
    session.add(job)
    session.flush()
    session.add(JobRequest(job_id=job.id, request_id=request.id))
    session.add(Certificate(seq=9001, certificate_id="DC-2026-009001", payload="{}", payload_hash="a" * 64,
                            prev_hash="0" * 64, signature="00", key_id="k", signed_at=datetime.now(UTC),
                            job_id=job.id))
    for target in (RequestStatus.SCHEDULED, RequestStatus.IN_PROGRESS, RequestStatus.COMPLETED):
        request_transition(session, actor="worker", reference=request.reference, target=target, action="t")
    return request.reference


@pytest.mark.parametrize("language, words", [
    ("en", ["has been erased", "DC-2026-009001", "supervisory authority", "approximate machine unlearning"]),
    ("de", ["gelöscht", "DC-2026-009001", "Aufsichtsbehörde", "approximatives maschinelles Verlernen"]),
])
def test_a_completion_letter_names_the_certificate_in_each_language(
        session: Session, model: Model, language: str, words: list[str]) -> None:
    reference = _completed(session, model)
    letter = letter_render(session, reference=reference, language=language, controller=CONTROLLER)
    text = letter.subject + "\n" + "\n".join(letter.paragraphs)
    for word in words:
        assert word in text, word
    assert "Zoë Müller-Łukasz" in text and reference in text and CONTROLLER in text
    assert letter.certificate_id == "DC-2026-009001"
    assert "Zoë" not in repr(letter)
    letter_issue_record(session, actor="user:ana", letter=letter, fmt="pdf")
    event = session.scalars(select(AuditEvent).where(AuditEvent.action == "letter.issued")
                            .order_by(AuditEvent.seq.desc())).first()
    assert event is not None and event.details_dict["language"] == language
    assert "Zo" not in event.details and "ller" not in event.details


@pytest.mark.parametrize("language, words", [
    ("en", ["legal claims", "Art. 77", "judicial remedy", "pending litigation"]),
    ("de", ["Rechtsansprüchen", "Art. 77", "gerichtlichen Rechtsbehelf", "pending litigation"]),
])
@pytest.mark.usefixtures("model")
def test_a_refusal_letter_gives_the_reason_and_the_rights_of_art_12_4(
        session: Session, language: str, words: list[str]) -> None:
    request = submit(session)
    request_deny(session, actor=REVIEWER, reference=request.reference, reason_code="17(3)(e)",
                 note="The records are needed for pending litigation.")
    letter = letter_render(session, reference=request.reference, language=language, controller=CONTROLLER)
    text = "\n".join(letter.paragraphs)
    for word in words:
        assert word in text, word
    assert letter.kind == "refused" and letter.certificate_id is None


@pytest.mark.usefixtures("model")
def test_an_open_request_has_no_letter_yet(session: Session) -> None:
    request = submit_approved(session)
    with pytest.raises(ValidationError):
        letter_render(session, reference=request.reference, language="en", controller=CONTROLLER)


def test_a_template_with_an_unknown_placeholder_is_refused_naming_it(session: Session) -> None:
    with pytest.raises(ValidationError) as error:
        letter_template_save(session, actor="user:ana", language="en", kind="completed",
                             subject="About {reference}", body="Dear {subject_name}, {reference} {shoe_size}")
    assert error.value.field == "body" and "{shoe_size}" in error.value.message
    for body in ("{reference} {subject_name.upper}", "{reference} {subject_name!r}", "{reference} {"):
        with pytest.raises(ValidationError):
            letter_template_save(session, actor="user:ana", language="en", kind="completed",
                                 subject="s", body=body)
    assert letter_template_get(session, language="en", kind="completed").version == 0


def test_an_edited_template_is_a_new_audited_version_and_is_used(session: Session, model: Model) -> None:
    saved = letter_template_save(session, actor="user:ana", language="en", kind="completed",
                                 subject="Done: {reference}", body="Hello {subject_name}.\n\nRef {reference}, "
                                 "certificate {certificate_id}. {{braces}} stay.")
    assert saved.version == 1
    again = letter_template_save(session, actor="user:ana", language="en", kind="completed",
                                 subject="Done: {reference}", body="Hi {subject_name}, {reference}")
    assert again.version == 2
    reference = _completed(session, model, name="Ada Byron")
    letter = letter_render(session, reference=reference, language="en", controller=CONTROLLER)
    assert letter.paragraphs == (f"Hi Ada Byron, {reference}",) and letter.template_version == 2
    assert session.scalar(select(AuditEvent.action).where(AuditEvent.action == "letter.template_saved"))


def test_a_letter_after_the_identifiers_were_purged_is_refused_clearly(session: Session, model: Model) -> None:
    reference = _completed(session, model)
    request_get(session, reference=reference).subject_ciphertext = None
    with pytest.raises(DomainError, match="purged"):
        letter_render(session, reference=reference, language="de", controller=CONTROLLER)


# -------------------------------------------------------------------- reminders

RECEIVED = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)  # due 2 December 2026, 09:30


def test_the_reminder_windows_are_7_days_2_days_and_the_day_itself() -> None:
    due = RECEIVED.replace(month=12)
    assert reminder_kind(due, due - timedelta(days=8), (7, 2)) is None
    assert reminder_kind(due, due - timedelta(days=6), (7, 2)) == "7d"
    assert reminder_kind(due, due - timedelta(days=1, hours=23), (7, 2)) == "2d"
    assert reminder_kind(due, due.replace(hour=0, minute=1), (7, 2)) == "0d"
    assert reminder_kind(due, due + timedelta(days=3), (7, 2)) == "0d"  # overdue: still today's


@pytest.mark.usefixtures("model")
def test_each_reminder_goes_once_to_the_officer_and_the_reviewer_under_a_fake_clock(session: Session) -> None:
    request = submit(session, actor="user:ana", received_at=RECEIVED)
    from deletion.domain.services import request_approve

    request_approve(session, actor="user:ben", reference=request.reference)
    mine = [r for r in reminders_due(session, now=datetime(2026, 11, 20, tzinfo=UTC))
            if r.reference == request.reference]
    assert mine == []
    sent: list[str] = []
    for day in (datetime(2026, 11, 26, 8, tzinfo=UTC), datetime(2026, 11, 26, 20, tzinfo=UTC),
                datetime(2026, 11, 30, 12, tzinfo=UTC), datetime(2026, 12, 2, 7, tzinfo=UTC),
                datetime(2026, 12, 2, 23, tzinfo=UTC)):
        for reminder in reminders_due(session, now=day):
            if reminder.reference != request.reference:
                continue
            assert reminder.actors == ("user:ana", "user:ben")
            assert reminder_record(session, reminder=reminder, outcomes={"emails": 2})
            assert not reminder_record(session, reminder=reminder, outcomes={"emails": 2})
            sent.append(reminder.kind)
    assert sent == ["7d", "2d", "0d"]
    events = session.scalars(select(AuditEvent).where(AuditEvent.object_ref == request.reference,
                                                      AuditEvent.action == "request.deadline_reminder"))
    assert [e.details_dict["kind"] for e in events] == ["7d", "2d", "0d"]


@pytest.mark.usefixtures("model")
def test_a_request_first_seen_two_days_out_gets_only_the_two_day_reminder(session: Session) -> None:
    request = submit(session, received_at=RECEIVED)
    kinds = [r.kind for r in reminders_due(session, now=datetime(2026, 11, 30, 12, tzinfo=UTC))
             if r.reference == request.reference]
    assert kinds == ["2d"]


@pytest.mark.usefixtures("model")
def test_a_closed_request_gets_no_reminder(session: Session) -> None:
    request = submit(session, received_at=RECEIVED)
    request_deny(session, actor=REVIEWER, reference=request.reference, reason_code="17(3)(a)")
    assert all(r.reference != request.reference
               for r in reminders_due(session, now=datetime(2026, 12, 2, tzinfo=UTC)))
