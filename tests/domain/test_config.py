from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from deletion.domain.config import ConfigError, load


def key() -> str:
    return base64.urlsafe_b64encode(b"k" * 32).decode()


def test_it_defaults_to_the_embedded_setup_and_generates_keys_once(tmp_path: Path) -> None:
    cfg = load({"VAR_DIR": str(tmp_path)})
    assert cfg.database_url == f"sqlite:///{tmp_path / 'erasure.sqlite3'}"
    assert cfg.celery_broker_url.startswith("sqla+sqlite:///")
    assert cfg.checkpoint_dir == tmp_path / "checkpoints"
    assert len(cfg.encryption_key) == 32 and cfg.encryption_key != cfg.blind_index_key
    for name in ("encryption.key", "blind-index.key", "django-secret"):
        mode = (tmp_path / "keys" / name).stat().st_mode
        assert stat.S_IMODE(mode) == 0o600, name
    # Only the signer creates the private key, on first use (signing.signer_from_config).
    assert cfg.signing_key_embedded
    assert not (tmp_path / "keys" / "signing-ed25519.pem").exists()
    again = load({"VAR_DIR": str(tmp_path)})
    assert again.encryption_key == cfg.encryption_key
    assert again.django_secret_key == cfg.django_secret_key


def test_it_reads_secrets_from_files(tmp_path: Path) -> None:
    secret = tmp_path / "enc"
    secret.write_text(key() + "\n")
    cfg = load({"VAR_DIR": str(tmp_path), "ENCRYPTION_KEY_FILE": str(secret),
                "DJANGO_SECRET_KEY": "s3cret"})
    assert cfg.encryption_key == b"k" * 32
    assert cfg.django_secret_key == "s3cret"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DEBUG", "maybe"),
        ("RETENTION_DAYS", "ten"),
        ("RETENTION_DAYS", "0"),
        ("ENCRYPTION_KEY", "not-base64-!!"),
        ("ENCRYPTION_KEY", base64.urlsafe_b64encode(b"short").decode()),
        ("BLIND_INDEX_KEY_FILE", "/nonexistent/file"),
        ("DATABASE_URL", "erasure.sqlite3"),
        ("REDIS_URL", "localhost:6379"),
        ("WEB_BIND", "8000"),
        ("DEADLINE_ALERT_DAYS", "7,x"),
        ("SIGNING_KEY_FILE", "/nonexistent/key.pem"),
    ],
)
def test_a_bad_value_names_its_variable(tmp_path: Path, variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as error:
        load({"VAR_DIR": str(tmp_path), variable: value})
    assert error.value.variable == variable
    assert variable in str(error.value)


def test_it_reads_typed_values(tmp_path: Path) -> None:
    cfg = load({"VAR_DIR": str(tmp_path), "DEBUG": "yes", "ALLOWED_HOSTS": "a.example, b.example",
                "DEADLINE_ALERT_DAYS": "2,7,14", "DATABASE_URL": "postgresql://u@db/x",
                "REDIS_URL": "redis://r:6379/0"})
    assert cfg.debug is True
    assert cfg.allowed_hosts == ("a.example", "b.example")
    assert cfg.deadline_alert_days == (14, 7, 2)
    assert cfg.redis_url == "redis://r:6379/0"


def test_env_example_documents_every_setting_and_loads(tmp_path: Path) -> None:
    import dataclasses
    import re

    from deletion.domain.config import REPO_ROOT, Config

    text = (REPO_ROOT / ".env.example").read_text()
    example = dict(re.findall(r"^([A-Z_]+)=(.*)$", text, flags=re.MULTILINE))
    documented = set(example) | set(re.findall(r"^# ([A-Z_]+)_FILE=", text, flags=re.MULTILINE))
    derived = {"signing_key_embedded"}  # follows from SIGNING_KEY_FILE being unset
    for field in dataclasses.fields(Config):
        if field.name not in derived:
            assert field.name.upper() in documented, field.name
    cfg = load({**example, "VAR_DIR": str(tmp_path)})
    # Relative SQLite paths are anchored at the repository root, not the working directory.
    assert cfg.database_url == f"sqlite:///{REPO_ROOT / 'var' / 'erasure.sqlite3'}"


def test_only_the_signer_generates_the_embedded_signing_key(tmp_path: Path) -> None:
    from deletion.domain.signing import keyring_from_config, signer_from_config

    cfg = load({"VAR_DIR": str(tmp_path)})
    signer = signer_from_config(cfg)
    key_file = tmp_path / "keys" / "signing-ed25519.pem"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert signer.key_id in keyring_from_config(cfg)


def test_a_configured_signing_key_file_that_is_missing_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load({"VAR_DIR": str(tmp_path), "SIGNING_KEY_FILE": str(tmp_path / "absent.pem")})
    assert caught.value.variable == "SIGNING_KEY_FILE"
