"""The verification badge: a stored certificate checked against the public key ring,
the same way an outsider would check the exported file; and the chain's status, checked
from its newest signed verified head (the whole chain only when asked)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC

from django.conf import settings
from sqlalchemy.orm import Session

from deletion.domain.certificate_heads import (
    PAGE_TAIL_LIMIT,
    CertificateChainCheck,
    certificate_chain_check,
)
from deletion.domain.certificates import certificate_verify_one, payload_hash_of
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


def certificate_chain_status(session: Session, *, full: bool = False) -> CertificateChainCheck:
    """From the newest signed verified head towards the chain head, at most
    PAGE_TAIL_LIMIT certificates (``full``: the whole chain from genesis)."""
    return certificate_chain_check(session, keyring_from_config(settings.CONFIG), full=full,
                                   tail_limit=None if full else PAGE_TAIL_LIMIT)


def chain_summary(chain: CertificateChainCheck) -> str:
    """What the check read, in one sentence (the page and the API say the same)."""
    if chain.mode == "incremental" and chain.verified_at is not None:
        start = (f"from seq {chain.verified_from} (signed verified head of "
                 f"{chain.verified_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC)")
    else:
        start = "from seq 1 (the whole chain)"
    if chain.ok and chain.unchecked:
        return (f"verified {start} to seq {chain.head_seq - chain.unchecked}: "
                f"{chain.checked} certificates re-checked, the {chain.unchecked} after it up to "
                f"the head at seq {chain.head_seq} left to the worker's check")
    if chain.ok:
        return (f"verified {start} to the head at seq {chain.head_seq}: "
                f"{chain.checked} certificates re-checked")
    return (f"checked {start}: broken at seq {chain.first_bad_seq} after "
            f"{chain.checked} certificates that verify")
