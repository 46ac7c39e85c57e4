"""The deadline reminders, run from beat: ``manage.py send_reminders`` in a child process.

Reminders go to staff accounts (their e-mail addresses and on/off switches live in
the web's tables) through Django's e-mail backends, so the sending is the web side's
code; the worker only starts it, and never imports Django itself.  The child's
output (counts only) is logged; a failure is logged and retried at the next tick,
and a reminder is recorded only once it went, so none is lost or sent twice.

A worker holds no copy of the web's DJANGO_SECRET_KEY (a process that could forge
officers' session cookies has no business holding it; deletion/domain/config.py), and
Django refuses to start without one.  The command signs nothing (no session, no token,
no signed link: a reminder names a case page the officer signs in to), so where the
worker has none, the child gets an ephemeral random key that lives only as long as it.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: the worker's own, plus an ephemeral key where it has none."""
    out = dict(os.environ if env is None else env)
    if not out.get("DJANGO_SECRET_KEY") and not out.get("DJANGO_SECRET_KEY_FILE"):
        out["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(48)
    return out


def reminders_run() -> int:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "manage.py"), "send_reminders"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False, env=child_env())
    if done.returncode != 0:
        log.error("send_reminders exited %s: %s", done.returncode, done.stderr[-1000:])
        return 0
    log.info("reminders: %s", done.stdout.strip())
    first = done.stdout.split(maxsplit=1)[0] if done.stdout.strip() else "0"
    return int(first) if first.isdigit() else 0
