"""Subject identifiers at rest: AES-GCM encryption and HMAC blind indexes.

Identifiers (name, aliases, emails, phones) are stored only as AES-256-GCM ciphertext
with the id of the key beside it, so keys can rotate: new rows use the current key,
old rows stay readable through ``ENCRYPTION_OLD_KEYS``.  Look-ups and duplicate
detection use HMAC-SHA256 over a normalised form (a "blind index"), never plaintext.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from deletion.domain import config
from deletion.domain.canonical import canonical_bytes

NONCE_BYTES = 12


class DecryptionError(ValueError):
    """The ciphertext does not open with the named key (tampered, or key unknown)."""


def key_id(key: bytes) -> str:
    """A public fingerprint of a secret key: first 16 hex digits of sha256(key)."""
    return hashlib.sha256(b"key-id:" + key).hexdigest()[:16]


@dataclass(frozen=True)
class Keyring:
    encryption_key: bytes
    old_encryption_keys: tuple[bytes, ...]
    blind_index_key: bytes

    @classmethod
    def from_config(cls, cfg: config.Config) -> Keyring:
        return cls(cfg.encryption_key, cfg.encryption_old_keys, cfg.blind_index_key)

    @property
    def encryption_key_id(self) -> str:
        return key_id(self.encryption_key)

    @property
    def blind_key_id(self) -> str:
        return key_id(self.blind_index_key)

    def encrypt(self, plaintext: bytes, *, context: str) -> tuple[bytes, str]:
        """Ciphertext (nonce first) and the key id; ``context`` binds it to its row kind."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self.encryption_key).encrypt(nonce, plaintext, context.encode())
        return nonce + sealed, self.encryption_key_id

    def decrypt(self, ciphertext: bytes, *, key_id_: str, context: str) -> bytes:
        for candidate in (self.encryption_key, *self.old_encryption_keys):
            if key_id(candidate) == key_id_:
                try:
                    return AESGCM(candidate).decrypt(
                        ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], context.encode()
                    )
                except InvalidTag:
                    raise DecryptionError("ciphertext does not authenticate") from None
        raise DecryptionError(f"unknown encryption key id {key_id_}")

    def encrypt_json(self, value: Any, *, context: str) -> tuple[bytes, str]:
        return self.encrypt(canonical_bytes(value), context=context)

    def decrypt_json(self, ciphertext: bytes, *, key_id_: str, context: str) -> Any:
        return json.loads(self.decrypt(ciphertext, key_id_=key_id_, context=context))

    def blind_index(self, kind: str, value: str) -> str:
        """HMAC-SHA256 of the normalised identifier, keyed and separated by kind."""
        message = f"{kind}\x00{normalise_identifier(kind, value)}".encode()
        return hmac.new(self.blind_index_key, message, hashlib.sha256).hexdigest()


def normalise_identifier(kind: str, value: str) -> str:
    """The form two spellings of one identifier share (NFKC, casefold, spacing, digits)."""
    text = unicodedata.normalize("NFKC", value).casefold().strip()
    if kind == "phone":
        return ("+" if text.startswith("+") else "") + re.sub(r"\D", "", text)
    if kind == "email":
        return re.sub(r"\s+", "", text)
    return " ".join(re.sub(r"[.,]", " ", text).split())


def keyring() -> Keyring:
    """The process keyring, from the settings."""
    return Keyring.from_config(config.current())
