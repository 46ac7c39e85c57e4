"""Unlearning jobs: creation, stage claims, progress, failure, rejection and hand-over.

A stage is *claimed* with a compare-and-set that also writes a fresh random
``claim_token``: ``job_claim`` moves the stage on (``UPDATE jobs SET stage = next,
claim_token = new WHERE id = ? AND stage = expected``), ``job_take_over`` takes a
stage that was handed over, or whose worker is gone, by its current token.  Only one
worker wins either update; the loser gets None and returns.  The winner keeps its token
and every later write of the stage is conditional on it (``job_hold`` locks the row and
checks it; ``job_hand_over``, heartbeats, progress and ``job_fail`` check it too), so a
copy whose claim was taken over in the meantime - a redelivered message, a worker that
was cut off from the database for longer than the stale window - raises ``ClaimLost``
and changes nothing.

The stage column always names the stage that is running (or about to run), so a
reconciler can tell a job whose worker died from one that is still working by its
heartbeat.  Once a job holds a certificate (stage ``promoting``) it can only finish:
failing, retrying, rejecting or re-basing it is refused.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from deletion.domain import config, registry
from deletion.domain.audit import audit_append
from deletion.domain.db import rows_changed
from deletion.domain.errors import DomainError, NotFound, ValidationError
from deletion.domain.models import (
    Certificate,
    Checkpoint,
    CorpusVersion,
    ErasureRequest,
    Job,
    JobRequest,
    Model,
    utcnow,
)
from deletion.domain.services.outbox import outbox_enqueue
from deletion.domain.services.requests import request_get, request_transition
from deletion.domain.states import (
    JOB_ACTIVE_STAGES,
    JOB_TERMINAL,
    CheckpointStatus,
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


class ClaimLost(DomainError):
    """This worker's claim on the job's stage is no longer current: stop, change nothing."""

    status = 409


class JobCertified(DomainError):
    """The job holds a certificate: it may only finish promoting."""

    status = 409


def _new_token() -> str:
    return secrets.token_hex(16)


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
    claim: str | None = None,
) -> str | None:
    """Compare-and-set the stage; the new claim token, or None when someone else
    already moved the job on (or, with ``claim``, when that claim is no longer current)."""
    target = check_job_transition(expected_stage, next_stage)
    now = utcnow()
    token = _new_token()
    closing = target in JOB_TERMINAL
    values: dict[str, Any] = {"stage": target.value, "updated_at": now,
                              "heartbeat_at": None if closing else now,
                              "claim_token": None if closing else token}
    if worker is not None:
        values["worker"] = worker
    condition = [Job.id == job_id, Job.stage == expected_stage, Job.dead_lettered_at.is_(None)]
    if claim is not None:
        condition.append(Job.claim_token == claim)
    changed = rows_changed(session.execute(
        update(Job).where(*condition).values(**values).execution_options(synchronize_session=False)
    ))
    if changed != 1:
        return None
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
    return token


def job_take_over(
    session: Session,
    *,
    job_id: int,
    stage: str,
    worker: str,
    stale_before: datetime,
    holder_gone: Callable[[str | None], bool] | None = None,
    claim: str | None = None,
) -> str | None:
    """Take ``stage`` of the job; the claim token, or None when it is not free for us.

    With ``claim`` (a retry of the very task that holds it): only if that claim is still
    current; the heartbeat is renewed, no attempt is spent.  Otherwise the stage is free
    when it was handed over (heartbeat NULL: no attempt spent), when its heartbeat is
    older than ``stale_before`` or ``holder_gone(worker)`` says the holder's process is
    dead (one attempt spent each).  The compare-and-set is on the token read here, so
    of two copies that both find the stage free exactly one wins.
    """
    now = utcnow()
    if claim is not None:
        renewed = rows_changed(session.execute(
            update(Job).where(Job.id == job_id, Job.stage == stage, Job.claim_token == claim,
                              Job.dead_lettered_at.is_(None))
            .values(heartbeat_at=now, worker=worker)
            .execution_options(synchronize_session=False)
        ))
        return claim if renewed else None
    row = session.execute(
        select(Job.stage, Job.heartbeat_at, Job.claim_token, Job.worker, Job.dead_lettered_at)
        .where(Job.id == job_id).execution_options(populate_existing=True)
    ).first()
    if row is None or row.stage != stage or row.dead_lettered_at is not None:
        return None
    free = (row.heartbeat_at is None or row.heartbeat_at < stale_before
            or (holder_gone is not None and holder_gone(row.worker)))
    if not free:
        return None
    token = _new_token()
    observed = (Job.claim_token.is_(None) if row.claim_token is None
                else Job.claim_token == row.claim_token)
    # A NULL heartbeat marks a stage handed over on purpose: no attempt spent.
    spent = case((Job.heartbeat_at.is_(None), 0), else_=1)
    changed = rows_changed(session.execute(
        update(Job).where(Job.id == job_id, Job.stage == stage, observed,
                          Job.dead_lettered_at.is_(None))
        .values(heartbeat_at=now, worker=worker, claim_token=token,
                attempts=Job.attempts + spent)
        .execution_options(synchronize_session=False)
    ))
    return token if changed else None


def job_hold(session: Session, *, job_id: int, claim: str) -> Job:
    """Lock the job row for a stage's write; ``ClaimLost`` unless ``claim`` is current.

    Every transaction in which a stage stores what it produced starts here, so nothing
    it writes lands once another worker has taken the stage over.
    """
    job = session.execute(
        select(Job).where(Job.id == job_id).with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if job is None:
        raise NotFound(f"no job {job_id}")
    if job.claim_token != claim or job.dead_lettered_at is not None:
        raise ClaimLost(f"job {job_id}: this worker's claim on {job.stage} is no longer current")
    return job


def job_heartbeat(session: Session, *, job_id: int, claim: str, worker: str) -> bool:
    """Touch the heartbeat of a stage this claim holds; False once it is no longer current."""
    changed = rows_changed(session.execute(
        update(Job).where(Job.id == job_id, Job.claim_token == claim)
        .values(heartbeat_at=utcnow(), worker=worker)
        .execution_options(synchronize_session=False)
    ))
    return bool(changed)


def job_release(session: Session, *, job_id: int) -> None:
    """Mark the job's current stage as handed over: no claim, no heartbeat."""
    session.execute(update(Job).where(Job.id == job_id)
                    .values(heartbeat_at=None, claim_token=None, updated_at=utcnow())
                    .execution_options(synchronize_session=False))


