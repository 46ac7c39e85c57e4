"""A job's progress as the pages and the API show it."""
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


def job_percent(job: Job) -> float:
    try:
        stage = JobStage(job.stage)
    except ValueError:
        return 0.0
    if stage not in STAGE_SPAN:
        return 0.0
    start, end = STAGE_SPAN[stage]
    step, total = job.progress_step, job.progress_total
    inner = (step / total) if (step is not None and total) else 0.0
    return round(start + (end - start) * min(max(inner, 0.0), 1.0), 1)


def job_progress_json(job: Job) -> dict[str, Any]:
    return {
        "id": job.id, "stage": job.stage, "method": job.method,
        "stage_index": JOB_PIPELINE.index(JobStage(job.stage)) if job.stage in JOB_PIPELINE else None,
        "step": job.progress_step, "total": job.progress_total,
        "eta_seconds": job.progress_eta_seconds, "percent": job_percent(job),
        "attempts": job.attempts, "error": job.error if job.stage in ("failed", "rejected") else None,
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }
