"""The reconciler: resume jobs that the database says are running but nobody runs.

Neither embedded broker redelivers a task after its worker is killed, and even
Redis only redelivers after the visibility timeout; the database is the truth.
A job's stage names the stage that runs or is about to run, and its heartbeat
says which (see workers/stages.py).  Every JOB_STALE_MINUTES:

- a stage handed over (heartbeat NULL) whose task never came: send the task again;
- a stage whose heartbeat went stale: the worker died mid-stage; send the stage's
  task, which takes the stage over (`job_take_over`, one attempt);
- a `queued` job whose first task vanished gets it again;
- a `failed` job with attempts left goes back to `queued` after a backoff
  (`job_retry`); one out of attempts was dead-lettered by `job_fail` already.

Re-sending is always safe: every task starts with a compare-and-set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update

from deletion.domain.db import session_scope
from deletion.domain.models import Job, utcnow
from deletion.domain.services.jobs import job_retry, jobs_stale
from deletion.domain.services.outbox import outbox_enqueue
from deletion.domain.states import JobStage
from workers import routing
from workers.runtime import config, engine

log = logging.getLogger(__name__)

S = JobStage
ACTOR = "system:reconciler"
RETRY_BACKOFF_BASE_S = 30.0

STAGE_TASK = {
    S.QUEUED: routing.BUILD_SETS,
    S.BUILDING_SETS: routing.BUILD_SETS,
    S.UNLEARNING: routing.UNLEARN,
    S.VERIFYING: routing.VERIFY,
    S.CERTIFYING: routing.CERTIFY,
    S.PROMOTING: routing.PROMOTE,
}


@dataclass(frozen=True)
class Resumption:
    job_id: int
    stage: str
    task_name: str
    reason: str


def jobs_reconcile(*, now: datetime | None = None) -> list[Resumption]:
    """Re-enqueue every job whose task went missing; returns what was sent."""
    now = now or utcnow()
    cutoff = now - timedelta(minutes=config().job_stale_minutes)
    done: list[Resumption] = []
    with session_scope(engine()) as session:
        for job in jobs_stale(session, older_than=cutoff):
            if job.heartbeat_at is None and job.updated_at >= cutoff:
                continue  # handed over a moment ago; its task is on its way
            reason = "hand-over lost" if job.heartbeat_at is None else "worker lost mid-stage"
            done.append(_resend(session, job, reason, now))
        queued = session.scalars(select(Job).where(
            Job.stage == S.QUEUED, Job.dead_lettered_at.is_(None), Job.updated_at < cutoff))
        for job in queued:
            done.append(_resend(session, job, "first task lost", now))
        failed = session.scalars(select(Job).where(
            Job.stage == S.FAILED, Job.dead_lettered_at.is_(None)))
        for job in failed:
            wait = timedelta(seconds=RETRY_BACKOFF_BASE_S * 2 ** max(0, job.attempts - 1))
            if job.finished_at is not None and now - job.finished_at < wait:
                continue
            job_retry(session, job_id=job.id, actor=ACTOR)
            done.append(Resumption(job.id, S.FAILED, routing.BUILD_SETS, "retry after failure"))
    for item in done:
        log.warning("job %s: %s in stage %s; sent %s", item.job_id, item.reason, item.stage,
                    item.task_name)
    if done:
        from workers.relay import relay_pending

        relay_pending()
    return done


def _resend(session: object, job: Job, reason: str, now: datetime) -> Resumption:
    task = STAGE_TASK[S(job.stage)]
    if job.heartbeat_at is None or job.stage == S.QUEUED:
        # Rate-limit: the next look comes a full stale period later.
        session.execute(update(Job).where(Job.id == job.id).values(updated_at=now)  # type: ignore[attr-defined]
                        .execution_options(synchronize_session=False))
    outbox_enqueue(session, task_name=task, args={"job_id": job.id})  # type: ignore[arg-type]
    return Resumption(job.id, job.stage, task, reason)
