"""AES-GCM associated data bound to the row: a ciphertext moved to another row no longer
opens, rows written before the binding stay readable, and the reseal binds them.

On the code before issue 14 the associated data was the column name alone, so someone
who can write the database (and holds no key) could swap two requests' ciphertexts: the
worker would then erase request B's subject under request A's reference.
"""

from __future__ import annotations

import os

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from deletion.domain import crypto
from deletion.domain.models import AuditEvent, ErasureRequest, Model, Recipient
from deletion.domain.services.recipients import (
    SECRET_CONTEXT,
    recipient_register,
    recipient_secret,
)
from deletion.domain.services.requests import SUBJECT_CONTEXT, subject_identifiers
from deletion.domain.services.sealing import ciphertexts_reseal
from tests.domain.conftest import submit


def _row(session: Session, reference: str) -> ErasureRequest:
    return session.scalars(select(ErasureRequest).where(ErasureRequest.reference == reference)).one()


@pytest.mark.usefixtures("model")
def test_a_subject_ciphertext_moved_to_another_request_does_not_open(session: Session) -> None:
    first, second = submit(session, name="Mara Okafor"), submit(session, name="Jon Vik")
    session.execute(update(ErasureRequest).where(ErasureRequest.id == first.id)
                    .values(subject_ciphertext=second.subject_ciphertext))
    session.expire_all()
    with pytest.raises(crypto.DecryptionError):
        subject_identifiers(session, first.reference)
    assert subject_identifiers(session, second.reference).name == "Jon Vik"


def test_a_webhook_secret_moved_to_another_recipient_does_not_open(session: Session) -> None:
    one = recipient_register(session, actor="admin", name=f"a-{os.urandom(3).hex()}",
                             kind="webhook", endpoint_url="https://a.example/hook", secret="s-one")
    two = recipient_register(session, actor="admin", name=f"b-{os.urandom(3).hex()}",
                             kind="webhook", endpoint_url="https://b.example/hook", secret="s-two")
    session.execute(update(Recipient).where(Recipient.id == one.id)
                    .values(secret_ciphertext=two.secret_ciphertext))
    session.expire_all()
    with pytest.raises(crypto.DecryptionError):
        recipient_secret(session, recipient_id=one.id)
    assert recipient_secret(session, recipient_id=two.id) == "s-two"


@pytest.mark.usefixtures("model")
def test_rows_sealed_before_the_binding_stay_readable_and_are_resealed(session: Session) -> None:
    keys = crypto.keyring()
    request = submit(session, name="Mara Okafor")
    legacy, key_id = keys.encrypt_json({"name": "Mara Okafor", "aliases": [], "emails": [],
                                        "phones": [], "notes": ""}, context=SUBJECT_CONTEXT)
    session.execute(update(ErasureRequest).where(ErasureRequest.id == request.id).values(
        subject_ciphertext=legacy, subject_key_id=key_id, subject_ad_version=crypto.AD_COLUMN))
    recipient = recipient_register(session, actor="admin", name=f"r-{os.urandom(3).hex()}",
                                   kind="webhook", endpoint_url="https://r.example/h")
    sealed, secret_key = keys.encrypt(b"old-secret", context=SECRET_CONTEXT)
    session.execute(update(Recipient).where(Recipient.id == recipient.id).values(
        secret_ciphertext=sealed, secret_key_id=secret_key, secret_ad_version=crypto.AD_COLUMN))
    session.expire_all()
    assert subject_identifiers(session, request.reference).name == "Mara Okafor"

    done = ciphertexts_reseal(session, actor="system:housekeeping")

    assert done.requests >= 1 and done.recipients >= 1
    row = _row(session, request.reference)
    assert row.subject_ad_version == crypto.AD_ROW and row.subject_ciphertext != legacy
    assert subject_identifiers(session, request.reference).name == "Mara Okafor"
    assert recipient_secret(session, recipient_id=recipient.id) == "old-secret"
    event = session.scalars(select(AuditEvent).where(
        AuditEvent.action == "keys.ciphertexts_resealed").order_by(AuditEvent.seq.desc())).first()
    assert event is not None and "Mara" not in event.details
    assert ciphertexts_reseal(session, actor="system:housekeeping").total == 0  # nothing left


@pytest.mark.usefixtures("model")
def test_a_reseal_moves_rows_off_a_retired_key(session: Session, monkeypatch: pytest.MonkeyPatch,
                                               model: Model) -> None:
    old = crypto.keyring()
    request = submit(session, name="Mara Okafor")
    rotated = crypto.Keyring(os.urandom(32), (old.encryption_key,), old.blind_index_key)
    monkeypatch.setattr(crypto, "keyring", lambda: rotated)
    assert subject_identifiers(session, request.reference).name == "Mara Okafor"  # old key kept

    ciphertexts_reseal(session, actor="system:housekeeping")

    assert _row(session, request.reference).subject_key_id == rotated.encryption_key_id
    only_new = crypto.Keyring(rotated.encryption_key, (), old.blind_index_key)
    monkeypatch.setattr(crypto, "keyring", lambda: only_new)
    assert subject_identifiers(session, request.reference).name == "Mara Okafor"
