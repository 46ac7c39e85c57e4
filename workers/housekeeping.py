"""Beat housekeeping: destroy old checkpoints after the grace window, purge identifiers.

Destruction removes the files first and records it second: a crash in between
leaves a retired row whose directory is gone, which the next run records; the
reverse order could leave files behind a row that says `destroyed`.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from deletion.domain import registry
from deletion.domain.db import session_scope
from deletion.domain.services.requests import request_purge_identifiers
from workers.runtime import config, engine

log = logging.getLogger(__name__)

ACTOR = "system:housekeeping"


def checkpoints_destroy_due() -> int:
    """Delete every retired checkpoint whose grace window has passed; returns the count."""
    with session_scope(engine()) as session:
        due = [(c.id, c.directory, c.digest)
               for c in registry.checkpoints_due_for_destruction(session)]
    destroyed = 0
    for checkpoint_id, directory, digest in due:
        path = Path(directory)
        if path.exists():
            shutil.rmtree(path)
        with session_scope(engine()) as session:
            registry.checkpoint_destroy(session, actor=ACTOR, checkpoint_id=checkpoint_id)
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
