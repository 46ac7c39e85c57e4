"""The erasure pipeline, stage by stage: build sets -> unlearn -> verify -> certify -> promote.

The job's `stage` names the stage that runs or is about to run; its heartbeat
says which: fresh while a worker is on it, NULL once the previous stage has
handed it over.  Every stage follows the same pattern, so that it is safe to
run twice, or to have a copy run at the same time:

1. take the stage: a compare-and-set that writes a fresh claim token
   (`services.jobs.job_take_over`; the first stage enters from `queued` with
   `job_claim`).  It is free when handed over (heartbeat NULL), when its
   heartbeat is stale or its holder's process is gone (one attempt spent), or for
   the retry of the very task that holds the claim;
2. do the work outside any transaction, unless it is already stored (a job
   retried from `queued` walks through its finished stages cheaply), writing
   only files of its own (named after its claim);
3. in one transaction that starts by locking the job and checking the claim
   (`job_hold`), store the result, move the stage on and enqueue the next task
   (`job_hand_over`); then relay the outbox at once (beat's relay is the
   safety net).

A run whose claim was taken over in the meantime raises `ClaimLost` at step 3 (or
earlier, from a heartbeat or the progress callback): the transaction rolls back, the
task removes the files it wrote and stops quietly (tasks.py).  It never fails the
job, and never touches the files of the run that holds the claim.

`certify` calls one domain service (`services.certification.job_certify_and_promote`):
the certificate, the move of the serving pointer, the corpus tombstones, the old
checkpoints' disposition and the requests' completion commit together, or not at all.
`promote` then closes the job (notifications, removal of the work folder that holds
the subject's records); from `promoting` a job can only finish.

ML code is imported inside the functions: the worker's parent process stays
free of torch, and the web never imports this module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.audit import audit_append
from deletion.domain.db import session_scope
from deletion.domain.errors import PermanentJobError
from deletion.domain.models import Checkpoint, Corpus, CorpusVersion, Job, Model, utcnow
from deletion.domain.services.certification import (
    job_certify_and_promote,
    report_text,
    verification_report_get,
    verification_report_load,
    verification_report_store,
)
from deletion.domain.services.jobs import (
    ClaimLost,
    job_claim,
    job_escalate,
    job_fail,
    job_hand_over,
    job_hold,
    job_record,
    job_reject,
    job_release,
)
from deletion.domain.services.outbox import outbox_enqueue
from deletion.domain.services.requests import subject_identifiers
from deletion.domain.states import JobStage
from workers import routing, workfiles
from workers.results import verification_results_store
from workers.runtime import (
    WORKER_ACTOR,
    ProgressReporter,
    StageRun,
    engine,
    heartbeat,
    signer,
    stage_take_over,
    versions,
    worker_name,
)

log = logging.getLogger(__name__)

S = JobStage


def _relay_now() -> None:
    from workers.relay import relay_pending

    relay_pending()


def _take(session: Session, run: StageRun, stage: S) -> bool:
    """Take `stage` for this run (it then holds `run.claim`).  False: someone else has the
    job now, or it moved on; do nothing."""
    if stage_take_over(session, run=run, stage=stage) is None:
        log.info("job %s: stage %s is not free for this task; nothing to do", run.job_id, stage)
        return False
    job = session.get_one(Job, run.job_id)
    session.refresh(job)
    # A certified job is never dead-lettered: its promotion must finish.
    if job.attempts > job.max_attempts and stage != S.PROMOTING:
        job_fail(session, job_id=run.job_id, error="worker lost too many times", permanent=True,
                 claim=run.claim)
        log.error("job %s dead-lettered after %s attempts", run.job_id, job.attempts)
        return False
    return True


def _claim(run: StageRun, stage: S) -> bool:
    """Take `stage` in a transaction of its own, so that whatever fails after it is this
    claim's to record (a failure in the same transaction would roll the claim back too)."""
    with session_scope(engine()) as session:
        if stage is S.BUILDING_SETS:
            return _enter_first_stage(session, run)
        return _take(session, run, stage)


