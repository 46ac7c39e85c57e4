"""Beat tasks that keep the chains honest: seal the audit chain (the only holder of the
seal key), compare the database with the signed heads exported off it, and sign the
certificate chain's verified heads (where pages and the API start their check).

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


@app.task(name=routing.VERIFY_CERTIFICATE_CHAIN, **_OPTIONS)
def verify_certificate_chain(full: bool = False) -> int:
    """Verify the certificate chain from its last verified head (``full``: from genesis)
    and sign the head reached; the seq vouched for (0: nothing new, or the check failed)."""
    from deletion.domain.certificate_heads import certificate_chain_vouch
    from deletion.domain.db import session_scope
    from deletion.domain.signing import keyring_from_config
    from workers.runtime import config, engine, signer

    signing = signer()  # first: loading the signer publishes its public key to the ring
    keyring = keyring_from_config(config())
    with session_scope(engine()) as session:
        outcome = certificate_chain_vouch(session, signer=signing, keyring=keyring, full=full)
    return outcome.head.verified_seq if outcome.head is not None else 0
