from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.errors import ValidationError
from deletion.domain.models import AuditEvent, Recipient
from deletion.domain.services import (
    deadline_alert_record,
    deadline_alerts_due,
    notification_list,
    notification_record,
    outbox_claim_pending,
    outbox_enqueue,
    outbox_mark_failed,
    outbox_mark_sent,
    recipient_list_for_model,
    recipient_register,
    recipient_secret,
)
from tests.domain.conftest import submit

pytestmark = pytest.mark.usefixtures("model")


def test_the_relay_sees_pending_messages_oldest_first_until_marked_sent(session: Session) -> None:
    first = outbox_enqueue(session, task_name="erasure.build_sets", args={"job_id": 1})
    second = outbox_enqueue(session, task_name="erasure.notify", args={"request": "ER-1"})
    assert [m.id for m in outbox_claim_pending(session, limit=10)] == [first.id, second.id]
    outbox_mark_failed(session, message_id=first.id, error="broker down")
    outbox_mark_sent(session, message_id=second.id)
    pending = outbox_claim_pending(session, limit=10)
    assert [m.id for m in pending] == [first.id]
    assert (pending[0].attempts, pending[0].last_error) == (1, "broker down")


def test_webhook_secrets_are_stored_encrypted(session: Session) -> None:
    recipient = recipient_register(session, actor="admin", name="Partner Ltd", kind="webhook",
                                   endpoint_url="https://partner.example/hooks", secret="hush-hush",
                                   model_name="demo")
    assert b"hush" not in (recipient.secret_ciphertext or b"")
    assert recipient_secret(session, recipient_id=recipient.id) == "hush-hush"
    everyone = recipient_register(session, actor="admin", name="Archive", kind="manual")
    assert [r.id for r in recipient_list_for_model(session, model_id=recipient.model_id)] == [
        recipient.id, everyone.id
    ]
    with pytest.raises(ValidationError):
        recipient_register(session, actor="admin", name="Bad", kind="webhook", endpoint_url="ftp://x")


def test_it_records_each_notification_attempt_and_why_one_was_not_sent(session: Session) -> None:
    request = submit(session)
    partner = recipient_register(session, actor="admin", name="Partner", kind="webhook",
                                 endpoint_url="https://p.example/h")
    archive = recipient_register(session, actor="admin", name="Archive", kind="manual")
    notification_record(session, actor="worker", reference=request.reference,
                        recipient_id=partner.id, status="failed", response_code=503, error="busy")
    notification_record(session, actor="worker", reference=request.reference,
                        recipient_id=partner.id, status="sent", response_code=200)
    with pytest.raises(ValidationError):
        notification_record(session, actor="officer", reference=request.reference,
                            recipient_id=archive.id, status="not_sent")
    notification_record(session, actor="officer", reference=request.reference,
                        recipient_id=archive.id, status="not_sent",
                        reason="disproportionate effort: offline archive")
    sent, not_sent = notification_list(session, reference=request.reference)
    assert (sent.status, sent.attempts, sent.response_code) == ("sent", 2, 200)
    assert sent.sent_at is not None
    assert not_sent.status == "not_sent" and not_sent.attempts == 0
    actions = session.execute(
        select(AuditEvent.action).where(AuditEvent.action.like("notification.%"))
    ).scalars().all()
    assert actions == ["notification.failed", "notification.sent", "notification.not_sent"]
    assert session.get(Recipient, partner.id) is not None


def test_the_deadline_watcher_alerts_once_per_window(session: Session) -> None:
    request = submit(session)  # due 2026-12-02 09:30
    assert deadline_alerts_due(session, now=datetime(2026, 11, 20, tzinfo=UTC)) == []
    seven = deadline_alerts_due(session, now=datetime(2026, 11, 26, tzinfo=UTC))
    assert [(r.reference, kind) for r, kind in seven] == [(request.reference, "7d")]
    deadline_alert_record(session, request=request, kind="7d")
    assert deadline_alerts_due(session, now=datetime(2026, 11, 27, tzinfo=UTC)) == []
    two = deadline_alerts_due(session, now=datetime(2026, 12, 1, tzinfo=UTC))
    assert [(r.reference, kind) for r, kind in two] == [(request.reference, "2d")]
