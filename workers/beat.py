"""The one beat schedule.  Run exactly one beat process per deployment.

Each entry expires after its own period: a periodic task that sat in the queue
for longer than that is stale, and the next tick sends a fresh one anyway.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from deletion.domain.certificate_heads import FULL_VERIFY_PERIOD, VERIFY_PERIOD
from deletion.domain.seals import SEAL_PERIOD
from workers import routing


def _every(seconds: float, task: str) -> dict[str, Any]:
    return {
        "task": task,
        "schedule": timedelta(seconds=seconds),
        "options": {"expires": seconds, "queue": routing.queue_for(task)},
    }


SCHEDULE: dict[str, dict[str, Any]] = {
    # Enqueue-after-commit safety net: stages relay their own hand-over at once.
    "relay-outbox": _every(1.0, routing.RELAY_OUTBOX),
    "schedule-batches": _every(15.0, routing.SCHEDULE_BATCHES),
    # Neither embedded broker redelivers after a kill: this is what resumes a job.
    "reconcile-jobs": _every(30.0, routing.RECONCILE),
    "notify-recipients": _every(30.0, routing.NOTIFY_RECIPIENTS),
    "watch-deadlines": _every(3600.0, routing.WATCH_DEADLINES),
    "destroy-checkpoints": _every(600.0, routing.DESTROY_CHECKPOINTS),
    "purge-identifiers": _every(3600.0, routing.PURGE_IDENTIFIERS),
    # Alerts on a serving checkpoint whose files changed between jobs.
    "check-serving-digests": _every(3600.0, routing.CHECK_SERVING_DIGESTS),
    # Signed chain heads kept off the database: at most 15 minutes of rows lack a copy.
    "export-chain-heads": _every(900.0, routing.EXPORT_CHAIN_HEADS),
    # Working files (the subjects' sets) of every closed job, and unregistered candidates.
    "sweep-work-files": _every(600.0, routing.SWEEP_WORK_FILES),
    "prune-outbox": _every(3600.0, routing.PRUNE_OUTBOX),
    # Ciphertexts bound to their rows and moved off retired keys (services/sealing.py).
    "reseal-ciphertexts": _every(3600.0, routing.RESEAL_CIPHERTEXTS),
    # Keyed seals over the audit chain: at most 5 minutes of events lack one.
    "seal-audit-chain": _every(SEAL_PERIOD.total_seconds(), routing.SEAL_AUDIT_CHAIN),
    # The database against every signed head exported so far (and the seals they name).
    "check-chain-heads": _every(3600.0, routing.CHECK_CHAIN_HEADS),
    # Signed verified heads of the certificate chain, where pages and the API start their
    # check: from the last one every 15 minutes, and once a day the whole chain.
    "verify-certificate-chain": _every(VERIFY_PERIOD.total_seconds(),
                                       routing.VERIFY_CERTIFICATE_CHAIN),
    "verify-certificate-chain-full": {
        **_every(FULL_VERIFY_PERIOD.total_seconds(), routing.VERIFY_CERTIFICATE_CHAIN),
        "kwargs": {"full": True},
    },
}