def job_hand_over(
    session: Session,
    *,
    job_id: int,
    claim: str,
    current: str,
    nxt: str,
    task_name: str,
    worker: str | None = None,
) -> None:
    """Move the job from ``current`` to ``nxt`` (held by ``claim``), mark the new stage
    free for its task, and enqueue that task through the outbox.  ``ClaimLost`` when the
    claim is no longer current."""
    if job_claim(session, job_id=job_id, expected_stage=current, next_stage=nxt, worker=worker,
                 claim=claim) is None:
        raise ClaimLost(f"job {job_id}: left {current} or was taken over while this worker held it")
    job_release(session, job_id=job_id)
    outbox_enqueue(session, task_name=task_name, args={"job_id": job_id})


def job_certified(session: Session, *, job_id: int) -> bool:
    return session.execute(
        select(Certificate.id).where(Certificate.job_id == job_id).limit(1)
    ).first() is not None


def job_progress(
    session: Session,
    *,
    job_id: int,
    step: int,
    total: int,
    eta_seconds: float | None,
    stage: str | None = None,
    claim: str | None = None,
) -> bool:
    """Record progress and a heartbeat (not audited: progress is not a state change).

    With ``claim``, only while that claim is current; returns whether a row changed."""
    now = utcnow()
    condition = [Job.id == job_id]
    if claim is not None:
        condition.append(Job.claim_token == claim)
    changed = rows_changed(session.execute(
        update(Job).where(*condition).values(
            progress_step=step, progress_total=total, progress_eta_seconds=eta_seconds,
            progress_stage=stage, heartbeat_at=now, updated_at=now,
        ).execution_options(synchronize_session=False)
    ))
    return bool(changed)


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
    session: Session,
    *,
    job_id: int,
    error: str,
    permanent: bool = False,
    actor: str = "worker",
    claim: str | None = None,
) -> Job:
    """Mark a running job failed; dead-letter it when permanent or out of attempts.

    With ``claim`` the failure counts only while that claim is current (``ClaimLost``
    otherwise: a copy that lost its claim must not fail the winner's job).  A job that
    holds a certificate is never failed: its promotion is interrupted, the error
    recorded and the stage handed back, and the reconciler sends promote again.  A
    dead-lettered job's candidate is retired, so housekeeping destroys it.
    """
    job = job_hold(session, job_id=job_id, claim=claim) if claim is not None else job_get(
        session, job_id=job_id, for_update=True)
    previous = job.stage
    job.error = error[:MAX_ERROR_CHARS]
    if previous == JobStage.PROMOTING or job_certified(session, job_id=job_id):
        job.attempts += 1
        job_release(session, job_id=job_id)
        audit_append(
            session, actor=actor, action="job.promotion_interrupted", object_type=OBJECT_TYPE,
            object_ref=str(job_id), details={"stage": previous, "attempts": job.attempts},
        )
        return job
    job.stage = check_job_transition(previous, JobStage.FAILED).value
    job.attempts += 1
    job.claim_token = None
    job.finished_at = utcnow()
    dead = permanent or job.attempts >= job.max_attempts
    if dead:
        job.dead_lettered_at = job.finished_at
        _requests_need_attention(session, job, actor=actor)
    audit_append(
        session, actor=actor, action="job.dead_lettered" if dead else "job.failed",
        object_type=OBJECT_TYPE, object_ref=str(job_id),
        details={"stage": previous, "attempts": job.attempts, "permanent": permanent,
                 "error_class": _error_class(error)},
    )
    if dead:
        _candidate_set_aside(session, job, actor=actor, reason="job dead-lettered")
    return job


