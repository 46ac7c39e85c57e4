"""Read-only queries the pages need (HackSoft 'selectors'): plain functions over a
domain session, returning rows or small dataclasses.  Writes go through the domain's
services only."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from deletion.domain.models import (
    AuditEvent,
    AuditSeal,
    Certificate,
    Checkpoint,
    CheckpointCertificate,
    ErasureRequest,
    Job,
    JobRequest,
    Model,
    Notification,
    Recipient,
    VerificationResult,
    utcnow,
)
from deletion.domain.states import JOB_ACTIVE_STAGES, OPEN_REQUEST_STATUSES, RequestStatus

AUDIT_PAGE_SIZE = 50


@dataclass(frozen=True)
class DeadlineSummary:
    overdue: list[ErasureRequest]
    due_soon: list[ErasureRequest]


def request_counts_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(
        select(ErasureRequest.status, func.count()).group_by(ErasureRequest.status)
    ).all()
    return {status: count for status, count in rows}


def request_deadlines(session: Session, *, within_days: int = 7, limit: int = 20) -> DeadlineSummary:
    now = utcnow()
    open_ = ErasureRequest.status.in_([s.value for s in OPEN_REQUEST_STATUSES])
    overdue = session.scalars(
        select(ErasureRequest).where(open_, ErasureRequest.due_at < now)
        .order_by(ErasureRequest.due_at).limit(limit)
    ).all()
    soon = session.scalars(
        select(ErasureRequest)
        .where(open_, ErasureRequest.due_at >= now, ErasureRequest.due_at < now + timedelta(days=within_days))
        .order_by(ErasureRequest.due_at).limit(limit)
    ).all()
    return DeadlineSummary(overdue=list(overdue), due_soon=list(soon))


def request_page(session: Session, *, status: str | None = None, limit: int = 100) -> list[ErasureRequest]:
    query = select(ErasureRequest).order_by(ErasureRequest.id.desc()).limit(limit)
    if status:
        query = query.where(ErasureRequest.status == status)
    return list(session.scalars(query))


def request_by_reference(session: Session, reference: str) -> ErasureRequest | None:
    return session.scalar(select(ErasureRequest).where(ErasureRequest.reference == reference))


def review_queue(session: Session) -> list[ErasureRequest]:
    return list(session.scalars(
        select(ErasureRequest).where(ErasureRequest.status == RequestStatus.SUBMITTED.value)
        .order_by(ErasureRequest.due_at)
    ))


def jobs_running(session: Session) -> list[Job]:
    return list(session.scalars(
        select(Job).where(Job.stage.in_([s.value for s in JOB_ACTIVE_STAGES]), Job.dead_lettered_at.is_(None))
        .order_by(Job.id)
    ))


def jobs_of_request(session: Session, request_id: int) -> list[Job]:
    return list(session.scalars(
        select(Job).join(JobRequest, JobRequest.job_id == Job.id)
        .where(JobRequest.request_id == request_id).order_by(Job.id)
    ))


def verification_results(session: Session, job_id: int) -> list[VerificationResult]:
    """The results of the job's last verification round (an escalated job has two)."""
    last_round = session.scalar(
        select(func.max(VerificationResult.round)).where(VerificationResult.job_id == job_id)
    )
    if last_round is None:
        return []
    return list(session.scalars(
        select(VerificationResult)
        .where(VerificationResult.job_id == job_id, VerificationResult.round == last_round)
        .order_by(VerificationResult.metric)
    ))


def certificate_of_job(session: Session, job_id: int) -> Certificate | None:
    return session.scalar(select(Certificate).where(Certificate.job_id == job_id).order_by(Certificate.seq.desc()))


def certificate_by_id(session: Session, certificate_id: str) -> Certificate | None:
    return session.scalar(select(Certificate).where(Certificate.certificate_id == certificate_id))


def certificate_page(session: Session, *, limit: int = 200) -> list[Certificate]:
    return list(session.scalars(select(Certificate).order_by(Certificate.seq.desc()).limit(limit)))


def audit_events_for(session: Session, refs: list[tuple[str, str]], *, limit: int = 200) -> list[AuditEvent]:
    """The timeline of some objects (object_type, object_ref pairs), oldest first."""
    if not refs:
        return []
    match = or_(*(and_(AuditEvent.object_type == t, AuditEvent.object_ref == r) for t, r in refs))
    return list(session.scalars(select(AuditEvent).where(match).order_by(AuditEvent.seq).limit(limit)))


@dataclass(frozen=True)
class AuditFilter:
    actor: str = ""
    action: str = ""
    object_ref: str = ""
    since: datetime | None = None
    until: datetime | None = None

    def where(self) -> list[Any]:
        clauses: list[Any] = []
        if self.actor:
            clauses.append(AuditEvent.actor == self.actor)
        if self.action:
            clauses.append(AuditEvent.action == self.action)
        if self.object_ref:
            clauses.append(AuditEvent.object_ref == self.object_ref)
        if self.since is not None:
            clauses.append(AuditEvent.at >= self.since)
        if self.until is not None:
            clauses.append(AuditEvent.at < self.until)
        return clauses


