"""Promotion never loses the serving model: a failure injected at every point of certify
and promote, before and after the certificate commits, with duplicate and concurrent
copies of the stage, and housekeeping destroying whatever is due after every step.

After every step: the model's serving checkpoint is `serving`, its files are there and
hash to its registered digest, and a certificate exists exactly when the candidate serves.
At the end: the job is done with one certificate and one promotion, the candidate
serves, and both chains verify.  On the code before issue 14 the fault in promote
(`notifications_open`) failed the job, the retried job re-based, retired the checkpoint
that already served, and housekeeping deleted its files.

In this process, on real PostgreSQL, with checkpoints that are small folders
(tests/stage_fixtures.py); nothing here trains or loads a model.
"""

from __future__ import annotations

import errno
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError

from deletion.domain import registry
from deletion.domain.audit import audit_verify
from deletion.domain.certificates import certificate_verify_chain
from deletion.domain.config import current
from deletion.domain.db import session_scope
from deletion.domain.models import AuditEvent, Certificate, Checkpoint, Model, utcnow
from deletion.domain.signing import keyring_load
from tests.stage_fixtures import WorkerDisk, run_task, worker_disk_fixtures
from workers import routing, stages

STAGE_TASK = {"queued": routing.BUILD_SETS, "building_sets": routing.BUILD_SETS,
              "unlearning": routing.UNLEARN, "verifying": routing.VERIFY,
              "certifying": routing.CERTIFY, "promoting": routing.PROMOTE}


class InjectedFault(RuntimeError):
    """The failure a test injects."""


def transient() -> BaseException:
    return OperationalError("COMMIT", {}, ConnectionError("server closed the connection"))


@dataclass(frozen=True)
class Point:
    name: str
    module: str
    function: str
    when: str  # "before" or "after" the real call
    error: Callable[[], BaseException] = lambda: InjectedFault("injected")
    committed: bool = False  # whether the certificate has committed when it fires


POINTS = [
    # Inside the certify transaction: everything rolls back.
    Point("candidate re-hash", "deletion.domain.registry", "checkpoint_check_files", "before"),
    Point("payload built", "deletion.domain.services.certification", "certificate_build_payload",
          "after"),
    Point("certificate issued", "deletion.domain.services.certification", "certificate_issue",
          "after"),
    Point("serving pointer moved", "deletion.domain.registry", "checkpoint_promote", "after"),
    Point("corpus tombstoned", "deletion.domain.registry", "corpus_tombstone", "after"),
    Point("requests completed", "deletion.domain.services.certification", "request_transition",
          "after"),
    Point("handed over to promote", "deletion.domain.services.certification", "job_hand_over",
          "after"),
    Point("connection lost before commit", "workers.stages", "job_certify_and_promote", "after",
          transient),
    # After the certificate committed.
    Point("connection lost after commit", "workers.stages", "_relay_now", "before", transient,
          committed=True),
    Point("relay crashed after commit", "workers.stages", "_relay_now", "before", committed=True),
    Point("promote claim", "workers.stages", "job_claim", "before", committed=True),
    Point("notifications", "workers.notifications", "notifications_open", "before",
          committed=True),
    Point("job.done audit", "workers.stages", "audit_append", "before", committed=True),
    Point("work files removal", "workers.workfiles", "work_files_remove", "before",
          lambda: PermissionError(errno.EACCES, "Permission denied"), committed=True),
]


database_url, disk = worker_disk_fixtures("reliability_promotion")


def arm(monkeypatch: pytest.MonkeyPatch, point: Point) -> list[int]:
    """Make `point` fail once (whichever copy reaches it first); returns the hit counter."""
    import importlib

    module = importlib.import_module(point.module)
    original = getattr(module, point.function)
    hits: list[int] = []
    lock = threading.Lock()

    def faulty(*args: Any, **kwargs: Any) -> Any:
        with lock:
            fire = not hits
            if fire:
                hits.append(1)
        if fire and point.when == "before":
            raise point.error()
        result = original(*args, **kwargs)
        if fire:
            raise point.error()
        return result

    monkeypatch.setattr(module, point.function, faulty)
    return hits


