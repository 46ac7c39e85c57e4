from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.errors import DomainError, InvalidTransition, ValidationError
from deletion.domain.models import OutboxMessage, utcnow
from deletion.domain.services import (
    ModelBusy,
    job_claim,
    job_create,
    job_escalate,
    job_fail,
    job_get,
    job_progress,
    job_record,
    job_reject,
    job_retry,
    jobs_stale,
    request_get,
)
from deletion.domain.states import JobStage, RequestStatus
from tests.domain.conftest import register_model, submit, submit_approved

pytestmark = pytest.mark.usefixtures("model")


def new_job(session: Session, *names: str, max_attempts: int = 3):
    requests = [submit_approved(session, name=n) for n in (names or ("Mara Okafor",))]
    job = job_create(session, actor="scheduler", model_name="demo",
                     references=[r.reference for r in requests], method="asu",
                     hparams={"tau": 2.3}, max_attempts=max_attempts)
    return job, requests


def test_it_schedules_the_requests_and_enqueues_the_first_stage_in_the_outbox(session: Session) -> None:
    job, requests = new_job(session, "A One", "B Two")
    assert job.stage == JobStage.QUEUED
    assert job.base_checkpoint_id == job.model.serving_checkpoint_id
    assert job.corpus_version_id is not None
    assert [r.status for r in requests] == [RequestStatus.SCHEDULED] * 2
    message = session.execute(select(OutboxMessage)).scalar_one()
    assert (message.task_name, message.args, message.sent_at) == (
        "erasure.build_sets", {"job_id": job.id}, None
    )


def test_it_schedules_only_approved_requests(session: Session) -> None:
    pending = submit(session)
    with pytest.raises(InvalidTransition):
        job_create(session, actor="scheduler", model_name="demo", references=[pending.reference],
                   method="asu")


def test_it_unlearns_one_model_with_one_job_at_a_time(session: Session, tmp_path: Path) -> None:
    job, _ = new_job(session)
    other = submit_approved(session, name="Other Person")
    with pytest.raises(ModelBusy):
        job_create(session, actor="scheduler", model_name="demo", references=[other.reference],
                   method="asu")
    register_model(session, tmp_path / "second", name="second")
    second = submit_approved(session, model_name="second", name="Third Person")
    job_create(session, actor="scheduler", model_name="second", references=[second.reference],
               method="asu")
    # Once the first job is done, the model is free again.
    for stage in ("queued", "building_sets", "unlearning", "verifying", "certifying", "promoting"):
        job_claim(session, job_id=job.id, expected_stage=stage,
                  next_stage=JobStage.DONE if stage == "promoting" else _next(stage))
    job_create(session, actor="scheduler", model_name="demo", references=[other.reference],
               method="asu")


def _next(stage: str) -> str:
    order = ["queued", "building_sets", "unlearning", "verifying", "certifying", "promoting", "done"]
    return order[order.index(stage) + 1]


def test_it_refuses_a_request_for_another_model(session: Session, tmp_path: Path) -> None:
    register_model(session, tmp_path / "second", name="second")
    foreign = submit_approved(session, model_name="second")
    with pytest.raises(ValidationError):
        job_create(session, actor="scheduler", model_name="demo", references=[foreign.reference],
                   method="asu")


def test_only_one_claim_of_a_stage_wins(session: Session) -> None:
    job, requests = new_job(session)
    assert job_claim(session, job_id=job.id, expected_stage="queued", next_stage="building_sets",
                     worker="w1")
    assert not job_claim(session, job_id=job.id, expected_stage="queued",
                         next_stage="building_sets", worker="w2")
    job = job_get(session, job_id=job.id)
    assert (job.stage, job.worker) == ("building_sets", "w1")
    assert job.started_at is not None and job.heartbeat_at is not None
    assert request_get(session, reference=requests[0].reference).status == RequestStatus.IN_PROGRESS