def audit_page_query(flt: AuditFilter, *, before_seq: int | None = None, after_seq: int | None = None,
                     limit: int = AUDIT_PAGE_SIZE) -> Any:
    """Keyset pagination on seq (the primary key): newest first, `before_seq` walks to
    older events, `after_seq` back to newer ones.  No OFFSET, so the last page of a
    million events costs what the first does."""
    query = select(AuditEvent).where(*flt.where())
    if after_seq is not None:
        return query.where(AuditEvent.seq > after_seq).order_by(AuditEvent.seq.asc()).limit(limit)
    if before_seq is not None:
        query = query.where(AuditEvent.seq < before_seq)
    return query.order_by(AuditEvent.seq.desc()).limit(limit)


def audit_page(session: Session, flt: AuditFilter, *, before_seq: int | None = None,
               after_seq: int | None = None, limit: int = AUDIT_PAGE_SIZE) -> list[AuditEvent]:
    rows = list(session.scalars(audit_page_query(flt, before_seq=before_seq, after_seq=after_seq, limit=limit)))
    if after_seq is not None:
        rows.reverse()
    return rows


def audit_oldest_seq(session: Session, flt: AuditFilter) -> int | None:
    return session.scalar(select(func.min(AuditEvent.seq)).where(*flt.where()))


def audit_newest_seq(session: Session, flt: AuditFilter) -> int | None:
    return session.scalar(select(func.max(AuditEvent.seq)).where(*flt.where()))


def audit_last_seal(session: Session) -> AuditSeal | None:
    return session.scalar(select(AuditSeal).order_by(AuditSeal.id.desc()).limit(1))


def model_all(session: Session) -> list[Model]:
    return list(session.scalars(select(Model).order_by(Model.name)))


def model_by_name(session: Session, name: str) -> Model | None:
    return session.scalar(select(Model).where(Model.name == name))


def checkpoints_of(session: Session, model_id: int) -> list[Checkpoint]:
    return list(session.scalars(select(Checkpoint).where(Checkpoint.model_id == model_id).order_by(Checkpoint.version)))


def certificates_by_checkpoint(session: Session, checkpoint_ids: list[int]) -> dict[int, list[Certificate]]:
    if not checkpoint_ids:
        return {}
    rows = session.execute(
        select(CheckpointCertificate.checkpoint_id, Certificate)
        .join(Certificate, Certificate.id == CheckpointCertificate.certificate_id)
        .where(CheckpointCertificate.checkpoint_id.in_(checkpoint_ids)).order_by(Certificate.seq)
    ).all()
    out: dict[int, list[Certificate]] = {}
    for checkpoint_id, certificate in rows:
        out.setdefault(checkpoint_id, []).append(certificate)
    return out


def recipients_of(session: Session, model_id: int) -> list[Recipient]:
    return list(session.scalars(
        select(Recipient).where(or_(Recipient.model_id == model_id, Recipient.model_id.is_(None)))
        .order_by(Recipient.name)
    ))


def notifications_of(session: Session, request_id: int) -> list[tuple[Notification, Recipient]]:
    return [tuple(row) for row in session.execute(  # type: ignore[misc]
        select(Notification, Recipient).join(Recipient, Recipient.id == Notification.recipient_id)
        .where(Notification.request_id == request_id).order_by(Recipient.name)
    ).all()]


@dataclass(frozen=True)
class ContinualPoint:
    """One erasure on the serving line: what the model kept and what still leaked."""

    version: int
    job_id: int | None
    retained: float | None  # retained-fact accuracy of the candidate (absolute)
    leakage: float | None  # forget leakage of that erasure's subjects after it
    control: float | None  # the chance level: people the model never saw


def continual_record(session: Session, model: Model) -> list[ContinualPoint]:
    """The serving checkpoint's ancestry, oldest first, with each erasure's measurements."""
    by_id = {c.id: c for c in checkpoints_of(session, model.id)}
    line: list[Checkpoint] = []
    cursor = by_id.get(model.serving_checkpoint_id) if model.serving_checkpoint_id else None
    while cursor is not None and len(line) < 1000:
        line.append(cursor)
        cursor = by_id.get(cursor.parent_id) if cursor.parent_id is not None else None
    line.reverse()
    jobs = {j.candidate_checkpoint_id: j for j in session.scalars(
        select(Job).where(Job.model_id == model.id, Job.stage == "done"))}
    points = []
    for index, checkpoint in enumerate(line):
        job = jobs.get(checkpoint.id)
        values = {r.metric: r.value for r in verification_results(session, job.id)} if job else {}
        if index == 0 and job is None and len(line) > 1:
            first = jobs.get(line[1].id)
            base = {r.metric: r.value for r in verification_results(session, first.id)} if first else {}
            points.append(ContinualPoint(checkpoint.version, None, base.get("utility.base_retain_accuracy"),
                                         base.get("leakage.base_forget"), base.get("leakage.control")))
            continue
        points.append(ContinualPoint(checkpoint.version, job.id if job else None,
                                     values.get("utility.retain_accuracy"), values.get("leakage.forget"),
                                     values.get("leakage.control")))
    return points
