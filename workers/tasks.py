"""Celery tasks: thin.  Each takes a job id (or nothing), calls one function, and
turns errors into the job's state.

Only transient errors are retried (a database that blinked, a broker
reconnecting, a full or flaky disk), with exponential backoff; anything else
fails the job's attempt at once through `job_fail`, which dead-letters a job
that keeps failing.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from celery import Task
from sqlalchemy.exc import OperationalError

from workers import routing
from workers.celery_app import app

log = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OperationalError, ConnectionError, IOError)
MAX_RETRIES = 5
BACKOFF_BASE_S = 5.0
BACKOFF_MAX_S = 300.0


def backoff_seconds(retries: int) -> float:
    """Exponential backoff with full jitter, so crashed neighbours do not retry in step."""
    return random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**retries))


def _fail_job(job_id: int, exc: BaseException, *, permanent: bool) -> None:
    from deletion.domain import services
    from deletion.domain.db import session_scope
    from workers.runtime import engine

    # The class and a short message only: engine errors can quote input text.
    error = f"{type(exc).__name__}: {str(exc)[:200]}"
    try:
        with session_scope(engine()) as session:
            services.job_fail(session, job_id=job_id, error=error, permanent=permanent)
    except Exception:  # noqa: BLE001 - the reconciler still sees the stale job
        log.exception("job %s: could not record the failure", job_id)


def _run_stage(task: Task, stage: Callable[..., None], job_id: int) -> None:
    from deletion.domain.errors import PermanentJobError

    redelivered = bool((task.request.delivery_info or {}).get("redelivered"))
    resume = task.request.retries > 0 or redelivered
    try:
        stage(job_id, resume=resume)
    except TRANSIENT_ERRORS as exc:
        if task.request.retries >= MAX_RETRIES:
            log.error("job %s: %s still failing after %s retries", job_id, task.name, MAX_RETRIES)
            _fail_job(job_id, exc, permanent=False)
            return
        countdown = backoff_seconds(task.request.retries)
        log.warning("job %s: %s hit %s; retry in %.0f s", job_id, task.name,
                    type(exc).__name__, countdown)
        raise task.retry(exc=exc, countdown=countdown) from exc
    except PermanentJobError as exc:
        log.error("job %s: %s failed permanently: %s", job_id, task.name, type(exc).__name__)
        _fail_job(job_id, exc, permanent=True)
    except Exception as exc:  # noqa: BLE001 - any crash costs the job one attempt
        log.exception("job %s: %s crashed", job_id, task.name)
        _fail_job(job_id, exc, permanent=False)


_STAGE_OPTIONS: dict[str, Any] = {"bind": True, "acks_late": True, "reject_on_worker_lost": True,
                                  "max_retries": MAX_RETRIES}


@app.task(name=routing.BUILD_SETS, **_STAGE_OPTIONS)
def build_sets(self: Task, job_id: int) -> None:
    from workers.stages import stage_build_sets

    _run_stage(self, stage_build_sets, job_id)


@app.task(name=routing.UNLEARN, **_STAGE_OPTIONS)
def unlearn(self: Task, job_id: int) -> None:
    from workers.stages import stage_unlearn

    _run_stage(self, stage_unlearn, job_id)


@app.task(name=routing.VERIFY, **_STAGE_OPTIONS)
def verify(self: Task, job_id: int) -> None:
    from workers.stages import stage_verify

    _run_stage(self, stage_verify, job_id)


@app.task(name=routing.CERTIFY, **_STAGE_OPTIONS)
def certify(self: Task, job_id: int) -> None:
    from workers.stages import stage_certify

    _run_stage(self, stage_certify, job_id)


@app.task(name=routing.PROMOTE, **_STAGE_OPTIONS)
def promote(self: Task, job_id: int) -> None:
    from workers.stages import stage_promote

    _run_stage(self, stage_promote, job_id)


# ------------------------------------------------------------- periodic tasks
# Idempotent housekeeping: a lost or doubled tick changes nothing.

_PERIODIC_OPTIONS: dict[str, Any] = {"acks_late": True, "autoretry_for": TRANSIENT_ERRORS,
                                     "retry_backoff": True, "max_retries": 3}


@app.task(name=routing.RELAY_OUTBOX, **_PERIODIC_OPTIONS)
def relay_outbox() -> int:
    from workers.relay import relay_pending

    return relay_pending()


@app.task(name=routing.SCHEDULE_BATCHES, **_PERIODIC_OPTIONS)
def schedule_batches() -> int:
    from workers.scheduler import batches_schedule

    return len(batches_schedule())


@app.task(name=routing.RECONCILE, **_PERIODIC_OPTIONS)
def reconcile() -> int:
    from workers.reconciler import jobs_reconcile

    return len(jobs_reconcile())


@app.task(name=routing.WATCH_DEADLINES, **_PERIODIC_OPTIONS)
def watch_deadlines() -> int:
    from workers.scheduler import deadlines_watch

    return deadlines_watch()


@app.task(name=routing.DESTROY_CHECKPOINTS, **_PERIODIC_OPTIONS)
def destroy_checkpoints() -> int:
    from workers.housekeeping import checkpoints_destroy_due

    return checkpoints_destroy_due()


@app.task(name=routing.PURGE_IDENTIFIERS, **_PERIODIC_OPTIONS)
def purge_identifiers() -> int:
    from workers.housekeeping import identifiers_purge_due

    return identifiers_purge_due()


@app.task(name=routing.NOTIFY_RECIPIENTS, **_PERIODIC_OPTIONS)
def notify_recipients() -> int:
    from workers.notifications import notifications_deliver_due

    return notifications_deliver_due()


@app.task(name=routing.CHECK_SERVING_DIGESTS, **_PERIODIC_OPTIONS)
def check_serving_digests() -> int:
    from workers.integrity import checkpoints_check_serving
    from workers.runtime import engine

    return len(checkpoints_check_serving(engine=engine()).mismatched)


@app.task(name=routing.EXPORT_CHAIN_HEADS, **_PERIODIC_OPTIONS)
def export_chain_heads() -> int:
    from workers.integrity import chain_heads_export
    from workers.runtime import config, engine, signer

    record = chain_heads_export(engine=engine(), signer=signer(),
                                export_dir=config().chain_head_export_dir)
    return len(record["heads"])
