"""`make demo`: one whole erasure, headless, through the real worker.

An officer submits a request for one of the demo people (priority immediate),
a second officer approves it, the batch scheduler makes the job, and the
worker process (started by `workers.embedded`) builds the sets, unlearns,
verifies, certifies and promotes.  Prints the certificate id, the verdicts and
where the new checkpoint is; the subject appears only by request reference.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from deletion.domain import registry
from deletion.domain.audit import audit_verify
from deletion.domain.certificates import certificate_get_for_job, certificate_verify_chain
from deletion.domain.config import Config
from deletion.domain.db import session_scope
from deletion.domain.models import Checkpoint, Job, VerificationReport, VerificationResult, utcnow
from deletion.domain.services.requests import request_approve, request_get, request_submit
from deletion.domain.signing import keyring_load
from workers.bootstrap import DEMO_MODEL
from workers.runtime import engine

OFFICER = "user:demo-officer"
REVIEWER = "user:demo-reviewer"
FINAL_STAGES = ("done", "rejected")


@dataclass
class DemoOutcome:
    ok: bool
    reason: str = ""
    reference: str = ""
    job_id: int | None = None
    certificate_id: str | None = None
    checkpoint: str | None = None
    checkpoint_version: int | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    chains: str = ""
    seconds: float = 0.0
    retained: float | None = None  # the candidate's retained-fact accuracy
    retained_ratio: float | None = None  # ... over the checkpoint it was made from

    def walk_row(self) -> dict[str, Any]:
        return {"reference": self.reference, "job": self.job_id, "certified": self.certificate_id is not None,
                "ok": self.ok, "seconds": round(self.seconds, 1), "checkpoint_version": self.checkpoint_version,
                "retained_accuracy": self.retained, "retained_ratio_vs_parent": self.retained_ratio,
                "failed": [c["metric"] for c in self.checks if not c["passed"]], "reason": self.reason}

    def render(self) -> str:
        lines = [f"request   {self.reference or '-'} (job {self.job_id})"]
        if self.checks:
            lines.append("verdicts")
            for c in self.checks:
                verdict = "pass" if c["passed"] else "FAIL"
                value = "-" if c["value"] is None else f"{c['value']:.4f}"
                threshold = "-" if c["threshold"] is None else f"{c['threshold']:.4f}"
                lines.append(f"  {verdict}  {c['metric']:<32} {value:>9} {c['comparator'] or '':>2}"
                             f" {threshold:>9}")
        if self.certificate_id:
            lines.append(f"certificate {self.certificate_id}")
            lines.append(f"checkpoint  v{self.checkpoint_version} serving at {self.checkpoint}")
        if self.chains:
            lines.append(self.chains)
        lines.append(f"erasure took {self.seconds:.1f} s from submission")
        lines.append("DEMO OK" if self.ok else f"DEMO FAILED: {self.reason}")
        return "\n".join(lines) + "\n"


def _pick_subject(session: Any, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A trained demo person none of whose records has been erased yet (and not in `skip`:
    people a walk already filed, whose request may have been rejected)."""
    model = registry.model_get(session, name=DEMO_MODEL)
    if model.corpus is None:
        raise RuntimeError("the demo model has no corpus; run the bootstrap")
    corpus_path = Path(registry.corpus_current(session, name=model.corpus.name).path)
    erased = registry.corpus_tombstoned_ids(session, name=model.corpus.name)
    with (corpus_path.parent / "people.jsonl").open(encoding="utf-8") as handle:
        people = [json.loads(line) for line in handle if line.strip()]
    for person in people:
        if person["person_id"] not in skip and not any(rid.startswith(person["person_id"] + "-") for rid in erased):
            return dict(person)
    raise RuntimeError("every demo person has already been erased")


def walk_people(count: int) -> list[dict[str, Any]]:
    """The demo people a walk of `count` requests files, in order: `submit_and_approve`'s
    picks, each person skipped after their turn (fewer where the demo people run out)."""
    people: list[dict[str, Any]] = []
    with session_scope(engine()) as session:
        for _ in range(count):
            try:
                people.append(_pick_subject(session, frozenset(p["person_id"] for p in people)))
            except RuntimeError:
                break
    return people


