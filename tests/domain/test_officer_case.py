"""The officer's case in the domain: four-eyes by account id, cancelling after approval,
the audited duplicate check, batch start times, and the resolution path of a failed
erasure (retry, retraining, refusal)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.errors import DomainError, PermissionDenied, ValidationError
from deletion.domain.models import AuditEvent, Job, Model, utcnow
from deletion.domain.services import job_claim, job_reject, request_approve, request_get
from deletion.domain.services.batches import batch_plan, batch_start_now, batch_window
from deletion.domain.services.jobs import ModelBusy
from deletion.domain.services.requests import request_cancel, request_duplicate_check
from deletion.domain.services.resolutions import (
    resolution_decide,
    resolution_propose,
    retraining_exclusions,
)
from tests.domain.conftest import REVIEWER, audit_count, submit, submit_approved


def _actions(session: Session, ref: str) -> list[str]:
    return list(session.scalars(select(AuditEvent.action).where(AuditEvent.object_ref == ref)
                                .order_by(AuditEvent.seq)))


# ------------------------------------------------------------------ four-eyes by id


@pytest.mark.usefixtures("model")
def test_a_renamed_account_still_cannot_review_its_own_request(session: Session) -> None:
    """Fails on the old code: it compared "user:<name>" strings, so an officer whose
    username changed between filing and reviewing passed the four-eyes check."""
    request = submit(session, actor="user:ana", actor_id=41)
    before = audit_count(session)
    with pytest.raises(PermissionDenied):
        request_approve(session, actor="user:ana.renamed", actor_id=41, reference=request.reference)
    assert request_get(session, reference=request.reference).status == "submitted"
    assert audit_count(session) == before
    request_approve(session, actor="user:ben", actor_id=42, reference=request.reference)
    assert request_get(session, reference=request.reference).reviewed_by_id == 42


@pytest.mark.usefixtures("model")
def test_two_accounts_whose_names_differ_only_in_case_are_two_people_by_id(session: Session) -> None:
    request = submit(session, actor="user:Ana", actor_id=7)
    request_approve(session, actor="user:ana", actor_id=8, reference=request.reference)
    assert request_get(session, reference=request.reference).status == "approved"


# -------------------------------------------------------- cancelling after approval


@pytest.mark.usefixtures("model")
def test_the_submitter_cannot_cancel_an_approved_request(session: Session) -> None:
    """Fails on the old code: any officer could cancel any request, approved or not,
    without a reason."""
    request = submit(session, actor="user:ana", actor_id=41)
    request_approve(session, actor="user:ben", actor_id=42, reference=request.reference)
    before = audit_count(session)
    with pytest.raises(PermissionDenied):
        request_cancel(session, actor="user:ana", actor_id=41, reference=request.reference,
                       reason="changed my mind")
    with pytest.raises(ValidationError) as missing:
        request_cancel(session, actor="user:cem", actor_id=43, reference=request.reference)
    assert missing.value.field == "reason"
    assert request_get(session, reference=request.reference).status == "approved"
    assert audit_count(session) == before
    request_cancel(session, actor="user:cem", actor_id=43, reference=request.reference,
                   reason="the subject withdrew the request in writing")
    row = request_get(session, reference=request.reference)
    assert row.status == "canceled" and row.decision_note.startswith("the subject withdrew")


@pytest.mark.usefixtures("model")
def test_a_request_nobody_approved_may_be_withdrawn_without_a_reason(session: Session) -> None:
    request = submit(session, actor="user:ana", actor_id=41)
    request_cancel(session, actor="user:ana", actor_id=41, reference=request.reference)
    assert request_get(session, reference=request.reference).status == "canceled"


# ------------------------------------------------------------ the duplicate check


@pytest.mark.usefixtures("model")
def test_the_duplicate_check_answers_only_with_an_audit_row(session: Session) -> None:
    """Fails on the old code: the form answered earlier references with no trace."""
    earlier = submit(session, name="Mara Okafor")
    found = request_duplicate_check(session, actor="user:ana", name="mara  okafor")
    assert [r.reference for r in found] == [earlier.reference]
    event = session.scalars(select(AuditEvent).where(AuditEvent.action == "request.duplicate_check")
                            .order_by(AuditEvent.seq.desc())).first()
    assert event is not None and event.actor == "user:ana"
    assert event.details_dict["answered"] == [earlier.reference]
    assert "Mara" not in event.details and "Okafor" not in event.details


# ----------------------------------------------------------------------- batches


def test_a_batch_request_shows_when_its_window_ends(session: Session, model: Model) -> None:
    model.batch_window_minutes = 5
    request = submit(session, received_at=utcnow() - timedelta(hours=1), now=utcnow())
    approved_at = utcnow()
    request_approve(session, actor=REVIEWER, reference=request.reference, now=approved_at)
    plan = batch_plan(session, model=model, now=approved_at + timedelta(minutes=1))
    assert plan is not None and plan.references == (request.reference,)
    assert plan.reason == "window" and plan.starts_at == approved_at + timedelta(minutes=5)
    assert "5 minutes" in plan.explanation
    assert batch_window(model) == timedelta(minutes=5)


def test_a_request_near_its_deadline_starts_at_once(session: Session, model: Model) -> None:
    model.batch_window_hours, model.batch_window_minutes = 24, None
    received = utcnow() - timedelta(days=28)
    request = submit(session, received_at=received, now=utcnow())
    request_approve(session, actor=REVIEWER, reference=request.reference)
    plan = batch_plan(session, model=model)
    assert plan is not None and plan.reason == "deadline" and plan.due_now


def test_a_reviewer_starts_a_pending_batch_now(session: Session, model: Model) -> None:
    model.batch_window_minutes = 600
    first = submit_approved(session, name="Mara Okafor")
    second = submit_approved(session, name="Ivo Lindqvist")
    job = batch_start_now(session, actor="user:ben", model_name=model.name)
    assert sorted(r.reference for r in job.requests) == sorted([first.reference, second.reference])
    assert "batch.started" in _actions(session, model.name)
    assert batch_plan(session, model=model) is None
    third = submit_approved(session, name="Noor Haddad")
    with pytest.raises(ModelBusy):
        batch_start_now(session, actor="user:ben", model_name=model.name)
    assert request_get(session, reference=third.reference).status == "approved"


# ------------------------------------------------------------------- resolutions


def _rejected(session: Session, model: Model, name: str = "Mara Okafor") -> str:
    request = submit_approved(session, name=name)
    job = batch_start_now(session, actor="user:ben", model_name=model.name)
    assert job_claim(session, job_id=job.id, expected_stage="queued", next_stage="building_sets")
    job.sets = {"forget_digest": "f" * 64, "forget": 2, "forget_record_ids": ["p1-a", "p1-b"]}
    job_reject(session, job_id=job.id, reason="verification failed: mia.auc")
    assert request_get(session, reference=request.reference).status == "needs_attention"
    return request.reference


def test_a_retry_needs_a_second_person_and_runs_the_chosen_method_and_preset(
        session: Session, model: Model) -> None:
    reference = _rejected(session, model)
    proposal = resolution_propose(session, actor="user:ana", actor_id=1, reference=reference,
                                  kind="retry", method="kif", preset="thorough")
    before = audit_count(session)
    with pytest.raises(PermissionDenied):
        resolution_decide(session, actor="user:ana", actor_id=1, resolution_id=proposal.id,
                          approve=True)
    assert audit_count(session) == before
    decision = resolution_decide(session, actor="user:ben", actor_id=2, resolution_id=proposal.id,
                                 approve=True)
    assert decision.job is not None
    assert (decision.job.method, decision.job.hparams) == ("kif", {"preset": "thorough"})
    assert request_get(session, reference=reference).status == "scheduled"
    assert {"resolution.proposed", "resolution.approved", "request.scheduled"} <= set(
        _actions(session, reference))


def test_a_proposal_names_a_known_method_and_preset(session: Session, model: Model) -> None:
    reference = _rejected(session, model)
    for field, kwargs in (("method", {"method": "magic", "preset": "standard"}),
                          ("preset", {"method": "asu", "preset": "turbo"})):
        with pytest.raises(ValidationError) as error:
            resolution_propose(session, actor="user:ana", reference=reference, kind="retry", **kwargs)
        assert error.value.field == field


def test_retraining_tombstones_the_records_and_exports_the_exclusions(
        session: Session, model: Model) -> None:
    reference = _rejected(session, model)
    proposal = resolution_propose(session, actor="user:ana", actor_id=1, reference=reference,
                                  kind="retraining", note="membership inference keeps failing")
    decision = resolution_decide(session, actor="user:ben", actor_id=2, resolution_id=proposal.id,
                                 approve=True)
    assert decision.notice is not None
    assert decision.notice.event["event"] == "erasure.retraining_required"
    assert decision.notice.event["forget_digest"] == "f" * 64
    assert request_get(session, reference=reference).status == "retraining"
    assert registry.corpus_tombstoned_ids(session, name=model.corpus.name) == {"p1-a", "p1-b"}
    exported = retraining_exclusions(session, reference=reference)
    assert exported["corpus"]["tombstoned_record_ids"] == ["p1-a", "p1-b"]
    assert exported["request"]["forget_digest"] == "f" * 64
    assert "Mara" not in repr(exported)


def test_a_refusal_needs_an_art_17_3_reason_and_its_reasons(session: Session, model: Model) -> None:
    reference = _rejected(session, model)
    with pytest.raises(ValidationError):
        resolution_propose(session, actor="user:ana", reference=reference, kind="refusal",
                           reason_code="17(3)(e)")
    proposal = resolution_propose(session, actor="user:ana", actor_id=1, reference=reference,
                                  kind="refusal", reason_code="17(3)(e)",
                                  note="the records are needed for pending litigation")
    resolution_decide(session, actor="user:ben", actor_id=2, resolution_id=proposal.id, approve=True)
    row = request_get(session, reference=reference)
    assert (row.status, row.reason_code) == ("denied", "17(3)(e)")


def test_a_declined_proposal_changes_nothing_but_its_own_record(session: Session, model: Model) -> None:
    reference = _rejected(session, model)
    proposal = resolution_propose(session, actor="user:ana", actor_id=1, reference=reference,
                                  kind="retry", method="asu", preset="thorough")
    with pytest.raises(ValidationError):  # one open proposal at a time
        resolution_propose(session, actor="user:ana", reference=reference, kind="retraining",
                           note="x")
    resolution_decide(session, actor="user:ben", actor_id=2, resolution_id=proposal.id, approve=False)
    assert request_get(session, reference=reference).status == "needs_attention"
    request_id = request_get(session, reference=reference).id
    assert [j.stage for j in session.scalars(select(Job).where(Job.requests.any(id=request_id)))] == ["rejected"]
    with pytest.raises(DomainError):
        resolution_decide(session, actor="user:cem", actor_id=3, resolution_id=proposal.id,
                          approve=True)


@pytest.mark.usefixtures("model")
def test_no_proposal_is_taken_for_a_request_that_did_not_fail(session: Session) -> None:
    request = submit_approved(session)
    with pytest.raises(ValidationError):
        resolution_propose(session, actor="user:ana", reference=request.reference, kind="retry",
                           method="asu", preset="standard")

