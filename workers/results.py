"""Verification results: one row per (job, round, metric), upserted.

A metric can be judged by more than one check (a two-sided check: an upper bound and
"not below strangers").  Its row's verdict is then the conjunction of its checks, the
threshold and comparator shown are those of the check that failed (else of the first),
and `details["checks"]` lists every check with its own verdict, so no bound's failure is
lost.  A verification delivered twice stores the same rows once; the JSON report of
each round also stays in the job's work directory until the job ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.models import VerificationResult


def verification_results_store(session: Session, *, job_id: int, round_: int,
                               report: Mapping[str, Any]) -> list[VerificationResult]:
    """Upsert the policy's checks (with threshold and verdict) and the bare metrics."""
    policy = report.get("policy") or {}
    existing = {
        row.metric: row
        for row in session.scalars(select(VerificationResult).where(
            VerificationResult.job_id == job_id, VerificationResult.round == round_))
    }
    by_metric: dict[str, list[Mapping[str, Any]]] = {}
    for check in report.get("checks", []):
        by_metric.setdefault(str(check.get("metric") or check["name"]), []).append(check)
    checked = set(by_metric)
    rows = []
    for metric, checks in by_metric.items():
        verdicts = [c.get("passed") for c in checks if c.get("passed") is not None]
        failed = [c for c in checks if c.get("passed") is False]
        shown = next((c for c in failed if c.get("decides_pass", True)), failed[0] if failed else checks[0])
        details: dict[str, Any] = {"check": shown.get("name"), "decides_pass": shown.get("decides_pass", True)}
        if shown.get("rule"):  # how an unmeasured or underpowered check was decided
            details["rule"] = str(shown["rule"])
        if len(checks) > 1:
            details["checks"] = [{"check": c.get("name"), "threshold": c.get("threshold"),
                                  "comparator": c.get("comparator"), "passed": c.get("passed"),
                                  "decides_pass": c.get("decides_pass", True)} for c in checks]
        rows.append(_upsert(session, existing, job_id=job_id, round_=round_, metric=metric,
                            value=shown.get("value"), threshold=shown.get("threshold"),
                            comparator=shown.get("comparator"),
                            passed=all(bool(v) for v in verdicts) if verdicts else None,
                            policy=policy, details=details))
    # Metrics no check judges (timings aside) are still evidence worth keeping.
    for metric, value in (report.get("metrics") or {}).items():
        if metric not in checked and (value is None or isinstance(value, int | float)):
            rows.append(_upsert(session, existing, job_id=job_id, round_=round_, metric=metric,
                                value=value, threshold=None, comparator=None, passed=None,
                                policy=policy, details=None))
    session.flush()
    return rows


def _upsert(session: Session, existing: dict[str, VerificationResult], *, job_id: int,
            round_: int, metric: str, value: Any, threshold: Any, comparator: Any, passed: Any,
            policy: Mapping[str, Any], details: dict[str, Any] | None) -> VerificationResult:
    row = existing.get(metric)
    if row is None:
        row = VerificationResult(job_id=job_id, round=round_, metric=metric)
        session.add(row)
        existing[metric] = row
    row.value = None if value is None else float(value)
    row.threshold = None if threshold is None else float(threshold)
    row.comparator = None if comparator is None else str(comparator)[:4]
    row.passed = None if passed is None else bool(passed)
    row.policy_name = str(policy.get("name", ""))
    row.policy_version = str(policy.get("version", ""))
    row.details = details
    return row
