"""Fixtures for the fault-injection tests: a Redis server the tests own (so restarting
it disturbs no one else's tests), a fresh PostgreSQL database, and one real pipeline
(worker + beat, tests/pipeline_fixtures.py) on the two, shared by the module."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import drop_database, fresh_database_url
from tests.pipeline_fixtures import RunningPipeline, running_pipeline

# Several injected crashes land in one job on purpose; each take-over costs an attempt,
# so the dead-letter limit is raised for these tests only (its own tests live in
# tests/workers).
MAX_ATTEMPTS_UNDER_FAULTS = "12"


@dataclass
class OwnedRedis:
    """A redis-server child on a free port; `restart` is SHUTDOWN NOSAVE + start again."""
    work_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    restarts: int = field(default=0)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.work_dir / "redis.log", "ab")  # noqa: SIM115 - closed below
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.work_dir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.ping():
                return
            time.sleep(0.1)
        raise AssertionError("redis-server did not start:\n" +
                             (self.work_dir / "redis.log").read_text(errors="replace"))

    def ping(self) -> bool:
        done = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True,
                              text=True, check=False)
        return done.stdout.strip() == "PONG"

    def shutdown(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown", "nosave"],
                       capture_output=True, check=False)
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self, *, down_s: float) -> None:
        self.shutdown()
        time.sleep(down_s)
        self.start()
        self.restarts += 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def owned_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnedRedis]:
    redis = OwnedRedis(tmp_path_factory.mktemp("redis"), port=_free_port())
    redis.start()
    yield redis
    redis.shutdown()


@pytest.fixture(scope="module")
def faults_database_url() -> Iterator[str]:
    url = fresh_database_url("reliability_faults")
    yield url
    drop_database(url)


@pytest.fixture(scope="module")
def faulty_pipeline(faults_database_url: str, owned_redis: OwnedRedis, tiny_assets_dir: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPipeline]:
    with running_pipeline(database_url=faults_database_url, broker_url=owned_redis.url,
                          work_dir=tmp_path_factory.mktemp("faulty-pipeline"),
                          assets_dir=tiny_assets_dir,
                          extra_env={"JOB_MAX_ATTEMPTS": MAX_ATTEMPTS_UNDER_FAULTS}) as running:
        yield running


class People:
    """Trained demo people, each handed out once per module."""

    def __init__(self, pipeline: RunningPipeline) -> None:
        path = pipeline.work_dir / "corpora" / "demo" / "people.jsonl"
        self._people = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                        if line]
        self._next = 0

    def take(self) -> dict[str, Any]:
        person = self._people[self._next]
        self._next += 1
        return person


@pytest.fixture(scope="module")
def people(faulty_pipeline: RunningPipeline) -> People:
    return People(faulty_pipeline)
