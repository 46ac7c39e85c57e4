"""Art. 19 notifications: tell each recipient of a model's data that an erasure happened.

Webhook recipients get a signed POST (HMAC-SHA256 over `<timestamp>.<body>`
with the recipient's secret, as Stripe and GitHub webhooks do), retried with
exponential backoff; every attempt, success or failure is recorded through
`notification_record` (and so lands in the audit chain).  Manual recipients
are recorded as pending for an officer to handle.

The body carries the request reference, the certificate id and the model, never
the subject's identifiers: the recipient resolves the reference with the
controller through its own authenticated channel.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from deletion.domain.db import session_scope
from deletion.domain.models import Certificate, ErasureRequest, Job, Notification, Recipient, utcnow
from deletion.domain.services.recipients import (
    notification_record,
    recipient_list_for_model,
    recipient_secret,
)
from workers.runtime import WORKER_ACTOR, engine

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
BACKOFF_BASE_S = 30.0
BACKOFF_MAX_S = 6 * 3600.0
LEASE = timedelta(minutes=5)  # a claimed delivery is someone else's for this long
TIMEOUT_S = 10.0
SIGNATURE_HEADER = "X-Erasure-Signature"
TIMESTAMP_HEADER = "X-Erasure-Timestamp"


def notifications_open(session: Session, *, job: Job) -> int:
    """Create a pending notification per (request, recipient); returns how many are webhooks."""
    webhooks = 0
    for recipient in recipient_list_for_model(session, model_id=job.model_id):
        for request in job.requests:
            notification_record(session, actor=WORKER_ACTOR, reference=request.reference,
                                recipient_id=recipient.id, status="pending",
                                next_attempt_at=utcnow() if recipient.kind == "webhook" else None)
            webhooks += recipient.kind == "webhook"
    return webhooks


def signature_of(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>` over `<timestamp>.<body>`; receivers recompute and compare."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def backoff_after(attempts: int) -> timedelta:
    return timedelta(seconds=min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** max(0, attempts - 1)))


@dataclass(frozen=True)
class _Delivery:
    notification_id: int
    reference: str
    recipient_id: int
    url: str
    secret: str | None
    attempts: int
    body: bytes


def _claim_due(now: datetime, limit: int) -> list[_Delivery]:
    with session_scope(engine()) as session:
        rows = session.execute(
            select(Notification, Recipient, ErasureRequest)
            .join(Recipient, Recipient.id == Notification.recipient_id)
            .join(ErasureRequest, ErasureRequest.id == Notification.request_id)
            .where(Notification.status.in_(("pending", "failed")),
                   Notification.next_attempt_at.is_not(None),
                   Notification.next_attempt_at <= now,
                   Notification.attempts < MAX_ATTEMPTS,
                   Recipient.kind == "webhook", Recipient.active.is_(True))
            .order_by(Notification.next_attempt_at).limit(limit)
        ).all()
        claimed = []
        for notification, recipient, request in rows:
            # Compare-and-set on the due time: two notifiers never send the same delivery.
            won = session.execute(
                update(Notification)
                .where(Notification.id == notification.id,
                       Notification.next_attempt_at == notification.next_attempt_at)
                .values(next_attempt_at=now + LEASE)
                .execution_options(synchronize_session=False)
            ).rowcount
            if won and recipient.endpoint_url:
                claimed.append(_Delivery(
                    notification.id, request.reference, recipient.id, recipient.endpoint_url,
                    recipient_secret(session, recipient_id=recipient.id), notification.attempts,
                    _body(session, request),
                ))
        return claimed


def _body(session: Session, request: ErasureRequest) -> bytes:
    certificate = session.scalars(
        select(Certificate.certificate_id)
        .join(Job, Job.id == Certificate.job_id)
        .where(Job.requests.any(ErasureRequest.id == request.id))
        .order_by(Certificate.seq.desc()).limit(1)
    ).first()
    document = {
        "event": "erasure.completed",
        "reference": request.reference,
        "certificate_id": certificate,
        "model": request.model.name,
        "completed_at": request.completed_at.isoformat() if request.completed_at else None,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _post(delivery: _Delivery) -> tuple[int | None, str | None]:
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", TIMESTAMP_HEADER: timestamp,
               "User-Agent": "erasure-service/notifier"}
    if delivery.secret:
        headers[SIGNATURE_HEADER] = signature_of(delivery.secret, timestamp, delivery.body)
    req = urllib.request.Request(delivery.url, data=delivery.body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as response:  # noqa: S310 - registered URL
            return int(response.status), None
    except urllib.error.HTTPError as exc:
        return int(exc.code), f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return None, type(exc).__name__


def notifications_deliver_due(*, limit: int = 50) -> int:
    """Send every webhook notification that is due; returns how many were delivered."""
    delivered = 0
    for delivery in _claim_due(utcnow(), limit):
        code, error = _post(delivery)
        ok = code is not None and 200 <= code < 300
        attempts = delivery.attempts + 1
        retry_at = None if ok or attempts >= MAX_ATTEMPTS else utcnow() + backoff_after(attempts)
        with session_scope(engine()) as session:
            notification_record(session, actor=WORKER_ACTOR, reference=delivery.reference,
                                recipient_id=delivery.recipient_id,
                                status="sent" if ok else "failed", response_code=code,
                                error=error, next_attempt_at=retry_at)
        if ok:
            delivered += 1
        else:
            log.warning("notification %s: delivery attempt %s failed (%s)%s",
                        delivery.notification_id, attempts, error,
                        "" if retry_at else "; giving up")
    return delivered
