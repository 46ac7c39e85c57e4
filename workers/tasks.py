"""Celery tasks: thin.  Each takes a job id (or nothing), calls one function, and
turns errors into the job's state.

Only transient errors are retried in place (a database that blinked, a broker
reconnecting, a network timeout, a disk that is full or busy for a moment: see
`is_transient`), with exponential backoff; a retry carries the stage's claim, so it
resumes only if nobody took the stage over meanwhile.  Anything else - a missing
file, a permission refused, a bug - fails the job's attempt at once through
`job_fail`, which dead-letters a job that keeps failing; `PermanentJobError`
dead-letters it now.  A run that lost its claim (`ClaimLost`) stops quietly: it
removes the files it wrote and changes nothing in the database.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from typing import Any

from celery import Task

from workers import routing
from workers.celery_app import app
from workers.retries import MAX_RETRIES, PERIODIC_TRANSIENT, backoff_seconds, is_transient

log = logging.getLogger(__name__)

def _fail_job(job_id: int, exc: BaseException, *, permanent: bool, claim: str | None) -> None:
    from deletion.domain import services
    from deletion.domain.db import session_scope
    from workers.runtime import engine

    if claim is None:
        # This run never took the stage: the job is someone else's (or nobody's, and the
        # reconciler resumes it).  Failing it from here would fail the holder's job.
        log.warning("job %s: %s before this task took its stage; job left as it is",
                    job_id, type(exc).__name__)
        return
    # The class and a short message only: engine errors can quote input text.
    error = f"{type(exc).__name__}: {str(exc)[:200]}"
    try:
        with session_scope(engine()) as session:
            services.job_fail(session, job_id=job_id, error=error, permanent=permanent,
                              claim=claim)
    except services.ClaimLost:
        log.info("job %s: the stage was taken over; its failure here is not recorded", job_id)
    except Exception:  # noqa: BLE001 - the reconciler still sees the stale job
        log.exception("job %s: could not record the failure", job_id)


def _discard(run: Any) -> None:
    """Remove what a run that lost its claim wrote (its own files only)."""
    for path in run.owned:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=False)
        else:
            path.unlink(missing_ok=True)
    run.owned.clear()


def _run_stage(task: Task, stage: Callable[..., None], job_id: int, claim: str | None) -> None:
    from deletion.domain.errors import PermanentJobError
    from deletion.domain.services.jobs import ClaimLost
    from workers.runtime import StageRun

    run = StageRun(job_id=job_id, claim=claim)
    try:
        stage(run)
    except ClaimLost:
        log.info("job %s: %s lost its claim to another worker; stopping quietly", job_id,
                 task.name)
        try:
            _discard(run)
        except OSError:
            log.warning("job %s: could not remove this run's files; the sweep will", job_id)
    except PermanentJobError as exc:
        log.error("job %s: %s failed permanently: %s", job_id, task.name, type(exc).__name__)
        _fail_job(job_id, exc, permanent=True, claim=run.claim)
    except Exception as exc:  # noqa: BLE001 - any crash costs the job one attempt
        if not is_transient(exc):
            log.exception("job %s: %s crashed", job_id, task.name)
            _fail_job(job_id, exc, permanent=False, claim=run.claim)
            return
        if task.request.retries >= MAX_RETRIES:
            log.error("job %s: %s still failing after %s retries", job_id, task.name, MAX_RETRIES)
            _fail_job(job_id, exc, permanent=False, claim=run.claim)
            return
        countdown = backoff_seconds(task.request.retries)
        log.warning("job %s: %s hit %s; retry in %.0f s", job_id, task.name,
                    type(exc).__name__, countdown)
        raise task.retry(exc=exc, countdown=countdown,
                         kwargs={"job_id": job_id, "claim": run.claim}) from exc


_STAGE_OPTIONS: dict[str, Any] = {"bind": True, "acks_late": True, "reject_on_worker_lost": True,
                                  "max_retries": MAX_RETRIES}


@app.task(name=routing.BUILD_SETS, **_STAGE_OPTIONS)
def build_sets(self: Task, job_id: int, claim: str | None = None) -> None:
    from workers.stages import stage_build_sets

    _run_stage(self, stage_build_sets, job_id, claim)


@app.task(name=routing.UNLEARN, **_STAGE_OPTIONS)
def unlearn(self: Task, job_id: int, claim: str | None = None) -> None:
    from workers.stages import stage_unlearn

    _run_stage(self, stage_unlearn, job_id, claim)


@app.task(name=routing.VERIFY, **_STAGE_OPTIONS)
def verify(self: Task, job_id: int, claim: str | None = None) -> None:
    from workers.stages import stage_verify

    _run_stage(self, stage_verify, job_id, claim)


@app.task(name=routing.CERTIFY, **_STAGE_OPTIONS)
def certify(self: Task, job_id: int, claim: str | None = None) -> None:
    from workers.stages import stage_certify

    _run_stage(self, stage_certify, job_id, claim)


@app.task(name=routing.PROMOTE, **_STAGE_OPTIONS)
def promote(self: Task, job_id: int, claim: str | None = None) -> None:
    from workers.stages import stage_promote

    _run_stage(self, stage_promote, job_id, claim)


# ------------------------------------------------------------- periodic tasks
# Idempotent housekeeping: a lost or doubled tick changes nothing.

_PERIODIC_OPTIONS: dict[str, Any] = {"acks_late": True, "autoretry_for": PERIODIC_TRANSIENT,
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
    # Deadline reminders by e-mail and webhook (7 and 2 days before, and on the day).
    from workers.reminders import reminders_run

    return reminders_run()


@app.task(name=routing.DESTROY_CHECKPOINTS, **_PERIODIC_OPTIONS)
def destroy_checkpoints() -> int:
    from workers.housekeeping import checkpoints_destroy_due

    return checkpoints_destroy_due()


@app.task(name=routing.SWEEP_WORK_FILES, **_PERIODIC_OPTIONS)
def sweep_work_files() -> int:
    from workers.workfiles import work_files_sweep

    swept = work_files_sweep()
    return swept.work_dirs + swept.candidates + swept.retired


@app.task(name=routing.PRUNE_OUTBOX, **_PERIODIC_OPTIONS)
def prune_outbox() -> int:
    from workers.housekeeping import outbox_prune_due

    return outbox_prune_due()


@app.task(name=routing.RESEAL_CIPHERTEXTS, **_PERIODIC_OPTIONS)
def reseal_ciphertexts() -> int:
    from workers.housekeeping import ciphertexts_reseal_due

    return ciphertexts_reseal_due()


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
