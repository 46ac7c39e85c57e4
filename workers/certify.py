"""The certify step: one transaction that either does all of this or none of it.

1. lock the model row (one promotion per model at a time) and check that the
   job's base checkpoint is still the serving one, else re-base the job;
2. decide the old checkpoints' disposition (destroyed after the grace window)
   and the Art. 19 recipients to tell, so the certificate can state both;
3. issue the signed, chained certificate;
4. move the serving pointer to the candidate (`checkpoint_promote`), tombstone
   the subject's corpus records (a new corpus version), complete the requests;
5. hand on to `erasure.promote`, which closes the job.

Because all of it commits together, there is never a promoted checkpoint
without its certificate, nor a certificate for a checkpoint that never served.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.certificates import (
    CheckpointDisposition,
    CheckpointFacts,
    CheckVerdict,
    NotificationFacts,
    RequestFacts,
    SetFacts,
    VerificationFacts,
    certificate_build_payload,
    certificate_issue,
)
from deletion.domain.models import Checkpoint, Corpus, CorpusVersion, Job, Model, utcnow
from deletion.domain.services.jobs import job_rebase
from deletion.domain.services.recipients import recipient_list_for_model
from deletion.domain.services.requests import request_transition
from deletion.domain.states import CheckpointStatus, JobStage, RequestStatus
from workers import routing
from workers.runtime import WORKER_ACTOR, config, signer

log = logging.getLogger(__name__)


def certify_and_promote(session: Session, *, job: Job, report: Mapping[str, Any]) -> bool:
    """Certify and promote `job` (its `certifying` stage taken); False when re-based."""
    from workers.stages import hand_over

    model = session.execute(
        select(Model).where(Model.id == job.model_id).with_for_update()
    ).scalar_one()
    if model.serving_checkpoint_id != job.base_checkpoint_id:
        log.warning("job %s: serving checkpoint moved under the job; re-basing", job.id)
        rebase(session, job=job)
        return False
    if job.candidate_checkpoint_id is None:
        raise RuntimeError(f"job {job.id} reached certification without a candidate")
    base = session.get_one(Checkpoint, job.base_checkpoint_id)
    candidate = session.get_one(Checkpoint, job.candidate_checkpoint_id)
    # The certificate names the candidate's digest: it must be the bytes that will serve.
    registry.checkpoint_check_files(candidate)
    version = session.get_one(CorpusVersion, job.corpus_version_id)
    corpus = session.get_one(Corpus, version.corpus_id)
    now = utcnow()
    destroy_after = now + _grace()  # what checkpoint_promote sets on the retired base
    old = _checkpoints_holding_the_data(session, model_id=model.id, exclude_id=candidate.id)
    recipients = recipient_list_for_model(session, model_id=model.id)

    payload = certificate_build_payload(
        job_id=job.id,
        model_name=model.name,
        requests=[_request_facts(r) for r in job.requests],
        sets=_set_facts(job, corpus_name=corpus.name, version=version),
        base=CheckpointFacts(version=base.version, digest=base.digest),
        candidate=CheckpointFacts(version=candidate.version, digest=candidate.digest),
        method=job.method,
        hparams=job.hparams or {},
        seeds={"sets": job.id, "verification": job.id,
               "erase": int((job.hparams or {}).get("seed", 0) or 0)},
        versions=_versions(),
        verification=_verification_facts(report),
        started_at=job.started_at or job.created_at,
        verified_at=_verified_at(report),
        old_checkpoints=[
            CheckpointDisposition(version=c.version, digest=c.digest,
                                  disposition="destroy_after_grace",
                                  destroy_after=c.destroy_after or destroy_after)
            for c in old
        ],
        notifications=[
            NotificationFacts(recipient_ref=f"recipient-{r.id}", status="pending")
            for r in recipients
        ],
    )
    certificate = certificate_issue(session, actor=WORKER_ACTOR, payload=payload, signer=signer(),
                                    at=now)
    registry.checkpoint_promote(session, actor=WORKER_ACTOR, job_id=job.id,
                                candidate_id=candidate.id, now=now)
    registry.corpus_tombstone(session, actor=WORKER_ACTOR, corpus=corpus.name,
                              record_ids=list((job.sets or {}).get("forget_record_ids", [])),
                              job_id=job.id)
    for request in job.requests:
        request_transition(session, actor=WORKER_ACTOR, reference=request.reference,
                           target=RequestStatus.COMPLETED, action="request.completed",
                           details={"job": job.id, "certificate": certificate.certificate_id})
    hand_over(session, job_id=job.id, current=JobStage.CERTIFYING, nxt=JobStage.PROMOTING,
              task_name=routing.PROMOTE)
    log.info("job %s: certificate %s issued; checkpoint v%s serving", job.id,
             certificate.certificate_id, candidate.version)
    return True


def rebase(session: Session, *, job: Job) -> None:
    """Start the job again from the checkpoint that serves now.

    The stale candidate never serves (destroyed soon); the sets are rebuilt,
    because the corpus version moved with the other erasure and its subject must
    not reappear in a retain set.
    """
    if job.candidate_checkpoint_id is not None:
        registry.checkpoint_retire(session, actor=WORKER_ACTOR,
                                   checkpoint_id=job.candidate_checkpoint_id, reason="re-based")
    job.sets = None
    job.corpus_version_id = None
    job_rebase(session, job_id=job.id, actor=WORKER_ACTOR)


def _grace() -> Any:
    from datetime import timedelta

    return timedelta(hours=config().checkpoint_grace_hours)


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


def _request_facts(request: Any) -> RequestFacts:
    extended = request.due_at if request.extension_months else None
    return RequestFacts(
        reference=request.reference, subject_hmac=request.subject_hmac,
        subject_key_id=request.blind_key_id, ground=request.ground,
        received_at=request.received_at, due_at=request.due_at,
        approved_at=request.decided_at, extended_due_at=extended,
    )


def _set_facts(job: Job, *, corpus_name: str, version: CorpusVersion) -> SetFacts:
    sets = job.sets or {}
    return SetFacts(
        corpus_name=corpus_name, corpus_version=version.version,
        corpus_manifest_digest=version.manifest_digest,
        forget_digest=sets["forget_digest"], forget_count=int(sets["forget"]),
        retain_digest=sets["retain_digest"], retain_count=int(sets["retain"]),
        probe_count=int(sets["probes"]) if "probes" in sets else None,
    )


def _verification_facts(report: Mapping[str, Any]) -> VerificationFacts:
    policy = report.get("policy") or {}
    checks = tuple(
        CheckVerdict(name=str(c["name"]), value=_number(c.get("value")),
                     threshold=_number(c.get("threshold")), comparator=str(c.get("comparator", "")),
                     passed=bool(c.get("passed")))
        for c in report.get("checks", [])
    )
    metrics = {str(k): _number(v) for k, v in (report.get("metrics") or {}).items()
               if v is None or isinstance(v, int | float)}
    return VerificationFacts(
        policy_name=str(policy.get("name", "")), policy_version=str(policy.get("version", "")),
        passed=bool(report["passed"]), guarantee=str(report.get("guarantee", "weights")),
        checks=checks, metrics=metrics,
    )


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _verified_at(report: Mapping[str, Any]) -> datetime:
    stamp = report.get("verified_at")
    return datetime.fromisoformat(stamp) if isinstance(stamp, str) else utcnow()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str] = {}
    for package in ("torch", "transformers", "celery", "sqlalchemy", "cryptography"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            continue
    versions["erasure-service"] = _code_version()
    return versions


def _code_version() -> str:
    from workers.runtime import code_version

    return code_version()
