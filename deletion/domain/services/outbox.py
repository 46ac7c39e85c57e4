"""The transactional outbox: enqueue a task only once the writing transaction commits.

Services add an ``outbox`` row in the same transaction as the state change; a relay on
the worker side claims pending rows, sends them to Celery by task name, and marks them
sent.  A crash between send and mark re-sends the message, which is safe because every
task is idempotent (it starts with a compare-and-set on its job).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.models import OutboxMessage, utcnow

MAX_ERROR_CHARS = 2000


def outbox_enqueue(session: Session, *, task_name: str, args: Mapping[str, Any]) -> OutboxMessage:
    message = OutboxMessage(task_name=task_name, args=dict(args), attempts=0)
    session.add(message)
    session.flush()
    return message


def outbox_claim_pending(session: Session, *, limit: int = 100) -> list[OutboxMessage]:
    """Unsent messages, oldest first, locked against other relays (skipped, not waited on)."""
    query = (
        select(OutboxMessage)
        .where(OutboxMessage.sent_at.is_(None))
        .order_by(OutboxMessage.id)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return list(session.execute(query).scalars())


def outbox_mark_sent(session: Session, *, message_id: int) -> None:
    message = session.get(OutboxMessage, message_id)
    if message is not None:
        message.sent_at = utcnow()
        message.attempts += 1


def outbox_mark_failed(session: Session, *, message_id: int, error: str) -> None:
    message = session.get(OutboxMessage, message_id)
    if message is not None:
        message.attempts += 1
        message.last_error = error[:MAX_ERROR_CHARS]
