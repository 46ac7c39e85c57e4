"""Beat integrity checks: serving checkpoints re-hashed, chain heads signed off-database.

A serving checkpoint's files are otherwise only re-hashed when the next job starts
from them, which may be days away; the hourly re-hash alerts in between.

The signed chain-head export and its check live in ``deletion.domain.chain_heads``
(``manage.py chain_heads_check`` needs them without worker code); they are named here
too for the beat tasks and older callers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.audit import audit_append
from deletion.domain.chain_heads import (
    CHAINS,
    HEADS_FILE,
    HEADS_FORMAT,
    HeadCheck,
    chain_heads_check,
    chain_heads_check_file,
    chain_heads_export,
)
from deletion.domain.chains import AUDIT_CHAIN, chain_head_lock
from deletion.domain.db import session_scope
from deletion.domain.models import AuditEvent, Checkpoint, Model
from deletion.domain.states import CheckpointStatus

__all__ = ["CHAINS", "HEADS_FILE", "HEADS_FORMAT", "HeadCheck", "IntegrityReport",
           "chain_heads_check", "chain_heads_check_file", "chain_heads_export",
           "checkpoints_check_serving"]

log = logging.getLogger(__name__)

ACTOR = "system:integrity"
INTEGRITY_FAILED = "checkpoint.integrity_failed"
INTEGRITY_RESTORED = "checkpoint.integrity_restored"
DIGEST_PREFIX = 12  # enough to tell digests apart in an alert; the full one is in the registry
MISSING = registry.MISSING



# --------------------------------------------------------------- serving checkpoints


@dataclass(frozen=True)
class IntegrityReport:
    checked: int
    mismatched: tuple[int, ...]  # checkpoint ids whose files differ now
    reported: tuple[int, ...]  # of those, the ones that got a new audit event this run
    restored: tuple[int, ...]  # ids whose files match again after a reported mismatch


def _actual_digest(directory: str) -> str:
    """The files' digest now, or `missing` / `refused` (a symlink inside)."""
    return registry.checkpoint_files_digest(directory)


def _last_integrity_event(session: Session, object_ref: str) -> AuditEvent | None:
    return session.execute(
        select(AuditEvent)
        .where(AuditEvent.object_type == "checkpoint", AuditEvent.object_ref == object_ref,
               AuditEvent.action.in_((INTEGRITY_FAILED, INTEGRITY_RESTORED)))
        .order_by(AuditEvent.seq.desc()).limit(1)
    ).scalar_one_or_none()


def checkpoints_check_serving(*, engine: Any) -> IntegrityReport:
    """Re-hash every serving checkpoint; audit each new mismatch once, and its repair.

    Idempotent per checkpoint and mismatch: while the files keep hashing to the same
    wrong digest, later runs add nothing.  Hashing runs outside any transaction (it
    can take minutes); the decision runs under the audit chain's lock, so two
    overlapping runs cannot both append the same event.
    """
    with session_scope(engine) as session:
        serving = [
            (c.id, c.version, c.directory, c.digest, m.name)
            for c, m in session.execute(
                select(Checkpoint, Model).join(Model, Checkpoint.model_id == Model.id)
                .where(Checkpoint.status == CheckpointStatus.SERVING.value)
                .order_by(Checkpoint.id)
            ).all()
        ]
    mismatched: list[int] = []
    reported: list[int] = []
    restored: list[int] = []
    for checkpoint_id, version, directory, expected, model_name in serving:
        actual = _actual_digest(directory)
        ok = actual == expected
        if not ok:
            mismatched.append(checkpoint_id)
        object_ref = f"{model_name}@{version}"
        with session_scope(engine) as session:
            chain_head_lock(session, name=AUDIT_CHAIN)
            last = _last_integrity_event(session, object_ref)
            last_failed = last is not None and last.action == INTEGRITY_FAILED
            last_actual = json.loads(last.details).get("actual") if last is not None else None
            details = {"model": model_name, "checkpoint_id": checkpoint_id, "version": version,
                       "expected": expected[:DIGEST_PREFIX], "actual": actual[:DIGEST_PREFIX]}
            if not ok:
                if last_failed and last_actual == details["actual"]:
                    continue  # already reported, nothing changed since
                audit_append(session, actor=ACTOR, action=INTEGRITY_FAILED,
                             object_type="checkpoint", object_ref=object_ref, details=details)
                reported.append(checkpoint_id)
                log.error("serving checkpoint %s of model %s (v%s) no longer matches its "
                          "digest %s (files now: %s)", checkpoint_id, model_name, version,
                          details["expected"], details["actual"])
            elif last_failed:
                audit_append(session, actor=ACTOR, action=INTEGRITY_RESTORED,
                             object_type="checkpoint", object_ref=object_ref, details=details)
                restored.append(checkpoint_id)
                log.warning("serving checkpoint %s of model %s (v%s) matches its digest again",
                            checkpoint_id, model_name, version)
    return IntegrityReport(checked=len(serving), mismatched=tuple(mismatched),
                           reported=tuple(reported), restored=tuple(restored))
