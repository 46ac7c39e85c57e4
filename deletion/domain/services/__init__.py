"""Domain services (writes) and selectors (reads): keyword-only ``<entity>_<action>``.

Each service works inside the caller's session and appends its audit events there; the
caller commits (``deletion.domain.db.session_scope``).
"""

from __future__ import annotations

from deletion.domain.services.deadline_alerts import deadline_alert_record, deadline_alerts_due
from deletion.domain.services.jobs import (
    ModelBusy,
    job_claim,
    job_create,
    job_escalate,
    job_fail,
    job_get,
    job_list,
    job_progress,
    job_rebase,
    job_record,
    job_reject,
    job_retry,
    jobs_stale,
)
from deletion.domain.services.outbox import (
    outbox_claim_pending,
    outbox_enqueue,
    outbox_mark_failed,
    outbox_mark_sent,
)
from deletion.domain.services.recipients import (
    notification_list,
    notification_record,
    recipient_list_for_model,
    recipient_register,
    recipient_secret,
)
from deletion.domain.services.requests import (
    SubjectIdentifiers,
    request_approve,
    request_cancel,
    request_deny,
    request_extend,
    request_find_earlier,
    request_get,
    request_list,
    request_purge_identifiers,
    request_submit,
    request_transition,
    subject_identifiers,
)

__all__ = [
    "ModelBusy",
    "SubjectIdentifiers",
    "deadline_alert_record",
    "deadline_alerts_due",
    "job_claim",
    "job_create",
    "job_escalate",
    "job_fail",
    "job_get",
    "job_list",
    "job_progress",
    "job_rebase",
    "job_record",
    "job_reject",
    "job_retry",
    "jobs_stale",
    "notification_list",
    "notification_record",
    "outbox_claim_pending",
    "outbox_enqueue",
    "outbox_mark_failed",
    "outbox_mark_sent",
    "recipient_list_for_model",
    "recipient_register",
    "recipient_secret",
    "request_approve",
    "request_cancel",
    "request_deny",
    "request_extend",
    "request_find_earlier",
    "request_get",
    "request_list",
    "request_purge_identifiers",
    "request_submit",
    "request_transition",
    "subject_identifiers",
]
