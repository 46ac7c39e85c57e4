"""Stage claims, certification and promotion, in this process on real PostgreSQL, with
checkpoints that are small folders (tests/stage_fixtures.py): what a copy that lost
its claim may do (nothing), what certification signs (the database's report), and what
a certified job may still become (done, nothing else).

Each test names the fault of issue 14 it pins; all of them fail on the code before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import func, select, update

from deletion.domain import registry
from deletion.domain.certificates import RequestFacts, VerificationFacts
from deletion.domain.db import session_scope
from deletion.domain.errors import DomainError
from deletion.domain.models import (
    AuditEvent,
    Certificate,
    Checkpoint,
    ErasureRequest,
    Job,
    OutboxMessage,
    utcnow,
)
from deletion.domain.services.jobs import (
    ClaimLost,
    JobCertified,
    job_fail,
    job_hand_over,
    job_rebase,
    job_reject,
    job_retry,
)
from tests.stage_fixtures import REPORT, WorkerDisk, run_stage, worker_disk_fixtures
from workers import stages, workfiles
from workers.runtime import StageRun, stage_take_over

database_url, disk = worker_disk_fixtures("erasure_claims")


def make_stale(disk: WorkerDisk, job_id: int) -> None:
    with session_scope(disk.engine) as session:
        session.execute(update(Job).where(Job.id == job_id)
                        .values(heartbeat_at=utcnow() - timedelta(hours=1)))


def audit_actions(disk: WorkerDisk, job_id: int) -> list[str]:
    with session_scope(disk.engine) as session:
        return list(session.scalars(select(AuditEvent.action).where(
            AuditEvent.object_type == "job", AuditEvent.object_ref == str(job_id))
            .order_by(AuditEvent.seq)))


# ------------------------------------------------------------- item 2: claims


def test_a_stage_copy_that_lost_its_claim_stops_quietly_and_leaves_the_winners_files(
    disk: WorkerDisk, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two copies of unlearning: the first is cut off long enough for a second to take the
    stage over.  The first finishes its work, finds its claim gone, removes its own
    candidate folder and fails nothing; the second's folder and claim are untouched."""
    job_id = disk.job_at("unlearning")
    winner_dir: list[Path] = []

    def erase_while_taken_over(plan: Any, run: StageRun) -> Any:
        out = workfiles.candidate_dir_of(plan.model_name, plan.job_id, plan.round,
                                         plan.base_version, plan.claim)
        run.owned.append(out)
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"loser")
        make_stale(disk, job_id)  # this worker looked dead for too long
        second = StageRun(job_id)
        with session_scope(disk.engine) as session:
            assert stage_take_over(session, run=second, stage="unlearning")
        theirs = workfiles.candidate_dir_of(plan.model_name, plan.job_id, plan.round,
                                            plan.base_version, second.token)
        theirs.mkdir(parents=True)
        (theirs / "model.safetensors").write_bytes(b"winner")
        winner_dir.append(theirs)
        return SimpleNamespace(out_dir=out, digest=registry.checkpoint_digest(out), method="asu",
                               hparams={}, seconds=0.1, steps=1)

    with session_scope(disk.engine) as session:  # the job as it is before any candidate
        session.execute(update(Job).where(Job.id == job_id).values(candidate_checkpoint_id=None))
    monkeypatch.setattr(stages, "_erase", erase_while_taken_over)
    assert run_stage(stages.stage_unlearn, job_id, name="erasure.unlearn") == "done"

    job = disk.job(job_id)
    assert (job.stage, job.error, job.dead_lettered_at, job.candidate_checkpoint_id) == (
        "unlearning", None, None, None)
    assert job.attempts == 1  # the take-over; the loser cost nothing
    assert "job.failed" not in audit_actions(disk, job_id)
    assert winner_dir[0].joinpath("model.safetensors").read_bytes() == b"winner"
    assert not [p for p in winner_dir[0].parent.iterdir()
                if p.name.startswith(f"job-{job_id}-base") and p != winner_dir[0]]


