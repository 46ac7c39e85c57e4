"""Beat tasks that keep the audit chain honest: seal it (the only holder of the seal
key), and compare the database with the signed heads exported off it.

Thin, like workers/tasks.py: each calls one domain function with the worker's
settings.  A failed check is logged as an error by the domain and returned as a
count, so monitoring sees it in the task result too; it is never retried (the
chain will not heal by itself)."""
from __future__ import annotations

import logging

from sqlalchemy.exc import OperationalError

from workers import routing
from workers.celery_app import app

log = logging.getLogger(__name__)

_OPTIONS = {"acks_late": True, "autoretry_for": (OperationalError, ConnectionError),
            "retry_backoff": True, "max_retries": 3}


@app.task(name=routing.SEAL_AUDIT_CHAIN, **_OPTIONS)
def seal_audit_chain() -> int:
    """Verify from the last seal and seal the head; the seq sealed (0: nothing sealed)."""
    from deletion.domain.db import session_scope
    from deletion.domain.seals import SealKeys, audit_seal
    from workers.runtime import config, engine

    keys = SealKeys.for_sealer(config())
    with session_scope(engine()) as session:
        outcome = audit_seal(session, keys=keys)
    if not outcome.check.ok:
        return 0
    return outcome.seal.sealed_seq if outcome.seal is not None else 0


@app.task(name=routing.CHECK_CHAIN_HEADS, **_OPTIONS)
def check_chain_heads() -> int:
    """Problems found comparing the exported heads with the database (0: all match)."""
    from deletion.domain.chain_heads import HEADS_FILE, chain_heads_check_file
    from deletion.domain.db import session_scope
    from deletion.domain.signing import keyring_from_config
    from workers.runtime import config, engine

    cfg = config()
    path = cfg.chain_head_export_dir / HEADS_FILE
    if not path.is_file():
        log.warning("no exported chain heads at %s yet: nothing to compare", path)
        return 0
    with session_scope(engine()) as session:
        verdict = chain_heads_check_file(session, path=path, keyring=keyring_from_config(cfg))
    return len(verdict.problems)
