"""The verification badge: a stored certificate checked against the public key ring,
the same way an outsider would check the exported file."""
from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from sqlalchemy.orm import Session

from deletion.domain.audit import ChainVerification
from deletion.domain.certificates import (
    certificate_verify_chain,
    certificate_verify_one,
    payload_hash_of,
)
from deletion.domain.models import Certificate
from deletion.domain.signing import KeyRing, SigningError, keyring_from_config


@dataclass(frozen=True)
class CertificateStatus:
    valid: bool
    reason: str | None
    key_id: str


def certificate_status(certificate: Certificate, keyring: KeyRing | None = None) -> CertificateStatus:
    """The row checked on its own, as an outsider checks the exported file."""
    ring = keyring if keyring is not None else keyring_from_config(settings.CONFIG)
    try:
        public_key = ring.get(certificate.key_id)
    except SigningError as error:
        return CertificateStatus(False, str(error), certificate.key_id)
    if payload_hash_of(certificate.payload) != certificate.payload_hash:
        return CertificateStatus(False, "stored payload hash does not match the payload", certificate.key_id)
    check = certificate_verify_one(certificate.payload, certificate.signature, public_key)
    return CertificateStatus(check.ok, check.reason, certificate.key_id)


def certificate_chain_status(session: Session) -> ChainVerification:
    return certificate_verify_chain(session, keyring_from_config(settings.CONFIG))
