"""A model's settings that the admin edits: its batch window and who owns it."""

from __future__ import annotations

import re

from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append
from deletion.domain.config import MAX_BATCH_WINDOW_MINUTES
from deletion.domain.errors import ValidationError
from deletion.domain.models import Model
from deletion.domain.registry import model_get
from deletion.domain.services.batches import batch_window

EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,190}\.[^@\s]{2,}$")


def model_batch_window_set(session: Session, *, actor: str, name: str, minutes: int) -> Model:
    """How long approved batch requests for the model wait to be merged (in minutes)."""
    if not 1 <= minutes <= MAX_BATCH_WINDOW_MINUTES:
        raise ValidationError("batch_window_minutes",
                              f"between 1 and {MAX_BATCH_WINDOW_MINUTES} minutes (14 days)")
    model = model_get(session, name=name, for_update=True)
    previous = int(batch_window(model).total_seconds() // 60)
    model.batch_window_minutes = minutes
    model.batch_window_hours = max(1, -(-minutes // 60))
    audit_append(session, actor=actor, action="model.schedule_changed", object_type="model",
                 object_ref=name, details={"batch_window_minutes": minutes, "previous": previous})
    return model


def model_owner_set(session: Session, *, actor: str, name: str, email: str | None,
                    webhook_url: str | None) -> Model:
    """The model's owner (the ML team), told when an erasure needs a retraining."""
    email = (email or "").strip() or None
    webhook_url = (webhook_url or "").strip() or None
    if email is not None and (len(email) > 254 or not EMAIL.match(email)):
        raise ValidationError("owner_email", "not an e-mail address")
    if webhook_url is not None and (len(webhook_url) > 500
                                    or not webhook_url.startswith(("https://", "http://"))):
        raise ValidationError("owner_webhook_url", "an http(s):// URL of at most 500 characters")
    model = model_get(session, name=name, for_update=True)
    model.owner_email, model.owner_webhook_url = email, webhook_url
    # The address is a team's contact, yet the audit keeps only whether one is set.
    audit_append(session, actor=actor, action="model.owner_changed", object_type="model",
                 object_ref=name, details={"email": email is not None,
                                           "webhook": webhook_url is not None})
    return model
