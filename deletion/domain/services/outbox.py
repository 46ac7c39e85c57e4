"""The transactional outbox: enqueue a task only once the writing transaction commits.

Services add an ``outbox`` row in the same transaction as the state change; a relay on
the worker side claims pending rows, sends them to Celery by task name, and marks them
sent.  A crash between send and mark re-sends the message, which is safe because every
task is idempotent (it starts with a compare-and-set on its job).

``outbox_prune`` keeps the table small: sent rows go after a week, and rows that never
sent for a week (a broker that refused them every time) are abandoned with an audit
event.  Abandoning loses nothing the service needs: the reconciler re-sends every
job's stage from the ``jobs`` table, beat re-sends periodic work, and notifications
are driven by their own rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append
from deletion.domain.db import rows_changed
from deletion.domain.models import OutboxMessage, utcnow

MAX_ERROR_CHARS = 2000
SENT_RETENTION = timedelta(days=7)
UNSENT_ABANDON_AFTER = timedelta(days=7)


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


@dataclass(frozen=True)
class OutboxPruned:
    sent: int  # delivered rows deleted
    abandoned: int  # rows that never sent, deleted (and audited)


def outbox_prune(
    session: Session,
    *,
    actor: str,
    now: datetime | None = None,
    sent_retention: timedelta = SENT_RETENTION,
    abandon_after: timedelta = UNSENT_ABANDON_AFTER,
) -> OutboxPruned:
    """Delete delivered rows older than ``sent_retention``; abandon rows still unsent
    ``abandon_after`` after they were written (one audit event names how many, of which
    tasks, for which jobs)."""
    now = now or utcnow()
    sent = rows_changed(session.execute(
        delete(OutboxMessage).where(OutboxMessage.sent_at.is_not(None),
                                    OutboxMessage.sent_at < now - sent_retention)
        .execution_options(synchronize_session=False)
    ))
    stale = list(session.execute(
        select(OutboxMessage).where(OutboxMessage.sent_at.is_(None),
                                    OutboxMessage.created_at < now - abandon_after)
        .order_by(OutboxMessage.id).with_for_update()
    ).scalars())
    if stale:
        jobs = sorted({int(m.args["job_id"]) for m in stale
                       if isinstance((m.args or {}).get("job_id"), int)})
        audit_append(
            session, actor=actor, action="outbox.abandoned", object_type="outbox",
            object_ref=f"{stale[0].id}-{stale[-1].id}",
            details={"messages": len(stale), "tasks": dict(Counter(m.task_name for m in stale)),
                     "jobs": jobs[:100], "max_attempts": max(m.attempts for m in stale)},
        )
        session.execute(delete(OutboxMessage).where(OutboxMessage.id.in_([m.id for m in stale]))
                        .execution_options(synchronize_session=False))
    return OutboxPruned(sent=sent, abandoned=len(stale))
