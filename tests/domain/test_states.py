"""Every edge the transition tables do not list raises and changes nothing."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy.orm import Session

from deletion.domain.errors import InvalidTransition
from deletion.domain.models import Job
from deletion.domain.services import job_claim, job_create, request_get, request_transition
from deletion.domain.states import (
    JOB_TRANSITIONS,
    REQUEST_TRANSITIONS,
    JobStage,
    RequestStatus,
    check_job_transition,
    check_request_transition,
)
from tests.domain.conftest import audit_count, submit, submit_approved

FORBIDDEN_REQUEST_EDGES = [
    (a, b) for a, b in itertools.product(RequestStatus, RequestStatus)
    if b not in REQUEST_TRANSITIONS[a]
]
FORBIDDEN_JOB_EDGES = [
    (a, b) for a, b in itertools.product(JobStage, JobStage) if b not in JOB_TRANSITIONS[a]
]


def test_the_tables_cover_every_state() -> None:
    assert set(REQUEST_TRANSITIONS) == set(RequestStatus)
    assert set(JOB_TRANSITIONS) == set(JobStage)
    assert len(FORBIDDEN_REQUEST_EDGES) == 81 - 16
    assert check_request_transition("submitted", "approved") is RequestStatus.APPROVED
    assert check_job_transition("verifying", "certifying") is JobStage.CERTIFYING


def test_it_rejects_unknown_states() -> None:
    with pytest.raises(InvalidTransition):
        check_request_transition("submitted", "teleported")
    with pytest.raises(InvalidTransition):
        check_job_transition("nowhere", "queued")


@pytest.mark.usefixtures("model")
def test_every_forbidden_request_transition_raises_and_changes_nothing(session: Session) -> None:
    request = submit(session)
    for current, target in FORBIDDEN_REQUEST_EDGES:
        request.status = current.value
        session.flush()
        before = audit_count(session)
        with pytest.raises(InvalidTransition):
            request_transition(session, actor="x", reference=request.reference, target=target,
                               action="request.test")
        session.expire_all()
        assert request_get(session, reference=request.reference).status == current.value
        assert audit_count(session) == before


@pytest.mark.usefixtures("model")
def test_every_forbidden_job_transition_raises_and_changes_nothing(session: Session) -> None:
    request = submit_approved(session)
    job = job_create(session, actor="scheduler", model_name="demo",
                     references=[request.reference], method="asu")
    for current, target in FORBIDDEN_JOB_EDGES:
        job.stage = current.value
        session.flush()
        before = audit_count(session)
        with pytest.raises(InvalidTransition):
            job_claim(session, job_id=job.id, expected_stage=current.value, next_stage=target.value)
        session.expire_all()
        assert session.get(Job, job.id).stage == current.value
        assert audit_count(session) == before


def test_a_finished_request_has_no_way_out() -> None:
    for terminal in (RequestStatus.COMPLETED, RequestStatus.DENIED, RequestStatus.CANCELED):
        assert REQUEST_TRANSITIONS[terminal] == frozenset()


def test_nothing_moves_a_retired_checkpoint_back_to_serving() -> None:
    from deletion.domain.states import CHECKPOINT_TRANSITIONS, CheckpointStatus

    assert CheckpointStatus.SERVING not in CHECKPOINT_TRANSITIONS[CheckpointStatus.RETIRED]


