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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from deletion.domain.config import Config, current
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import utcnow

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


def holder_gone(holder: str | None) -> bool:
    """True when the stage's holder was a worker process on this host that no longer runs.

    `jobs.worker` is `worker@<node>:<pid>` (`worker_name`).  A pool process killed by the
    kernel or an OOM keeps a fresh-looking heartbeat for up to a stale period; when the
    broker redelivers its task on the same host, this lets the new copy take the stage over
    at once instead of waiting for the reconciler.  Another host's holder is never judged
    from here (its heartbeat is).  The take-over is a compare-and-set on the claim, so a
    wrong answer here can cost an attempt, never a double run's writes.
    """
    prefix = f"worker@{os.uname().nodename}:"
    if not holder or not holder.startswith(prefix):
        return False
    try:
        pid = int(holder.removeprefix(prefix))
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


@dataclass
class StageRun:
    """One run of one stage task: the claim it holds once taken, whether that claim was
    lost since (another worker took the stage over), and the files it wrote that are its
    alone until they are registered (removed if the claim is lost)."""

    job_id: int
    claim: str | None = None
    lost: threading.Event = field(default_factory=threading.Event)
    owned: list[Path] = field(default_factory=list)

    def check(self) -> None:
        """Raise `ClaimLost` once a heartbeat or progress update found the claim taken over."""
        if self.lost.is_set():
            from deletion.domain.services.jobs import ClaimLost

            raise ClaimLost(f"job {self.job_id}: another worker took this stage over")

    @property
    def token(self) -> str:
        """The claim this run holds; `ClaimLost` when it never took its stage."""
        if self.claim is None:
            from deletion.domain.services.jobs import ClaimLost

            raise ClaimLost(f"job {self.job_id}: this run holds no claim")
        return self.claim


def stage_take_over(session: Any, *, run: StageRun, stage: str) -> str | None:
    """Take `stage` for this run (services.jobs.job_take_over): by its own claim when this is
    a retry of the task that holds it, else when it was handed over, its heartbeat is stale
    or its holder's process is gone."""
    from datetime import timedelta

    from deletion.domain.services.jobs import job_take_over

    token = job_take_over(
        session, job_id=run.job_id, stage=stage, worker=worker_name(),
        stale_before=utcnow() - timedelta(minutes=config().job_stale_minutes),
        holder_gone=holder_gone, claim=run.claim,
    )
    if token is not None:
        run.claim = token
    return token


def touch_heartbeat(run: StageRun) -> None:
    """Mark the job as alive while this run's claim is current; note it when it is not."""
    from deletion.domain.services.jobs import job_heartbeat

    if run.claim is None:
        return
    with session_scope(engine()) as session:
        if not job_heartbeat(session, job_id=run.job_id, claim=run.claim, worker=worker_name()):
            run.lost.set()


@contextmanager
def heartbeat(run: StageRun, *, every_s: float = HEARTBEAT_SECONDS) -> Iterator[None]:
    """Touch the job's heartbeat from a side thread while a long stage runs.

    A stage that blocks in torch for minutes would otherwise look dead; a
    worker that is killed stops beating, which is exactly what the reconciler
    looks for.  A beat that finds the claim taken over marks the run lost: the
    progress callback then stops the engine, and nothing the run made is stored.
    """
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            try:
                touch_heartbeat(run)
            except Exception:  # noqa: BLE001 - a missed beat must not kill the stage
                log.warning("job %s: heartbeat failed", run.job_id, exc_info=True)

    touch_heartbeat(run)
    thread = threading.Thread(target=beat, name=f"heartbeat-job-{run.job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


class ProgressReporter:
    """The engine's progress callback, throttled into `job_progress` rows.

    Raises `ClaimLost` (which ends the engine's work) once the run's claim is gone."""

    def __init__(self, run: StageRun, *, min_interval_s: float = PROGRESS_MIN_INTERVAL_S) -> None:
        self.run = run
        self.min_interval_s = min_interval_s
        self._last = 0.0

    def __call__(self, progress: Any) -> None:
        self.run.check()
        now = time.monotonic()
        last_step = progress.total > 0 and progress.step >= progress.total
        if now - self._last < self.min_interval_s and not last_step:
            return
        self._last = now
        from deletion.domain.services.jobs import job_progress

        try:
            with session_scope(engine()) as session:
                current = job_progress(session, job_id=self.run.job_id, step=int(progress.step),
                                       total=int(progress.total), eta_seconds=progress.eta_seconds,
                                       stage=str(progress.stage), claim=self.run.claim)
        except Exception:  # noqa: BLE001 - progress is advisory; the stage goes on
            log.warning("job %s: progress update failed", self.run.job_id, exc_info=True)
            return
        if not current:
            self.run.lost.set()
            self.run.check()


def versions() -> dict[str, str]:
    """Library and code versions a certificate states."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for package in ("torch", "transformers", "celery", "sqlalchemy", "cryptography"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    found["erasure-service"] = code_version()
    return found


def code_version() -> str:
    """The commit the worker runs (stated in certificates): `ERASURE_CODE_VERSION` (set by
    the image build, which carries no .git), else the checkout's; `unknown` otherwise."""
    import subprocess

    stated = os.environ.get("ERASURE_CODE_VERSION", "").strip()
    if stated and stated != "unknown":
        return stated[:40]
    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() or "unknown"


def unlearn_parallelism() -> tuple[str, str]:
    """How the unlearning stage spreads over this worker's devices, as set, not yet resolved:
    `UNLEARN_PROCESSES` (a number of ranks, or `auto`: one per CUDA device; default 1) and
    `UNLEARN_SHARDING` (`none`, or `fsdp` to shard the parameters too; default none).
    `unlearning.distributed` resolves them (it needs torch, which this module never imports)."""
    return (os.environ.get("UNLEARN_PROCESSES", "1").strip() or "1",
            os.environ.get("UNLEARN_SHARDING", "none").strip() or "none")
