"""The erasure pipeline, stage by stage: build sets -> unlearn -> verify -> certify -> promote.

The job's `stage` names the stage that runs or is about to run; its heartbeat
says which: fresh while a worker is on it, NULL once the previous stage has
handed it over.  Every stage follows the same pattern, so that it is safe to
run twice:

1. take the stage with a compare-and-set on (stage, heartbeat): the task
   that finds the stage handed over (heartbeat NULL) takes it; a copy that
   arrives while a worker is on it finds the heartbeat fresh and returns.
   A stale heartbeat means the worker is gone: the stage is taken over, at the
   cost of one attempt (the first stage enters from `queued` with `job_claim`);
2. do the work outside any transaction, unless it is already stored (a job
   retried from `queued` walks through its finished stages cheaply);
3. in one transaction store the result, move the stage on (`job_claim`),
   clear the heartbeat and add an outbox row for the next task; then relay the
   outbox at once (beat's relay is the safety net).

`certify` is the one atomic step: the certificate, the move of the serving
pointer, the corpus tombstones, the old checkpoints' disposition and the
requests' completion commit together, or not at all.  `promote` then closes
the job (notifications, removal of the work directory that holds the
subject's records).

ML code is imported inside the functions: the worker's parent process stays
free of torch, and the web never imports this module.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.audit import audit_append
from deletion.domain.db import session_scope
from deletion.domain.errors import PermanentJobError
from deletion.domain.models import Checkpoint, Corpus, CorpusVersion, Job, Model, utcnow
from deletion.domain.services.jobs import (
    job_claim,
    job_escalate,
    job_fail,
    job_record,
    job_reject,
)
from deletion.domain.services.outbox import outbox_enqueue
from deletion.domain.services.requests import subject_identifiers
from deletion.domain.states import JobStage
from workers import routing
from workers.results import verification_results_store
from workers.runtime import (
    WORKER_ACTOR,
    ProgressReporter,
    config,
    engine,
    heartbeat,
    job_take_over,
    worker_name,
)

log = logging.getLogger(__name__)

S = JobStage


# ------------------------------------------------------------------ paths


def work_dir_of(job_id: int) -> Path:
    """Scratch space of one job (its sets hold the subject's records: removed at the end)."""
    return config().checkpoint_dir / "_work" / f"job-{job_id}"


def sets_dir_of(job_id: int) -> Path:
    return work_dir_of(job_id) / "sets"


def report_path_of(job_id: int, candidate_id: int) -> Path:
    """One report per candidate: a re-based or escalated job never reuses a stale verdict."""
    return work_dir_of(job_id) / f"verification-candidate-{candidate_id}.json"


def candidate_dir_of(model_name: str, job_id: int, round_: int, base_version: int) -> Path:
    return config().checkpoint_dir / model_name / f"job-{job_id}-base-v{base_version}-round-{round_}"


def hand_over(session: Session, *, job_id: int, current: S, nxt: S, task_name: str) -> None:
    """Move the job to `nxt`, mark it free for the next task, and enqueue that task."""
    if not job_claim(session, job_id=job_id, expected_stage=current, next_stage=nxt,
                     worker=worker_name()):
        raise RuntimeError(f"job {job_id} left {current} while this worker held it")
    release_heartbeat(session, job_id=job_id)
    outbox_enqueue(session, task_name=task_name, args={"job_id": job_id})


def release_heartbeat(session: Session, *, job_id: int) -> None:
    session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=None)
                    .execution_options(synchronize_session=False))


def _relay_now() -> None:
    from workers.relay import relay_pending

    relay_pending()


def _take(session: Session, job_id: int, stage: S, *, resume: bool) -> bool:
    """Take `stage` when it was handed over (or its worker is gone).  False: someone
    else has the job now, or it moved on; do nothing."""
    if not job_take_over(session, job_id=job_id, stage=stage, own_retry=resume):
        log.info("job %s: stage %s is not free for this task; nothing to do", job_id, stage)
        return False
    job = session.get_one(Job, job_id)
    session.refresh(job)
    if job.attempts > job.max_attempts:
        job_fail(session, job_id=job_id, error="worker lost too many times", permanent=True)
        log.error("job %s dead-lettered after %s attempts", job_id, job.attempts)
        return False
    return True


def _enter_first_stage(session: Session, job_id: int, *, resume: bool) -> bool:
    if job_claim(session, job_id=job_id, expected_stage=S.QUEUED,
                 next_stage=S.BUILDING_SETS, worker=worker_name()):
        return True
    return _take(session, job_id, S.BUILDING_SETS, resume=resume)


# ------------------------------------------------------------ build sets


