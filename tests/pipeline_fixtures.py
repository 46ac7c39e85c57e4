"""A real pipeline for tests: a Celery worker process (both queues) and beat (outbox
relay, batch scheduler, reconciler) against a given database and broker, with the
tiny demo model bootstrapped as model `demo` v1.

Use the context manager directly:

    with running_pipeline(database_url=url, broker_url=redis_broker_url(), work_dir=tmp) as p:
        ...  # submit + approve (priority "immediate" runs at once), then p.wait_for_request(ref)

or the `pipeline` fixture (module scope), after `pytest_plugins = ["tests.pipeline_fixtures"]`;
it runs on the database named by the `pipeline_database_url` fixture (by default a fresh
migrated PostgreSQL database; override that fixture to share your own, e.g. the
pytest-django one) and on Redis under a key prefix of its own.

The test process and the worker share the encryption, blind-index and signing keys (the
worker gets the test process's through its environment), so requests submitted in the
test process decrypt in the worker and certificates verify with the test's key ring.
The trained tiny model is cached for the whole test session (about 30 s to train once).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

REPO_ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
READY_TIMEOUT_S = 90.0

# Tests of the pipeline's mechanics (claims, hand-overs, certificates, promotion,
# lineage) must not hinge on how well today's engine forgets on a 0.1M-parameter
# model: the verification suite's own tests judge that.  So they judge with this
# policy, named for what it is (every certificate it yields says so): the full
# suite still runs and every metric is stored and certified, but the verdict only
# asks that the candidate is not wrecked (held-out perplexity within 10x the base).
PIPELINE_TEST_POLICY = {
    "name": "pipeline-mechanics-test",
    "version": "1",
    "checks": [
        {"name": "candidate not wrecked", "metric": "utility.ppl_ratio", "comparator": "<=",
         "margin": 10.0},
    ],
    "escalation": {"asu": {"scale": {"steps": 2.0}}},
}
# A policy nothing can pass: drives the escalate-then-reject path deterministically.
REJECTING_POLICY = {
    "name": "pipeline-rejects-everything-test",
    "version": "1",
    "checks": [{"name": "impossible leakage bound", "metric": "leakage.forget",
                "comparator": "<=", "margin": -1.0}],
    "escalation": {"asu": {"scale": {"steps": 2.0}}},
}
STOP_TIMEOUT_S = 30.0


def redis_broker_url() -> str:
    """Redis with a key prefix of its own: parallel test runs never take each other's tasks."""
    return f"{REDIS_URL}?key_prefix=test-{uuid.uuid4().hex[:10]}:"


def sqlite_broker_url(directory: Path) -> str:
    """kombu's server-less SQLAlchemy transport (the embedded default)."""
    return f"sqla+sqlite:///{directory / 'broker.sqlite3'}"


def _b64(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode("ascii")


def pipeline_env(*, database_url: str, broker_url: str, work_dir: Path,
                 policy: Mapping[str, object] | None = PIPELINE_TEST_POLICY,
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the worker and beat: the given database and broker, the test
    process's keys, scratch directories under `work_dir`."""
    from deletion.domain.config import current
    from deletion.domain.signing import signer_from_config

    cfg = current()
    # The children get SIGNING_KEY_FILE set, which must exist: generate the embedded key
    # here as the signing worker would (a test run alone has no earlier test doing it).
    signer_from_config(cfg)
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": broker_url,
        "VAR_DIR": str(work_dir / "var"),
        # The pipeline's own heads, beside its own database (not the test session's folder).
        "CHAIN_HEAD_EXPORT_DIR": str(work_dir / "var" / "chain-heads"),
        "CHECKPOINT_DIR": str(work_dir / "checkpoints"),
        "CORPUS_DIR": str(work_dir / "corpora"),
        "ENCRYPTION_KEY": _b64(cfg.encryption_key),
        "BLIND_INDEX_KEY": _b64(cfg.blind_index_key),
        "SIGNING_KEY_FILE": str(cfg.signing_key_file),
        "SIGNING_KEYRING_DIR": str(cfg.signing_keyring_dir),
        "DJANGO_SECRET_KEY": cfg.django_secret_key,
        "JOB_STALE_MINUTES": "1",
        # Two cores shared by everyone: one torch thread per worker child.
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT),
    })
    if policy is not None:
        policy_file = work_dir / "verification-policy.json"
        policy_file.write_text(json.dumps(policy), encoding="utf-8")
        env["VERIFICATION_POLICY_FILE"] = str(policy_file)
    else:
        env.pop("VERIFICATION_POLICY_FILE", None)
    env.update(extra or {})
    return env


