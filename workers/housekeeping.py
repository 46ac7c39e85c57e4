"""Beat housekeeping: destroy old checkpoints after the grace window, purge identifiers,
prune the outbox, reseal ciphertexts.  (The sweep of jobs' working files is in
workfiles.py.)

Destruction removes the files first and records it second: a crash in between
leaves a retired row whose directory is gone, which the next run records; the
reverse order could leave files behind a row that says `destroyed`.  Both happen
with the checkpoint's row locked and re-checked (`checkpoint_check_destroyable`):
retired, and named by no model's serving pointer.  A checkpoint that serves is never
destroyed, whatever its row says.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from deletion.domain import registry
from deletion.domain.db import session_scope
from deletion.domain.models import Checkpoint
from deletion.domain.services.outbox import outbox_prune
from deletion.domain.services.requests import request_purge_identifiers
from deletion.domain.services.sealing import ciphertexts_reseal
from workers.runtime import config, engine

log = logging.getLogger(__name__)

ACTOR = "system:housekeeping"


def checkpoints_destroy_due() -> int:
    """Delete every retired checkpoint whose grace window has passed; returns the count."""
    with session_scope(engine()) as session:
        due = [c.id for c in registry.checkpoints_due_for_destruction(session)]
    destroyed = 0
    for checkpoint_id in due:
        with session_scope(engine()) as session:
            checkpoint = session.get(Checkpoint, checkpoint_id, with_for_update=True)
            if checkpoint is None:
                continue
            try:
                registry.checkpoint_check_destroyable(session, checkpoint)
            except registry.ServingCheckpointProtected as refused:
                log.error("checkpoint %s left alone: %s", checkpoint_id, refused)
                continue
            path = Path(checkpoint.directory)
            if path.exists():
                shutil.rmtree(path)
            registry.checkpoint_destroy(session, actor=ACTOR, checkpoint_id=checkpoint_id)
            digest = checkpoint.digest
        log.info("checkpoint %s destroyed (digest %s)", checkpoint_id, digest[:12])
        destroyed += 1
    return destroyed


def identifiers_purge_due() -> int:
    """Drop encrypted identifiers of requests closed longer than RETENTION_DAYS ago."""
    with session_scope(engine()) as session:
        purged = request_purge_identifiers(session, actor=ACTOR,
                                           retention_days=config().retention_days)
    if purged:
        log.info("purged the identifiers of %s closed request(s)", len(purged))
    return len(purged)


def outbox_prune_due() -> int:
    """Drop delivered outbox rows after a week, abandon (audited) rows that never sent."""
    with session_scope(engine()) as session:
        pruned = outbox_prune(session, actor=ACTOR)
    if pruned.abandoned:
        log.warning("abandoned %s outbox message(s) that never sent in a week", pruned.abandoned)
    return pruned.sent + pruned.abandoned


def ciphertexts_reseal_due() -> int:
    """Bind old ciphertexts to their rows and move rows off retired keys (audited)."""
    with session_scope(engine()) as session:
        done = ciphertexts_reseal(session, actor=ACTOR)
    if done.total:
        log.info("resealed %s ciphertext(s)", done.total)
    return done.total