@dataclass(frozen=True)
class _SetsPlan:
    job_id: int
    corpus_path: Path
    tombstoned: frozenset[str]
    subjects: tuple[Any, ...]
    done: bool


def _corpus_version_of(session: Session, job: Job) -> CorpusVersion:
    if job.corpus_version_id is not None:
        return session.get_one(CorpusVersion, job.corpus_version_id)
    model = session.get_one(Model, job.model_id)
    if model.corpus is None:
        raise PermanentJobError(f"model {model.name} has no registered corpus")
    version = registry.corpus_current(session, name=model.corpus.name)
    job.corpus_version_id = version.id
    return version


def _tombstoned(session: Session, version: CorpusVersion) -> frozenset[str]:
    """Records erased earlier: never again in a retain set, a probe or a control sample."""
    corpus = session.get_one(Corpus, version.corpus_id)
    return frozenset(registry.corpus_tombstoned_ids(session, name=corpus.name))


def stage_build_sets(job_id: int, *, resume: bool = False) -> None:
    with session_scope(engine()) as session:
        if not _enter_first_stage(session, job_id, resume=resume):
            return
        job = session.get_one(Job, job_id)
        version = _corpus_version_of(session, job)
        done = job.sets is not None and (sets_dir_of(job_id) / "manifest.json").is_file()
        subjects = () if done else tuple(
            subject_identifiers(session, r.reference) for r in job.requests
        )
        plan = _SetsPlan(job_id, Path(version.path), _tombstoned(session, version), subjects, done)
    manifest = None if plan.done else _compute_sets(plan)
    with session_scope(engine()) as session:
        if manifest is not None and manifest["counts"]["unmatched"]:
            # Certifying the erasure of data we never found would be a false statement.
            job_reject(session, job_id=job_id, actor=WORKER_ACTOR,
                       reason=f"{len(manifest['counts']['unmatched'])} subject(s) match no "
                              "record of the corpus")
            shutil.rmtree(work_dir_of(job_id), ignore_errors=True)
            return
        if manifest is not None:
            job_record(session, job_id=job_id, sets=manifest, work_dir=str(work_dir_of(job_id)),
                       timings={"build_sets_s": manifest.pop("seconds")})
        hand_over(session, job_id=job_id, current=S.BUILDING_SETS, nxt=S.UNLEARNING,
                  task_name=routing.UNLEARN)
    _relay_now()


def _compute_sets(plan: _SetsPlan) -> dict[str, Any]:
    """Build and save the sets; return digests and counts only (no names leave here)."""
    import time

    from unlearning.corpus import load_corpus
    from unlearning.sets import Subject, build_sets

    started = time.monotonic()
    with heartbeat(plan.job_id):
        corpus = load_corpus(plan.corpus_path).without(plan.tombstoned)
        subjects = [
            Subject(name=s.name, aliases=tuple(s.aliases), identifiers=(*s.emails, *s.phones))
            for s in plan.subjects
        ]
        sets = build_sets(corpus, subjects, seed=plan.job_id)
        out = sets_dir_of(plan.job_id)
        shutil.rmtree(out, ignore_errors=True)
        sets.save(out)
    manifest = sets.manifest()
    log.info("job %s: sets built (forget %s, retain %s, probes %s)", plan.job_id,
             len(sets.forget), len(sets.retain), len(sets.probes))
    return {
        "forget_digest": manifest["forget_digest"],
        "retain_digest": manifest["retain_digest"],
        "probes_digest": manifest["probes_digest"],
        "corpus_digest": manifest["corpus_digest"],
        "counts": manifest["counts"],
        "forget": len(sets.forget),
        "retain": len(sets.retain),
        "probes": len(sets.probes),
        # Record ids (not personal data) so that certify can tombstone them.
        "forget_record_ids": sorted(r.id for r in sets.forget),
        "seconds": round(time.monotonic() - started, 3),
    }


# ------------------------------------------------------------------ unlearn


@dataclass(frozen=True)
class _UnlearnPlan:
    job_id: int
    model_name: str
    base_dir: Path
    base_version: int
    base_id: int
    method: str
    hparams: dict[str, Any]
    round: int
    done: bool


