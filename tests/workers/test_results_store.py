"""Verification results as stored for the web pages and evidence packs: a metric judged on
both sides keeps both verdicts, and a failed bound is never shown as passed."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.models import Job, VerificationResult
from deletion.web.explain import explain
from tests.domain.conftest import register_model
from workers.results import verification_results_store

REPORT = {
    "policy": {"name": "default", "version": "2"},
    "checks": [
        # written upper bound first, the passing lower bound last: the last must not win
        {"name": "latent residual knowledge", "metric": "latent.residual_ratio", "value": 0.61,
         "threshold": 0.25, "comparator": "<=", "passed": False,
         "rule": "underpowered: threshold halfway, about 22% of readings misjudged either way"},
        {"name": "latent traces not below strangers", "metric": "latent.residual_ratio", "value": 0.61,
         "threshold": -0.25, "comparator": ">=", "passed": True},
        {"name": "retained-fact accuracy", "metric": "utility.retain_ratio", "value": 0.99,
         "threshold": 0.95, "comparator": ">=", "passed": True},
    ],
    "metrics": {"latent.residual_ratio": 0.61, "utility.retain_ratio": 0.99, "mia.auc": 0.52},
}


@pytest.fixture
def job_id(sqlite_session: Session, tmp_path: Path) -> int:
    model = register_model(sqlite_session, tmp_path)
    job = Job(model_id=model.id, method="asu", hparams={}, base_checkpoint_id=model.serving_checkpoint_id,
              stage="verifying", created_by="t", timings={})
    sqlite_session.add(job)
    sqlite_session.flush()
    return job.id


def _rows(session: Session, job_id: int) -> dict[str, VerificationResult]:
    return {r.metric: r for r in session.scalars(select(VerificationResult).where(VerificationResult.job_id == job_id))}


def test_a_metric_judged_on_both_sides_fails_when_either_bound_fails_and_keeps_both(
    sqlite_session: Session, job_id: int,
) -> None:
    verification_results_store(sqlite_session, job_id=job_id, round_=0, report=REPORT)
    rows = _rows(sqlite_session, job_id)
    latent = rows["latent.residual_ratio"]
    assert latent.passed is False and (latent.threshold, latent.comparator) == (0.25, "<=")
    assert latent.details["check"] == "latent residual knowledge"
    # How the policy set a threshold the sample could not carry reaches the officer's sentence.
    assert latent.details["rule"].startswith("underpowered")
    assert "22% of readings misjudged" in explain(latent).sentence
    assert "rule" not in rows["utility.retain_ratio"].details
    assert [(c["check"], c["passed"]) for c in latent.details["checks"]] == [
        ("latent residual knowledge", False), ("latent traces not below strangers", True)]
    assert rows["utility.retain_ratio"].passed is True and "checks" not in rows["utility.retain_ratio"].details
    assert rows["mia.auc"].passed is None and rows["mia.auc"].threshold is None  # a bare metric


def test_storing_the_same_report_twice_changes_nothing(sqlite_session: Session, job_id: int) -> None:
    verification_results_store(sqlite_session, job_id=job_id, round_=0, report=REPORT)
    first = {m: (r.id, r.passed, r.details) for m, r in _rows(sqlite_session, job_id).items()}
    verification_results_store(sqlite_session, job_id=job_id, round_=0, report=REPORT)
    assert {m: (r.id, r.passed, r.details) for m, r in _rows(sqlite_session, job_id).items()} == first