def _enter_first_stage(session: Session, run: StageRun) -> bool:
    if run.claim is None:
        token = job_claim(session, job_id=run.job_id, expected_stage=S.QUEUED,
                          next_stage=S.BUILDING_SETS, worker=worker_name())
        if token is not None:
            run.claim = token
            return True
    return _take(session, run, S.BUILDING_SETS)


def _hand_over(session: Session, run: StageRun, current: S, nxt: S, task_name: str) -> None:
    job_hand_over(session, job_id=run.job_id, claim=run.token, current=current, nxt=nxt,
                  task_name=task_name, worker=worker_name())


def _hold(session: Session, run: StageRun) -> Job:
    return job_hold(session, job_id=run.job_id, claim=run.token)


# ------------------------------------------------------------ build sets


@dataclass(frozen=True)
class _SetsPlan:
    job_id: int
    claim: str
    corpus_path: Path
    tombstoned: frozenset[str]
    subjects: tuple[Any, ...]
    done: bool
    corpus_digest: str = ""
    content_digest: str = ""  # the corpus file's (first version's) digest: what its index is for


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


def _sets_file(job: Job) -> str:
    name = (job.sets or {}).get("sets_file")
    if not isinstance(name, str):
        raise PermanentJobError(f"job {job.id} has no sets file recorded")
    return name


def stage_build_sets(run: StageRun) -> None:
    job_id = run.job_id
    if not _claim(run, S.BUILDING_SETS):
        return
    with session_scope(engine()) as session:
        job = _hold(session, run)
        version = _corpus_version_of(session, job)
        done = job.sets is not None and workfiles.sets_present(job_id, job.sets.get("sets_file"))
        subjects = () if done else tuple(
            subject_identifiers(session, r.reference) for r in job.requests
        )
        plan = _SetsPlan(job_id, run.token, Path(version.path), _tombstoned(session, version),
                         subjects, done, version.manifest_digest,
                         registry.corpus_content_digest(session, corpus_id=version.corpus_id))
    manifest = None if plan.done else _compute_sets(plan, run)
    rejected = False
    with session_scope(engine()) as session:
        _hold(session, run)
        if manifest is not None and manifest["counts"]["unmatched"]:
            # Certifying the erasure of data we never found would be a false statement.
            job_reject(session, job_id=job_id, actor=WORKER_ACTOR,
                       reason=f"{len(manifest['counts']['unmatched'])} subject(s) match no "
                              "record of the corpus")
            rejected = True
        else:
            if manifest is not None:
                job_record(session, job_id=job_id, sets=manifest,
                           work_dir=str(workfiles.work_dir_of(job_id)),
                           timings={"build_sets_s": manifest.pop("seconds")})
            _hand_over(session, run, S.BUILDING_SETS, S.UNLEARNING, routing.UNLEARN)
    run.owned.clear()
    if rejected:
        workfiles.work_files_remove(job_id, reason="job rejected", actor=WORKER_ACTOR)
        return
    if manifest is not None:
        workfiles.sets_files_discard(job_id, keep=manifest["sets_file"])
    _relay_now()


def _compute_sets(plan: _SetsPlan, run: StageRun) -> dict[str, Any]:
    """Build the sets and write them encrypted; return digests and counts only (no names
    leave here)."""
    import time

    from unlearning.sets import Subject
    from workers.scan import compute_sets

    started = time.monotonic()
    with heartbeat(run):
        subjects = [
            Subject(name=s.name, aliases=tuple(s.aliases), identifiers=(*s.emails, *s.phones))
            for s in plan.subjects
        ]
        # By index look-up when the corpus has a fresh index; otherwise streamed (never loaded
        # whole), a corpus of shards scanned by many workers.
        sets = compute_sets(plan.corpus_path, subjects, job_work_dir=workfiles.work_dir_of(plan.job_id),
                            seed=plan.job_id, exclude_ids=plan.tombstoned,
                            corpus_digest=plan.corpus_digest, content_digest=plan.content_digest)
        run.check()
        path = workfiles.sets_save(plan.job_id, plan.claim, sets)
        run.owned.append(path)
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
        "sets_file": path.name,
        "seconds": round(time.monotonic() - started, 3),
    }


# ------------------------------------------------------------------ unlearn


