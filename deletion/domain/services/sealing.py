"""Reseal ciphertexts: bind old rows to themselves, move rows off retired keys.

Rows written before revision 0002 carry AES-GCM associated data that names the column
only (``crypto.AD_COLUMN``); rows written under a key now listed in
``ENCRYPTION_OLD_KEYS`` open only while that key is kept.  ``ciphertexts_reseal``
re-encrypts both kinds with the current key and row-bound associated data, in the
caller's transaction, and audits how many it changed.  Run by beat every hour
(``erasure.reseal_ciphertexts``); a run with nothing to do writes nothing.

After a key rotation, once a run reports nothing left under the old key id, the old
key can be dropped from ``ENCRYPTION_OLD_KEYS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from deletion.domain import crypto
from deletion.domain.audit import audit_append
from deletion.domain.models import ErasureRequest, Recipient
from deletion.domain.services.recipients import SECRET_CONTEXT
from deletion.domain.services.requests import SUBJECT_CONTEXT

BATCH = 500


@dataclass(frozen=True)
class Resealed:
    requests: int
    recipients: int

    @property
    def total(self) -> int:
        return self.requests + self.recipients


def ciphertexts_reseal(
    session: Session, *, actor: str, keys: crypto.Keyring | None = None, limit: int = BATCH
) -> Resealed:
    """Re-encrypt up to ``limit`` rows of each table that are column-bound or under an old key."""
    keys = keys or crypto.keyring()
    current = keys.encryption_key_id
    requests = session.scalars(
        select(ErasureRequest).where(
            ErasureRequest.subject_ciphertext.is_not(None),
            or_(ErasureRequest.subject_ad_version != crypto.AD_ROW,
                ErasureRequest.subject_key_id != current),
        ).order_by(ErasureRequest.id).limit(limit).with_for_update()
    ).all()
    for request in requests:
        if request.subject_ciphertext is None:  # excluded by the query; narrows the type
            continue
        plaintext = keys.decrypt(
            request.subject_ciphertext, key_id_=request.subject_key_id, context=SUBJECT_CONTEXT,
            row=crypto.ad_row(request.subject_ad_version, request.reference))
        request.subject_ciphertext, request.subject_key_id = keys.encrypt(
            plaintext, context=SUBJECT_CONTEXT, row=request.reference)
        request.subject_ad_version = crypto.AD_ROW
    recipients = session.scalars(
        select(Recipient).where(
            Recipient.secret_ciphertext.is_not(None),
            or_(Recipient.secret_ad_version != crypto.AD_ROW, Recipient.secret_key_id != current),
        ).order_by(Recipient.id).limit(limit).with_for_update()
    ).all()
    for recipient in recipients:
        if recipient.secret_ciphertext is None or recipient.secret_key_id is None:
            continue
        plaintext = keys.decrypt(
            recipient.secret_ciphertext, key_id_=recipient.secret_key_id, context=SECRET_CONTEXT,
            row=crypto.ad_row(recipient.secret_ad_version, str(recipient.id)))
        recipient.secret_ciphertext, recipient.secret_key_id = keys.encrypt(
            plaintext, context=SECRET_CONTEXT, row=str(recipient.id))
        recipient.secret_ad_version = crypto.AD_ROW
    done = Resealed(len(requests), len(recipients))
    if done.total:
        audit_append(
            session, actor=actor, action="keys.ciphertexts_resealed", object_type="key",
            object_ref=current,
            details={"erasure_requests": done.requests, "recipients": done.recipients,
                     "ad_version": crypto.AD_ROW},
        )
    return done
