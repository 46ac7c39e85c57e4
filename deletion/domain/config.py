"""Settings: every environment variable is read once, here, into a frozen ``Config``.

Django settings, workers and the CLIs all read their values from ``load()`` (or the
cached ``current()``), so a bad value stops start-up with one message naming the
variable instead of failing later somewhere deep inside a request.

Defaults are the embedded ones (``make run``): SQLite and a server-less broker under
``var/``, and keys generated once under ``var/keys/`` with mode 0600.  Secrets may be
given directly (``NAME``) or as a file path (``NAME_FILE``, the Docker secrets habit).
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


@dataclass(frozen=True)
class Config:
    var_dir: Path
    database_url: str
    celery_broker_url: str
    redis_url: str | None
    checkpoint_dir: Path
    corpus_dir: Path
    # 32-byte AES-GCM key for subject identifiers at rest, plus older keys kept
    # only so that rows written before a rotation can still be decrypted.
    encryption_key: bytes
    encryption_old_keys: tuple[bytes, ...]
    blind_index_key: bytes
    signing_key_file: Path
    # True when SIGNING_KEY_FILE was not set: the signer (the worker) may then
    # generate the embedded-default key on first use.  Other processes never
    # create or read the private key.
    signing_key_embedded: bool
    signing_keyring_dir: Path
    # Append-only folder, outside the database, for the signed chain heads the
    # worker exports; a copy kept elsewhere is what detects a rewound chain.
    chain_head_export_dir: Path
    django_secret_key: str
    debug: bool
    allowed_hosts: tuple[str, ...]
    web_bind: str
    retention_days: int
    checkpoint_grace_hours: int
    batch_window_hours: int
    deadline_alert_days: tuple[int, ...]
    job_max_attempts: int
    job_stale_minutes: int


# ----------------------------------------------------------------- small typed readers


def env_str(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name, "").strip()
    return value or default


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(name, f"expected a boolean (true/false), got {raw!r}")


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, f"expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(name, f"must be at least {minimum}, got {value}")
    return value


def env_int_list(env: Mapping[str, str], name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        values = tuple(sorted({int(part) for part in raw.split(",") if part.strip()}, reverse=True))
    except ValueError:
        raise ConfigError(name, f"expected comma-separated integers, got {raw!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(name, "expected positive integers")
    return values


def env_secret(env: Mapping[str, str], name: str) -> str | None:
    """The secret in ``NAME``, else the contents of the file named by ``NAME_FILE``."""
    value = env.get(name, "").strip()
    if value:
        return value
    path = env.get(f"{name}_FILE", "").strip()
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{name}_FILE", f"cannot read {path}: {exc.strerror}") from None


def env_path(env: Mapping[str, str], name: str, default: Path) -> Path:
    raw = env.get(name, "").strip()
    path = Path(raw) if raw else default
    return path if path.is_absolute() else REPO_ROOT / path


def _anchored(url: str) -> str:
    """A relative SQLite path is taken from the repository root, like every other path."""
    for scheme in ("sqlite:///", "sqla+sqlite:///"):
        if url.startswith(scheme):
            rest = url.removeprefix(scheme)
            if rest and not rest.startswith((":memory:", "/", "file:")):
                return scheme + str(REPO_ROOT / rest)
    return url


def _decode_key(name: str, text: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.encode("ascii") + b"=" * (-len(text) % 4))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise ConfigError(name, "expected a urlsafe base64 key") from None
    if len(key) != 32:
        raise ConfigError(name, f"expected 32 bytes of key, got {len(key)}")
    return key


def _generated_secret(path: Path) -> str:
    """Read, or create once with mode 0600, an embedded-default secret file."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text + "\n")
        logger.info("generated embedded-default secret %s", path.name)
    return path.read_text(encoding="ascii").strip()


def _key(env: Mapping[str, str], name: str, keys_dir: Path, filename: str) -> bytes:
    given = env_secret(env, name)
    if given is not None:
        return _decode_key(name, given)
    return _decode_key(name, _generated_secret(keys_dir / filename))


