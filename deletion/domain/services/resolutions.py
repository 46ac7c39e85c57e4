"""What to do when an erasure fails: the officer proposes, a reviewer decides.

A rejected (or dead-lettered) job leaves its requests in ``needs_attention``.  Three
ways out, each proposed by one person and approved by another (four-eyes, compared
by account id), each audited:

- **retry** with another method or a stronger named preset: a new job for the request
  (``method`` and ``hparams = {"preset": name}``), verified and certified like any;
- **retraining required**: unlearning will not do; the subject's records are
  tombstoned (no future training may use them), the model's owner is told, and the
  exclusions are exported for the next training run.  The request waits in
  ``retraining``; once a retrained checkpoint serves, a retry verifies it;
- **refusal** under Art. 17(3) (or Art. 12(5)/(6)), with the reasons the reply to the
  data subject must give (Art. 12(4)).

The Art. 12(3) deadline keeps running through all of it and stays on the request page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.audit import audit_append
from deletion.domain.canonical import canonical_time
from deletion.domain.errors import NotFound, PermissionDenied, ValidationError
from deletion.domain.gdpr import DENIAL_REASONS
from deletion.domain.methods import METHODS, PRESETS, preset_hparams
from deletion.domain.models import (
    ErasureRequest,
    Job,
    JobRequest,
    Model,
    RequestResolution,
    utcnow,
)
from deletion.domain.services.jobs import job_create
from deletion.domain.services.requests import request_get, request_transition, same_person
from deletion.domain.states import RequestStatus

KINDS = ("retry", "retraining", "refusal")
MAX_NOTE = 2000
OBJECT_TYPE = "erasure_request"
# Where each proposal may be made from.
PROPOSABLE_FROM = {
    "retry": (RequestStatus.NEEDS_ATTENTION, RequestStatus.RETRAINING),
    "retraining": (RequestStatus.NEEDS_ATTENTION,),
    "refusal": (RequestStatus.NEEDS_ATTENTION, RequestStatus.RETRAINING),
}


@dataclass(frozen=True)
class OwnerNotice:
    """What the model's owner is told when a retraining is required (no personal data)."""

    model_name: str
    owner_email: str | None
    owner_webhook_url: str | None
    event: dict[str, Any]


@dataclass(frozen=True)
class Decision:
    resolution: RequestResolution
    job: Job | None = None
    notice: OwnerNotice | None = None


def resolution_propose(
    session: Session,
    *,
    actor: str,
    actor_id: int | None = None,
    reference: str,
    kind: str,
    method: str | None = None,
    preset: str | None = None,
    reason_code: str | None = None,
    note: str = "",
) -> RequestResolution:
    if kind not in KINDS:
        raise ValidationError("kind", f"one of {', '.join(KINDS)}")
    note = note.strip()
    if len(note) > MAX_NOTE:
        raise ValidationError("note", f"at most {MAX_NOTE} characters")
    request = request_get(session, reference=reference, for_update=True)
    if request.status not in PROPOSABLE_FROM[kind]:
        raise ValidationError("kind", f"a {request.status} request cannot take a {kind} proposal")
    if kind == "retry":
        if method not in METHODS:
            raise ValidationError("method", f"one of {', '.join(METHODS)}")
        if preset not in PRESETS:
            raise ValidationError("preset", f"one of {', '.join(PRESETS)}")
    else:
        method = preset = None
    if kind == "refusal":
        if reason_code not in DENIAL_REASONS:
            raise ValidationError("reason_code", f"one of {', '.join(DENIAL_REASONS)}")
        if not note:
            raise ValidationError("note", "a refusal states its reasons (Art. 12(4))")
    else:
        reason_code = None
    if kind == "retraining" and not note:
        raise ValidationError("note", "say why unlearning will not do")
    if resolution_open(session, request_id=request.id) is not None:
        raise ValidationError("kind", "another proposal waits for a reviewer's decision")
    resolution = RequestResolution(
        request_id=request.id, kind=kind, method=method, preset=preset, reason_code=reason_code,
        note=note or None, status="proposed", proposed_by=actor, proposed_by_id=actor_id,
        proposed_at=utcnow(),
    )
    session.add(resolution)
    session.flush()
    audit_append(session, actor=actor, action="resolution.proposed", object_type=OBJECT_TYPE,
                 object_ref=reference,
                 details={"resolution": resolution.id, "kind": kind, "method": method,
                          "preset": preset, "reason_code": reason_code})
    return resolution


