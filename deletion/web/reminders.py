"""Deadline reminders, sent: e-mail to the request's officer and reviewer (unless they
switched reminders off) and one webhook event per reminder.

Run by ``manage.py send_reminders`` (beat starts it every 10 minutes); the selection
and the once-only record are the domain's (``deletion.domain.services.notices``).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model

from deletion.domain.services.notices import Reminder, reminder_record, reminders_due
from deletion.web.domain_session import domain_session
from deletion.web.models import reminders_enabled
from deletion.web.notify import email_send, webhook_post

WHEN = {"7d": "in 7 days", "2d": "in 2 days", "0d": "today"}


@dataclass(frozen=True)
class ReminderRun:
    sent: int
    emails: int
    webhooks: int


def _addresses(reminder: Reminder) -> list[str]:
    names = [actor.removeprefix("user:") for actor in reminder.actors]
    users = get_user_model().objects.filter(username__in=names, is_active=True)
    return [u.email for u in users if u.email and reminders_enabled(u)]


def _message(reminder: Reminder) -> tuple[str, str]:
    when = WHEN.get(reminder.kind, f"within {reminder.kind}")
    link = f"{settings.CONFIG.public_base_url}/requests/{reminder.reference}/"
    subject = f"[erasure] {reminder.reference} is due {when} ({reminder.due_at:%d %b %Y})"
    body = (f"Erasure request {reminder.reference} (model {reminder.model}) is due {when}, on "
            f"{reminder.due_at:%d %B %Y %H:%M} UTC (Art. 12(3) GDPR). It is {reminder.status.replace('_', ' ')}.\n\n"
            f"Open it: {link}\n\nYou get this because you filed or reviewed the request; switch "
            f"reminders off under Account in the service.\n")
    return subject, body


def reminders_send(*, now: datetime | None = None) -> ReminderRun:
    with domain_session() as session:
        due = reminders_due(session, now=now)
    sent = emails = webhooks = 0
    config = settings.CONFIG
    for reminder in due:
        addresses = _addresses(reminder)
        subject, body = _message(reminder)
        mail = email_send(to=addresses, subject=subject, body=body) if addresses else None
        hook = webhook_post(url=config.event_webhook_url, event=reminder.event(),
                            secret=config.event_webhook_secret) if config.event_webhook_url else None
        outcomes = {"emails": len(addresses) if mail and mail.ok else 0,
                    "email_error": mail.detail if mail and not mail.ok else None,
                    "webhook": None if hook is None else hook.ok}
        with domain_session() as session:
            if reminder_record(session, reminder=reminder, outcomes=outcomes):
                sent += 1
                emails += outcomes["emails"]
                webhooks += bool(hook and hook.ok)
    return ReminderRun(sent, emails, webhooks)
