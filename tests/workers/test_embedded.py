"""The embedded runtime: SQLite and kombu's server-less broker with real processes.

Two things `make run` relies on: a worker on the `sqla+sqlite://` broker drives a job
through escalation to rejection when verification keeps failing (nothing promoted,
nothing certified); and `python -m workers.embedded run` serves pages on its address
and stops every child on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import Certificate, Checkpoint, ErasureRequest, Job, Model, utcnow
from deletion.domain.services.requests import request_approve, request_submit
from tests.conftest import fresh_sqlite_url
from tests.pipeline_fixtures import (
    REJECTING_POLICY,
    REPO_ROOT,
    pipeline_env,
    running_pipeline,
    sqlite_broker_url,
)

pytestmark = pytest.mark.slow


def test_the_embedded_broker_escalates_once_then_rejects_and_promotes_nothing(
    tmp_path: Path, tiny_assets_dir: Path,
) -> None:
    url = fresh_sqlite_url(tmp_path)
    with running_pipeline(database_url=url, broker_url=sqlite_broker_url(tmp_path),
                          work_dir=tmp_path / "pipeline", assets_dir=tiny_assets_dir,
                          policy=REJECTING_POLICY) as pipeline:
        engine = make_engine(url)
        people = (pipeline.work_dir / "corpora" / "demo" / "people.jsonl").read_text().splitlines()
        person = json.loads(people[0])
        with session_scope(engine) as session:
            reference = request_submit(
                session, actor="user:officer", name=person["name"], ground="17(1)(a)",
                received_at=utcnow(), model_name="demo", priority="immediate").reference
        with session_scope(engine) as session:
            request_approve(session, actor="user:reviewer", reference=reference)

        assert pipeline.wait_for_request(reference, statuses=("needs_attention",)) \
            == "needs_attention"

        with session_scope(engine) as session:
            job = session.scalars(select(Job)).one()
            assert job.stage == "rejected" and job.escalated and job.verification_round == 1
            assert "verification failed after escalation" in (job.error or "")
            # The retry ran with what the policy's escalation changed, and says so.
            assert job.hparams["steps"] > 0
            assert any(note.startswith("steps ") for note in job.hparams["escalation"]), job.hparams
            model = session.scalars(select(Model)).one()
            serving = session.get_one(Checkpoint, model.serving_checkpoint_id)
            assert serving.version == 1 and serving.id == job.base_checkpoint_id
            candidates = session.scalars(select(Checkpoint).where(Checkpoint.version > 1)).all()
            # Both candidates (before and after escalation) are set aside for destruction.
            assert len(candidates) == 2
            assert all(c.status == "retired" and c.destroy_after is not None for c in candidates)
            assert session.scalar(select(func.count()).select_from(Certificate)) == 0
            request = session.scalars(select(ErasureRequest)).one()
            assert request.status == "needs_attention"
        engine.dispose()
    assert not (pipeline.work_dir / "checkpoints" / "_work" / f"job-{job.id}").exists()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - local test server
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_embedded_run_serves_pages_and_ctrl_c_stops_every_child(
    tmp_path: Path, tiny_assets_dir: Path,
) -> None:
    port = _free_port()
    env = pipeline_env(database_url=f"sqlite:///{tmp_path / 'erasure.sqlite3'}",
                       broker_url=sqlite_broker_url(tmp_path), work_dir=tmp_path,
                       extra={"WEB_BIND": f"127.0.0.1:{port}", "DEBUG": "false"})
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115
    runner = subprocess.Popen(
        [sys.executable, "-m", "workers.embedded", "run", "--preset", "tiny", "--assets",
         str(tiny_assets_dir)],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        status = None
        while time.monotonic() < deadline and runner.poll() is None:
            try:
                status = _get(f"http://127.0.0.1:{port}/")
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)
        output = (tmp_path / "run.log").read_text(errors="replace")
        assert status in (200, 302), output[-4000:]
        assert f"http://127.0.0.1:{port}/" in output
        children = _children_of(runner.pid)
        assert len(children) >= 3, children  # worker, beat, web (and their own children)

        os.kill(runner.pid, signal.SIGINT)  # what Ctrl-C sends to the supervisor
        assert runner.wait(timeout=60) == 0
        time.sleep(1)
        assert not [pid for pid in children if _alive(pid)]
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
        log.close()


def _children_of(pid: int) -> list[int]:
    done = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def _alive(pid: int) -> Any:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"
