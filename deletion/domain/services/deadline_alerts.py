"""The deadline watcher's selectors: which requests need a 7-day or 2-day alert."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append
from deletion.domain.models import DeadlineAlert, ErasureRequest, utcnow
from deletion.domain.states import OPEN_REQUEST_STATUSES


def deadline_alerts_due(
    session: Session, *, days: Sequence[int] = (7, 2), now: datetime | None = None
) -> list[tuple[ErasureRequest, str]]:
    """(request, kind) pairs for open requests inside a window not yet alerted.

    Only the tightest window applies: a request found with 1 day left gets the 2-day
    alert, not the 7-day one as well.
    """
    now = now or utcnow()
    open_requests = list(session.execute(
        select(ErasureRequest).where(
            ErasureRequest.status.in_([s.value for s in OPEN_REQUEST_STATUSES]),
            ErasureRequest.due_at <= now + timedelta(days=max(days)),
        ).order_by(ErasureRequest.due_at)
    ).scalars())
    alerted = {
        (request_id, kind)
        for request_id, kind in session.execute(
            select(DeadlineAlert.request_id, DeadlineAlert.kind).where(
                DeadlineAlert.request_id.in_([r.id for r in open_requests])
            )
        )
    }
    due: list[tuple[ErasureRequest, str]] = []
    for request in open_requests:
        window = min(d for d in days if request.due_at <= now + timedelta(days=d))
        kind = f"{window}d"
        if (request.id, kind) not in alerted:
            due.append((request, kind))
    return due


def deadline_alert_record(
    session: Session, *, request: ErasureRequest, kind: str, actor: str = "deadline-watcher"
) -> DeadlineAlert:
    alert = DeadlineAlert(request_id=request.id, kind=kind)
    session.add(alert)
    session.flush()
    audit_append(
        session, actor=actor, action="request.deadline_alert", object_type="erasure_request",
        object_ref=request.reference, details={"kind": kind},
    )
    return alert
