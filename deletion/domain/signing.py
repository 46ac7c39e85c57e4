"""Ed25519 keys for deletion certificates: the active signing key and the key ring.

Two roles, kept apart on purpose:

- the **signer** (the worker that issues certificates) loads the one active
  private key from ``SIGNING_KEY_FILE``; on the embedded default that file is
  generated on first start by ``config.load()``, readable by its owner only;
- **verifiers** (web, CLI, anyone offline) load only public keys, from the key
  ring directory (``SIGNING_KEYRING_DIR``), one ``<key id>.pub.pem`` file per
  key that ever signed.  The signer publishes its public key there when it
  loads, so rotating the private key never orphans an old certificate.

The key id is the public key's fingerprint: the sha256 hex digest (all 64
characters) of the 32 raw public-key bytes.  Anyone can recompute it from an
exported PEM file, and it is never derived from a file name.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from deletion.domain.config import Config, ensure_signing_key
from deletion.domain.errors import DomainError

logger = logging.getLogger(__name__)

PUBLIC_KEY_SUFFIX = ".pub.pem"
KEY_ID_PATTERN = re.compile(r"^[0-9a-f]{64}$")


class SigningError(DomainError):
    """A key is missing, unreadable, of the wrong type, or unknown to the ring."""


def key_id_of(public_key: Ed25519PublicKey) -> str:
    """The fingerprint that names a key: sha256 hex of its 32 raw public bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def public_key_pem(public_key: Ed25519PublicKey) -> bytes:
    """SubjectPublicKeyInfo PEM, the form openssl and `cryptography` both read."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def public_key_from_pem(data: bytes) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise SigningError(f"not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SigningError("public key is not an Ed25519 key")
    return key


def private_key_from_pem(data: bytes) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningError(f"not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError("signing key is not an Ed25519 key")
    return key


def signature_valid(public_key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        public_key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


@dataclass(frozen=True)
class Signer:
    """The active private key; only the certifying process ever builds one."""

    private_key: Ed25519PrivateKey = field(repr=False)
    key_id: str

    @classmethod
    def from_private_key(cls, private_key: Ed25519PrivateKey) -> Signer:
        return cls(private_key=private_key, key_id=key_id_of(private_key.public_key()))

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)


class KeyRing:
    """Public keys by key id: the active one and every one it replaced."""

    def __init__(self, keys: dict[str, Ed25519PublicKey] | None = None) -> None:
        self._keys: dict[str, Ed25519PublicKey] = {}
        for key in (keys or {}).values():
            self.add(key)

    def add(self, public_key: Ed25519PublicKey) -> str:
        key_id = key_id_of(public_key)
        self._keys[key_id] = public_key
        return key_id

    def get(self, key_id: str) -> Ed25519PublicKey:
        try:
            return self._keys[key_id]
        except KeyError:
            raise SigningError(f"key {key_id[:16]}... is not in the key ring") from None

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._keys))

    def __len__(self) -> int:
        return len(self._keys)


def keyring_load(keyring_dir: Path) -> KeyRing:
    """Every ``*.pub.pem`` in the directory.  Private keys there are never read."""
    ring = KeyRing()
    if not keyring_dir.is_dir():
        return ring
    for path in sorted(keyring_dir.glob(f"*{PUBLIC_KEY_SUFFIX}")):
        key = public_key_from_pem(path.read_bytes())
        key_id = ring.add(key)
        if path.name != f"{key_id}{PUBLIC_KEY_SUFFIX}":
            # The id comes from the key bytes; a misnamed file is harmless but odd.
            logger.warning("key ring file %s holds key %s", path.name, key_id[:16])
    return ring


def keyring_publish(keyring_dir: Path, public_key: Ed25519PublicKey) -> Path:
    """Add a public key to the ring directory (idempotent); returns its file."""
    keyring_dir.mkdir(parents=True, exist_ok=True)
    path = keyring_dir / f"{key_id_of(public_key)}{PUBLIC_KEY_SUFFIX}"
    if not path.exists():
        _write_atomically(path, public_key_pem(public_key), mode=0o644)
        logger.info("published signing public key %s", path.name[:16])
    return path


def signer_load(
    *, key_file: Path, keyring_dir: Path | None = None, generate: bool = False
) -> Signer:
    """The active signer from its PEM file; publishes its public key to the ring.

    The embedded default's key file is created on first start, by ``config.load()``
    or here with ``generate`` (``config.ensure_signing_key``: mode 0600, never
    overwrites).  Production passes a key file and never generates one.
    """
    if generate:
        ensure_signing_key(key_file)
    try:
        pem = key_file.read_bytes()
    except OSError as exc:
        raise SigningError(f"cannot read signing key file {key_file}: {exc.strerror}") from exc
    signer = Signer.from_private_key(private_key_from_pem(pem))
    if keyring_dir is not None:
        keyring_publish(keyring_dir, signer.public_key)
    return signer


def signer_from_config(cfg: Config) -> Signer:
    """For the certifying worker only: the one process that may hold the private key.

    The embedded default key is generated here on first use (never by ``config.load``),
    so a web process never creates or reads a private key.  A configured
    ``SIGNING_KEY_FILE`` that is missing stays an error: a new key must not appear
    silently in production.
    """
    return signer_load(
        key_file=cfg.signing_key_file,
        keyring_dir=cfg.signing_keyring_dir,
        generate=cfg.signing_key_embedded,
    )


def keyring_from_config(cfg: Config) -> KeyRing:
    """For every verifier (web, CLI): public keys only."""
    return keyring_load(cfg.signing_keyring_dir)


def signing_key_rotate(*, key_file: Path, keyring_dir: Path) -> Signer:
    """Replace the active key with a fresh one; the old public key stays in the ring.

    The old private key is overwritten: after rotation nothing can sign with it,
    and every certificate it signed still verifies through its public key.
    """
    if key_file.exists():
        old = private_key_from_pem(key_file.read_bytes())
        keyring_publish(keyring_dir, old.public_key())
    new = Ed25519PrivateKey.generate()
    _write_atomically(key_file, _private_pem(new), mode=0o600)
    signer = Signer.from_private_key(new)
    keyring_publish(keyring_dir, signer.public_key)
    logger.info("rotated signing key to %s", signer.key_id[:16])
    return signer


def _private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