def stage_unlearn(job_id: int, *, resume: bool = False) -> None:
    with session_scope(engine()) as session:
        if not _take(session, job_id, S.UNLEARNING, resume=resume):
            return
        job = session.get_one(Job, job_id)
        base = session.get_one(Checkpoint, job.base_checkpoint_id)
        if job.candidate_checkpoint_id is None:
            # Never unlearn from bytes nobody registered (a serving checkpoint that changed).
            registry.checkpoint_check_files(base)
        plan = _UnlearnPlan(
            job_id=job_id, model_name=job.model.name, base_dir=Path(base.directory),
            base_version=base.version, base_id=base.id, method=job.method,
            hparams=dict(job.hparams or {}), round=job.verification_round,
            done=job.candidate_checkpoint_id is not None,
        )
    if not plan.done:
        result = _erase(plan)
        with session_scope(engine()) as session:
            registry.checkpoint_register(
                session, actor=WORKER_ACTOR, model_name=plan.model_name,
                directory=str(result.out_dir), digest=result.digest, parent_id=plan.base_id,
                job_id=job_id,
            )
            job = session.get_one(Job, job_id)
            # The settings actually used (defaults filled in) are what the certificate states.
            job.hparams = _plain(result.hparams)
            job_record(session, job_id=job_id,
                       timings={f"unlearn_round_{plan.round}_s": round(result.seconds, 3)})
            hand_over(session, job_id=job_id, current=S.UNLEARNING, nxt=S.VERIFYING,
                      task_name=routing.VERIFY)
    else:
        with session_scope(engine()) as session:
            hand_over(session, job_id=job_id, current=S.UNLEARNING, nxt=S.VERIFYING,
                      task_name=routing.VERIFY)
    _relay_now()


def _plain(hparams: Any) -> dict[str, Any]:
    """JSON-ready hyper-parameters (tuples become lists, as they will when read back)."""
    return dict(json.loads(json.dumps(dict(hparams), default=str)))


def _erase(plan: _UnlearnPlan) -> Any:
    from unlearning.erase import erase
    from unlearning.sets import ErasureSets

    out_dir = candidate_dir_of(plan.model_name, plan.job_id, plan.round, plan.base_version)
    shutil.rmtree(out_dir, ignore_errors=True)  # a half-written attempt that crashed
    sets = ErasureSets.load(sets_dir_of(plan.job_id))
    with heartbeat(plan.job_id):
        result = erase(plan.base_dir, sets, method=plan.method, out_dir=out_dir,
                       hparams=plan.hparams or None, progress=ProgressReporter(plan.job_id))
    log.info("job %s: %s round %s wrote %s in %.1f s", plan.job_id, plan.method, plan.round,
             out_dir.name, result.seconds)
    return result


# ------------------------------------------------------------------- verify


@dataclass(frozen=True)
class _VerifyPlan:
    job_id: int
    candidate_dir: Path
    base_dir: Path
    corpus_path: Path
    tombstoned: frozenset[str]
    round: int


def stage_verify(job_id: int, *, resume: bool = False) -> None:
    with session_scope(engine()) as session:
        if not _take(session, job_id, S.VERIFYING, resume=resume):
            return
        job = session.get_one(Job, job_id)
        if job.candidate_checkpoint_id is None:
            raise PermanentJobError("verification reached without a candidate checkpoint")
        candidate = session.get_one(Checkpoint, job.candidate_checkpoint_id)
        base = session.get_one(Checkpoint, job.base_checkpoint_id)
        version = _corpus_version_of(session, job)
        plan = _VerifyPlan(job_id, Path(candidate.directory), Path(base.directory),
                           Path(version.path), _tombstoned(session, version),
                           job.verification_round)
        report_file = report_path_of(job_id, candidate.id)
    if report_file.is_file():
        report = json.loads(report_file.read_text(encoding="utf-8"))
    else:
        report = _verify(plan)
        report_file.write_text(json.dumps(report, sort_keys=True), encoding="utf-8")
    with session_scope(engine()) as session:
        verification_results_store(session, job_id=job_id, round_=plan.round, report=report)
        job_record(session, job_id=job_id,
                   timings={f"verify_round_{plan.round}_s": report.get("seconds", 0.0)})
        if report["passed"]:
            hand_over(session, job_id=job_id, current=S.VERIFYING, nxt=S.CERTIFYING,
                      task_name=routing.CERTIFY)
        elif not _escalate(session, job_id=job_id, report=report):
            _reject_after_verification(session, job_id=job_id, report=report)
    _relay_now()


def _verify(plan: _VerifyPlan) -> dict[str, Any]:
    import time

    from unlearning.corpus import load_corpus
    from unlearning.sets import ErasureSets
    from unlearning.verification import verify
    from workers.policies import deployment_policy

    started = time.monotonic()
    sets = ErasureSets.load(sets_dir_of(plan.job_id))
    control = plan.corpus_path.parent / "control.jsonl"
    heldout = plan.corpus_path.parent / "heldout.txt"
    with heartbeat(plan.job_id):
        report = verify(
            plan.candidate_dir, plan.base_dir, sets,
            control=control if control.is_file() else None,
            corpus=load_corpus(plan.corpus_path).without(plan.tombstoned),
            heldout=heldout if heldout.is_file() else None, policy=deployment_policy(),
            progress=ProgressReporter(plan.job_id), seed=plan.job_id,
        )
    data: dict[str, Any] = report.to_json()
    data["verified_at"] = utcnow().isoformat()
    data["seconds"] = round(time.monotonic() - started, 3)
    log.info("job %s: verification round %s %s", plan.job_id, plan.round,
             "passed" if data["passed"] else "failed")
    return data


