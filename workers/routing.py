"""Queues and task routes, in one place.

Two queues: `default` (set building, CPU verification, certificates,
notifications, housekeeping) and `gpu` (unlearning).  Everything that sends a
task - the outbox relay, beat, a stage handing on - routes through
`queue_for(task_name)`, so a task can never land on a queue no worker reads.
"""

from __future__ import annotations

from kombu import Exchange, Queue

DEFAULT_QUEUE = "default"
GPU_QUEUE = "gpu"
ALL_QUEUES = (DEFAULT_QUEUE, GPU_QUEUE)

# Stage task names: the web side and the domain's outbox refer to tasks by
# these strings only, never by importing worker code.
BUILD_SETS = "erasure.build_sets"
UNLEARN = "erasure.unlearn"
VERIFY = "erasure.verify"
CERTIFY = "erasure.certify"
PROMOTE = "erasure.promote"
STAGE_TASKS = (BUILD_SETS, UNLEARN, VERIFY, CERTIFY, PROMOTE)

# Periodic and side tasks.
RELAY_OUTBOX = "erasure.relay_outbox"
SCHEDULE_BATCHES = "erasure.schedule_batches"
RECONCILE = "erasure.reconcile"
WATCH_DEADLINES = "erasure.watch_deadlines"
DESTROY_CHECKPOINTS = "erasure.destroy_checkpoints"
PURGE_IDENTIFIERS = "erasure.purge_identifiers"
NOTIFY_RECIPIENTS = "erasure.notify_recipients"
DELIVER_NOTIFICATION = "erasure.deliver_notification"
CHECK_SERVING_DIGESTS = "erasure.check_serving_digests"
EXPORT_CHAIN_HEADS = "erasure.export_chain_heads"
SWEEP_WORK_FILES = "erasure.sweep_work_files"
PRUNE_OUTBOX = "erasure.prune_outbox"
RESEAL_CIPHERTEXTS = "erasure.reseal_ciphertexts"
CHECK_CHAIN_HEADS = "erasure.check_chain_heads"
SEAL_AUDIT_CHAIN = "erasure.seal_audit_chain"
VERIFY_CERTIFICATE_CHAIN = "erasure.verify_certificate_chain"

_GPU_TASKS = frozenset({UNLEARN})

TASK_QUEUES = tuple(
    Queue(name, Exchange(name, type="direct"), routing_key=name) for name in ALL_QUEUES
)


def queue_for(task_name: str) -> str:
    """The queue a task runs on (unknown names go to `default`)."""
    return GPU_QUEUE if task_name in _GPU_TASKS else DEFAULT_QUEUE


def route_task(name: str, args: object, kwargs: object, options: object,
               task: object = None, **_: object) -> dict[str, str]:
    """Celery router: the single routing rule for every task sent."""
    queue = queue_for(name)
    return {"queue": queue, "routing_key": queue, "exchange": queue}
