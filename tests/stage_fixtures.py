"""Jobs on disk for in-process stage tests: a registered model whose checkpoints are
small folders, jobs brought to any stage by the real services, and a stand-in for the
Celery task that runs a stage exactly as tasks.py does.  No model is trained or
loaded: these tests are about claims, files, certificates and the serving pointer.

    disk = WorkerDisk.start(tmp_path, monkeypatch, database_url)
    job_id = disk.job_at("certifying")
    outcome = run_stage(stage_certify, job_id)
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine, select

from deletion.domain import registry
from deletion.domain.config import current
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import Checkpoint, Job, Model, utcnow
from deletion.domain.services.certification import verification_report_store
from deletion.domain.services.jobs import job_claim, job_create, job_hand_over, job_record
from deletion.domain.services.requests import request_approve, request_submit

REPORT: dict[str, Any] = {
    "policy": {"name": "pipeline-mechanics-test", "version": "1"},
    "passed": True,
    "guarantee": "weights",
    "metrics": {"utility.ppl_ratio": 1.02, "leakage.forget": 0.05, "mia.auc": 0.55},
    "checks": [{"name": "candidate not wrecked", "metric": "utility.ppl_ratio", "value": 1.02,
                "threshold": 10.0, "comparator": "<=", "passed": True}],
    "verified_at": "2026-12-01T10:00:00+00:00",
    "seconds": 1.0,
}
PIPELINE = ("queued", "building_sets", "unlearning", "verifying", "certifying", "promoting")
TASKS = {"building_sets": "erasure.unlearn", "unlearning": "erasure.verify",
         "verifying": "erasure.certify", "certifying": "erasure.promote"}


class Retried(Exception):
    """What the stand-in task raises where Celery's `task.retry` would."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("retry")
        self.kwargs = kwargs


def fake_task(name: str, *, retries: int = 0) -> Any:
    def retry(*, exc: BaseException, countdown: float, kwargs: dict[str, Any]) -> Exception:
        return Retried(kwargs)

    return SimpleNamespace(name=name, request=SimpleNamespace(retries=retries, delivery_info={}),
                           retry=retry)


def run_stage(stage: Callable[..., None], job_id: int, *, claim: str | None = None,
              retries: int = 0, name: str = "erasure.stage") -> str:
    """Run one stage as its Celery task would; `done`, or `retry` where it asked for one."""
    from workers.tasks import _run_stage

    try:
        _run_stage(fake_task(name, retries=retries), stage, job_id, claim)
    except Retried:
        return "retry"
    return "done"


def run_task(stage: Callable[..., None], job_id: int, *, name: str = "erasure.stage") -> int:
    """One delivery of a stage task with Celery's retries (no countdown): each retry carries
    the claim the task asked it to.  Returns how many retries it took."""
    from workers.tasks import MAX_RETRIES, _run_stage

    claim = None
    for retries in range(MAX_RETRIES + 1):
        try:
            _run_stage(fake_task(name, retries=retries), stage, job_id, claim)
            return retries
        except Retried as retry:
            claim = retry.kwargs.get("claim")
    raise AssertionError(f"{name} asked for a retry after its last one")


