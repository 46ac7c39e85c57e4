"""State machines as transition tables: one table per machine, nothing implicit.

``check_transition`` raises ``InvalidTransition`` for any edge the table does not
list, before anything is changed, so a forbidden request can never half-happen.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from deletion.domain.errors import InvalidTransition


class RequestStatus(StrEnum):
    SUBMITTED = "submitted"
    APPROVED = "approved"
    DENIED = "denied"
    CANCELED = "canceled"
    SCHEDULED = "scheduled"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    NEEDS_ATTENTION = "needs_attention"
    # A reviewer decided that unlearning cannot erase the subject: the model's owner
    # retrains without the subject's records; a retry then verifies the new model.
    RETRAINING = "retraining"


class JobStage(StrEnum):
    QUEUED = "queued"
    BUILDING_SETS = "building_sets"
    UNLEARNING = "unlearning"
    VERIFYING = "verifying"
    CERTIFYING = "certifying"
    PROMOTING = "promoting"
    DONE = "done"
    FAILED = "failed"
    REJECTED = "rejected"


class CheckpointStatus(StrEnum):
    CANDIDATE = "candidate"
    SERVING = "serving"
    RETIRED = "retired"
    DESTROYED = "destroyed"


R = RequestStatus
REQUEST_TRANSITIONS: dict[RequestStatus, frozenset[RequestStatus]] = {
    R.SUBMITTED: frozenset({R.APPROVED, R.DENIED, R.CANCELED}),
    R.APPROVED: frozenset({R.SCHEDULED, R.CANCELED}),
    # A job can be rejected or dead-lettered before it ever starts its requests.
    R.SCHEDULED: frozenset({R.IN_PROGRESS, R.NEEDS_ATTENTION}),
    R.IN_PROGRESS: frozenset({R.COMPLETED, R.NEEDS_ATTENTION}),
    # The resolution path of a failed erasure: a retry, retraining, or a refusal.
    R.NEEDS_ATTENTION: frozenset({R.SCHEDULED, R.CANCELED, R.RETRAINING, R.DENIED}),
    R.RETRAINING: frozenset({R.SCHEDULED, R.CANCELED, R.DENIED}),
    R.DENIED: frozenset(),
    R.CANCELED: frozenset(),
    R.COMPLETED: frozenset(),
}
OPEN_REQUEST_STATUSES = frozenset(
    {R.SUBMITTED, R.APPROVED, R.SCHEDULED, R.IN_PROGRESS, R.NEEDS_ATTENTION, R.RETRAINING}
)
# After a reviewer's approval, only a second person (a reviewer, never the submitter)
# may cancel, and only with a reason (four-eyes holds both ways).
CANCEL_NEEDS_REVIEW = frozenset({R.APPROVED, R.NEEDS_ATTENTION, R.RETRAINING})

J = JobStage
# The pipeline order; every running stage may also fail (retryable) or be rejected.
JOB_PIPELINE: tuple[JobStage, ...] = (
    J.QUEUED, J.BUILDING_SETS, J.UNLEARNING, J.VERIFYING, J.CERTIFYING, J.PROMOTING, J.DONE,
)
JOB_TERMINAL = frozenset({J.DONE, J.REJECTED})
JOB_TRANSITIONS: dict[JobStage, frozenset[JobStage]] = {
    **{
        stage: frozenset({JOB_PIPELINE[i + 1], J.FAILED, J.REJECTED})
        for i, stage in enumerate(JOB_PIPELINE[:-1])
    },
    # Escalation after a failed verification re-runs unlearning with stronger settings.
    J.VERIFYING: frozenset({J.CERTIFYING, J.UNLEARNING, J.FAILED, J.REJECTED}),
    # Re-basing: the serving checkpoint moved under the job before it was certified (found
    # in the certify transaction, where the serving pointer moves), so it starts again from
    # the new one.
    J.CERTIFYING: frozenset({J.PROMOTING, J.QUEUED, J.FAILED, J.REJECTED}),
    # `promoting` begins in the transaction that issued the certificate and moved the
    # serving pointer: from here the job can only finish.  A crash in promote resumes
    # promote; it never fails, re-queues or re-bases a job whose candidate already serves.
    J.PROMOTING: frozenset({J.DONE}),
    J.FAILED: frozenset({J.QUEUED, J.REJECTED}),
    J.DONE: frozenset(),
    J.REJECTED: frozenset(),
}
# A job holds its model until it is done, rejected or dead-lettered (a failed job that
# used up its attempts): at most one such job per model (a partial unique index).
JOB_ACTIVE_STAGES = frozenset(JobStage) - JOB_TERMINAL

C = CheckpointStatus
CHECKPOINT_TRANSITIONS: dict[CheckpointStatus, frozenset[CheckpointStatus]] = {
    C.CANDIDATE: frozenset({C.SERVING, C.RETIRED}),
    # Only `registry.checkpoint_promote` takes this edge, in the transaction that makes
    # its successor serve; `checkpoint_retire` refuses a serving checkpoint.
    C.SERVING: frozenset({C.RETIRED}),
    # Never back to serving: a retired checkpoint may still hold erased data.
    C.RETIRED: frozenset({C.DESTROYED}),
    C.DESTROYED: frozenset(),
}


def check_request_transition(current: str, target: str) -> RequestStatus:
    return _check("erasure request", REQUEST_TRANSITIONS, RequestStatus, current, target)


def check_job_transition(current: str, target: str) -> JobStage:
    return _check("job", JOB_TRANSITIONS, JobStage, current, target)


def check_checkpoint_transition(current: str, target: str) -> CheckpointStatus:
    return _check("checkpoint", CHECKPOINT_TRANSITIONS, CheckpointStatus, current, target)


S = TypeVar("S", bound=StrEnum)


def _check(
    entity: str, table: dict[S, frozenset[S]], kind: type[S], current: str, target: str
) -> S:
    try:
        source, goal = kind(current), kind(target)
    except ValueError:
        raise InvalidTransition(entity, current, target) from None
    if goal not in table[source]:
        raise InvalidTransition(entity, current, target)
    return goal