def ensure_signing_key(path: Path) -> None:
    """Create an Ed25519 private key (PKCS#8 PEM, mode 0600) at ``path`` if absent."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    logger.info("generated embedded-default signing key %s", path.name)


# ------------------------------------------------------------------------------ load


def load(env: Mapping[str, str] | None = None) -> Config:
    """Read and check every setting; raise ``ConfigError`` naming the first bad one."""
    env = os.environ if env is None else env
    var_dir = env_path(env, "VAR_DIR", REPO_ROOT / "var")
    keys_dir = var_dir / "keys"

    database_url = _anchored(
        env_str(env, "DATABASE_URL", f"sqlite:///{var_dir / 'erasure.sqlite3'}")
    )
    if "://" not in database_url:
        raise ConfigError("DATABASE_URL", "expected a URL such as postgresql://user@host/db")
    broker = _anchored(
        env_str(env, "CELERY_BROKER_URL", f"sqla+sqlite:///{var_dir / 'broker.sqlite3'}")
    )
    if "://" not in broker:
        raise ConfigError("CELERY_BROKER_URL", "expected a URL such as redis://host:6379/0")
    redis_url = env.get("REDIS_URL", "").strip() or None
    if redis_url is not None and not redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError("REDIS_URL", "expected a redis:// URL")

    old_keys = tuple(
        _decode_key("ENCRYPTION_OLD_KEYS", part.strip())
        for part in (env_secret(env, "ENCRYPTION_OLD_KEYS") or "").split(",")
        if part.strip()
    )
    signing_key_file = env_path(env, "SIGNING_KEY_FILE", keys_dir / "signing-ed25519.pem")
    signing_key_embedded = not env.get("SIGNING_KEY_FILE", "").strip()
    if not signing_key_embedded and not signing_key_file.is_file():
        raise ConfigError("SIGNING_KEY_FILE", f"no such file: {signing_key_file}")

    django_secret = env_secret(env, "DJANGO_SECRET_KEY") or _generated_secret(
        keys_dir / "django-secret"
    )
    debug = env_bool(env, "DEBUG", False)
    hosts = tuple(
        h.strip() for h in env_str(env, "ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()
    )
    web_bind = env_str(env, "WEB_BIND", "127.0.0.1:8000")
    host, _, port = web_bind.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError("WEB_BIND", f"expected HOST:PORT, got {web_bind!r}")

    return Config(
        var_dir=var_dir,
        database_url=database_url,
        celery_broker_url=broker,
        redis_url=redis_url,
        checkpoint_dir=env_path(env, "CHECKPOINT_DIR", var_dir / "checkpoints"),
        corpus_dir=env_path(env, "CORPUS_DIR", var_dir / "corpora"),
        encryption_key=_key(env, "ENCRYPTION_KEY", keys_dir, "encryption.key"),
        encryption_old_keys=old_keys,
        blind_index_key=_key(env, "BLIND_INDEX_KEY", keys_dir, "blind-index.key"),
        signing_key_file=signing_key_file,
        signing_key_embedded=signing_key_embedded,
        signing_keyring_dir=env_path(env, "SIGNING_KEYRING_DIR", keys_dir / "keyring"),
        chain_head_export_dir=env_path(env, "CHAIN_HEAD_EXPORT_DIR", var_dir / "chain-heads"),
        django_secret_key=django_secret,
        debug=debug,
        allowed_hosts=hosts,
        web_bind=web_bind,
        retention_days=env_int(env, "RETENTION_DAYS", 30, minimum=1),
        checkpoint_grace_hours=env_int(env, "CHECKPOINT_GRACE_HOURS", 72),
        batch_window_hours=env_int(env, "BATCH_WINDOW_HOURS", 24, minimum=1),
        deadline_alert_days=env_int_list(env, "DEADLINE_ALERT_DAYS", (7, 2)),
        job_max_attempts=env_int(env, "JOB_MAX_ATTEMPTS", 3, minimum=1),
        job_stale_minutes=env_int(env, "JOB_STALE_MINUTES", 5, minimum=1),
    )


@functools.cache
def current() -> Config:
    """The process-wide settings, loaded from ``os.environ`` on first use."""
    return load()