def resolution_decide(
    session: Session,
    *,
    actor: str,
    actor_id: int | None = None,
    resolution_id: int,
    approve: bool,
    note: str = "",
    now: datetime | None = None,
) -> Decision:
    """Approve or decline a proposal; approval carries it out in the same transaction."""
    resolution = session.execute(
        select(RequestResolution).where(RequestResolution.id == resolution_id).with_for_update()
    ).scalar_one_or_none()
    if resolution is None:
        raise NotFound(f"no resolution {resolution_id}")
    if resolution.status != "proposed":
        raise ValidationError("resolution", f"this proposal was already {resolution.status}")
    if same_person(actor=actor, actor_id=actor_id, other=resolution.proposed_by,
                   other_id=resolution.proposed_by_id):
        raise PermissionDenied("four-eyes: the officer who proposed it cannot approve it")
    request = session.get_one(ErasureRequest, resolution.request_id)
    now = now or utcnow()
    resolution.decided_by, resolution.decided_by_id, resolution.decided_at = actor, actor_id, now
    resolution.decision_note = note.strip()[:MAX_NOTE] or None
    if not approve:
        resolution.status = "declined"
        session.flush()
        audit_append(session, actor=actor, action="resolution.declined", object_type=OBJECT_TYPE,
                     object_ref=request.reference,
                     details={"resolution": resolution.id, "kind": resolution.kind})
        return Decision(resolution)
    resolution.status = "approved"
    session.flush()
    audit_append(session, actor=actor, action="resolution.approved", object_type=OBJECT_TYPE,
                 object_ref=request.reference,
                 details={"resolution": resolution.id, "kind": resolution.kind,
                          "method": resolution.method, "preset": resolution.preset,
                          "reason_code": resolution.reason_code})
    if resolution.kind == "retry":
        job = job_create(session, actor=actor, model_name=request.model.name,
                         references=[request.reference], method=str(resolution.method),
                         hparams=preset_hparams(str(resolution.preset)))
        resolution.job_id = job.id
        return Decision(resolution, job=job)
    if resolution.kind == "refusal":
        request_transition(session, actor=actor, reference=request.reference,
                           target=RequestStatus.DENIED, action="request.refused",
                           details={"reason_code": resolution.reason_code,
                                    "resolution": resolution.id})
        request.reason_code = resolution.reason_code
        request.decision_note = resolution.note
        request.reviewed_by, request.reviewed_by_id, request.decided_at = actor, actor_id, now
        return Decision(resolution)
    return Decision(resolution, notice=_retraining(session, actor=actor, request=request,
                                                    resolution=resolution))


def _retraining(session: Session, *, actor: str, request: ErasureRequest,
                resolution: RequestResolution) -> OwnerNotice:
    job = last_job_of(session, request_id=request.id)
    model = session.get_one(Model, request.model_id)
    record_ids = list(((job.sets or {}) if job else {}).get("forget_record_ids", []))
    if model.corpus is not None and record_ids:
        # No future training may use them again: the next run must exclude them.
        registry.corpus_tombstone(session, actor=actor, corpus=model.corpus.name,
                                  record_ids=record_ids, job_id=job.id if job else None)
    request_transition(session, actor=actor, reference=request.reference,
                       target=RequestStatus.RETRAINING, action="request.retraining_required",
                       details={"resolution": resolution.id, "job": job.id if job else None,
                                "tombstoned": len(record_ids)})
    event = {
        "event": "erasure.retraining_required",
        "reference": request.reference,
        "model": model.name,
        "job": job.id if job else None,
        "forget_digest": ((job.sets or {}) if job else {}).get("forget_digest"),
        "tombstoned_records": len(record_ids),
        "due_at": canonical_time(request.due_at),
    }
    return OwnerNotice(model.name, model.owner_email, model.owner_webhook_url, event)


# ------------------------------------------------------------------------ selectors


def resolution_open(session: Session, *, request_id: int) -> RequestResolution | None:
    return session.scalar(
        select(RequestResolution).where(RequestResolution.request_id == request_id,
                                        RequestResolution.status == "proposed")
    )


def resolutions_of(session: Session, *, request_id: int) -> list[RequestResolution]:
    return list(session.scalars(
        select(RequestResolution).where(RequestResolution.request_id == request_id)
        .order_by(RequestResolution.id)
    ))


def last_job_of(session: Session, *, request_id: int) -> Job | None:
    return session.scalar(
        select(Job).join(JobRequest, JobRequest.job_id == Job.id)
        .where(JobRequest.request_id == request_id).order_by(Job.id.desc()).limit(1)
    )


def retraining_exclusions(session: Session, *, reference: str) -> dict[str, Any]:
    """What the next training run of the request's model must exclude (no personal data:
    record ids, digests and counts).  Every tombstone of the corpus is listed, so the
    file is complete on its own, not a diff."""
    request = request_get(session, reference=reference)
    model = session.get_one(Model, request.model_id)
    job = last_job_of(session, request_id=request.id)
    sets = (job.sets or {}) if job else {}
    corpus: dict[str, Any] | None = None
    if model.corpus is not None:
        version = registry.corpus_current(session, name=model.corpus.name)
        corpus = {
            "name": model.corpus.name, "version": version.version,
            "manifest_digest": version.manifest_digest,
            "tombstoned_record_ids": sorted(registry.corpus_tombstoned_ids(
                session, name=model.corpus.name)),
        }
    return {
        "format": "erasure-retraining-exclusions/1",
        "model": model.name,
        "reference": request.reference,
        "status": request.status,
        "due_at": canonical_time(request.due_at),
        "corpus": corpus,
        "request": {
            "job": job.id if job else None,
            "forget_digest": sets.get("forget_digest"),
            "forget_count": sets.get("forget"),
            "forget_record_ids": sorted(sets.get("forget_record_ids", [])),
        },
        "exported_at": canonical_time(utcnow()),
    }


def retraining_exclusions_export(session: Session, *, actor: str, reference: str) -> dict[str, Any]:
    """``retraining_exclusions``, audited as a download (counts only)."""
    document = retraining_exclusions(session, reference=reference)
    corpus = document["corpus"]
    audit_append(session, actor=actor, action="retraining.exclusions_exported",
                 object_type=OBJECT_TYPE, object_ref=reference,
                 details={"records": len(corpus["tombstoned_record_ids"]) if corpus else 0,
                          "forget_digest": document["request"]["forget_digest"]})
    return document
