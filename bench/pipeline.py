"""Time to certificate for one request, by stage, through the real pipeline.

Runs ``python -m workers.embedded demo`` (SQLite, the embedded broker, a real
Celery worker process and beat) in a private ``VAR_DIR`` whose demo assets
are the benchmark's own corpus and base model, so nothing is trained again.
Afterwards the stage boundaries are read from that database: the audit
trail's timestamps for the request and its job, the job's own stage timings
and the certificate's signing time.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.assets import REPO_ROOT, Assets
from bench.console import Console
from bench.settings import BenchSettings

logger = logging.getLogger(__name__)

_TOOK = re.compile(r"erasure took ([0-9.]+) s from submission")


def _label(event: Any) -> str:
    """``job.stage`` events name the stage a worker claimed (``details`` has from/to)."""
    if event.action == "job.stage":
        details = event.details_dict
        return f"{details.get('from')} -> {details.get('to')} claimed"
    return str(event.action)


def _stages(database: Path) -> dict[str, Any]:
    from sqlalchemy import select

    from deletion.domain.db import make_engine, session_scope
    from deletion.domain.models import AuditEvent, Certificate, Job

    engine = make_engine(f"sqlite:///{database}")
    try:
        with session_scope(engine) as session:
            job = session.scalars(select(Job).order_by(Job.id.desc())).first()
            if job is None:
                raise RuntimeError("the pipeline created no job")
            certificate = session.scalars(select(Certificate).where(Certificate.job_id == job.id)).first()
            events = session.scalars(select(AuditEvent).order_by(AuditEvent.seq)).all()
            submitted = next((e.at for e in events if e.action == "request.submitted"), None)
            timeline = [(_label(e), e.at) for e in events
                        if e.action.startswith(("request.", "certificate.", "checkpoint.", "corpus."))
                        or (e.object_type == "job" and e.object_ref == str(job.id))]
            # Each row: the time from the previous event to this one, named by what ended it.
            stages, previous, since = [], submitted, "request.submitted"
            for label, at in timeline:
                if previous is not None and at > previous:
                    stages.append({"stage": f"{since} .. {label}", "seconds": (at - previous).total_seconds()})
                    previous, since = at, label
            return {
                "job_stage": job.stage,
                "job_timings": dict(job.timings or {}),
                "submission_to_certificate_s": (certificate.signed_at - submitted).total_seconds()
                if certificate is not None and submitted is not None else None,
                "certificate": certificate is not None,
                "stages": stages,
            }
    finally:
        engine.dispose()


def _embedded_env(settings: BenchSettings, assets: Assets, var: Path, *, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """A fresh private VAR_DIR whose demo assets are the benchmark's own corpus and base (so
    nothing is trained again), and the environment of `workers.embedded` run in it."""
    shutil.rmtree(var, ignore_errors=True)
    for name, source in (("corpus", assets.corpus_dir), ("base", assets.base_dir)):
        shutil.copytree(source, var / "demo-assets" / settings.preset / name)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "CHECKPOINT_DIR", "CORPUS_DIR",
                        "SIGNING_KEY_FILE", "SIGNING_KEYRING_DIR", *drop)}
    env["VAR_DIR"] = str(var)
    import torch

    # The worker processes get the bench's torch thread count (`--threads`): on a shared
    # machine oversubscribed threads slow torch down by an order of magnitude.
    env.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    return env


def time_to_certificate(settings: BenchSettings, assets: Assets, *, work: Path, console: Console) -> dict[str, Any]:
    var = work / "pipeline-var"
    env = _embedded_env(settings, assets, var)
    command = [sys.executable, "-m", "workers.embedded", "demo", "--preset", settings.preset,
               "--timeout", str(int(settings.pipeline_timeout_s))]
    with console.task("one request through the real pipeline"):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=settings.pipeline_timeout_s + 300, check=False)
        wall = time.perf_counter() - started
    (work / "pipeline-demo.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        lines = done.stdout.strip().splitlines()
        tail = next((line for line in lines if line.startswith("DEMO FAILED")), lines[-1] if lines else "")
        partial: dict[str, Any] = {}
        if (var / "erasure.sqlite3").is_file():
            partial = _stages(var / "erasure.sqlite3")
        return {"not_measured": f"`workers.embedded demo` exited {done.returncode}: {tail[:300]} "
                                f"(log: {work / 'pipeline-demo.log'})",
                "process_wall_s": wall, "partial": partial}
    took = _TOOK.search(done.stdout)
    result = {"preset": settings.preset, "process_wall_s": wall,
              "demo_reported_s": float(took.group(1)) if took else None,
              **_stages(var / "erasure.sqlite3")}
    shutil.rmtree(var, ignore_errors=True)
    return result


def service_walk(settings: BenchSettings, assets: Assets, *, work: Path, console: Console) -> dict[str, Any]:
    """`settings.continual_requests` demo people filed one after another as separate
    immediate requests through the real embedded pipeline (`workers.embedded demo
    --requests N`): per request, certified or not, seconds from submission to the end of
    its job, the verifier's retained ratio vs its parent, and the serving model's accuracy
    on the walk's one fixed sample of retained questions, over v1's on it (`workers.walk`)."""
    var = work / "walk-var"
    env = _embedded_env(settings, assets, var, drop=("VERIFICATION_POLICY_FILE",))
    rows_file = work / "walk.json"
    rows_file.unlink(missing_ok=True)
    count = settings.continual_requests
    command = [sys.executable, "-m", "workers.embedded", "demo", "--preset", settings.preset,
               "--timeout", str(int(settings.pipeline_timeout_s)), "--requests", str(count),
               "--walk-json", str(rows_file)]
    with console.task(f"{count} requests one after another through the real pipeline"):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=count * (settings.pipeline_timeout_s + 120) + 300, check=False)
        wall = time.perf_counter() - started
    (work / "walk-demo.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr, encoding="utf-8")
    if not rows_file.is_file():
        lines = done.stdout.strip().splitlines()
        return {"not_measured": f"`workers.embedded demo --requests {count}` exited {done.returncode} "
                                f"without a walk table: {(lines[-1] if lines else '')[:300]}"}
    import json

    rows = json.loads(rows_file.read_text(encoding="utf-8"))
    from workers.demo import render_walk

    render_walk(rows)  # fills in each row's ratio since v1 (its fixed-sample accuracy over v1's)
    shutil.rmtree(var, ignore_errors=True)
    return {"requests": count, "rows": rows, "certified": sum(bool(r["certified"]) for r in rows),
            "process_wall_s": round(wall, 1), "exit": done.returncode}