def submit_and_approve(*, priority: str = "immediate", filed: set[str] | None = None) -> str:
    """File and approve a request for a fresh demo person (four eyes: two actors); the
    person's demo id is added to `filed`, and no one in it is filed again."""
    with session_scope(engine()) as session:
        person = _pick_subject(session, frozenset(filed or ()))
        if filed is not None:
            filed.add(person["person_id"])
        request = request_submit(
            session, actor=OFFICER, name=person["name"], aliases=person.get("aliases", ()),
            emails=[person["email"]] if person.get("email") else (), ground="17(1)(b)",
            received_at=utcnow(), model_name=DEMO_MODEL, priority=priority,
        )
        reference = request.reference
    with session_scope(engine()) as session:
        request_approve(session, actor=REVIEWER, reference=reference)
    return reference


def _progress_line(job: Job) -> str:
    step = f" {job.progress_step}/{job.progress_total}" if job.progress_total else ""
    return f"  job {job.id}: {job.stage:<14}{(job.progress_stage or ''):<14}{step:<14}"


def wait_for_job(reference: str, *, timeout_s: float,
                 watch: Callable[[], tuple[str, int] | None] | None = None,
                 echo: bool = True) -> tuple[int | None, str]:
    """Poll until the request's job ends; returns (job id, final stage or the reason)."""
    from workers.scheduler import batches_schedule

    deadline = time.monotonic() + timeout_s
    job_id: int | None = None
    shown = ""
    # A terminal gets one line redrawn in place; a log file gets one line per change.
    end = "\r" if sys.stdout.isatty() else "\n"
    while time.monotonic() < deadline:
        if watch is not None and (exited := watch()) is not None:
            return job_id, f"{exited[0]} exited with status {exited[1]}"
        with session_scope(engine()) as session:
            request = request_get(session, reference=reference)
            job = session.scalars(select(Job).where(Job.requests.any(id=request.id))
                                  .order_by(Job.id.desc())).first()
            state = None if job is None else (job.id, job.stage, job.dead_lettered_at,
                                              _progress_line(job))
        if state is None:
            # What beat does every few seconds, without the wait (outside the session
            # above: SQLite allows one writer, and this opens its own transaction).
            batches_schedule()
        else:
            job_id, stage, dead, line = state
            if echo and line != shown:
                sys.stdout.write(line.rstrip() + end)
                sys.stdout.flush()
                shown = line
            if stage in FINAL_STAGES or dead is not None:
                if echo and end == "\r":
                    sys.stdout.write("\n")
                return job_id, stage
        time.sleep(1.0)
    return job_id, f"timed out after {timeout_s:.0f} s"


def run_demo(*, config: Config, timeout_s: float, filed: set[str] | None = None,
             watch: Callable[[], tuple[str, int] | None] | None = None) -> DemoOutcome:
    started = time.monotonic()
    try:
        reference = submit_and_approve(filed=filed)
    except Exception as exc:  # noqa: BLE001 - reported as the demo's failure reason
        return DemoOutcome(ok=False, reason=f"submission failed: {exc}")
    sys.stdout.write(f"submitted and approved {reference}; waiting for the worker\n")
    job_id, final = wait_for_job(reference, timeout_s=timeout_s, watch=watch)
    outcome = DemoOutcome(ok=False, reference=reference, job_id=job_id,
                          seconds=time.monotonic() - started)
    if job_id is None or final != "done":
        outcome.reason = f"job ended {final!r}"
    with session_scope(engine()) as session:
        if job_id is not None:
            job = session.get_one(Job, job_id)
            if job.error:
                outcome.reason += f" ({job.error})"
            outcome.checks = [
                {"metric": r.metric, "value": r.value, "threshold": r.threshold,
                 "comparator": r.comparator, "passed": r.passed}
                for r in session.scalars(select(VerificationResult).where(
                    VerificationResult.job_id == job_id,
                    VerificationResult.round == job.verification_round,
                    VerificationResult.passed.is_not(None)).order_by(VerificationResult.metric))
            ]
            report = session.scalars(select(VerificationReport.report)
                                     .where(VerificationReport.job_id == job_id)
                                     .order_by(VerificationReport.id.desc())).first()
            if report:
                metrics = json.loads(report).get("metrics", {})
                outcome.retained = metrics.get("utility.retain_accuracy")
                outcome.retained_ratio = metrics.get("utility.retain_ratio")
            certificate = certificate_get_for_job(session, job_id=job_id)
            if certificate is not None and job.candidate_checkpoint_id is not None:
                checkpoint = session.get_one(Checkpoint, job.candidate_checkpoint_id)
                outcome.certificate_id = certificate.certificate_id
                outcome.checkpoint = checkpoint.directory
                outcome.checkpoint_version = checkpoint.version
        certificates = certificate_verify_chain(session, keyring_load(config.signing_keyring_dir))
        audit = audit_verify(session)
        outcome.chains = (f"certificate chain: {'verifies' if certificates.ok else 'BROKEN'}"
                          f" ({certificates.checked} rows); audit chain: "
                          f"{'verifies' if audit.ok else 'BROKEN'} ({audit.checked} events)")
    outcome.ok = final == "done" and outcome.certificate_id is not None \
        and certificates.ok and audit.ok
    if final == "done" and not outcome.ok:
        outcome.reason = "a chain does not verify"
    return outcome


def render_walk(rows: list[dict[str, Any]]) -> str:
    """The table of a walk of requests filed one after another (`demo --requests N`).

    `vs parent` is each job's verifier: its candidate over the checkpoint it was made from,
    on that job's own sample of retained questions.  `retained` is the accuracy of the
    model serving after the request (the promoted checkpoint, or the unchanged one when the
    request was not certified) on one fixed sample of retained questions about people the
    walk does not file (`workers.walk`), the same questions for every row; row 0 is the
    model serving before the first request ("v1").  `since v1` is a row's `retained` over
    v1's, each row's its own ratio of two readings of one sample, not a product of the
    per-job ratios (which compounds their sampling noise).  Sets `retained_ratio_since_v1`
    in each row.  The verifier's own retained accuracy stays in the rows (the JSON)."""
    start = next((r for r in rows if r.get("retained_accuracy_fixed_v1") is not None), None)
    v1 = None if start is None else float(start["retained_accuracy_fixed_v1"])
    label = f"v{start.get('start_version') or 1}" if start is not None else "v1"
    questions = next((r["retained_questions"] for r in rows if r.get("retained_questions")), None)
    lines = ["", "walk: one request after another, each immediate, on the serving model"]
    if v1 is not None:
        lines.append(f"retained: one fixed sample of {questions} retained questions (people this walk does not "
                     f"file), asked greedily of {label} before the first request and of the model serving after "
                     f"each; since {label} = retained / {label}'s; vs parent = the job's verifier, on its own sample")
    else:
        errors = sorted({r["retained_fixed_error"] for r in rows if r.get("retained_fixed_error")})
        lines.append("retained: the fixed sample was not scored" + (f" ({'; '.join(errors)})" if errors else ""))
    lines.append(f"  {'#':>2}  {'request':<14} {'certified':<9} {'seconds':>8} {'serving':>7} "
                 f"{'vs parent':>9} {'retained':>8} {'since ' + label:>8}  failed checks")
    if v1 is not None:
        lines.append(f"  {0:>2}  {'(before)':<14} {'-':<9} {'-':>8} {label:>7} {'-':>9} {_fmt(v1):>8} "
                     f"{_fmt(1.0):>8}  -")
    for number, row in enumerate(rows, 1):
        fixed = row.get("retained_accuracy_fixed")
        row["retained_ratio_since_v1"] = fixed / v1 if fixed is not None and v1 else None
        serving = row.get("serving_version") or row["checkpoint_version"]
        version = f"v{serving}" if serving else "-"
        lines.append(
            f"  {number:>2}  {row['reference'] or '-':<14} {'yes' if row['certified'] else 'NO':<9} "
            f"{row['seconds']:>8.1f} {version:>7} {_fmt(row['retained_ratio_vs_parent']):>9} {_fmt(fixed):>8} "
            f"{_fmt(row['retained_ratio_since_v1']):>8}  {', '.join(row['failed']) or '-'}")
    certified = sum(r["certified"] for r in rows)
    lines.append(f"certified {certified} of {len(rows)}")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
