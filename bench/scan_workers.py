"""A sharded corpus scanned by a real Celery worker with N processes (`workers.scan`).

    python -m bench.scan_workers --corpus DIR --subjects 100 --processes 2 --work /tmp/x

Starts `celery worker -Q default -c N` on a server-less filesystem broker in `--work`,
warms it up with one untimed run, then times `workers.scan.build_sets_sharded` with the
coordinator only waiting (`participate=False`): every shard is scanned by the worker's
processes.  Prints one JSON line; stops the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "VAR_DIR": str(work / "var"), "CHECKPOINT_DIR": str(work / "checkpoints"),
        "CELERY_BROKER_URL": f"filesystem://{work / 'broker'}",
        "DATABASE_URL": f"sqlite:///{work / 'var' / 'bench.sqlite3'}",
        "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
    })
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--subjects", type=int, default=100)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    env = _env(args.work)
    if os.environ.get("BENCH_SCAN_CHILD") != "1":
        shutil.rmtree(args.work, ignore_errors=True)  # no task left over from an earlier run
    (args.work / "var").mkdir(parents=True, exist_ok=True)
    (args.work / "checkpoints").mkdir(parents=True, exist_ok=True)
    if os.environ.get("BENCH_SCAN_CHILD") != "1":
        # Re-run this module with the worker's settings, so the coordinator sends to its broker.
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-Q", "default",
             "-c", str(args.processes), "--pool", "prefork", "--without-heartbeat", "--without-gossip",
             "--without-mingle", "-l", os.environ.get("BENCH_SCAN_WORKER_LOG", "WARNING")],
            env=env, cwd=args.work, stdout=subprocess.DEVNULL, stderr=(args.work / "worker.log").open("wb"),
            start_new_session=True)
        try:
            done = subprocess.run([sys.executable, "-m", "bench.scan_workers", *(argv or sys.argv[1:])],
                                  env={**env, "BENCH_SCAN_CHILD": "1"}, cwd=args.work, capture_output=True,
                                  text=True, check=False, timeout=3600)
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=20)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr[-2000:])
        return done.returncode
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(relativeCreated)d %(message)s")
    from unlearning.sets_benchmark import benchmark_people, corpus_bytes, subjects_of
    from workers.runtime import celery, config
    from workers.scan import build_sets_sharded, celery_dispatch

    subjects = subjects_of(benchmark_people(), args.subjects)
    dispatch = celery_dispatch(celery())
    times = []
    for round_ in range(args.rounds + 1):  # round 0 warms the worker up (imports, page cache)
        started = time.perf_counter()
        sets = build_sets_sharded(args.corpus, subjects, scan_dir=config().checkpoint_dir / "_work" / "bench" / "scan",
                                  seed=0, dispatch=dispatch, participate=False, timeout_s=1800)
        if round_:
            times.append(time.perf_counter() - started)
    size_mb = corpus_bytes(args.corpus) / 1e6
    sys.stdout.write(json.dumps({"processes": args.processes, "corpus_mb": round(size_mb, 1),
                                 "subjects": args.subjects, "seconds": min(times), "mb_per_s": size_mb / min(times),
                                 "forget": len(sets.forget), "retain": len(sets.retain),
                                 "forget_digest": sets.forget_digest, "retain_digest": sets.retain_digest}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
