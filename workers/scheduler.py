"""The batch scheduler and the deadline watcher (both run from beat).

The batching rule lives in `deletion.domain.services.batches` (so the pages can say
when a batch will start); this module applies it on every beat tick.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from deletion.domain.db import session_scope
from deletion.domain.methods import DEFAULT_METHOD
from deletion.domain.models import Model, utcnow
from deletion.domain.services.batches import (
    SCHEDULER_ACTOR,
    batch_decision,
    batch_pending,
    batch_start,
    batch_window,
    model_active_job,
)
from deletion.domain.services.deadline_alerts import deadline_alert_record, deadline_alerts_due
from deletion.domain.services.jobs import ModelBusy
from workers.runtime import config, engine

log = logging.getLogger(__name__)

ACTOR = SCHEDULER_ACTOR


@dataclass(frozen=True)
class ScheduledJob:
    job_id: int
    model_name: str
    references: tuple[str, ...]
    reason: str


def batches_schedule(*, now: datetime | None = None, method: str = DEFAULT_METHOD) -> list[ScheduledJob]:
    """Create at most one job per idle model from its approved requests; returns them.

    The rule (window, deadline, immediate priority) is the domain's `batches` module,
    the same one the pages ask for the start time they show.
    """
    now = now or utcnow()
    created: list[ScheduledJob] = []
    with session_scope(engine()) as session:
        for model_id, requests in batch_pending(session).items():
            model = session.get_one(Model, model_id)
            reason = batch_decision(requests, window=batch_window(model), now=now)
            if reason is None or model_active_job(session, model_id=model_id) is not None:
                continue
            try:
                with session.begin_nested():
                    job = batch_start(session, model=model, reason=reason, method=method)
            except ModelBusy:
                continue
            references = tuple(r.reference for r in job.requests)
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