def job_retry(session: Session, *, job_id: int, actor: str = "reconciler") -> Job:
    """Send a failed (not dead-lettered) job back to the start of the pipeline."""
    job = job_get(session, job_id=job_id, for_update=True)
    if job.dead_lettered_at is not None:
        raise DomainError(f"job {job_id} is dead-lettered; it is not retried")
    _refuse_if_certified(session, job)
    job.stage = check_job_transition(job.stage, JobStage.QUEUED).value
    job.error = None
    job.finished_at = None
    job.claim_token = None
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
    _refuse_if_certified(session, job)
    previous = job.stage
    job.stage = check_job_transition(previous, JobStage.REJECTED).value
    job.error = reason[:MAX_ERROR_CHARS]
    job.finished_at = utcnow()
    job.claim_token = None
    _requests_need_attention(session, job, actor=actor)
    audit_append(
        session, actor=actor, action="job.rejected", object_type=OBJECT_TYPE,
        object_ref=str(job_id), details={"stage": previous},
    )
    _candidate_set_aside(session, job, actor=actor, reason="job rejected")
    return job


def job_rebase(session: Session, *, job_id: int, actor: str = "worker") -> Job:
    """The serving checkpoint moved under the job before it was certified: start again
    from the new one.  The stale candidate (never served) is retired for destruction; the
    sets are rebuilt, because the corpus version moved with the other erasure and its
    subject must not reappear in a retain set.  Refused once the job holds a certificate.
    """
    job = job_get(session, job_id=job_id, for_update=True)
    _refuse_if_certified(session, job)
    model = session.get(Model, job.model_id)
    if model is None or model.serving_checkpoint_id is None:
        raise DomainError(f"job {job_id}: the model has no serving checkpoint")
    job.stage = check_job_transition(job.stage, JobStage.QUEUED).value
    _candidate_set_aside(session, job, actor=actor, reason="re-based")
    previous_base, job.base_checkpoint_id = job.base_checkpoint_id, model.serving_checkpoint_id
    job.candidate_checkpoint_id = None
    job.sets = None
    job.corpus_version_id = None
    job.claim_token = None
    job.heartbeat_at = None
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


def _error_class(error: str) -> str:
    """The exception class an error text starts with (``Name: message``): never its message,
    which can quote input."""
    head = error.split(":", 1)[0].strip()
    return head[:80] if head.isidentifier() else "unknown"


def _refuse_if_certified(session: Session, job: Job) -> None:
    if job.stage == JobStage.PROMOTING or job_certified(session, job_id=job.id):
        raise JobCertified(f"job {job.id} holds a certificate; it can only finish promoting")


def _candidate_set_aside(session: Session, job: Job, *, actor: str, reason: str) -> None:
    """A candidate that will never serve still holds the subject's data: retire it, so
    housekeeping destroys it.  One that serves is never touched (checkpoint_retire
    refuses it anyway)."""
    if job.candidate_checkpoint_id is None:
        return
    candidate = session.get(Checkpoint, job.candidate_checkpoint_id)
    if candidate is not None and candidate.status == CheckpointStatus.CANDIDATE:
        registry.checkpoint_retire(session, actor=actor, checkpoint_id=candidate.id, reason=reason)


def _requests_need_attention(session: Session, job: Job, *, actor: str) -> None:
    _lock_requests(session, job)
    for request in job.requests:
        if request.status in (RequestStatus.SCHEDULED, RequestStatus.IN_PROGRESS):
            request_transition(
                session, actor=actor, reference=request.reference,
                target=RequestStatus.NEEDS_ATTENTION, action="request.needs_attention",
                details={"job": job.id},
            )
