"""Deadline reminders and staff notices: which to send, and the record that they went.

Reminders go out 7 and 2 days before an open request's deadline (DEADLINE_ALERT_DAYS)
and on the day itself, to the officer who filed it and the reviewer who decided it
(each may switch reminders off), by e-mail and as a webhook event.  Each (request,
window) is reminded once: a ``deadline_alerts`` row, written with the audit event in
one transaction, is what makes a second run send nothing.  Only the tightest window
applies: a request first seen two days before its deadline gets the 2-day reminder,
not the 7-day one as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from deletion.domain import config
from deletion.domain.audit import audit_append
from deletion.domain.canonical import canonical_time
from deletion.domain.models import DeadlineAlert, ErasureRequest, utcnow
from deletion.domain.states import OPEN_REQUEST_STATUSES

ON_THE_DAY = "0d"


@dataclass(frozen=True)
class Reminder:
    reference: str
    kind: str  # "7d", "2d", "0d"
    due_at: datetime
    status: str
    model: str
    actors: tuple[str, ...]  # "user:<name>" of the submitter and the reviewer

    def event(self) -> dict[str, Any]:
        return {"event": "request.deadline_reminder", "reference": self.reference,
                "kind": self.kind, "due_at": canonical_time(self.due_at), "status": self.status,
                "model": self.model}


def reminder_kind(due_at: datetime, now: datetime, days: Sequence[int]) -> str | None:
    """The tightest reminder window ``now`` is in, or None (on the day wins)."""
    if due_at.date() <= now.date():
        return ON_THE_DAY
    for window in sorted(days):
        if due_at <= now + timedelta(days=window):
            return f"{window}d"
    return None


def reminders_due(session: Session, *, now: datetime | None = None,
                  days: Sequence[int] | None = None) -> list[Reminder]:
    now = now or utcnow()
    days = tuple(days or config.current().deadline_alert_days)
    candidates = list(session.scalars(
        select(ErasureRequest).where(
            ErasureRequest.status.in_([s.value for s in OPEN_REQUEST_STATUSES]),
            ErasureRequest.due_at <= now + timedelta(days=max(days)),
        ).order_by(ErasureRequest.due_at, ErasureRequest.id)
    ))
    sent = {(r, k) for r, k in session.execute(
        select(DeadlineAlert.request_id, DeadlineAlert.kind)
        .where(DeadlineAlert.request_id.in_([r.id for r in candidates]))
    )}
    due = []
    for request in candidates:
        kind = reminder_kind(request.due_at, now, days)
        if kind is None or (request.id, kind) in sent:
            continue
        actors = tuple(dict.fromkeys(a for a in (request.submitted_by, request.reviewed_by)
                                     if a and a.startswith("user:")))
        due.append(Reminder(request.reference, kind, request.due_at, request.status,
                            request.model.name, actors))
    return due


def reminder_record(session: Session, *, reminder: Reminder, outcomes: Mapping[str, Any],
                    actor: str = "system:reminders") -> bool:
    """Record that a reminder went (False when another run recorded it first)."""
    request = session.scalar(select(ErasureRequest)
                             .where(ErasureRequest.reference == reminder.reference))
    if request is None:
        return False
    try:
        with session.begin_nested():
            session.add(DeadlineAlert(request_id=request.id, kind=reminder.kind))
            session.flush()
    except IntegrityError:  # the unique (request, kind) row exists: already sent
        return False
    audit_append(session, actor=actor, action="request.deadline_reminder",
                 object_type="erasure_request", object_ref=reminder.reference,
                 details={"kind": reminder.kind, **dict(outcomes)})
    return True


def notice_record(session: Session, *, actor: str, event: Mapping[str, Any],
                  outcomes: Mapping[str, Any]) -> None:
    """Audit a staff notice (retraining required, ...): its event and how it was sent."""
    audit_append(session, actor=actor, action="notice.sent", object_type="erasure_request",
                 object_ref=str(event.get("reference", "-"))[:64],
                 details={"event": event.get("event"), **dict(outcomes)})
