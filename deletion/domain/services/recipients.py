"""Art. 19: recipients of a model's personal data, and the record of telling them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from deletion.domain import crypto
from deletion.domain.audit import audit_append
from deletion.domain.errors import NotFound, ValidationError
from deletion.domain.models import Model, Notification, Recipient, utcnow
from deletion.domain.services.requests import request_get

RECIPIENT_KINDS = ("webhook", "manual")
NOTIFICATION_STATUSES = ("pending", "sent", "failed", "not_sent")
SECRET_CONTEXT = "recipients.secret"


def recipient_register(
    session: Session,
    *,
    actor: str,
    name: str,
    kind: str,
    endpoint_url: str | None = None,
    secret: str | None = None,
    model_name: str | None = None,
) -> Recipient:
    if kind not in RECIPIENT_KINDS:
        raise ValidationError("kind", f"one of {list(RECIPIENT_KINDS)}")
    if kind == "webhook" and not (endpoint_url or "").startswith(("https://", "http://")):
        raise ValidationError("endpoint_url", "a webhook recipient needs an http(s) URL")
    model_id = None
    if model_name is not None:
        model = session.execute(select(Model).where(Model.name == model_name)).scalar_one_or_none()
        if model is None:
            raise ValidationError("model_name", "no such registered model")
        model_id = model.id
    recipient = Recipient(name=name, kind=kind, endpoint_url=endpoint_url, model_id=model_id,
                          active=True, secret_ad_version=crypto.AD_ROW)
    session.add(recipient)
    session.flush()  # the id the secret's associated data names
    if secret:
        recipient.secret_ciphertext, recipient.secret_key_id = crypto.keyring().encrypt(
            secret.encode(), context=SECRET_CONTEXT, row=str(recipient.id)
        )
    audit_append(
        session, actor=actor, action="recipient.registered", object_type="recipient",
        object_ref=str(recipient.id), details={"kind": kind, "model": model_name},
    )
    return recipient


def recipient_secret(session: Session, *, recipient_id: int) -> str | None:
    """The webhook signing secret, decrypted (for the notifier only)."""
    recipient = session.get(Recipient, recipient_id)
    if recipient is None:
        raise NotFound(f"no recipient {recipient_id}")
    if recipient.secret_ciphertext is None or recipient.secret_key_id is None:
        return None
    return crypto.keyring().decrypt(
        recipient.secret_ciphertext, key_id_=recipient.secret_key_id, context=SECRET_CONTEXT,
        row=crypto.ad_row(recipient.secret_ad_version, str(recipient.id)),
    ).decode()


def recipient_list_for_model(session: Session, *, model_id: int) -> list[Recipient]:
    return list(session.execute(
        select(Recipient).where(
            Recipient.active.is_(True),
            or_(Recipient.model_id.is_(None), Recipient.model_id == model_id),
        ).order_by(Recipient.id)
    ).scalars())


def notification_record(
    session: Session,
    *,
    actor: str,
    reference: str,
    recipient_id: int,
    status: str,
    reason: str | None = None,
    response_code: int | None = None,
    error: str | None = None,
    next_attempt_at: datetime | None = None,
) -> Notification:
    """Record one delivery attempt or decision for (request, recipient); upserted."""
    if status not in NOTIFICATION_STATUSES:
        raise ValidationError("status", f"one of {list(NOTIFICATION_STATUSES)}")
    if status == "not_sent" and not (reason or "").strip():
        raise ValidationError("reason", "Art. 19: say why the recipient was not told")
    request = request_get(session, reference=reference)
    notification = session.execute(
        select(Notification).where(
            Notification.request_id == request.id, Notification.recipient_id == recipient_id
        ).with_for_update()
    ).scalar_one_or_none()
    if notification is None:
        notification = Notification(request_id=request.id, recipient_id=recipient_id, attempts=0)
        session.add(notification)
    now = utcnow()
    notification.status = status
    notification.reason = reason
    notification.response_code = response_code
    notification.error = error
    notification.next_attempt_at = next_attempt_at
    if status in ("sent", "failed"):
        notification.attempts += 1
        notification.last_attempt_at = now
    if status == "sent":
        notification.sent_at = now
    session.flush()
    audit_append(
        session, actor=actor, action=f"notification.{status}", object_type="erasure_request",
        object_ref=reference,
        details={"recipient_id": recipient_id, "attempts": notification.attempts,
                 "response_code": response_code},
    )
    return notification


def notification_list(session: Session, *, reference: str) -> list[Notification]:
    request = request_get(session, reference=reference)
    return list(session.execute(
        select(Notification).where(Notification.request_id == request.id)
        .order_by(Notification.id)
    ).scalars())