@dataclass(frozen=True)
class _UnlearnPlan:
    job_id: int
    claim: str
    model_name: str
    base_dir: Path
    base_version: int
    base_id: int
    method: str
    hparams: dict[str, Any]
    round: int
    sets_file: str
    done: bool


def stage_unlearn(run: StageRun) -> None:
    job_id = run.job_id
    if not _claim(run, S.UNLEARNING):
        return
    with session_scope(engine()) as session:
        job = _hold(session, run)
        base = session.get_one(Checkpoint, job.base_checkpoint_id)
        if job.candidate_checkpoint_id is None:
            # Never unlearn from bytes nobody registered (a serving checkpoint that changed).
            registry.checkpoint_check_files(base)
        plan = _UnlearnPlan(
            job_id=job_id, claim=run.token, model_name=job.model.name,
            base_dir=Path(base.directory), base_version=base.version, base_id=base.id,
            method=job.method, hparams=dict(job.hparams or {}), round=job.verification_round,
            sets_file=_sets_file(job), done=job.candidate_checkpoint_id is not None,
        )
    result = None if plan.done else _erase(plan, run)
    with session_scope(engine()) as session:
        job = _hold(session, run)
        if result is not None:
            registry.checkpoint_register(
                session, actor=WORKER_ACTOR, model_name=plan.model_name,
                directory=str(result.out_dir), digest=result.digest, parent_id=plan.base_id,
                job_id=job_id,
            )
            # The settings actually used (defaults filled in) are what the certificate states.
            job.hparams = _plain(result.hparams)
            job_record(session, job_id=job_id,
                       timings={f"unlearn_round_{plan.round}_s": round(result.seconds, 3)})
        _hand_over(session, run, S.UNLEARNING, S.VERIFYING, routing.VERIFY)
    run.owned.clear()
    _relay_now()


def _plain(hparams: Any) -> dict[str, Any]:
    """JSON-ready hyper-parameters (tuples become lists, as they will when read back)."""
    return dict(json.loads(json.dumps(dict(hparams), default=str)))


def _refusal(what: str, exc: BaseException) -> str:
    """A job error for a model the engine refuses to load (its first line, in the short form
    the job keeps: paths and model types, no record text)."""
    first = (str(exc).splitlines() or [""])[0]
    return f"{what} is refused by the engine ({type(exc).__name__}): {first}"


@contextmanager
def _refusals_are_permanent(what: str) -> Iterator[None]:
    """A checkpoint whose registered bytes the engine refuses to load (an encoder, code from
    outside the folder, a chat template it cannot prompt) fails the same way on every
    retry: the job fails permanently at once instead of spending its attempts."""
    from unlearning.modeling import ModelLoadError
    from unlearning.prompting import PromptFormatError

    try:
        yield
    except (ModelLoadError, PromptFormatError) as exc:
        raise PermanentJobError(_refusal(what, exc)) from exc


def _erase(plan: _UnlearnPlan, run: StageRun) -> Any:
    from unlearning.distributed import resolve_processes, resolve_sharding
    from unlearning.erase import erase
    from workers.runtime import unlearn_parallelism

    # Several ranks on a worker with several GPUs (UNLEARN_PROCESSES): this process is
    # rank 0, so the heartbeat and the progress reports go on as in one process.
    processes_setting, sharding_setting = unlearn_parallelism()
    processes, sharding = resolve_processes(processes_setting), resolve_sharding(sharding_setting)
    out_dir = workfiles.candidate_dir_of(plan.model_name, plan.job_id, plan.round,
                                         plan.base_version, plan.claim)
    run.owned.append(out_dir)
    sets = workfiles.sets_load(plan.job_id, plan.sets_file)
    with heartbeat(run), _refusals_are_permanent(f"base checkpoint {plan.base_id}"):
        result = erase(plan.base_dir, sets, method=plan.method, out_dir=out_dir,
                       hparams=plan.hparams or None, progress=ProgressReporter(run),
                       processes=processes, sharding=sharding)
    log.info("job %s: %s round %s wrote %s in %.1f s on %s process(es)", plan.job_id, plan.method,
             plan.round, out_dir.name, result.seconds, processes)
    return result


# ------------------------------------------------------------------- verify