def housekeeping_now(disk: WorkerDisk) -> None:
    """Destroy every retired checkpoint at once, as if its grace window had passed."""
    from workers.housekeeping import checkpoints_destroy_due

    with session_scope(disk.engine) as session:
        session.execute(update(Checkpoint).where(Checkpoint.status == "retired")
                        .values(destroy_after=utcnow() - timedelta(seconds=1)))
    checkpoints_destroy_due()


def assert_serving_intact(disk: WorkerDisk, job_id: int) -> None:
    with session_scope(disk.engine) as session:
        model = session.scalars(select(Model).where(Model.name == disk.model)).one()
        serving = session.get_one(Checkpoint, model.serving_checkpoint_id)
        assert serving.status == "serving" and serving.destroyed_at is None
        assert registry.checkpoint_digest(serving.directory) == serving.digest
        certificates = session.scalar(select(func.count()).select_from(Certificate)
                                      .where(Certificate.job_id == job_id))
        candidate = disk.job(job_id).candidate_checkpoint_id
        # A certificate exists exactly when the candidate serves.
        assert (certificates == 1) == (serving.id == candidate), (certificates, serving.id)
        assert certificates <= 1


def step(disk: WorkerDisk, job_id: int, *, concurrent: bool = False) -> None:
    """Run the job's current stage the way the broker may deliver it: twice in a row, or
    as two copies at once; then housekeeping; then the invariants."""
    stage = disk.job(job_id).stage
    if stage in ("failed",):
        from workers.reconciler import jobs_reconcile

        jobs_reconcile(now=utcnow() + timedelta(hours=1))
    elif stage in STAGE_TASK:
        task = stages.STAGES[STAGE_TASK[stage]]
        if concurrent:
            threads = [threading.Thread(target=run_task, args=(task, job_id), kwargs={"name": stage})
                       for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
        else:
            for _ in range(2):  # the message and a redelivered copy
                run_task(task, job_id, name=stage)
    housekeeping_now(disk)
    assert_serving_intact(disk, job_id)
    if disk.job(job_id).heartbeat_at is None and stage == disk.job(job_id).stage:
        # A hand-over whose message was lost (a crash between commit and relay): the
        # reconciler sends it again after the stale window.
        from workers.reconciler import jobs_reconcile

        jobs_reconcile(now=utcnow() + timedelta(hours=1))


@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
def test_a_failure_at_this_point_of_promotion_never_loses_the_serving_checkpoint(
    disk: WorkerDisk, monkeypatch: pytest.MonkeyPatch, point: Point,
) -> None:
    job_id = disk.job_at("certifying")
    base = disk.serving()
    hits = arm(monkeypatch, point)
    step(disk, job_id, concurrent=True)
    for _ in range(12):
        if disk.job(job_id).stage == "done":
            break
        step(disk, job_id)
    job = disk.job(job_id)
    assert hits, f"the fault at {point.name} never fired"
    assert (job.stage, job.dead_lettered_at) == ("done", None), (job.stage, job.error)

    serving = disk.serving()
    assert serving.id == job.candidate_checkpoint_id and serving.parent_id == base.id
    with session_scope(disk.engine) as session:
        assert session.get_one(Checkpoint, base.id).status == "destroyed"  # grace passed
        promotions = session.scalars(select(AuditEvent).where(
            AuditEvent.action == "checkpoint.promoted",
            AuditEvent.details.contains(f'"job":{job_id}'))).all()
        assert len(promotions) == 1
        retired_serving = session.scalars(select(AuditEvent).where(
            AuditEvent.action == "checkpoint.retired",
            AuditEvent.object_ref == str(serving.id))).all()
        assert not retired_serving
        assert certificate_verify_chain(session, keyring_load(current().signing_keyring_dir)).ok
        assert audit_verify(session).ok
    sys.stderr.write(f"\npromotion fault '{point.name}' "
                     f"({'after' if point.committed else 'before'} the certificate commit): "
                     f"job {job_id} done, attempts {job.attempts}, serving v{serving.version} "
                     "intact\n")
