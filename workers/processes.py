"""Child processes of the embedded runner: start, watch, stop cleanly.

Children run in their own session so that a Ctrl-C in the terminal reaches
only the supervisor, which then stops them in order (web first, worker last, so
a running stage gets its warm shutdown).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def run_step(args: Sequence[str], *, env: Mapping[str, str] | None = None) -> None:
    """Run one set-up step to completion; raise with its exit status on failure."""
    log.info("running %s", " ".join(args))
    done = subprocess.run(list(args), cwd=REPO_ROOT, env=dict(env or os.environ), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed with exit status {done.returncode}")


def worker_command(*, queues: str = "default,gpu", concurrency: int = 2,
                   hostname: str = "embedded@%h", loglevel: str = "INFO") -> list[str]:
    return [PYTHON, "-m", "celery", "-A", "workers.celery_app", "worker", "-Q", queues,
            "--concurrency", str(concurrency), "--hostname", hostname, "--loglevel", loglevel,
            "--without-gossip", "--without-mingle"]


def beat_command(*, schedule_file: Path, loglevel: str = "INFO") -> list[str]:
    return [PYTHON, "-m", "celery", "-A", "workers.celery_app", "beat",
            "--schedule", str(schedule_file), "--loglevel", loglevel]


def web_command(*, bind: str) -> list[str]:
    """gunicorn with the repository's gunicorn.conf.py (threaded workers: long exports)."""
    return [PYTHON, "-m", "gunicorn", "deletion.wsgi:application",
            "--config", str(REPO_ROOT / "gunicorn.conf.py"), "--bind", bind, "--workers", "2"]


@dataclass
class ProcessGroup:
    """Named children started together and stopped together."""

    env: Mapping[str, str]
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, args: Sequence[str], *, log_file: Path | None = None) -> None:
        out = None
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            out = open(log_file, "ab")  # noqa: SIM115 - lives as long as the child
        self.children[name] = subprocess.Popen(
            list(args), cwd=REPO_ROOT, env=dict(self.env), stdout=out, stderr=out,
            start_new_session=True,
        )
        log.info("started %s (pid %s)", name, self.children[name].pid)

    def first_exited(self) -> tuple[str, int] | None:
        for name, child in self.children.items():
            code = child.poll()
            if code is not None:
                return name, code
        return None

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """SIGTERM the children in reverse start order (web, beat, then the worker, whose
        warm shutdown lets a running stage finish), then wait; kill what hangs."""
        for name, child in reversed(list(self.children.items())):
            if child.poll() is None:
                log.info("stopping %s", name)
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name, child in self.children.items():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s; killing its process group", name, timeout_s)
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            if child.stdout is not None:
                child.stdout.close()
        self.children.clear()
