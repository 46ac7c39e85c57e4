"""Per-model settings the web edits.  The domain registry has no service for the batch
window yet, so this one lives here, written like a domain service: keyword-only,
in the caller's transaction, audited.  It belongs in deletion.domain.registry."""
from __future__ import annotations

from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append
from deletion.domain.errors import ValidationError
from deletion.domain.models import Model
from deletion.domain.registry import model_get

MAX_WINDOW_HOURS = 24 * 14


def model_schedule_update(session: Session, *, actor: str, name: str, batch_window_hours: int) -> Model:
    if not 1 <= batch_window_hours <= MAX_WINDOW_HOURS:
        raise ValidationError("batch_window_hours", f"between 1 and {MAX_WINDOW_HOURS} hours")
    model = model_get(session, name=name, for_update=True)
    previous = model.batch_window_hours
    model.batch_window_hours = batch_window_hours
    audit_append(session, actor=actor, action="model.schedule_changed", object_type="model", object_ref=name,
                 details={"batch_window_hours": batch_window_hours, "previous": previous})
    return model