def test_a_failure_of_a_copy_that_lost_its_claim_is_not_recorded(disk: WorkerDisk) -> None:
    job_id = disk.job_at("verifying")
    first, second = StageRun(job_id), StageRun(job_id)
    with session_scope(disk.engine) as session:
        assert stage_take_over(session, run=first, stage="verifying")
    make_stale(disk, job_id)
    with session_scope(disk.engine) as session:
        assert stage_take_over(session, run=second, stage="verifying")
    with session_scope(disk.engine) as session, pytest.raises(ClaimLost):
        job_fail(session, job_id=job_id, error="RuntimeError: the loser crashed",
                 claim=first.token)
    with session_scope(disk.engine) as session, pytest.raises(ClaimLost):
        job_hand_over(session, job_id=job_id, claim=first.token, current="verifying",
                      nxt="certifying", task_name="erasure.certify")
    job = disk.job(job_id)
    assert (job.stage, job.error, job.claim_token) == ("verifying", None, second.token)


def test_a_redelivered_copy_takes_over_at_once_when_the_holders_process_is_gone(
    disk: WorkerDisk,
) -> None:
    import os

    job_id = disk.job_at("verifying")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    holder = f"worker@{os.uname().nodename}:{gone.pid}"
    alive = f"worker@{os.uname().nodename}:{os.getppid()}"
    with session_scope(disk.engine) as session:
        session.execute(update(Job).where(Job.id == job_id)
                        .values(heartbeat_at=utcnow(), claim_token="x" * 32, worker=alive))
    with session_scope(disk.engine) as session:  # fresh heartbeat, holder alive: not ours
        assert not stage_take_over(session, run=StageRun(job_id), stage="verifying")
    with session_scope(disk.engine) as session:
        session.execute(update(Job).where(Job.id == job_id).values(worker=holder))
    with session_scope(disk.engine) as session:  # fresh heartbeat, holder dead: ours
        assert stage_take_over(session, run=StageRun(job_id), stage="verifying")
        assert session.get_one(Job, job_id).attempts == 1


def test_a_retry_resumes_only_the_claim_it_still_holds(disk: WorkerDisk) -> None:
    job_id = disk.job_at("verifying")
    run = StageRun(job_id)
    with session_scope(disk.engine) as session:
        assert stage_take_over(session, run=run, stage="verifying")
    retry = StageRun(job_id, claim=run.token)
    with session_scope(disk.engine) as session:
        assert stage_take_over(session, run=retry, stage="verifying") == run.token
    make_stale(disk, job_id)
    with session_scope(disk.engine) as session:
        assert stage_take_over(session, run=StageRun(job_id), stage="verifying")
    with session_scope(disk.engine) as session:
        assert not stage_take_over(session, run=StageRun(job_id, claim=run.token),
                                   stage="verifying")
    assert disk.job(job_id).attempts == 1


# ------------------------------------------- item 1: a certified job only finishes


def certified(disk: WorkerDisk) -> int:
    job_id = disk.job_at("certifying")
    assert run_stage(stages.stage_certify, job_id, name="erasure.certify") == "done"
    assert disk.job(job_id).stage == "promoting"
    return job_id


