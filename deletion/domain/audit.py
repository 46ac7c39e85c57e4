"""The append-only, hash-chained audit trail.

Each event stores the previous event's hash and its own hash over the canonical JSON
of every stored field, so changing, removing or reordering any row breaks the chain at
that row.  ``audit_append`` runs inside the caller's transaction: the event lands if
and only if the state change it describes lands.  Details must never contain personal
data: references, HMACs and digests only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.canonical import (
    GENESIS_HASH,
    CanonicalError,
    canonical_hash,
    canonical_json,
    canonical_time,
)
from deletion.domain.chains import AUDIT_CHAIN, chain_head_advance, chain_head_lock
from deletion.domain.models import AuditEvent, ChainHead, utcnow

logger = logging.getLogger(__name__)


def audit_event_hash(
    *,
    seq: int,
    at: datetime,
    actor: str,
    action: str,
    object_type: str,
    object_ref: str,
    details: str,
    prev_hash: str,
) -> str:
    """sha256 over the canonical JSON of every stored field but the hash itself."""
    return canonical_hash(
        {
            "seq": seq,
            "at": canonical_time(at),
            "actor": actor,
            "action": action,
            "object_type": object_type,
            "object_ref": object_ref,
            "details": details,  # the stored text, byte for byte
            "prev_hash": prev_hash,
        }
    )


def audit_append(
    session: Session,
    *,
    actor: str,
    action: str,
    object_type: str,
    object_ref: str,
    details: Mapping[str, Any] | None = None,
    at: datetime | None = None,
) -> AuditEvent:
    """Append one event at the tip of the chain, in the caller's transaction."""
    head = chain_head_lock(session, name=AUDIT_CHAIN)
    moment = at or utcnow()
    details_text = canonical_json(dict(details or {}))
    seq = head.seq + 1
    event = AuditEvent(
        seq=seq,
        at=moment,
        actor=actor,
        action=action,
        object_type=object_type,
        object_ref=object_ref,
        details=details_text,
        prev_hash=head.hash,
    )
    event.hash = audit_event_hash(
        seq=seq, at=moment, actor=actor, action=action, object_type=object_type,
        object_ref=object_ref, details=details_text, prev_hash=head.hash,
    )
    session.add(event)
    session.flush()
    chain_head_advance(session, head, seq=seq, hash_hex=event.hash)
    logger.info("audit %s %s %s:%s seq=%s", actor, action, object_type, object_ref, seq)
    return event


@dataclass(frozen=True)
class ChainVerification:
    ok: bool
    checked: int
    first_bad_seq: int | None = None
    reason: str | None = None


def audit_verify(session: Session, *, batch_size: int = 1000) -> ChainVerification:
    """Walk the whole chain; name the first row whose seq, link or hash is wrong.

    The chain head is checked too, so rows cut off the end of the chain are noticed.
    """
    expected_seq, prev_hash, checked = 1, GENESIS_HASH, 0
    last_seq = 0
    while True:
        rows = session.execute(
            select(AuditEvent).where(AuditEvent.seq >= last_seq + 1)
            .order_by(AuditEvent.seq).limit(batch_size)
            .execution_options(populate_existing=True)
        ).scalars().all()
        if not rows:
            break
        for event in rows:
            problem = _event_problem(event, expected_seq=expected_seq, prev_hash=prev_hash)
            if problem is not None:
                # A seq out of place means the expected row is missing or was moved.
                bad = event.seq if event.seq == expected_seq else expected_seq
                return ChainVerification(False, checked, bad, problem)
            checked += 1
            expected_seq, prev_hash, last_seq = event.seq + 1, event.hash, event.seq
    head = session.get(ChainHead, AUDIT_CHAIN, populate_existing=True)
    head_seq, head_hash = (head.seq, head.hash) if head else (0, GENESIS_HASH)
    if (head_seq, head_hash) != (expected_seq - 1, prev_hash):
        return ChainVerification(
            False, checked, expected_seq,
            f"chain head says seq {head_seq}, the table ends at seq {expected_seq - 1}: "
            "rows are missing at the end",
        )
    return ChainVerification(True, checked)


def _event_problem(event: AuditEvent, *, expected_seq: int, prev_hash: str) -> str | None:
    if event.seq != expected_seq:
        return f"expected seq {expected_seq}, found {event.seq} (a row is missing or moved)"
    if event.prev_hash != prev_hash:
        return "prev_hash does not match the previous row's hash"
    try:
        recomputed = audit_event_hash(
            seq=event.seq, at=event.at, actor=event.actor, action=event.action,
            object_type=event.object_type, object_ref=event.object_ref,
            details=event.details, prev_hash=event.prev_hash,
        )
    except (CanonicalError, ValueError) as exc:
        return f"row cannot be re-encoded: {exc}"
    if recomputed != event.hash:
        return "hash does not match the row's contents"
    return None