@dataclass(frozen=True)
class _VerifyPlan:
    job_id: int
    candidate_id: int
    candidate_dir: Path
    candidate_digest: str
    base_dir: Path
    base_digest: str
    corpus_path: Path
    tombstoned: frozenset[str]
    round: int
    sets_file: str
    control_path: Path | None = None  # the control corpus registered with the corpus


def stage_verify(run: StageRun) -> None:
    job_id = run.job_id
    if not _claim(run, S.VERIFYING):
        return
    with session_scope(engine()) as session:
        job = _hold(session, run)
        if job.candidate_checkpoint_id is None:
            raise PermanentJobError("verification reached without a candidate checkpoint")
        candidate = session.get_one(Checkpoint, job.candidate_checkpoint_id)
        base = session.get_one(Checkpoint, job.base_checkpoint_id)
        version = _corpus_version_of(session, job)
        control = registry.corpus_control_path(session, corpus_id=version.corpus_id)
        plan = _VerifyPlan(job_id, candidate.id, Path(candidate.directory), candidate.digest,
                           Path(base.directory), base.digest, Path(version.path),
                           _tombstoned(session, version), job.verification_round,
                           _sets_file(job), Path(control) if control else None)
        stored = verification_report_get(session, job_id=job_id, candidate_id=candidate.id)
        report = verification_report_load(stored) if stored is not None else None
    if report is None:
        report = _verify(plan, run)
    rejected = False
    with session_scope(engine()) as session:
        _hold(session, run)
        verification_report_store(session, job_id=job_id, round_=plan.round,
                                  candidate_id=plan.candidate_id, report=report,
                                  actor=WORKER_ACTOR)
        verification_results_store(session, job_id=job_id, round_=plan.round, report=report)
        job_record(session, job_id=job_id,
                   timings={f"verify_round_{plan.round}_s": report.get("seconds", 0.0)})
        if report["passed"]:
            _hand_over(session, run, S.VERIFYING, S.CERTIFYING, routing.CERTIFY)
        elif not _escalate(session, job_id=job_id, report=report):
            _reject_after_verification(session, job_id=job_id, report=report)
            rejected = True
    if rejected:
        workfiles.work_files_remove(job_id, reason="job rejected", actor=WORKER_ACTOR)
    else:
        # The working copy, written once the database holds the report it copies.
        workfiles.report_save(job_id, plan.candidate_id, report_text(report))
    _relay_now()


def _check_files(directory: Path, digest: str, what: str) -> None:
    actual = registry.checkpoint_files_digest(str(directory))
    if actual != digest:
        raise registry.CheckpointCorrupted(
            f"the {what} checkpoint no longer matches its registered digest {digest[:12]} "
            f"(files now: {actual[:12]}); it is not loaded")


VERIFY_CORPUS_SAMPLE = 3000  # retained records the verifier draws its utility and lens material from


def _verify(plan: _VerifyPlan, run: StageRun) -> dict[str, Any]:
    import time

    from unlearning.corpus.scan import sample_records
    from unlearning.modeling import TokenizerMismatch
    from unlearning.verification import verify
    from workers.policies import deployment_policy

    started = time.monotonic()
    sets = workfiles.sets_load(plan.job_id, plan.sets_file)
    heldout = plan.corpus_path.parent / "heldout.txt"
    with heartbeat(run), _refusals_are_permanent(f"checkpoint {plan.candidate_id} or its base"):
        # Loading runs code a checkpoint ships (KIF's gates): only bytes that were registered.
        _check_files(plan.candidate_dir, plan.candidate_digest, "candidate")
        _check_files(plan.base_dir, plan.base_digest, "base")
        try:
            report = verify(
                plan.candidate_dir, plan.base_dir, sets,
                control=plan.control_path,
                # A seeded sample of the retained records (never the whole corpus in memory).
                corpus=sample_records(plan.corpus_path, VERIFY_CORPUS_SAMPLE, seed=plan.job_id,
                                      exclude_ids=plan.tombstoned),
                heldout=heldout if heldout.is_file() else None, policy=deployment_policy(),
                progress=ProgressReporter(run), seed=plan.job_id,
            )
        except TokenizerMismatch as exc:
            # Bad input no retry cures (the engine refused before scoring anything): named by
            # checkpoint, in the short form the job's error keeps.
            raise PermanentJobError(
                f"candidate checkpoint {plan.candidate_id} ({plan.candidate_digest[:12]}) does not share "
                f"the base's tokenizer ({plan.base_digest[:12]}): {exc.difference}") from exc
    data: dict[str, Any] = report.to_json()
    data["verified_at"] = utcnow().isoformat()
    data["seconds"] = round(time.monotonic() - started, 3)
    log.info("job %s: verification round %s %s", plan.job_id, plan.round,
             "passed" if data["passed"] else "failed")
    return data


