"""A worker killed in the middle of a stage loses nothing: neither embedded broker
redelivers the task, so the reconciler (in beat) sees the stale heartbeat and sends the
stage again, and a new worker takes it over.  Takes about two minutes: the stale cutoff
is one minute (JOB_STALE_MINUTES=1, its minimum)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import Certificate, Job, utcnow
from deletion.domain.services.requests import request_approve, request_submit
from tests.conftest import fresh_sqlite_url
from tests.pipeline_fixtures import running_pipeline, sqlite_broker_url

pytestmark = pytest.mark.slow


def test_a_job_survives_its_worker_being_killed_mid_stage(tmp_path: Path,
                                                          tiny_assets_dir: Path) -> None:
    url = fresh_sqlite_url(tmp_path)
    with running_pipeline(database_url=url, broker_url=sqlite_broker_url(tmp_path),
                          work_dir=tmp_path / "pipeline", assets_dir=tiny_assets_dir) as pipeline:
        engine = make_engine(url)
        people = (pipeline.work_dir / "corpora" / "demo" / "people.jsonl").read_text().splitlines()
        person = json.loads(people[1])
        with session_scope(engine) as session:
            reference = request_submit(
                session, actor="user:officer", name=person["name"], ground="17(1)(a)",
                received_at=utcnow(), model_name="demo", priority="immediate").reference
        with session_scope(engine) as session:
            request_approve(session, actor="user:reviewer", reference=reference)

        # Wait until a worker is inside verification (the longest stage on the tiny model).
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with session_scope(engine) as session:
                job = session.scalars(select(Job)).first()
                if job is not None and job.stage == "verifying" and job.heartbeat_at is not None:
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("the job never reached verification\n" + pipeline.log("worker"))
        pipeline.stop_child("worker", sig=signal.SIGKILL)
        pipeline.start_worker("worker-2")

        assert pipeline.wait_for_request(reference, timeout_s=300) == "completed"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # `promote` closes the job just after
            with session_scope(engine) as session:
                if session.get_one(Job, job.id).stage == "done":
                    break
            time.sleep(0.5)
        with session_scope(engine) as session:
            job = session.get_one(Job, job.id)
            assert job.stage == "done"
            assert job.attempts == 1  # the take-over after the kill
            assert session.scalar(select(func.count()).select_from(Certificate)) == 1
        assert "worker lost mid-stage" in pipeline.log("beat") + pipeline.log("worker-2")
        engine.dispose()
