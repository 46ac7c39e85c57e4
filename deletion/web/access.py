"""Sign-in lock-outs (django-axes) and their release, written to the audit trail.

A lock-out is recorded when axes locks an account name; its release when the
attempt record that held the lock goes away: an admin's ``manage.py unlock_account``
or the cool-off expiring (axes deletes the record then).  Account names are recorded
as actors when the account exists; a name that matches no account (a typo, a
stranger's guess, possibly an e-mail address) is recorded only as a short hash.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any

from axes.models import AccessAttempt
from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete
from django.dispatch import receiver

from deletion.domain.services.access import login_event_record
from deletion.web.domain_session import domain_session

logger = logging.getLogger(__name__)
ACTOR = "system:sign-in"


def account_ref(username: str | None) -> str:
    if username and get_user_model().objects.filter(username=username).exists():
        return f"user:{username}"
    digest = hashlib.sha256((username or "").encode("utf-8")).hexdigest()[:16]
    return f"unknown:{digest}"


@receiver(user_locked_out)
def record_lockout(sender: Any, request: Any = None, username: str | None = None, **kwargs: Any) -> None:
    with domain_session() as session:
        login_event_record(session, actor=ACTOR, action="auth.locked_out", account=account_ref(username),
                           details={"failure_limit": settings.AXES_FAILURE_LIMIT,
                                    "cooloff_minutes": int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)})
    logger.warning("sign-in locked for an account after %s failures", settings.AXES_FAILURE_LIMIT)


@receiver(post_delete, sender=AccessAttempt)
def record_release(sender: Any, instance: AccessAttempt, **kwargs: Any) -> None:
    if instance.failures_since_start < settings.AXES_FAILURE_LIMIT:
        return  # a few failures forgotten, never a lock-out
    released_by = getattr(instance, "_released_by", None) or "cool-off expired or reset"
    with domain_session() as session:
        login_event_record(session, actor=getattr(instance, "_released_actor", ACTOR),
                           action="auth.lockout_released", account=account_ref(instance.username),
                           details={"how": released_by, "failures": instance.failures_since_start})


def lockout_release(*, username: str, actor: str) -> int:
    """Release a locked account now (an admin's decision); returns the records removed."""
    removed = 0
    for attempt in AccessAttempt.objects.filter(username=username):
        attempt._released_by = "released by an admin"  # type: ignore[attr-defined]
        attempt._released_actor = actor  # type: ignore[attr-defined]
        attempt.delete()
        removed += 1
    return removed


def locked_accounts() -> list[str]:
    return sorted({a.username for a in AccessAttempt.objects.filter(
        failures_since_start__gte=settings.AXES_FAILURE_LIMIT) if a.username})


MAX_USERNAME = 150  # Django's own limit; a longer "name" is noise, never an account


def axes_username(request: Any, credentials: dict[str, Any] | None = None) -> str:
    """The account name axes counts failures for, bounded so that hostile input (a
    megabyte of "username") is one more failure, not a database error."""
    source = credentials if credentials else getattr(request, "POST", {})
    return str(source.get("username", "") or "")[:MAX_USERNAME]
