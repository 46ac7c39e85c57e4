"""The outbox relay: committed `outbox` rows -> Celery, by task name.

Services write an outbox row in the transaction that makes a task necessary,
so a task is never sent for a change that rolled back, and never lost for one
that committed.  Sending happens before the row is marked sent: a crash in
between sends the message twice, which every task tolerates (each starts with
a compare-and-set on its job).  On PostgreSQL concurrent relays skip each
other's locked rows; on SQLite the database write lock serialises them.
"""

from __future__ import annotations

import logging

from celery import Celery

from deletion.domain.db import session_scope
from deletion.domain.services.outbox import (
    outbox_claim_pending,
    outbox_mark_failed,
    outbox_mark_sent,
)
from workers.routing import queue_for
from workers.runtime import celery, engine

log = logging.getLogger(__name__)

BATCH = 100


def relay_pending(*, app: Celery | None = None, limit: int = BATCH) -> int:
    """Send every pending outbox message (up to `limit`); returns how many were sent."""
    app = app or celery()
    sent = 0
    with session_scope(engine()) as session:
        for message in outbox_claim_pending(session, limit=limit):
            queue = queue_for(message.task_name)
            try:
                app.send_task(message.task_name, kwargs=dict(message.args or {}), queue=queue,
                              routing_key=queue, exchange=queue)
            except Exception as exc:  # noqa: BLE001 - recorded; the next tick tries again
                log.warning("outbox %s: sending %s failed: %s", message.id, message.task_name,
                            type(exc).__name__)
                outbox_mark_failed(session, message_id=message.id, error=repr(exc))
                continue
            outbox_mark_sent(session, message_id=message.id)
            sent += 1
    if sent:
        log.info("relayed %s outbox message(s)", sent)
    return sent