def _escalate(session: Session, *, job_id: int, report: dict[str, Any]) -> bool:
    """Once per job: stronger settings from the policy, then unlearn again from the base."""
    from unlearning.verification import CheckResult, get_policy, policy_escalate
    from workers.policies import deployment_policy

    deployment_policy()  # registers a deployment's own policy in this process
    job = session.get_one(Job, job_id)
    if job.escalated:
        return False
    policy_info = report.get("policy") or {}
    try:
        policy = get_policy(str(policy_info.get("name", "default")), policy_info.get("version"))
    except KeyError:
        return False
    fields = CheckResult.__dataclass_fields__
    failed = [CheckResult(**{k: v for k, v in c.items() if k in fields})
              for c in report.get("checks", []) if not c.get("passed")]
    stronger = policy_escalate(policy, method=job.method, hparams=job.hparams or {},
                               failed_checks=failed)
    if stronger is None:
        return False
    _set_candidate_aside(session, job, reason="failed verification; escalating")
    job_escalate(session, job_id=job_id, hparams=_plain(stronger), actor=WORKER_ACTOR)
    release_heartbeat(session, job_id=job_id)  # `unlearning` is handed over, as usual
    log.info("job %s: verification failed; escalating once with stronger settings", job_id)
    outbox_enqueue(session, task_name=routing.UNLEARN, args={"job_id": job_id})
    return True


def _set_candidate_aside(session: Session, job: Job, *, reason: str) -> None:
    """A candidate that will never serve still holds the subject's data: destroy it soon."""
    if job.candidate_checkpoint_id is None:
        return
    registry.checkpoint_retire(session, actor=WORKER_ACTOR,
                               checkpoint_id=job.candidate_checkpoint_id, reason=reason)
    job.candidate_checkpoint_id = None


def _reject_after_verification(session: Session, *, job_id: int, report: dict[str, Any]) -> None:
    job = session.get_one(Job, job_id)
    _set_candidate_aside(session, job, reason="failed verification")
    failed = sorted(c["name"] for c in report.get("checks", []) if not c.get("passed"))
    job_reject(session, job_id=job_id, actor=WORKER_ACTOR,
               reason="verification failed" + (" after escalation" if job.escalated else "")
               + ": " + ", ".join(failed))
    shutil.rmtree(work_dir_of(job_id), ignore_errors=True)
    log.warning("job %s rejected: %s", job_id, ", ".join(failed))


# --------------------------------------------------------- certify (atomic)


def stage_certify(job_id: int, *, resume: bool = False) -> None:
    from workers.certify import certify_and_promote

    with session_scope(engine()) as session:
        if not _take(session, job_id, S.CERTIFYING, resume=resume):
            return
        job = session.get_one(Job, job_id)
        if job.candidate_checkpoint_id is None:
            raise PermanentJobError("certification reached without a candidate checkpoint")
        report = json.loads(report_path_of(job_id, job.candidate_checkpoint_id).read_text("utf-8"))
        certify_and_promote(session, job=job, report=report)
    _relay_now()


# ------------------------------------------------------------------ promote


def stage_promote(job_id: int, *, resume: bool = False) -> None:
    from workers.notifications import notifications_open

    with session_scope(engine()) as session:
        if not _take(session, job_id, S.PROMOTING, resume=resume):
            return
        if not job_claim(session, job_id=job_id, expected_stage=S.PROMOTING, next_stage=S.DONE,
                         worker=worker_name()):
            raise RuntimeError(f"job {job_id} left promoting while this worker held it")
        job = session.get_one(Job, job_id)
        job.finished_at = utcnow()
        audit_append(session, actor=WORKER_ACTOR, action="job.done", object_type="job",
                     object_ref=str(job_id), details={"timings": job.timings or {}})
        if notifications_open(session, job=job):
            outbox_enqueue(session, task_name=routing.NOTIFY_RECIPIENTS, args={})
    # The forget set on disk is the subject's data: it goes as soon as the job is done.
    shutil.rmtree(work_dir_of(job_id), ignore_errors=True)
    log.info("job %s done", job_id)
    _relay_now()
