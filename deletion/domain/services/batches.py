"""Batches: when a model's approved requests will start, and starting them now.

Approved requests for one model are merged into one job, because one unlearning run
for many subjects costs about what one run for a single subject costs.  A model's
requests wait for its batch window (counted from the oldest approval) unless one of
them is `immediate` or close to its deadline: then the whole pending batch runs at
once.  One job per model at a time; requests that arrive while a job runs wait for the
next batch.  The beat scheduler and the pages both ask this module, so the time a
page promises is the rule the scheduler applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain import config
from deletion.domain.audit import audit_append
from deletion.domain.errors import DomainError
from deletion.domain.methods import DEFAULT_METHOD
from deletion.domain.models import ErasureRequest, Job, JobRequest, Model, utcnow
from deletion.domain.services.jobs import ModelBusy, job_create
from deletion.domain.states import JOB_ACTIVE_STAGES, RequestStatus

MAX_REQUESTS_PER_JOB = 50
SCHEDULER_ACTOR = "system:scheduler"

REASONS = {
    "immediate": "a request has immediate priority",
    "deadline": "a request is due within {urgent} days (the deadline rule)",
    "window": "the model's batch window of {window} has passed since the oldest approval",
    "manual": "a reviewer started the batch",
}


def batch_window(model: Model) -> timedelta:
    """The model's window: minutes when set (short demo windows), else whole hours."""
    if model.batch_window_minutes is not None:
        return timedelta(minutes=model.batch_window_minutes)
    return timedelta(hours=model.batch_window_hours)


def urgent_within() -> timedelta:
    """A request this close to its deadline runs now (the earliest alert window)."""
    return timedelta(days=max(config.current().deadline_alert_days))


def window_label(window: timedelta) -> str:
    minutes = int(window.total_seconds() // 60)
    if minutes % 60:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    hours = minutes // 60
    return f"{hours} hour{'s' if hours != 1 else ''}"


def batch_decision(requests: Sequence[ErasureRequest], *, window: timedelta,
                   now: datetime, urgent: timedelta | None = None) -> str | None:
    """Why this model's pending batch should run now, or None to keep waiting."""
    urgent = urgent if urgent is not None else urgent_within()
    if any(r.priority == "immediate" for r in requests):
        return "immediate"
    if any(r.due_at - now <= urgent for r in requests):
        return "deadline"
    if now - _oldest_approval(requests) >= window:
        return "window"
    return None


@dataclass(frozen=True)
class BatchPlan:
    """When one model's pending batch will start, and why (for the pages)."""

    model_name: str
    references: tuple[str, ...]
    starts_at: datetime
    reason: str  # a key of REASONS: the rule that decides the start time
    explanation: str
    window: timedelta
    busy_job_id: int | None  # a job that holds the model: the batch waits for it

    @property
    def due_now(self) -> bool:
        return self.starts_at <= utcnow()


def batch_pending(session: Session, *, model_id: int | None = None) -> dict[int, list[ErasureRequest]]:
    """Approved requests that no job has taken yet, per model, earliest deadline first."""
    already = select(JobRequest.request_id)
    query = (select(ErasureRequest)
             .where(ErasureRequest.status == RequestStatus.APPROVED,
                    ErasureRequest.id.not_in(already))
             .order_by(ErasureRequest.due_at, ErasureRequest.id))
    if model_id is not None:
        query = query.where(ErasureRequest.model_id == model_id)
    pending: dict[int, list[ErasureRequest]] = {}
    for request in session.scalars(query):
        pending.setdefault(request.model_id, []).append(request)
    return pending


def model_active_job(session: Session, *, model_id: int) -> int | None:
    return session.scalar(
        select(Job.id).where(Job.model_id == model_id,
                             Job.stage.in_([s.value for s in JOB_ACTIVE_STAGES]),
                             Job.dead_lettered_at.is_(None)).limit(1)
    )


def batch_plan(session: Session, *, model: Model, now: datetime | None = None) -> BatchPlan | None:
    """The plan for `model`'s pending batch, or None when nothing waits."""
    now = now or utcnow()
    requests = batch_pending(session, model_id=model.id).get(model.id, [])
    if not requests:
        return None
    window, urgent = batch_window(model), urgent_within()
    reason = batch_decision(requests, window=window, now=now, urgent=urgent)
    if reason is None:
        by_window = _oldest_approval(requests) + window
        by_deadline = min(r.due_at for r in requests) - urgent
        reason, starts_at = ("deadline", by_deadline) if by_deadline < by_window else ("window", by_window)
    else:
        starts_at = now
    explanation = REASONS[reason].format(window=window_label(window), urgent=urgent.days)
    busy = model_active_job(session, model_id=model.id)
    if busy is not None:
        explanation += f"; it waits until job #{busy} releases the model"
    return BatchPlan(model_name=model.name, references=tuple(r.reference for r in requests),
                     starts_at=starts_at, reason=reason, explanation=explanation, window=window,
                     busy_job_id=busy)


def batch_plans(session: Session, *, now: datetime | None = None) -> list[BatchPlan]:
    plans = []
    for model_id in batch_pending(session):
        plan = batch_plan(session, model=session.get_one(Model, model_id), now=now)
        if plan is not None:
            plans.append(plan)
    return sorted(plans, key=lambda p: p.starts_at)


def batch_start(session: Session, *, model: Model, reason: str, actor: str = SCHEDULER_ACTOR,
                method: str = DEFAULT_METHOD) -> Job:
    """One job for the model's pending batch (earliest deadlines first, at most 50)."""
    requests = batch_pending(session, model_id=model.id).get(model.id, [])
    if not requests:
        raise DomainError(f"model {model.name} has no approved request waiting")
    references = [r.reference for r in requests[:MAX_REQUESTS_PER_JOB]]
    job = job_create(session, actor=actor, model_name=model.name, references=references,
                     method=method)
    audit_append(session, actor=actor, action="batch.started", object_type="model",
                 object_ref=model.name,
                 details={"job": job.id, "reason": reason, "requests": references})
    return job


def batch_start_now(session: Session, *, actor: str, model_name: str) -> Job:
    """A reviewer starts a model's pending batch without waiting for its window."""
    model = session.execute(select(Model).where(Model.name == model_name)).scalar_one_or_none()
    if model is None:
        raise DomainError(f"no model {model_name}")
    busy = model_active_job(session, model_id=model.id)
    if busy is not None:
        raise ModelBusy(f"model {model_name} is being unlearned by job #{busy}; the batch "
                        "starts when it finishes")
    return batch_start(session, model=model, reason="manual", actor=actor)


def _oldest_approval(requests: Sequence[ErasureRequest]) -> datetime:
    return min((r.decided_at or r.created_at) for r in requests)
