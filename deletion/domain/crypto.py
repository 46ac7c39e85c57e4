"""Subject identifiers at rest: AES-GCM encryption and HMAC blind indexes.

Identifiers (name, aliases, emails, phones) are stored only as AES-256-GCM ciphertext
with the id of the key beside it, so keys can rotate: new rows use the current key,
old rows stay readable through ``ENCRYPTION_OLD_KEYS``.  Look-ups and duplicate
detection use HMAC-SHA256 over a normalised form (a "blind index"), never plaintext.

The associated data of a ciphertext names what it belongs to: the column (``context``)
and, since revision 0002, the row (``row``: a request's reference, a recipient's id, a
job's work file).  Someone who can write the database but holds no key can then no
longer move a ciphertext to another row (say, make request A's job erase the subject of
request B): it stops authenticating.  ``AD_COLUMN`` marks ciphertexts written before
that (column only); beat reseals them (``services.sealing``).
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
AD_COLUMN = 1  # associated data = the column name only (rows written before 0002)
AD_ROW = 2  # associated data = the column name and the row's stable key


def associated_data(context: str, row: str | None) -> bytes:
    """What a ciphertext is bound to; ``row=None`` is the pre-0002 column-only form."""
    if row is None:
        return context.encode()
    if "\x00" in context or "\x00" in row:
        raise ValueError("associated data parts may not contain NUL")
    return f"{context}\x00{row}".encode()


def ad_row(version: int, row: str) -> str | None:
    """The ``row`` argument for a ciphertext stored with associated-data ``version``."""
    if version == AD_ROW:
        return row
    if version == AD_COLUMN:
        return None
    raise DecryptionError(f"unknown associated-data version {version}")


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

    def encrypt(self, plaintext: bytes, *, context: str, row: str | None = None) -> tuple[bytes, str]:
        """Ciphertext (nonce first) and the key id; ``context`` and ``row`` are the
        associated data (module docstring): pass ``row`` for every new ciphertext."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self.encryption_key).encrypt(
            nonce, plaintext, associated_data(context, row))
        return nonce + sealed, self.encryption_key_id

    def decrypt(self, ciphertext: bytes, *, key_id_: str, context: str,
                row: str | None = None) -> bytes:
        for candidate in (self.encryption_key, *self.old_encryption_keys):
            if key_id(candidate) == key_id_:
                try:
                    return AESGCM(candidate).decrypt(
                        ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:],
                        associated_data(context, row),
                    )
                except InvalidTag:
                    raise DecryptionError("ciphertext does not authenticate") from None
        raise DecryptionError(f"unknown encryption key id {key_id_}")

    def encrypt_json(self, value: Any, *, context: str, row: str | None = None) -> tuple[bytes, str]:
        return self.encrypt(canonical_bytes(value), context=context, row=row)

    def decrypt_json(self, ciphertext: bytes, *, key_id_: str, context: str,
                     row: str | None = None) -> Any:
        return json.loads(self.decrypt(ciphertext, key_id_=key_id_, context=context, row=row))

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