@dataclass
class WorkerDisk:
    """A database and a checkpoint folder the worker code in this process uses."""

    engine: Engine
    root: Path
    model: str = ""
    people: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str,
              *, model: bool = True) -> WorkerDisk:
        from workers import runtime, workfiles

        root = tmp_path / "checkpoints"
        root.mkdir()
        settings = dataclasses.replace(current(), checkpoint_dir=root)
        monkeypatch.setattr(workfiles, "config", lambda: settings)
        runtime.use_database(database_url,
                             broker_url=f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}")
        monkeypatch.setattr(runtime, "_database_url_override", database_url)
        disk = cls(make_engine(database_url), root)
        if model:
            disk.model = disk.a_model()
        return disk

    def stop(self) -> None:
        from workers import runtime

        runtime.use_database(None)
        self.engine.dispose()

    def a_model(self, corpus: Path | None = None) -> str:
        """A model serving v1; `corpus` a JSONL file set building can scan (else none)."""
        name = f"m-{uuid.uuid4().hex[:8]}"
        directory = self.root / name / "v1"
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"base weights " + name.encode())
        (directory / "config.json").write_text('{"layers": 2}')
        with session_scope(self.engine) as session:
            registry.corpus_register(session, actor="test", name=f"c-{name}",
                                     path=str(corpus or "/dev/null"), manifest_digest="0" * 64,
                                     record_count=10)
            registry.model_register(session, actor="test", name=name, corpus_name=f"c-{name}",
                                    batch_window_hours=24)
            registry.checkpoint_register(session, actor="test", model_name=name,
                                         directory=str(directory), serving=True)
        return name

    def approved_request(self, model: str | None = None, *, name: str | None = None,
                         emails: tuple[str, ...] = ()) -> str:
        with session_scope(self.engine) as session:
            reference = request_submit(
                session, actor="user:officer", name=name or f"Person {uuid.uuid4().hex[:6]}",
                emails=list(emails), ground="17(1)(a)", received_at=utcnow(),
                model_name=model or self.model).reference
        with session_scope(self.engine) as session:
            request_approve(session, actor="user:reviewer", reference=reference)
        self.people.append(reference)
        return reference

    def job_at(self, stage: str, *, model: str | None = None,
               report: dict[str, Any] | None = None) -> int:
        """A new job for a new request, brought to `stage` and handed over there (free for
        its task), with what the earlier stages store: sets, a candidate folder, a report."""
        from datetime import timedelta

        from deletion.domain.services.jobs import job_release, job_take_over

        model = model or self.model
        reference = self.approved_request(model)
        with session_scope(self.engine) as session:
            job_id = job_create(session, actor="test", model_name=model, references=[reference],
                                method="asu").id
        target = PIPELINE.index(stage)
        if target == 0:
            return job_id
        with session_scope(self.engine) as session:
            claim = job_claim(session, job_id=job_id, expected_stage="queued",
                              next_stage="building_sets", worker="test")
        for done in PIPELINE[1:target]:
            with session_scope(self.engine) as session:
                if done != "building_sets":
                    claim = job_take_over(session, job_id=job_id, stage=done, worker="test",
                                          stale_before=utcnow() - timedelta(hours=1))
                self._produce(session, job_id, done, model, report or REPORT)
                job_hand_over(session, job_id=job_id, claim=claim or "", current=done,
                              nxt=PIPELINE[PIPELINE.index(done) + 1], task_name=TASKS[done])
        if stage == "building_sets":
            with session_scope(self.engine) as session:
                job_release(session, job_id=job_id)
        return job_id

    def _produce(self, session: Any, job_id: int, stage: str, model: str,
                 report: dict[str, Any]) -> None:
        if stage == "building_sets":
            from workers import workfiles

            # A stand-in for the encrypted sets (no stage here reads it: the candidate and
            # the report exist), so that a replayed job finds its sets built.
            folder = workfiles.private_dir(workfiles.work_dir_of(job_id))
            workfiles.write_private(folder / "sets-none.aesgcm", b"stand-in")
            job_record(session, job_id=job_id, sets={
                "forget_digest": "f" * 64, "retain_digest": "e" * 64, "probes_digest": "d" * 64,
                "corpus_digest": "c" * 64, "counts": {"unmatched": []}, "forget": 1,
                "retain": 1, "probes": 4, "forget_record_ids": [f"rec-{job_id}"],
                "sets_file": "sets-none.aesgcm"})
        elif stage == "unlearning":
            job = session.get_one(Job, job_id)
            directory = self.root / model / f"job-{job_id}-candidate"
            directory.mkdir(parents=True)
            (directory / "model.safetensors").write_bytes(f"candidate of job {job_id}".encode())
            (directory / "config.json").write_text('{"layers": 2}')
            registry.checkpoint_register(session, actor="test", model_name=model,
                                         directory=str(directory),
                                         parent_id=job.base_checkpoint_id, job_id=job_id)
        elif stage == "verifying":
            job = session.get_one(Job, job_id)
            verification_report_store(session, job_id=job_id, round_=0,
                                      candidate_id=job.candidate_checkpoint_id, report=report)

    # ------------------------------------------------------------- reading back

    def job(self, job_id: int) -> Job:
        with session_scope(self.engine) as session:
            return session.get_one(Job, job_id)

    def serving(self, model: str | None = None) -> Checkpoint:
        with session_scope(self.engine) as session:
            row = session.scalars(select(Model).where(Model.name == (model or self.model))).one()
            return session.get_one(Checkpoint, row.serving_checkpoint_id)


# ----------------------------------------------------- the engine, stood in for


def fake_erase(plan: Any, run: Any) -> Any:
    """`stages._erase` without torch: a candidate folder under this claim's name (the
    fields of `EraseResult` that the stage reads)."""
    from workers import workfiles

    out = workfiles.candidate_dir_of(plan.model_name, plan.job_id, plan.round, plan.base_version,
                                     plan.claim)
    run.owned.append(out)
    workfiles.sets_load(plan.job_id, plan.sets_file)  # what the real one reads first
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(f"unlearned by claim {plan.claim}".encode())
    (out / "config.json").write_text('{"layers": 2}')
    return SimpleNamespace(out_dir=out, digest=registry.checkpoint_digest(out), method=plan.method,
                           hparams={"epochs": 1}, seconds=0.01, steps=1)


def fake_verify(passed: bool = True) -> Callable[[Any, Any], dict[str, Any]]:
    """`stages._verify` without torch: checks the files as the real one does, then judges."""
    def verify(plan: Any, run: Any) -> dict[str, Any]:
        from workers import stages, workfiles

        workfiles.sets_load(plan.job_id, plan.sets_file)
        stages._check_files(plan.candidate_dir, plan.candidate_digest, "candidate")
        report = dict(REPORT, passed=passed)
        if not passed:
            report["checks"] = [dict(REPORT["checks"][0], passed=False)]
        return report

    return verify


def worker_disk_fixtures(database_name: str) -> tuple[Any, Any]:
    """The module's fresh database (`database_url`) and a `disk` on it for each test:
    `database_url, disk = worker_disk_fixtures("erasure_claims")` at a test module's top."""
    from tests.conftest import drop_database, fresh_database_url

    @pytest.fixture(scope="module")
    def database_url() -> Iterator[str]:
        url = fresh_database_url(database_name)
        yield url
        drop_database(url)

    @pytest.fixture
    def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str) -> Iterator[WorkerDisk]:
        disk = WorkerDisk.start(tmp_path, monkeypatch, database_url)
        yield disk
        disk.stop()

    return database_url, disk