def test_a_crash_in_promote_interrupts_promotion_and_never_fails_the_job(
    disk: WorkerDisk, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Today's main: promoting -> failed -> queued, the stages replayed, certify re-based and
    retired the candidate that already served, and housekeeping destroyed its files."""
    job_id = certified(disk)
    serving = disk.serving()  # the candidate, promoted in the certify transaction

    def notifications_fail(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("webhook table locked")

    import workers.notifications
    from workers.reconciler import jobs_reconcile

    with monkeypatch.context() as patch:
        patch.setattr(workers.notifications, "notifications_open", notifications_fail)
        assert run_stage(stages.stage_promote, job_id, name="erasure.promote") == "done"
    job = disk.job(job_id)
    assert (job.stage, job.dead_lettered_at, job.heartbeat_at) == ("promoting", None, None)
    assert "job.promotion_interrupted" in audit_actions(disk, job_id)
    assert "job.failed" not in audit_actions(disk, job_id)

    jobs_reconcile(now=utcnow() + timedelta(hours=1))  # the hand-over looks lost: sent again
    assert run_stage(stages.stage_promote, job_id, name="erasure.promote") == "done"
    assert disk.job(job_id).stage == "done"
    assert disk.serving().id == serving.id == disk.job(job_id).candidate_checkpoint_id


@pytest.mark.parametrize("service", ["fail", "retry", "rebase", "reject"])
def test_a_certified_job_refuses_everything_but_finishing(disk: WorkerDisk, service: str) -> None:
    job_id = certified(disk)
    with session_scope(disk.engine) as session:
        if service == "fail":
            job_fail(session, job_id=job_id, error="RuntimeError: x", permanent=True)
        else:
            with pytest.raises(JobCertified):
                {"retry": job_retry, "rebase": job_rebase}.get(service, job_reject)(
                    session, job_id=job_id, **({"reason": "x"} if service == "reject" else {}))
    job = disk.job(job_id)
    assert (job.stage, job.dead_lettered_at) == ("promoting", None)


def test_the_serving_checkpoint_is_retired_by_a_promotion_only(disk: WorkerDisk) -> None:
    serving = disk.serving()
    with session_scope(disk.engine) as session, pytest.raises(registry.ServingCheckpointProtected):
        registry.checkpoint_retire(session, actor="test", checkpoint_id=serving.id,
                                   reason="re-based")
    job_id = certified(disk)
    new = disk.serving()
    assert new.id == disk.job(job_id).candidate_checkpoint_id
    with session_scope(disk.engine) as session:
        assert session.get_one(Checkpoint, serving.id).status == "retired"  # by the promotion
        with pytest.raises(registry.ServingCheckpointProtected):
            registry.checkpoint_retire(session, actor="test", checkpoint_id=new.id,
                                       reason="re-based")


def test_housekeeping_never_deletes_the_files_of_a_checkpoint_that_serves(disk: WorkerDisk) -> None:
    from workers.housekeeping import checkpoints_destroy_due

    serving = disk.serving()
    with session_scope(disk.engine) as session:  # a row that says retired, wrongly
        session.execute(update(Checkpoint).where(Checkpoint.id == serving.id).values(
            status="retired", destroy_after=utcnow() - timedelta(days=1)))
    checkpoints_destroy_due()
    assert Path(serving.directory, "model.safetensors").is_file()
    with session_scope(disk.engine) as session:
        assert session.get_one(Checkpoint, serving.id).destroyed_at is None
        session.execute(update(Checkpoint).where(Checkpoint.id == serving.id)
                        .values(status="serving", destroy_after=None))


# ----------------------------------- items 3 and 4: certify signs the stored report


def test_certify_signs_the_report_stored_when_verification_ended(disk: WorkerDisk) -> None:
    job_id = disk.job_at("certifying")
    assert run_stage(stages.stage_certify, job_id, name="erasure.certify") == "done"
    with session_scope(disk.engine) as session:
        payload = json.loads(session.scalars(
            select(Certificate.payload).where(Certificate.job_id == job_id)).one())
        request = session.scalars(select(ErasureRequest).join(
            Job.requests).where(Job.id == job_id)).one()
        facts = RequestFacts.from_row(request)
    verification = VerificationFacts.from_report(REPORT)
    assert payload["verification"]["checks"] == [
        {"name": "candidate not wrecked", "value": "1.02", "threshold": "10.0",
         "comparator": "<=", "passed": True}]
    assert payload["verification"]["policy"] == {"name": verification.policy_name,
                                                 "version": verification.policy_version}
    assert payload["verification"]["metrics"] == {k: repr(v) for k, v in REPORT["metrics"].items()}
    assert payload["requests"][0]["subject_hmac"] == facts.subject_hmac
    assert payload["timestamps"]["verified"] == "2026-12-01T10:00:00.000000Z"


def test_a_report_file_that_differs_from_the_stored_report_stops_certification(
    disk: WorkerDisk,
) -> None:
    """Today's main signed whatever the report file said."""
    job_id = disk.job_at("certifying")
    job = disk.job(job_id)
    forged = {**REPORT, "checks": [], "metrics": {"leakage.forget": 0.0}}
    workfiles.report_save(job_id, job.candidate_checkpoint_id, json.dumps(forged))

    assert run_stage(stages.stage_certify, job_id, name="erasure.certify") == "done"
    job = disk.job(job_id)
    assert job.dead_lettered_at is not None and (job.error or "").startswith("ReportMismatch")
    with session_scope(disk.engine) as session:
        assert not session.scalar(select(func.count()).select_from(Certificate)
                                  .where(Certificate.job_id == job_id))
        candidate = session.get_one(Checkpoint, job.candidate_checkpoint_id)
        assert candidate.status == "retired"  # a dead-lettered job's candidate goes
    assert disk.serving().id == job.base_checkpoint_id


def test_a_report_without_a_guarantee_class_is_never_certified_as_weights(disk: WorkerDisk) -> None:
    """Today's main defaulted a missing guarantee to `weights` in production only."""
    report = {k: v for k, v in REPORT.items() if k != "guarantee"}
    job_id = disk.job_at("certifying", report=report)
    assert run_stage(stages.stage_certify, job_id, name="erasure.certify") == "done"
    job = disk.job(job_id)
    assert job.stage == "failed" and "guarantee" in (job.error or "")
    with pytest.raises(DomainError):
        VerificationFacts.from_report(report)


def test_certify_and_promote_live_in_the_domain_and_the_import_cycle_is_gone() -> None:
    import importlib.util

    assert importlib.util.find_spec("workers.certify") is None
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import workers.stages"],
                          capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert "workers.certify" not in done.stderr


# --------------------------------------------- item 12: which errors are retried


@pytest.mark.parametrize("error,retried", [
    (FileNotFoundError(2, "No such file or directory"), False),
    (PermissionError(13, "Permission denied"), False),
    (IsADirectoryError(21, "Is a directory"), False),
    (OSError(28, "No space left on device"), True),
    (ConnectionResetError(104, "Connection reset by peer"), True),
    (TimeoutError("timed out"), True),
])
def test_only_transient_os_errors_are_retried(disk: WorkerDisk, monkeypatch: pytest.MonkeyPatch,
                                              error: OSError, retried: bool) -> None:
    """Today's main retried every OSError (IOError) as transient, five times, then failed."""
    job_id = disk.job_at("verifying")

    def verify_raises(plan: Any, run: StageRun) -> Any:
        raise error

    monkeypatch.setattr(stages, "_verify", verify_raises)
    outcome = run_stage(stages.stage_verify, job_id, name="erasure.verify")
    job = disk.job(job_id)
    if retried:
        assert outcome == "retry" and job.stage == "verifying" and job.error is None
    else:
        assert outcome == "done" and job.stage == "failed" and job.attempts == 1
        assert type(error).__name__ in (job.error or "")


def test_a_stage_that_never_took_its_claim_fails_no_job(disk: WorkerDisk,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = disk.job_at("verifying")
    holder = StageRun(job_id)
    with session_scope(disk.engine) as session:
        assert stage_take_over(session, run=holder, stage="verifying")

    def take_raises(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("crashed before claiming")

    monkeypatch.setattr(stages, "stage_take_over", take_raises)
    assert run_stage(stages.stage_verify, job_id, name="erasure.verify") == "done"
    assert (disk.job(job_id).stage, disk.job(job_id).claim_token) == ("verifying", holder.token)


def test_outbox_messages_are_pruned_and_never_sending_ones_abandoned_with_an_audit_row(
    disk: WorkerDisk,
) -> None:
    from workers.housekeeping import outbox_prune_due

    old = utcnow() - timedelta(days=8)
    with session_scope(disk.engine) as session:
        sent = OutboxMessage(task_name="erasure.verify", args={"job_id": 1}, attempts=1,
                             created_at=old, sent_at=old)
        stuck = OutboxMessage(task_name="erasure.certify", args={"job_id": 777}, attempts=40,
                              created_at=old, last_error="ConnectionRefusedError")
        fresh = OutboxMessage(task_name="erasure.promote", args={"job_id": 2}, attempts=0)
        session.add_all([sent, stuck, fresh])
        session.flush()
        ids = (sent.id, stuck.id, fresh.id)
    assert outbox_prune_due() >= 2
    with session_scope(disk.engine) as session:
        left = set(session.scalars(select(OutboxMessage.id).where(OutboxMessage.id.in_(ids))))
        event = session.scalars(select(AuditEvent).where(AuditEvent.action == "outbox.abandoned")
                                .order_by(AuditEvent.seq.desc())).first()
    assert left == {ids[2]}
    assert event is not None and 777 in event.details_dict["jobs"]
    assert event.details_dict["tasks"]["erasure.certify"] >= 1


def test_a_candidate_that_does_not_share_the_bases_tokenizer_fails_the_job_permanently_naming_it(
    disk: WorkerDisk, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine refuses it before scoring (`modeling.check_same_tokenizer`); no retry cures it."""
    import unlearning.corpus.scan
    import unlearning.verification
    from unlearning.modeling import TokenizerMismatch

    job_id = disk.job_at("verifying")
    seen: list[tuple[Path, Path]] = []

    def verify_refuses(candidate: Path, base: Path, *args: Any, **kwargs: Any) -> Any:
        seen.append((candidate, base))
        raise TokenizerMismatch(candidate, base, "vocabulary of 403 tokens vs 400")

    monkeypatch.setattr(workfiles, "sets_load", lambda *a, **k: SimpleNamespace())
    monkeypatch.setattr(unlearning.corpus.scan, "sample_records", lambda *a, **k: [])
    monkeypatch.setattr(unlearning.verification, "verify", verify_refuses)
    assert run_stage(stages.stage_verify, job_id, name="erasure.verify") == "done"
    job = disk.job(job_id)
    assert seen and job.stage == "failed" and job.dead_lettered_at is not None
    assert "does not share the base's tokenizer" in (job.error or "")
    assert "vocabulary of 403 tokens vs 400" in (job.error or "")
    assert "job.dead_lettered" in audit_actions(disk, job_id)


@pytest.mark.parametrize("stage", ["unlearning", "verifying"])
def test_a_checkpoint_the_engine_refuses_to_load_fails_the_job_permanently_at_once(
    disk: WorkerDisk, monkeypatch: pytest.MonkeyPatch, stage: str,
) -> None:
    """An encoder, code from outside the folder, a template it cannot prompt: the registered
    bytes fail the same way on every retry, so no attempt is spent on them."""
    import unlearning.corpus.scan
    import unlearning.erase
    import unlearning.verification
    from unlearning.modeling import ModelLoadError

    job_id = disk.job_at(stage)

    def refuses(*args: Any, **kwargs: Any) -> Any:
        raise ModelLoadError("/models/m/v1: bert (BertForMaskedLM) is an encoder-only model\nmore detail")

    monkeypatch.setattr(workfiles, "sets_load", lambda *a, **k: SimpleNamespace())
    monkeypatch.setattr(unlearning.corpus.scan, "sample_records", lambda *a, **k: [])
    monkeypatch.setattr(unlearning.erase, "erase", refuses)
    monkeypatch.setattr(unlearning.verification, "verify", refuses)
    if stage == "unlearning":
        with session_scope(disk.engine) as session:  # the job as it is before any candidate
            session.execute(update(Job).where(Job.id == job_id).values(candidate_checkpoint_id=None))
        task = (stages.stage_unlearn, "erasure.unlearn")
    else:
        task = (stages.stage_verify, "erasure.verify")
    assert run_stage(task[0], job_id, name=task[1]) == "done"
    job = disk.job(job_id)
    assert job.stage == "failed" and job.dead_lettered_at is not None and job.attempts == 1
    assert "refused by the engine (ModelLoadError)" in (job.error or "")
    assert "encoder-only" in (job.error or "") and "more detail" not in (job.error or "")
    assert "job.dead_lettered" in audit_actions(disk, job_id)