@dataclass
class RunningPipeline:
    database_url: str
    broker_url: str
    work_dir: Path
    env: dict[str, str]
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def log(self, name: str) -> str:
        path = self.work_dir / f"{name}.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def assert_alive(self) -> None:
        for name, child in self.children.items():
            if child.poll() is not None:
                raise AssertionError(f"{name} exited with {child.returncode}:\n{self.log(name)[-4000:]}")

    def wait_for_request(self, reference: str, *, statuses: tuple[str, ...] = ("completed",),
                         timeout_s: float = 240.0) -> str:
        """Poll the request until its status is one of `statuses` and its job has left the
        pipeline (or it fails); returns the status."""
        from deletion.domain.db import make_engine, session_scope
        from deletion.domain.models import ErasureRequest

        engine = make_engine(self.database_url)
        try:
            deadline = time.monotonic() + timeout_s
            status = ""
            while time.monotonic() < deadline:
                self.assert_alive()
                with session_scope(engine) as session:
                    status = session.scalar(select(ErasureRequest.status)
                                            .where(ErasureRequest.reference == reference)) or ""
                if status in statuses and self._job_closed(session_scope, engine, reference):
                    return status
                if status in ("needs_attention", "denied", "canceled"):
                    break
                time.sleep(0.5)
            raise AssertionError(
                f"{reference} is {status!r}, not one of {statuses}\n--- worker log ---\n"
                f"{self.log('worker')[-6000:]}"
            )
        finally:
            engine.dispose()

    @staticmethod
    def _job_closed(session_scope: Any, engine: Any, reference: str) -> bool:
        """The request's job has left the pipeline (`promote` closes it just after the
        certify transaction completed the request, or the job was dead-lettered)."""
        from deletion.domain.models import ErasureRequest, Job

        with session_scope(engine) as session:
            request_id = session.scalar(select(ErasureRequest.id)
                                        .where(ErasureRequest.reference == reference))
            job = session.execute(select(Job.stage, Job.dead_lettered_at)
                                  .where(Job.requests.any(id=request_id))
                                  .order_by(Job.id.desc()).limit(1)).first()
        if job is None:
            return True
        # Done, rejected, or failed for good (dead-lettered): nothing will move it again.
        return job.stage in ("done", "rejected") or job.dead_lettered_at is not None

    def stop_child(self, name: str, *, sig: int = signal.SIGTERM) -> None:
        child = self.children.pop(name)
        if child.poll() is None:
            os.killpg(child.pid, sig)
            try:
                child.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()

    def start_worker(self, name: str = "worker", *, concurrency: int = 2) -> None:
        args = [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker",
                "-Q", "default,gpu", "--concurrency", str(concurrency), "--loglevel", "INFO",
                "--hostname", f"{name}-{uuid.uuid4().hex[:6]}@%h", "--without-gossip",
                "--without-mingle", "--without-heartbeat"]
        self._start(name, args)
        _wait_for_line(self, name, "ready.")

    def start_beat(self) -> None:
        args = [sys.executable, "-m", "celery", "-A", "workers.celery_app", "beat",
                "--loglevel", "INFO", "--schedule", str(self.work_dir / "celerybeat-schedule")]
        self._start("beat", args)

    def _start(self, name: str, args: list[str]) -> None:
        out = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the child
        self.children[name] = subprocess.Popen(args, cwd=REPO_ROOT, env=self.env, stdout=out,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    def stop(self) -> None:
        for name in ("beat", *[n for n in list(self.children) if n != "beat"]):
            if name in self.children:
                self.stop_child(name)


def _wait_for_line(pipeline: RunningPipeline, name: str, needle: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        pipeline.assert_alive()
        if needle in pipeline.log(name):
            return
        time.sleep(0.3)
    raise AssertionError(f"{name} not ready after {READY_TIMEOUT_S:.0f} s:\n{pipeline.log(name)[-4000:]}")


def bootstrap_tiny(env: Mapping[str, str], *, assets_dir: Path) -> None:
    """Register corpus and model `demo` v1 (tiny preset) in env's DATABASE_URL."""
    done = subprocess.run(
        [sys.executable, "-m", "workers.bootstrap", "--preset", "tiny", "--assets",
         str(assets_dir), "--no-progress"],
        cwd=REPO_ROOT, env=dict(env), capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"bootstrap failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")


@contextmanager
def running_pipeline(*, database_url: str, broker_url: str, work_dir: Path,
                     assets_dir: Path | None = None, beat: bool = True,
                     policy: Mapping[str, object] | None = PIPELINE_TEST_POLICY,
                     extra_env: Mapping[str, str] | None = None) -> Iterator[RunningPipeline]:
    """Bootstrap the tiny model into `database_url`, start worker (+ beat), yield, stop.

    `policy` is the verification policy the worker judges with (None: the engine's
    default policy)."""
    from workers.runtime import use_database

    work_dir.mkdir(parents=True, exist_ok=True)
    env = pipeline_env(database_url=database_url, broker_url=broker_url, work_dir=work_dir,
                       policy=policy, extra=extra_env)
    bootstrap_tiny(env, assets_dir=assets_dir or work_dir / "assets")
    pipeline = RunningPipeline(database_url, broker_url, work_dir, env)
    # Code in the test process (scheduler, relay, demo driver) talks to the same pair.
    use_database(database_url, broker_url=broker_url)
    try:
        pipeline.start_worker()
        if beat:
            pipeline.start_beat()
        yield pipeline
    finally:
        pipeline.stop()
        use_database(None)


@pytest.fixture(scope="session")
def tiny_assets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trained tiny corpus + base model, shared by every pipeline of the session
    (TEST_DEMO_ASSETS names a folder to keep them in across sessions)."""
    kept = os.environ.get("TEST_DEMO_ASSETS")
    return Path(kept) if kept else tmp_path_factory.mktemp("demo-assets")


@pytest.fixture(scope="module")
def pipeline_database_url() -> Iterator[str]:
    from tests.conftest import drop_database, fresh_database_url

    url = fresh_database_url("erasure_pipeline")
    yield url
    drop_database(url)


@pytest.fixture(scope="module")
def pipeline(pipeline_database_url: str, tiny_assets_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPipeline]:
    with running_pipeline(database_url=pipeline_database_url, broker_url=redis_broker_url(),
                          work_dir=tmp_path_factory.mktemp("pipeline"),
                          assets_dir=tiny_assets_dir) as running:
        yield running
