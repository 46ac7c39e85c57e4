"""End to end on real PostgreSQL and Redis: a real worker process (both queues) and beat
take requests from submission to a promoted, certified checkpoint on the tiny preset.

The three tests share one pipeline (one bootstrap, one worker) and run in order; each
asserts on its own requests and jobs.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from deletion.domain.audit import audit_verify
from deletion.domain.certificates import certificate_get_for_job, certificate_verify_chain
from deletion.domain.config import current
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import (
    AuditEvent,
    Certificate,
    Checkpoint,
    CorpusTombstone,
    CorpusVersion,
    ErasureRequest,
    Job,
    Model,
    utcnow,
)
from deletion.domain.services.requests import request_approve, request_submit
from deletion.domain.signing import keyring_load
from tests.pipeline_fixtures import RunningPipeline
from workers import routing

pytestmark = pytest.mark.slow

STAGE_TASKS = (routing.BUILD_SETS, routing.UNLEARN, routing.VERIFY, routing.CERTIFY,
               routing.PROMOTE)
_used_people: set[str] = set()


def fresh_people(pipeline: RunningPipeline, count: int) -> list[dict[str, Any]]:
    """Trained demo people no earlier test of this module has erased."""
    path = pipeline.work_dir / "corpora" / "demo" / "people.jsonl"
    people = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    chosen = [p for p in people if p["person_id"] not in _used_people][:count]
    _used_people.update(p["person_id"] for p in chosen)
    assert len(chosen) == count
    return chosen


def submit(engine: Any, person: dict[str, Any], *, priority: str = "immediate") -> str:
    with session_scope(engine) as session:
        return request_submit(
            session, actor="user:officer", name=person["name"], aliases=person["aliases"],
            emails=[person["email"]], ground="17(1)(b)", received_at=utcnow(),
            model_name="demo", priority=priority,
        ).reference


def approve(engine: Any, reference: str) -> None:
    with session_scope(engine) as session:
        request_approve(session, actor="user:reviewer", reference=reference)


def job_of(session: Any, reference: str) -> Job:
    request = session.scalars(select(ErasureRequest).where(ErasureRequest.reference == reference)).one()
    return session.scalars(select(Job).where(Job.requests.any(id=request.id))
                           .order_by(Job.id.desc())).first()


@pytest.fixture(scope="module")
def engine(pipeline: RunningPipeline) -> Any:
    engine = make_engine(pipeline.database_url)
    yield engine
    engine.dispose()


def test_a_request_goes_from_submission_to_a_promoted_certified_checkpoint(
    pipeline: RunningPipeline, engine: Any,
) -> None:
    (person,) = fresh_people(pipeline, 1)
    started = time.monotonic()
    reference = submit(engine, person)
    approve(engine, reference)

    assert pipeline.wait_for_request(reference) == "completed"
    elapsed = time.monotonic() - started

    with session_scope(engine) as session:
        job = job_of(session, reference)
        assert job.stage == "done" and job.dead_lettered_at is None
        model = session.scalars(select(Model).where(Model.name == "demo")).one()
        serving = session.get_one(Checkpoint, model.serving_checkpoint_id)
        assert serving.id == job.candidate_checkpoint_id
        assert serving.parent_id == job.base_checkpoint_id
        assert Path(serving.directory).is_dir()
        base = session.get_one(Checkpoint, job.base_checkpoint_id)
        assert base.status == "retired" and base.destroy_after is not None
        certificate = certificate_get_for_job(session, job_id=job.id)
        assert certificate is not None
        payload = json.loads(certificate.payload)
        assert [r["reference"] for r in payload["requests"]] == [reference]
        assert payload["model"]["candidate_checkpoint"]["digest"] == serving.digest
        assert payload["model"]["base_checkpoint"]["digest"] == base.digest
        assert payload["verification"]["passed"] is True
        assert payload["verification"]["policy"]["name"] == "pipeline-mechanics-test"
        assert any(d["digest"] == base.digest for d in payload["old_checkpoints"])
        for secret in (person["name"], person["email"], *person["aliases"]):
            assert secret not in certificate.payload
        tombstones = session.scalar(select(func.count()).select_from(CorpusTombstone)
                                    .where(CorpusTombstone.job_id == job.id))
        assert tombstones == job.sets["forget"] > 0
        chain = certificate_verify_chain(session, keyring_load(current().signing_keyring_dir))
        assert chain.ok, chain
        audit = audit_verify(session)
        assert audit.ok, audit
    # The forget set on disk is personal data: it goes with the job.
    assert not (pipeline.work_dir / "checkpoints" / "_work" / f"job-{job.id}").exists()
    print(f"\nsubmission to completed on the tiny preset: {elapsed:.1f} s; "
          f"stage timings {job.timings}")


def test_every_stage_task_delivered_again_and_again_changes_nothing(
    pipeline: RunningPipeline, engine: Any,
) -> None:
    (person,) = fresh_people(pipeline, 1)
    reference = submit(engine, person)
    approve(engine, reference)
    from workers.runtime import celery

    app = celery()
    job_ids: set[int] = set()
    stop = threading.Event()

    def redeliver() -> None:
        # Every stage task for the job, once a second, while the real pipeline runs:
        # each stage sees its own task at least twice, some while it is running.
        while not stop.wait(1.0):
            with session_scope(engine) as session:
                job = job_of(session, reference)
            if job is None:
                continue
            job_ids.add(job.id)
            for name in STAGE_TASKS:
                queue = routing.queue_for(name)
                app.send_task(name, kwargs={"job_id": job.id}, queue=queue, routing_key=queue,
                              exchange=queue)

    thread = threading.Thread(target=redeliver, daemon=True)
    thread.start()
    try:
        assert pipeline.wait_for_request(reference) == "completed"
        time.sleep(3.0)  # let the last duplicates drain
    finally:
        stop.set()
        thread.join()

    with session_scope(engine) as session:
        (job_id,) = job_ids
        certificates = session.scalar(select(func.count()).select_from(Certificate)
                                      .where(Certificate.job_id == job_id))
        promotions = session.scalar(select(func.count()).select_from(AuditEvent).where(
            AuditEvent.action == "checkpoint.promoted",
            AuditEvent.details.contains(f'"job":{job_id}')))
        tombstone_versions = session.scalar(select(func.count()).select_from(CorpusVersion)
                                            .where(CorpusVersion.job_id == job_id))
        job = session.get_one(Job, job_id)
        serving = session.scalars(select(Checkpoint).where(Checkpoint.status == "serving")).all()
    assert (certificates, promotions, tombstone_versions) == (1, 1, 1)
    assert len(serving) == 1 and serving[0].id == job.candidate_checkpoint_id
    assert job.stage == "done" and job.attempts == 0


def test_ten_requests_at_once_end_in_a_linear_lineage_with_every_request_certified(
    pipeline: RunningPipeline, engine: Any,
) -> None:
    from workers.scheduler import batches_schedule

    people = fresh_people(pipeline, 10)
    references = [submit(engine, p) for p in people]
    # Approvals trickle in: the first three make a job at once, the other seven wait
    # for the model to be free and run from the checkpoint that job promotes.
    for reference in references[:3]:
        approve(engine, reference)
    batches_schedule()
    for reference in references[3:]:
        approve(engine, reference)
    for reference in references:
        assert pipeline.wait_for_request(reference, timeout_s=400) == "completed"

    with session_scope(engine) as session:
        model = session.scalars(select(Model).where(Model.name == "demo")).one()
        promoted = session.scalars(
            select(Checkpoint).where(Checkpoint.model_id == model.id,
                                     Checkpoint.promoted_at.is_not(None))
            .order_by(Checkpoint.promoted_at)
        ).all()
        # Linear: every promoted checkpoint's parent is the one promoted before it.
        for earlier, later in zip(promoted, promoted[1:], strict=False):
            assert later.parent_id == earlier.id
        assert promoted[-1].id == model.serving_checkpoint_id
        certified: list[str] = []
        chained_digests = []
        for certificate in session.scalars(select(Certificate).order_by(Certificate.seq)):
            payload = json.loads(certificate.payload)
            certified += [r["reference"] for r in payload["requests"]]
            chained_digests.append((payload["model"]["base_checkpoint"]["digest"],
                                    payload["model"]["candidate_checkpoint"]["digest"]))
        for (_, candidate), (base, _) in zip(chained_digests, chained_digests[1:], strict=False):
            assert base == candidate
        assert sorted(r for r in certified if r in references) == sorted(references)
        assert len(certified) == len(set(certified))
        jobs = {job_of(session, r).id for r in references}
        assert len(jobs) >= 2
        # Rolling back may never bring an erased subject back.
        from workers.lineage import rollback_targets

        assert [c.id for c in rollback_targets(session, model_name="demo")] == [promoted[-1].id]
        assert certificate_verify_chain(session, keyring_load(current().signing_keyring_dir)).ok
        assert audit_verify(session).ok
