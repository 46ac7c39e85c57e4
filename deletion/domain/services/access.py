"""Audit rows for access to the service itself: API tokens and sign-in lock-outs.

The accounts and tokens live in the web's own tables; what happened to them is
recorded here, in the same chain as every erasure, so an auditor sees who could act
and when that changed.  Details name accounts by their actor string and tokens by
their public hint, never a secret, a password or an address.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append
from deletion.domain.models import AuditEvent

TOKEN_ACTIONS = ("token.created", "token.revoked", "token.refused")
LOGIN_ACTIONS = ("auth.locked_out", "auth.lockout_released")


def token_event_record(
    session: Session, *, actor: str, action: str, hint: str, details: Mapping[str, Any]
) -> AuditEvent:
    if action not in TOKEN_ACTIONS:
        raise ValueError(f"not a token action: {action}")
    return audit_append(session, actor=actor, action=action, object_type="api_token",
                        object_ref=hint, details=dict(details))


def login_event_record(
    session: Session, *, actor: str, action: str, account: str, details: Mapping[str, Any]
) -> AuditEvent:
    if action not in LOGIN_ACTIONS:
        raise ValueError(f"not a sign-in action: {action}")
    return audit_append(session, actor=actor, action=action, object_type="account",
                        object_ref=account[:64], details=dict(details))