def _escalate(session: Session, *, job_id: int, report: dict[str, Any]) -> bool:
    """Once per job: stronger settings from the policy, then unlearn again from the base."""
    from unlearning.verification import report_escalation
    from workers.policies import deployment_policy

    deployment_policy()  # registers a deployment's own policy in this process
    job = session.get_one(Job, job_id)
    if job.escalated:
        return False
    try:
        stronger = report_escalation(report, method=job.method, hparams=job.hparams or {})
    except KeyError:  # a policy this process does not know
        return False
    if stronger is None:
        return False
    _set_candidate_aside(session, job, reason="failed verification; escalating")
    job_escalate(session, job_id=job_id, hparams=_plain(stronger), actor=WORKER_ACTOR)
    job_release(session, job_id=job_id)  # `unlearning` is handed over, as usual
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
    failed = sorted(c["name"] for c in report.get("checks", []) if not c.get("passed"))
    # job_reject retires the candidate: it never serves and still holds the subject's data.
    job_reject(session, job_id=job_id, actor=WORKER_ACTOR,
               reason="verification failed" + (" after escalation" if job.escalated else "")
               + ": " + ", ".join(failed))
    log.warning("job %s rejected: %s", job_id, ", ".join(failed))


# --------------------------------------------------------- certify (atomic)


def stage_certify(run: StageRun) -> None:
    job_id = run.job_id
    if not _claim(run, S.CERTIFYING):
        return
    with session_scope(engine()) as session:
        job = _hold(session, run)
        if job.candidate_checkpoint_id is None:
            raise PermanentJobError("certification reached without a candidate checkpoint")
        stored = verification_report_get(session, job_id=job_id,
                                         candidate_id=job.candidate_checkpoint_id)
        if stored is not None:
            # The file is a copy; the database holds what is signed.  A copy that differs
            # means someone changed the work folder: stop, do not certify.
            workfiles.report_file_check(job_id, job.candidate_checkpoint_id, stored.digest)
        job_certify_and_promote(session, job_id=job_id, claim=run.token, signer=signer(),
                                versions=versions(), actor=WORKER_ACTOR, worker=worker_name())
    _relay_now()


# ------------------------------------------------------------------ promote


def stage_promote(run: StageRun) -> None:
    from workers.notifications import notifications_open

    job_id = run.job_id
    if not _claim(run, S.PROMOTING):
        return
    with session_scope(engine()) as session:
        _hold(session, run)
        if job_claim(session, job_id=job_id, expected_stage=S.PROMOTING, next_stage=S.DONE,
                     worker=worker_name(), claim=run.claim) is None:
            raise ClaimLost(f"job {job_id} left promoting while this worker held it")
        job = session.get_one(Job, job_id)
        job.finished_at = utcnow()
        audit_append(session, actor=WORKER_ACTOR, action="job.done", object_type="job",
                     object_ref=str(job_id), details={"timings": job.timings or {}})
        if notifications_open(session, job=job):
            outbox_enqueue(session, task_name=routing.NOTIFY_RECIPIENTS, args={})
    # The sets on disk are the subject's data: they go as soon as the job is done (the
    # sweep removes them if this worker dies first).
    workfiles.work_files_remove(job_id, reason="job done", actor=WORKER_ACTOR)
    log.info("job %s done", job_id)
    _relay_now()


STAGES = {
    routing.BUILD_SETS: stage_build_sets,
    routing.UNLEARN: stage_unlearn,
    routing.VERIFY: stage_verify,
    routing.CERTIFY: stage_certify,
    routing.PROMOTE: stage_promote,
}
