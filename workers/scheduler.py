"""The batch scheduler and the deadline watcher (both run from beat).

Approved requests for one model are merged into one job, because one
unlearning run for many subjects costs about what one run for a single subject
costs.  A model's requests wait for its batch window (counted from the oldest
approval) unless one of them is `immediate` or close to its deadline: then the
whole pending batch runs at once.  One job per model at a time; requests that
arrive while a job runs wait for the next batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.db import session_scope
from deletion.domain.models import ErasureRequest, Job, JobRequest, Model, utcnow
from deletion.domain.services.deadline_alerts import deadline_alert_record, deadline_alerts_due
from deletion.domain.services.jobs import ModelBusy, job_create
from deletion.domain.states import JOB_ACTIVE_STAGES, RequestStatus
from workers.runtime import config, engine

log = logging.getLogger(__name__)

ACTOR = "system:scheduler"
DEFAULT_METHOD = "asu"
MAX_REQUESTS_PER_JOB = 50


@dataclass(frozen=True)
class ScheduledJob:
    job_id: int
    model_name: str
    references: tuple[str, ...]
    reason: str


def _urgent_within() -> timedelta:
    """A request this close to its deadline runs now (the earliest alert window)."""
    return timedelta(days=max(config().deadline_alert_days))


def batch_decision(requests: list[ErasureRequest], *, window_hours: int,
                   now: datetime) -> str | None:
    """Why this model's pending batch should run now, or None to keep waiting."""
    if any(r.priority == "immediate" for r in requests):
        return "immediate"
    if any(r.due_at - now <= _urgent_within() for r in requests):
        return "deadline"
    oldest = min((r.decided_at or r.created_at) for r in requests)
    if now - oldest >= timedelta(hours=window_hours):
        return "window"
    return None


def _pending_by_model(session: Session) -> dict[int, list[ErasureRequest]]:
    already = select(JobRequest.request_id)
    rows = session.scalars(
        select(ErasureRequest).where(ErasureRequest.status == RequestStatus.APPROVED,
                                     ErasureRequest.id.not_in(already))
        .order_by(ErasureRequest.due_at, ErasureRequest.id)
    )
    pending: dict[int, list[ErasureRequest]] = {}
    for request in rows:
        pending.setdefault(request.model_id, []).append(request)
    return pending


def _busy(session: Session, model_id: int) -> bool:
    return session.scalar(
        select(Job.id).where(Job.model_id == model_id,
                             Job.stage.in_([s.value for s in JOB_ACTIVE_STAGES]),
                             Job.dead_lettered_at.is_(None)).limit(1)
    ) is not None


def batches_schedule(*, now: datetime | None = None, method: str = DEFAULT_METHOD) -> list[ScheduledJob]:
    """Create at most one job per idle model from its approved requests; returns them."""
    now = now or utcnow()
    created: list[ScheduledJob] = []
    with session_scope(engine()) as session:
        for model_id, requests in _pending_by_model(session).items():
            model = session.get_one(Model, model_id)
            reason = batch_decision(requests, window_hours=model.batch_window_hours, now=now)
            if reason is None or _busy(session, model_id):
                continue
            batch = requests[:MAX_REQUESTS_PER_JOB]  # earliest deadlines first
            references = tuple(r.reference for r in batch)
            try:
                with session.begin_nested():
                    job = job_create(session, actor=ACTOR, model_name=model.name,
                                     references=references, method=method)
            except ModelBusy:
                continue
            created.append(ScheduledJob(job.id, model.name, references, reason))
            log.info("job %s scheduled for model %s: %s request(s) (%s)", job.id, model.name,
                     len(references), reason)
    if created:
        from workers.relay import relay_pending

        relay_pending()
    return created


def deadlines_watch(*, now: datetime | None = None) -> int:
    """Alert once per window (7 and 2 days by default) before each open request's deadline."""
    with session_scope(engine()) as session:
        due = deadline_alerts_due(session, days=config().deadline_alert_days, now=now)
        for request, kind in due:
            deadline_alert_record(session, request=request, kind=kind)
            log.warning("deadline alert %s: %s is due %s (status %s)", kind, request.reference,
                        request.due_at.date().isoformat(), request.status)
    return len(due)
