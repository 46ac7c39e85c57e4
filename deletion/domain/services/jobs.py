"""Unlearning jobs: creation, the stage compare-and-set, progress, failure and rejection.

A task starts with ``job_claim``: ``UPDATE jobs SET stage = next WHERE id = ? AND
stage = expected``.  Only one worker can win that update, so a task delivered twice
does its work once; the loser gets False and returns.  The stage column always names
the stage that is running (or last ran), so a reconciler can tell a job whose worker
died from one that is still working by its heartbeat.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from deletion.domain import config
from deletion.domain.audit import audit_append
from deletion.domain.errors import DomainError, NotFound, ValidationError
from deletion.domain.models import CorpusVersion, ErasureRequest, Job, JobRequest, Model, utcnow
from deletion.domain.services.outbox import outbox_enqueue
from deletion.domain.services.requests import request_get, request_transition
from deletion.domain.states import (
    JOB_ACTIVE_STAGES,
    JobStage,
    RequestStatus,
    check_job_transition,
)

logger = logging.getLogger(__name__)

OBJECT_TYPE = "job"
FIRST_TASK = "erasure.build_sets"
MAX_ERROR_CHARS = 4000


class ModelBusy(DomainError):
    """Another job is already unlearning this model."""

    status = 409


def job_create(
    session: Session,
    *,
    actor: str,
    model_name: str,
    references: Sequence[str],
    method: str,
    hparams: Mapping[str, Any] | None = None,
    max_attempts: int | None = None,
) -> Job:
    """One job for one model and one or more approved requests; enqueues its first stage."""
    if not references:
        raise ValidationError("references", "a job needs at least one request")
    model = session.execute(
        select(Model).where(Model.name == model_name).with_for_update()
    ).scalar_one_or_none()
    if model is None:
        raise NotFound(f"no model {model_name}")
    if model.serving_checkpoint_id is None:
        raise DomainError(f"model {model_name} has no serving checkpoint to unlearn from")
    if _active_job_exists(session, model_id=model.id):
        raise ModelBusy(f"model {model_name} is already being unlearned by another job")

    # Row locks in a fixed order, all before the first audit append (see _lock_requests).
    requests = [
        request_get(session, reference=ref, for_update=True) for ref in sorted(set(references))
    ]
    for request in requests:
        if request.model_id != model.id:
            raise ValidationError("references", f"{request.reference} targets another model")
    job = Job(
        model_id=model.id,
        method=method,
        hparams=dict(hparams or {}),
        base_checkpoint_id=model.serving_checkpoint_id,
        corpus_version_id=_current_corpus_version_id(session, model),
        stage=JobStage.QUEUED,
        attempts=0,
        max_attempts=max_attempts or config.current().job_max_attempts,
        created_by=actor,
        timings={},
    )
    session.add(job)
    try:
        # The partial unique index is the last word when two schedulers race.
        with session.begin_nested():
            session.flush()
    except IntegrityError:
        raise ModelBusy(f"model {model_name} is already being unlearned by another job") from None
    for request in requests:
        session.add(JobRequest(job_id=job.id, request_id=request.id))
        request_transition(
            session, actor=actor, reference=request.reference, target=RequestStatus.SCHEDULED,
            action="request.scheduled", details={"job": job.id},
        )
    audit_append(
        session, actor=actor, action="job.created", object_type=OBJECT_TYPE, object_ref=str(job.id),
        details={"model": model_name, "method": method, "requests": list(references),
                 "base_checkpoint_id": job.base_checkpoint_id},
    )
    outbox_enqueue(session, task_name=FIRST_TASK, args={"job_id": job.id})
    return job


def job_claim(
    session: Session,
    *,
    job_id: int,
    expected_stage: str,
    next_stage: str,
    worker: str | None = None,
) -> bool:
    """Compare-and-set the stage; False when someone else already moved the job on."""
    target = check_job_transition(expected_stage, next_stage)
    now = utcnow()
    values: dict[str, Any] = {"stage": target.value, "heartbeat_at": now, "updated_at": now}
    if worker is not None:
        values["worker"] = worker
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.stage == expected_stage, Job.dead_lettered_at.is_(None))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return False
    job = job_get(session, job_id=job_id)
    if job.started_at is None:
        job.started_at = now
    if target is JobStage.BUILDING_SETS:
        _lock_requests(session, job)
        for request in job.requests:
            if request.status == RequestStatus.SCHEDULED:
                request_transition(
                    session, actor="worker", reference=request.reference,
                    target=RequestStatus.IN_PROGRESS, action="request.started",
                    details={"job": job_id},
                )
    audit_append(
        session, actor=worker or "worker", action="job.stage", object_type=OBJECT_TYPE,
        object_ref=str(job_id), details={"from": expected_stage, "to": target.value},
    )
    return True


def job_progress(
    session: Session,
    *,
    job_id: int,
    step: int,
    total: int,
    eta_seconds: float | None,
    stage: str | None = None,
) -> None:
    """Record progress and a heartbeat (not audited: progress is not a state change)."""
    now = utcnow()
    session.execute(
        update(Job).where(Job.id == job_id).values(
            progress_step=step, progress_total=total, progress_eta_seconds=eta_seconds,
            progress_stage=stage, heartbeat_at=now, updated_at=now,
        ).execution_options(synchronize_session=False)
    )


def job_record(
    session: Session,
    *,
    job_id: int,
    sets: Mapping[str, Any] | None = None,
    work_dir: str | None = None,
    timings: Mapping[str, float] | None = None,
) -> Job:
    """Store what a stage produced (sets digests and counts, work dir, stage timings)."""
    job = job_get(session, job_id=job_id)
    if sets is not None:
        job.sets = dict(sets)
        audit_append(
            session, actor="worker", action="job.sets_built", object_type=OBJECT_TYPE,
            object_ref=str(job_id),
            details={k: v for k, v in sets.items() if k.endswith(("digest", "count", "counts"))},
        )
    if work_dir is not None:
        job.work_dir = work_dir
    if timings:
        job.timings = {**(job.timings or {}), **timings}
    return job


def job_fail(
    session: Session, *, job_id: int, error: str, permanent: bool = False, actor: str = "worker"
) -> Job:
    """Mark a running job failed; dead-letter it when permanent or out of attempts."""
    job = job_get(session, job_id=job_id, for_update=True)
    previous = job.stage
    job.stage = check_job_transition(previous, JobStage.FAILED).value
    job.attempts += 1
    job.error = error[:MAX_ERROR_CHARS]
    job.finished_at = utcnow()
    dead = permanent or job.attempts >= job.max_attempts
    if dead:
        job.dead_lettered_at = job.finished_at
        _requests_need_attention(session, job, actor=actor)
    audit_append(
        session, actor=actor, action="job.dead_lettered" if dead else "job.failed",
        object_type=OBJECT_TYPE, object_ref=str(job_id),
        details={"stage": previous, "attempts": job.attempts, "permanent": permanent},
    )
    return job


def job_retry(session: Session, *, job_id: int, actor: str = "reconciler") -> Job:
    """Send a failed (not dead-lettered) job back to the start of the pipeline."""
    job = job_get(session, job_id=job_id, for_update=True)
    if job.dead_lettered_at is not None:
        raise DomainError(f"job {job_id} is dead-lettered; it is not retried")
    job.stage = check_job_transition(job.stage, JobStage.QUEUED).value
    job.error = None
    job.finished_at = None
    audit_append(
        session, actor=actor, action="job.retried", object_type=OBJECT_TYPE,
        object_ref=str(job_id), details={"attempts": job.attempts},
    )
    outbox_enqueue(session, task_name=FIRST_TASK, args={"job_id": job_id})
    return job


def job_escalate(
    session: Session, *, job_id: int, hparams: Mapping[str, Any], actor: str = "worker"
) -> Job:
    """After a failed verification, unlearn once more with stronger settings (only once)."""
    job = job_get(session, job_id=job_id, for_update=True)
    if job.escalated:
        raise DomainError(f"job {job_id} was already escalated once; reject it instead")
    job.stage = check_job_transition(job.stage, JobStage.UNLEARNING).value
    job.escalated = True
    job.verification_round += 1
    job.hparams = dict(hparams)
    audit_append(
        session, actor=actor, action="job.escalated", object_type=OBJECT_TYPE,
        object_ref=str(job_id), details={"round": job.verification_round},
    )
    return job


def job_reject(session: Session, *, job_id: int, reason: str, actor: str = "worker") -> Job:
    """Verification failed after escalation: nothing is promoted, requests need attention."""
    job = job_get(session, job_id=job_id, for_update=True)
    previous = job.stage
    job.stage = check_job_transition(previous, JobStage.REJECTED).value
    job.error = reason[:MAX_ERROR_CHARS]
    job.finished_at = utcnow()
    _requests_need_attention(session, job, actor=actor)
    audit_append(
        session, actor=actor, action="job.rejected", object_type=OBJECT_TYPE,
        object_ref=str(job_id), details={"stage": previous},
    )
    return job


def job_rebase(session: Session, *, job_id: int, actor: str = "worker") -> Job:
    """The serving checkpoint moved under the job: start again from the new one."""
    job = job_get(session, job_id=job_id, for_update=True)
    model = session.get(Model, job.model_id)
    if model is None or model.serving_checkpoint_id is None:
        raise DomainError(f"job {job_id}: the model has no serving checkpoint")
    job.stage = check_job_transition(job.stage, JobStage.QUEUED).value
    previous_base, job.base_checkpoint_id = job.base_checkpoint_id, model.serving_checkpoint_id
    job.candidate_checkpoint_id = None
    audit_append(
        session, actor=actor, action="job.rebased", object_type=OBJECT_TYPE, object_ref=str(job_id),
        details={"from_checkpoint_id": previous_base, "to_checkpoint_id": job.base_checkpoint_id},
    )
    outbox_enqueue(session, task_name=FIRST_TASK, args={"job_id": job_id})
    return job


# ------------------------------------------------------------------------ selectors


def job_get(session: Session, *, job_id: int, for_update: bool = False) -> Job:
    query = select(Job).where(Job.id == job_id).execution_options(populate_existing=True)
    if for_update:
        query = query.with_for_update()
    job = session.execute(query).scalar_one_or_none()
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


def job_list(
    session: Session, *, stages: Sequence[str] | None = None, model_id: int | None = None,
    limit: int | None = None,
) -> list[Job]:
    query = select(Job).order_by(Job.id.desc())
    if stages is not None:
        query = query.where(Job.stage.in_(list(stages)))
    if model_id is not None:
        query = query.where(Job.model_id == model_id)
    if limit is not None:
        query = query.limit(limit)
    return list(session.execute(query).scalars())


def jobs_stale(session: Session, *, older_than: datetime) -> list[Job]:
    """Running jobs whose last heartbeat is older than ``older_than`` (for the reconciler)."""
    running = [s.value for s in JOB_ACTIVE_STAGES if s not in (JobStage.QUEUED, JobStage.FAILED)]
    return list(session.execute(
        select(Job).where(
            Job.stage.in_(running), Job.dead_lettered_at.is_(None),
            (Job.heartbeat_at.is_(None)) | (Job.heartbeat_at < older_than),
        ).order_by(Job.id)
    ).scalars())


# -------------------------------------------------------------------------- helpers


def _active_job_exists(session: Session, *, model_id: int) -> bool:
    return bool(session.execute(
        select(exists().where(
            Job.model_id == model_id,
            Job.stage.in_([s.value for s in JOB_ACTIVE_STAGES]),
            Job.dead_lettered_at.is_(None),
        ))
    ).scalar())


def _current_corpus_version_id(session: Session, model: Model) -> int | None:
    if model.corpus_id is None:
        return None
    return session.execute(
        select(CorpusVersion.id).where(CorpusVersion.corpus_id == model.corpus_id)
        .order_by(CorpusVersion.version.desc()).limit(1)
    ).scalar_one_or_none()


def _lock_requests(session: Session, job: Job) -> None:
    """Lock the job's requests, in id order, before the audit chain head.

    Every audited change ends by locking the chain head; taking all row locks first (in a
    fixed order) means no transaction ever waits for a row while holding the head, which
    is what would let two of them deadlock.
    """
    session.execute(
        select(ErasureRequest.id)
        .join(JobRequest, JobRequest.request_id == ErasureRequest.id)
        .where(JobRequest.job_id == job.id)
        .order_by(ErasureRequest.id)
        .with_for_update()
    ).all()


def _requests_need_attention(session: Session, job: Job, *, actor: str) -> None:
    _lock_requests(session, job)
    for request in job.requests:
        if request.status in (RequestStatus.SCHEDULED, RequestStatus.IN_PROGRESS):
            request_transition(
                session, actor=actor, reference=request.reference,
                target=RequestStatus.NEEDS_ATTENTION, action="request.needs_attention",
                details={"job": job.id},
            )
