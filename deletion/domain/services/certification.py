"""Certify and promote: one domain service, one transaction, all of it or none of it.

The worker's certify task takes its stage claim and calls ``job_certify_and_promote``
with the signer; everything else comes from the database:

1. lock the job row (the claim must still be current) and the model row (one
   promotion per model at a time); if the job's base no longer serves, re-base the job
   (its candidate never served: retired for destruction);
2. check that the candidate's files still hash to its registered digest (a certificate
   names the bytes that will serve);
3. read the verification report stored for this candidate when verification ended
   (``verification_report_store``), never a file;
4. map rows and report to certificate facts (``RequestFacts.from_row``,
   ``SetFacts.from_job_sets``, ``VerificationFacts.from_report``: the one mapping the
   tests use as well), decide the old checkpoints' disposition and the Art. 19
   recipients, and issue the signed, chained certificate;
5. move the serving pointer (``checkpoint_promote``: the old serving checkpoint is
   retired for destruction after the grace window, in this same transaction),
   tombstone the subject's corpus records, complete the requests, and hand over to
   ``promoting`` through the outbox.

Because it all commits together, there is never a promoted checkpoint without its
certificate, nor a certificate for a checkpoint that never served; and from
``promoting`` on the job can only finish (``states.JOB_TRANSITIONS``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain import config, registry
from deletion.domain.audit import audit_append
from deletion.domain.canonical import sha256_hex
from deletion.domain.certificates import (
    CheckpointDisposition,
    CheckpointFacts,
    NotificationFacts,
    RequestFacts,
    SetFacts,
    VerificationFacts,
    certificate_build_payload,
    certificate_issue,
    report_verified_at,
)
from deletion.domain.errors import PermanentJobError
from deletion.domain.models import (
    Checkpoint,
    Corpus,
    CorpusVersion,
    Model,
    VerificationReport,
    utcnow,
)
from deletion.domain.services.jobs import job_hand_over, job_hold, job_rebase
from deletion.domain.services.recipients import recipient_list_for_model
from deletion.domain.services.requests import request_transition
from deletion.domain.signing import Signer
from deletion.domain.states import CheckpointStatus, JobStage, RequestStatus

logger = logging.getLogger(__name__)

PROMOTE_TASK = "erasure.promote"


class ReportMismatch(PermanentJobError):
    """A verification report differs from the one stored for its candidate."""


# ------------------------------------------------------------ verification reports


def report_text(report: Mapping[str, Any]) -> str:
    """The stored form of a report: sorted keys, no spaces; its sha256 is the digest."""
    return json.dumps(dict(report), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def verification_report_store(
    session: Session, *, job_id: int, round_: int, candidate_id: int, report: Mapping[str, Any],
    actor: str = "worker",
) -> VerificationReport:
    """Store the report verification produced for this candidate (append-only).

    A report is stored once per (job, candidate): a second store of the same bytes
    returns the row, different bytes raise ``ReportMismatch`` (the first verdict stands;
    a duplicate verification that disagrees is an integrity failure, not a new verdict).
    """
    text = report_text(report)
    digest = sha256_hex(text)
    stored = verification_report_get(session, job_id=job_id, candidate_id=candidate_id)
    if stored is not None:
        if stored.digest != digest:
            raise ReportMismatch(f"job {job_id}: a different report is already stored for "
                                 f"candidate {candidate_id}")
        return stored
    row = VerificationReport(job_id=job_id, round=round_, candidate_checkpoint_id=candidate_id,
                             report=text, digest=digest, passed=bool(report.get("passed")))
    session.add(row)
    session.flush()
    audit_append(
        session, actor=actor, action="verification.report_stored", object_type="job",
        object_ref=str(job_id),
        details={"round": round_, "candidate_checkpoint_id": candidate_id, "digest": digest,
                 "passed": row.passed},
    )
    return row


def verification_report_get(
    session: Session, *, job_id: int, candidate_id: int
) -> VerificationReport | None:
    return session.execute(
        select(VerificationReport).where(VerificationReport.job_id == job_id,
                                         VerificationReport.candidate_checkpoint_id == candidate_id)
    ).scalar_one_or_none()


def verification_report_load(row: VerificationReport) -> dict[str, Any]:
    """The report a row holds, after checking the row against its own digest."""
    if sha256_hex(row.report) != row.digest:
        raise ReportMismatch(f"job {row.job_id}: the stored verification report does not match "
                             "its digest")
    loaded: dict[str, Any] = json.loads(row.report)
    return loaded


# ------------------------------------------------------------------ certify + promote


@dataclass(frozen=True)
class Certification:
    """What ``job_certify_and_promote`` did: certified (and promoted) or re-based."""

    rebased: bool
    certificate_id: str | None = None
    serving_version: int | None = None


def job_certify_and_promote(
    session: Session,
    *,
    job_id: int,
    claim: str,
    signer: Signer,
    versions: Mapping[str, str],
    actor: str,
    worker: str | None = None,
    now: datetime | None = None,
) -> Certification:
    """Certify the job's candidate and make it serve, in the caller's transaction."""
    job = job_hold(session, job_id=job_id, claim=claim)
    if job.stage != JobStage.CERTIFYING:
        raise PermanentJobError(f"job {job_id} is {job.stage}, not certifying")
    model = session.execute(
        select(Model).where(Model.id == job.model_id).with_for_update()
    ).scalar_one()
    if model.serving_checkpoint_id != job.base_checkpoint_id:
        logger.warning("job %s: serving checkpoint moved under the job; re-basing", job_id)
        job_rebase(session, job_id=job_id, actor=actor)
        return Certification(rebased=True)
    if job.candidate_checkpoint_id is None:
        raise PermanentJobError(f"job {job_id} reached certification without a candidate")
    base = session.get_one(Checkpoint, job.base_checkpoint_id)
    candidate = session.get_one(Checkpoint, job.candidate_checkpoint_id)
    registry.checkpoint_check_files(candidate)
    stored = verification_report_get(session, job_id=job_id, candidate_id=candidate.id)
    if stored is None:
        raise PermanentJobError(f"job {job_id}: no verification report is stored for "
                                f"candidate {candidate.id}")
    report = verification_report_load(stored)
    if job.corpus_version_id is None or job.sets is None:
        raise PermanentJobError(f"job {job_id} reached certification without its sets")
    version = session.get_one(CorpusVersion, job.corpus_version_id)
    corpus = session.get_one(Corpus, version.corpus_id)
    now = now or utcnow()
    destroy_after = now + timedelta(hours=config.current().checkpoint_grace_hours)
    hparams = dict(job.hparams or {})

    payload = certificate_build_payload(
        job_id=job.id,
        model_name=model.name,
        requests=[RequestFacts.from_row(r) for r in job.requests],
        sets=SetFacts.from_job_sets(job.sets, corpus_name=corpus.name,
                                    corpus_version=version.version,
                                    corpus_manifest_digest=version.manifest_digest),
        base=CheckpointFacts(version=base.version, digest=base.digest),
        candidate=CheckpointFacts(version=candidate.version, digest=candidate.digest),
        method=job.method,
        hparams=hparams,
        seeds={"sets": job.id, "verification": job.id,
               "erase": int(hparams.get("seed", 0) or 0)},
        versions=versions,
        verification=VerificationFacts.from_report(report),
        started_at=job.started_at or job.created_at,
        verified_at=report_verified_at(report) or stored.created_at,
        old_checkpoints=[
            CheckpointDisposition(version=c.version, digest=c.digest,
                                  disposition="destroy_after_grace",
                                  destroy_after=c.destroy_after or destroy_after)
            for c in _checkpoints_holding_the_data(session, model_id=model.id,
                                                   exclude_id=candidate.id)
        ],
        notifications=[
            NotificationFacts(recipient_ref=f"recipient-{r.id}", status="pending")
            for r in recipient_list_for_model(session, model_id=model.id)
        ],
    )
    certificate = certificate_issue(session, actor=actor, payload=payload, signer=signer, at=now)
    registry.checkpoint_promote(session, actor=actor, job_id=job.id, candidate_id=candidate.id,
                                now=now)
    registry.corpus_tombstone(session, actor=actor, corpus=corpus.name,
                              record_ids=list(job.sets.get("forget_record_ids", [])),
                              job_id=job.id)
    for request in job.requests:
        request_transition(session, actor=actor, reference=request.reference,
                           target=RequestStatus.COMPLETED, action="request.completed",
                           details={"job": job.id, "certificate": certificate.certificate_id})
    job_hand_over(session, job_id=job.id, claim=claim, current=JobStage.CERTIFYING,
                  nxt=JobStage.PROMOTING, task_name=PROMOTE_TASK, worker=worker)
    logger.info("job %s: certificate %s issued; checkpoint v%s serving", job.id,
                certificate.certificate_id, candidate.version)
    return Certification(rebased=False, certificate_id=certificate.certificate_id,
                         serving_version=candidate.version)


def _checkpoints_holding_the_data(session: Session, *, model_id: int,
                                  exclude_id: int) -> list[Checkpoint]:
    """Every surviving checkpoint of the model except the new one predates this
    erasure, so each may still hold the subject's data."""
    return list(session.scalars(
        select(Checkpoint).where(
            Checkpoint.model_id == model_id,
            Checkpoint.id != exclude_id,
            Checkpoint.status != CheckpointStatus.DESTROYED,
        ).order_by(Checkpoint.version)
    ))
