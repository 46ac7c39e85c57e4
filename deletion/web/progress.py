"""A job's progress and outcome as the pages and the API show it.

The stage column names the stage that runs, or how the job ended; the progress step
and total belong to the running stage only, so a job that ended is never shown as
"0 % · step 9 of 9": it shows its outcome instead.
"""
from __future__ import annotations

from typing import Any

from deletion.domain.models import Job
from deletion.domain.states import JOB_PIPELINE, JobStage

# The share of the whole pipeline a stage starts at: unlearning and verifying are the
# long ones, so the bar does not sit at 90 % for most of the run.
STAGE_SPAN = {
    JobStage.QUEUED: (0, 2), JobStage.BUILDING_SETS: (2, 10), JobStage.UNLEARNING: (10, 60),
    JobStage.VERIFYING: (60, 90), JobStage.CERTIFYING: (90, 95), JobStage.PROMOTING: (95, 100),
    JobStage.DONE: (100, 100),
}
OUTCOME_TEXT = {
    "running": "running",
    "retrying": "failed; it will be retried",
    "certified": "certified and promoted",
    "rejected": "rejected: the erasure failed verification, nothing was promoted",
    "dead_lettered": "stopped after repeated failures; nothing was promoted",
}


def job_outcome(job: Job) -> str:
    if job.dead_lettered_at is not None:
        return "dead_lettered"
    if job.stage == JobStage.DONE:
        return "certified"
    if job.stage == JobStage.REJECTED:
        return "rejected"
    if job.stage == JobStage.FAILED:
        return "retrying"
    return "running"


def job_percent(job: Job) -> float | None:
    """Share of the pipeline done; None for a job that ended without finishing it."""
    try:
        stage = JobStage(job.stage)
    except ValueError:
        return None
    if stage not in STAGE_SPAN or job.dead_lettered_at is not None:
        return None
    start, end = STAGE_SPAN[stage]
    step, total = job.progress_step, job.progress_total
    inner = (step / total) if (step is not None and total) else 0.0
    return round(start + (end - start) * min(max(inner, 0.0), 1.0), 1)


def job_progress_json(job: Job) -> dict[str, Any]:
    outcome = job_outcome(job)
    running = outcome == "running"
    return {
        "id": job.id, "stage": job.stage, "method": job.method,
        "preset": (job.hparams or {}).get("preset") if isinstance(job.hparams, dict) else None,
        "stage_index": JOB_PIPELINE.index(JobStage(job.stage)) if job.stage in JOB_PIPELINE else None,
        "outcome": outcome, "outcome_text": OUTCOME_TEXT[outcome],
        # Step counters describe the stage that runs; an ended job has none.
        "step": job.progress_step if running else None,
        "total": job.progress_total if running else None,
        "eta_seconds": job.progress_eta_seconds if running else None,
        "percent": job_percent(job),
        "attempts": job.attempts, "error": job.error if job.stage in ("failed", "rejected") or not running else None,
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }
