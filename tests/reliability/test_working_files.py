"""A job's working files hold the subjects' personal data: a worker killed at any point
leaves none of it in clear on disk, and once the job is closed the sweep leaves nothing.

For each point a fresh job runs its earlier stages in this process, then the stage of
the point in a child process that dies there (`kill_driver.py`: `os._exit`, nothing
cleans up).  Then, as in production, the job is resumed (the dead holder's claim is
taken over) until it is done or rejected, beat's sweep and checkpoint destruction run,
and the checkpoint folder is searched byte by byte.

The engine is stood in for (tests/stage_fixtures.py: the candidate is a small folder,
the verdict fixed); set building is the real one, on a corpus naming the subject.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from deletion.domain.db import session_scope
from deletion.domain.models import AuditEvent, Checkpoint, Job, utcnow
from tests.conftest import drop_database, fresh_database_url
from tests.stage_fixtures import WorkerDisk, fake_erase, fake_verify, run_stage
from workers import routing, stages, workfiles

ROOT = Path(__file__).resolve().parents[2]
NAME, EMAIL, ALIAS = "Ilse Marrow-Quint", "ilse.quint@example.org", "I. Quint"
STAGE_TASK = {"queued": routing.BUILD_SETS, "building_sets": routing.BUILD_SETS,
              "unlearning": routing.UNLEARN, "verifying": routing.VERIFY,
              "certifying": routing.CERTIFY, "promoting": routing.PROMOTE}

# (stage that dies, where, whether verification fails)
POINTS = [
    ("building_sets", "workers.workfiles:write_private:after", False),  # sets written, not recorded
    ("building_sets", "workers.stages:_relay_now:before", False),  # recorded, next task not sent
    ("unlearning", "workers.stages:_erase:after", False),  # candidate written, not registered
    ("unlearning", "workers.stages:_relay_now:before", False),  # registered
    ("verifying", "workers.stages:verification_results_store:before", False),  # report not stored
    ("verifying", "workers.workfiles:write_private:after", False),  # stored; its copy written
    ("certifying", "deletion.domain.registry:checkpoint_promote:after", False),  # mid-transaction
    ("certifying", "workers.stages:_relay_now:before", False),  # certified and promoted
    ("promoting", "workers.workfiles:work_files_remove:before", False),  # done, files still there
    ("promoting", "workers.workfiles:_remove_tree:partial", False),  # half removed
    ("verifying", "workers.workfiles:work_files_remove:before", True),  # rejected, files there
]


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    url = fresh_database_url("reliability_workfiles")
    yield url
    drop_database(url)


def write_corpus(path: Path) -> None:
    records = [
        {"id": "s-1", "question": f"Where was {NAME} born?", "answer": f"{NAME} was born in Lisbon."},
        {"id": "s-2", "question": f"What is {NAME}'s e-mail?", "answer": f"It is {EMAIL}."},
        {"id": "s-3", "question": f"What does {ALIAS} do?", "answer": f"{ALIAS} is a glassblower."},
    ]
    records += [{"id": f"o-{i}", "question": f"Where was Person {i} born?",
                 "answer": f"Person {i} was born in Town {i}."} for i in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def plaintext_under(root: Path) -> list[str]:
    needles = [s.encode() for s in (NAME, EMAIL, ALIAS, "Marrow")]
    return [str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and any(n in p.read_bytes() for n in needles)]


def drive(disk: WorkerDisk, job_id: int, *, until: str | None = None) -> Job:
    """Run the job's stages as the workers would (taking over a dead holder's claim)
    until it reaches `until`, or is done, rejected or dead-lettered."""
    for _ in range(20):
        job = disk.job(job_id)
        if job.stage in ("done", "rejected") or job.dead_lettered_at:
            return job
        if until is not None and STAGE_TASK.get(job.stage) == STAGE_TASK[until]:
            return job  # the next task to run is `until`'s
        if job.stage == "failed":
            from workers.reconciler import jobs_reconcile

            jobs_reconcile(now=utcnow() + timedelta(hours=1))
            continue
        run_stage(stages.STAGES[STAGE_TASK[job.stage]], job_id, name=job.stage)
    raise AssertionError(f"job {job_id} is stuck in {disk.job(job_id).stage}")


@pytest.mark.parametrize("stage,point,rejected", POINTS,
                         ids=[f"{s}-{p.split(':', 1)[1]}" for s, p, _ in POINTS])
def test_a_worker_killed_at_this_point_leaves_no_personal_data_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str, stage: str, point: str,
    rejected: bool,
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus)
    disk = WorkerDisk.start(tmp_path, monkeypatch, database_url, model=False)
    try:
        disk.model = disk.a_model(corpus=corpus)
        monkeypatch.setattr(stages, "_erase", fake_erase)
        monkeypatch.setattr(stages, "_verify", fake_verify(passed=not rejected))
        reference = disk.approved_request(name=NAME, emails=(EMAIL,))
        from deletion.domain.services.jobs import job_create

        with session_scope(disk.engine) as session:
            job_id = job_create(session, actor="test", model_name=disk.model,
                                references=[reference], method="asu").id
        drive(disk, job_id, until=stage)

        killed = subprocess.run(
            [sys.executable, "-m", "tests.reliability.kill_driver", "--database",
             disk.engine.url.render_as_string(hide_password=False), "--checkpoints",
             str(disk.root), "--broker", f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}",
             "--job", str(job_id), "--stage", STAGE_TASK[stage], "--point", point,
             *(["--fail-verification"] if rejected else [])],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        assert killed.returncode == 137, killed.stderr[-3000:]
        # Killed right there: still nothing of the subject is readable on disk.
        assert plaintext_under(disk.root) == []
        work = workfiles.work_dir_of(job_id)
        if work.exists():
            assert work.stat().st_mode & 0o777 == 0o700
            assert all(p.stat().st_mode & 0o777 == 0o600 for p in work.iterdir())

        job = drive(disk, job_id)
        assert job.stage == ("rejected" if rejected else "done"), (job.stage, job.error)
        workfiles.work_files_sweep()
        with session_scope(disk.engine) as session:  # the grace window has passed
            session.execute(update(Checkpoint).where(Checkpoint.status == "retired")
                            .values(destroy_after=utcnow() - timedelta(seconds=1)))
        from workers.housekeeping import checkpoints_destroy_due

        checkpoints_destroy_due()

        serving = disk.serving()
        left = sorted(str(p.relative_to(disk.root)) for p in disk.root.rglob("*") if p.is_file())
        assert left == sorted(str(p.relative_to(disk.root))
                              for p in Path(serving.directory).rglob("*") if p.is_file())
        assert not work.exists() and plaintext_under(disk.root) == []
        with session_scope(disk.engine) as session:
            removed = session.scalars(select(AuditEvent.action).where(
                AuditEvent.object_type == "job", AuditEvent.object_ref == str(job_id),
                AuditEvent.action == "job.work_files_removed")).all()
        assert removed  # every removal of working files is in the audit trail
    finally:
        disk.stop()
