"""What every task body shares: settings, the database engine, the signer,
and the heartbeat/progress reporters that keep a running job visibly alive.

Engines are made per process (the prefork pool forks after import, and a
connection pool must never cross a fork).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, case, update

from deletion.domain.config import Config, current
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import Job, utcnow

if TYPE_CHECKING:
    from celery import Celery

    from deletion.domain.signing import Signer

log = logging.getLogger(__name__)

WORKER_ACTOR = "system:worker"
HEARTBEAT_SECONDS = 15.0
PROGRESS_MIN_INTERVAL_S = 2.0

_engines: dict[tuple[int, str], Engine] = {}
_lock = threading.Lock()
_database_url_override: str | None = None
_broker_override: Celery | None = None


def config() -> Config:
    return current()


def use_database(url: str | None, *, broker_url: str | None = None) -> None:
    """Point this process at another database and broker than its settings name
    (a test, or a driver process talking to a running pipeline)."""
    global _database_url_override, _broker_override
    _database_url_override = url
    if broker_url is None:
        _broker_override = None
    else:
        from workers.celery_app import make_celery

        _broker_override = make_celery(broker_url)


def celery() -> Celery:
    """The Celery app to send with: the override, else the one built from settings."""
    if _broker_override is not None:
        return _broker_override
    from workers.celery_app import app

    return app


def engine() -> Engine:
    """This process's engine for DATABASE_URL (made after any fork)."""
    key = (os.getpid(), _database_url_override or config().database_url)
    with _lock:
        if key not in _engines:
            _engines[key] = make_engine(key[1])
        return _engines[key]


def signer() -> Signer:
    from deletion.domain.signing import signer_load

    cfg = config()
    return signer_load(key_file=cfg.signing_key_file, keyring_dir=cfg.signing_keyring_dir,
                       generate=True)


def worker_name() -> str:
    """Audit actor of a claim: which worker process took the stage."""
    return f"worker@{os.uname().nodename}:{os.getpid()}"


def touch_heartbeat(job_id: int) -> None:
    """Mark the job as alive: the reconciler resumes jobs whose heartbeat went stale."""
    with session_scope(engine()) as session:
        session.execute(
            update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow(), worker=worker_name())
        )


@contextmanager
def heartbeat(job_id: int, *, every_s: float = HEARTBEAT_SECONDS) -> Iterator[None]:
    """Touch the job's heartbeat from a side thread while a long stage runs.

    A stage that blocks in torch for minutes would otherwise look dead; a
    worker that is killed stops beating, which is exactly what the reconciler
    looks for.
    """
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            try:
                touch_heartbeat(job_id)
            except Exception:  # noqa: BLE001 - a missed beat must not kill the stage
                log.warning("job %s: heartbeat failed", job_id, exc_info=True)

    touch_heartbeat(job_id)
    thread = threading.Thread(target=beat, name=f"heartbeat-job-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


class ProgressReporter:
    """The engine's progress callback, throttled into `job_progress` rows."""

    def __init__(self, job_id: int, *, min_interval_s: float = PROGRESS_MIN_INTERVAL_S) -> None:
        self.job_id = job_id
        self.min_interval_s = min_interval_s
        self._last = 0.0

    def __call__(self, progress: Any) -> None:
        now = time.monotonic()
        last_step = progress.total > 0 and progress.step >= progress.total
        if now - self._last < self.min_interval_s and not last_step:
            return
        self._last = now
        from deletion.domain.services.jobs import job_progress

        try:
            with session_scope(engine()) as session:
                job_progress(session, job_id=self.job_id, step=int(progress.step),
                             total=int(progress.total), eta_seconds=progress.eta_seconds,
                             stage=str(progress.stage))
        except Exception:  # noqa: BLE001 - progress is advisory; the stage goes on
            log.warning("job %s: progress update failed", self.job_id, exc_info=True)


def job_take_over(session: Any, *, job_id: int, stage: str, own_retry: bool) -> bool:
    """Resume a stage whose worker is gone: the job is in `stage` and its heartbeat is
    stale or cleared (or this is a retry of the very task that claimed it).  A compare-and-set on
    the heartbeat, so two redelivered copies cannot both take over; each take-over
    counts as an attempt.
    """
    from datetime import timedelta

    cutoff = utcnow() - timedelta(minutes=config().job_stale_minutes)
    condition = [Job.id == job_id, Job.stage == stage, Job.dead_lettered_at.is_(None)]
    if not own_retry:
        condition.append((Job.heartbeat_at.is_(None)) | (Job.heartbeat_at < cutoff))
    # A NULL heartbeat marks a stage handed over on purpose (escalation): no attempt spent.
    spent = case((Job.heartbeat_at.is_(None), 0), else_=1)
    changed = session.execute(
        update(Job).where(*condition)
        .values(heartbeat_at=utcnow(), worker=worker_name(), attempts=Job.attempts + spent)
        .execution_options(synchronize_session=False)
    ).rowcount
    return bool(changed)


def code_version() -> str:
    """The commit the worker runs (stated in certificates); `unknown` outside a checkout."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() or "unknown"