def test_it_records_progress_and_what_a_stage_produced(session: Session) -> None:
    job, _ = new_job(session)
    job_progress(session, job_id=job.id, step=3, total=10, eta_seconds=12.5, stage="unlearning")
    job_record(session, job_id=job.id, sets={"forget_digest": "f" * 64, "forget_count": 10},
               work_dir="/tmp/x", timings={"build_sets": 1.5})
    job = job_get(session, job_id=job.id)
    assert (job.progress_step, job.progress_total, job.progress_eta_seconds) == (3, 10, 12.5)
    assert job.sets == {"forget_digest": "f" * 64, "forget_count": 10}
    assert job.timings == {"build_sets": 1.5}


def test_a_failing_job_is_retried_until_its_attempts_run_out(session: Session) -> None:
    job, requests = new_job(session, max_attempts=2)
    job_claim(session, job_id=job.id, expected_stage="queued", next_stage="building_sets")
    job_fail(session, job_id=job.id, error="worker lost")
    assert (job.stage, job.attempts, job.dead_lettered_at) == ("failed", 1, None)
    job_retry(session, job_id=job.id)
    assert job.stage == "queued"
    assert len(session.execute(select(OutboxMessage)).scalars().all()) == 2
    job_claim(session, job_id=job.id, expected_stage="queued", next_stage="building_sets")
    job_fail(session, job_id=job.id, error="worker lost again")
    assert job.dead_lettered_at is not None
    assert request_get(session, reference=requests[0].reference).status == RequestStatus.NEEDS_ATTENTION
    with pytest.raises(DomainError):
        job_retry(session, job_id=job.id)
    # A dead-lettered job no longer holds its model.
    again = requests[0]
    job_create(session, actor="scheduler", model_name="demo", references=[again.reference],
               method="asu")


def test_a_permanent_error_dead_letters_at_once(session: Session) -> None:
    job, _ = new_job(session)
    job_fail(session, job_id=job.id, error="checkpoint missing", permanent=True)
    assert job.dead_lettered_at is not None and job.attempts == 1


def test_a_failed_verification_escalates_once_then_rejects(session: Session) -> None:
    job, requests = new_job(session)
    for stage in ("queued", "building_sets", "unlearning"):
        job_claim(session, job_id=job.id, expected_stage=stage, next_stage=_next(stage))
    job_escalate(session, job_id=job.id, hparams={"tau": 4.0})
    assert (job.stage, job.verification_round, job.hparams) == ("unlearning", 1, {"tau": 4.0})
    job_claim(session, job_id=job.id, expected_stage="unlearning", next_stage="verifying")
    with pytest.raises(DomainError, match="already escalated"):
        job_escalate(session, job_id=job.id, hparams={"tau": 8.0})
    job_reject(session, job_id=job.id, reason="leakage above policy")
    assert job.stage == "rejected"
    assert request_get(session, reference=requests[0].reference).status == RequestStatus.NEEDS_ATTENTION


def test_the_reconciler_finds_jobs_whose_heartbeat_stopped(session: Session) -> None:
    job, _ = new_job(session)
    job_claim(session, job_id=job.id, expected_stage="queued", next_stage="building_sets")
    assert jobs_stale(session, older_than=utcnow() - timedelta(minutes=5)) == []
    assert [j.id for j in jobs_stale(session, older_than=utcnow() + timedelta(minutes=5))] == [job.id]


def test_the_database_itself_refuses_a_second_active_job_for_a_model(session: Session) -> None:
    from sqlalchemy.exc import IntegrityError

    from deletion.domain.models import Job

    job, _ = new_job(session)
    with pytest.raises(IntegrityError), session.begin_nested():
        session.add(Job(model_id=job.model_id, method="asu", hparams={}, stage="unlearning",
                        base_checkpoint_id=job.base_checkpoint_id, created_by="racer", timings={}))
        session.flush()
