"""What the Docker build context holds, checked without a Docker engine.

`.dockerignore` is applied here with Docker's own rules (moby's patternmatcher, which
both the classic builder and BuildKit use): each line is cleaned like a path, `!`
re-includes, `*` and `?` stay inside one path segment, `**` spans any number of
them, a pattern that matches a parent folder matches everything under it, and the
last matching line wins.  The rules are applied to a tree that holds every tracked
file of the repository plus every secret a checkout can hold: none of the secrets may
be in the context, everything the Dockerfile copies must be.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What a developer's or an operator's checkout holds besides the tracked files.
SECRETS = (
    "secrets/signing_key.pem", "secrets/encryption_key", "secrets/blind_index_key",
    "secrets/django_secret_key", "secrets/keyring/abc.pub.pem",
    ".env", ".env.production",
    "var/keys/encryption.key", "var/keys/blind-index.key", "var/keys/signing-ed25519.pem",
    "var/keys/django-secret", "var/erasure.sqlite3", "var/erasure.sqlite3-wal",
    "var/broker.sqlite3", "var/demo-credentials.json", "var/checkpoints/demo/v1/model.safetensors",
    "var/checkpoints/_work/job-3/sets-abc.aesgcm",
    ".venv/bin/python", ".venv/lib/python3.11/site-packages/x.py",
    ".git/config", ".git/objects/ab/cdef",
    "deletion/.env", "workers/secrets/token", "unlearning/__pycache__/x.cpython-311.pyc",
    "deletion/keys/old.pem", "migrations/var/erasure.sqlite3",
)
# What the run stage copies (Dockerfile) and the image must therefore receive.
NEEDED = ("deletion/wsgi.py", "deletion/settings.py", "deletion/domain/models.py",
          "workers/tasks.py", "unlearning/methods/kif_remote.py",
          "migrations/versions/0001_domain_tables.py", "migrations/env.py", "manage.py",
          "alembic.ini", "requirements.txt", "gunicorn.conf.py")


# --------------------------------------------------------------- Docker's matcher


def read_dockerignore(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per line, as moby's ignorefile.ReadAll + patternmatcher do."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        if exception:
            line = line[1:].strip()
        line = _clean(line)
        if len(line) > 1 and line.startswith("/"):
            line = line[1:]
        rules.append((exception, re.compile(_regex(line))))
    return rules


def _clean(path: str) -> str:
    """Go's filepath.Clean for a slash path: no empty, `.` or trailing segments."""
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == ".." and parts and parts[-1] != "..":
            parts.pop()
        else:
            parts.append(part)
    cleaned = "/".join(parts)
    return ("/" + cleaned) if path.startswith("/") else (cleaned or ".")


def _regex(pattern: str) -> str:
    out, i = "^", 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*" and pattern[i + 1:i + 2] == "*":
            i += 2
            if pattern[i:i + 1] == "/":
                i += 1
            out += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "[":
            end = pattern.index("]", i)
            out += "[" + pattern[i + 1:end].replace("!", "^", 1) + "]"
            i = end
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(ch)
        i += 1
    return out + "$"


def excluded(rules: list[tuple[bool, re.Pattern[str]]], path: str) -> bool:
    """moby's MatchesOrParentMatches: the last rule that matches the path or a parent wins."""
    parts = path.split("/")
    parents = ["/".join(parts[:i + 1]) for i in range(len(parts) - 1)]
    matched = False
    for exception, regex in rules:
        if exception != matched:
            continue  # an include that already matched, or an exception with nothing to undo
        if regex.match(path) or any(regex.match(parent) for parent in parents):
            matched = not exception
    return matched


# ------------------------------------------------------------------------ tests


@cache
def tracked_files() -> tuple[str, ...]:
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    return tuple(done.stdout.split())


def build_context(ignore_text: str) -> set[str]:
    rules = read_dockerignore(ignore_text)
    return {path for path in (*tracked_files(), *SECRETS, *NEEDED) if not excluded(rules, path)}


def test_the_matcher_follows_dockers_documented_examples() -> None:
    rules = read_dockerignore("*/temp*\n*/*/temp*\ntemp?\n*.md\n!README*.md\nREADME-secret.md\n"
                              "**/*.go\n/abs\n")
    assert excluded(rules, "somedir/temporary.txt")
    assert excluded(rules, "somedir/subdir/temporary.txt")
    assert excluded(rules, "tempa")
    assert not excluded(rules, "README.md") and excluded(rules, "README-secret.md")
    assert excluded(rules, "a/b/c.go") and excluded(rules, "c.go")
    assert excluded(rules, "abs/inner") and not excluded(rules, "temp")


def test_without_the_dockerignore_the_context_would_hold_every_secret() -> None:
    """The check can fail: today's main had no .dockerignore and `COPY . .`."""
    assert set(SECRETS) <= build_context("")


def test_no_key_secret_database_credential_venv_or_git_reaches_the_build_context() -> None:
    context = build_context((ROOT / ".dockerignore").read_text(encoding="utf-8"))
    assert not set(SECRETS) & context
    for path in context:
        assert not path.startswith(("secrets/", "var/", ".venv/", ".git/", "tests/", "docs/"))
        assert not path.endswith((".pem", ".key", ".sqlite3", ".pyc")) and ".env" not in path
    assert set(NEEDED) <= context


def test_the_image_is_built_in_two_stages_and_copies_named_folders_only() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    stages = re.findall(r"^FROM \S+ AS (\w+)", dockerfile, flags=re.M)
    assert stages == ["build", "run"]
    run_stage = dockerfile.split("AS run", 1)[1]
    copies = re.findall(r"^COPY (?!--from)(.+)$", run_stage, flags=re.M)
    sources = [s for line in copies for s in line.split()[:-1]]
    assert sources and "." not in sources
    context = build_context((ROOT / ".dockerignore").read_text(encoding="utf-8"))
    for source in sources:  # everything copied is in the context
        assert any(p == source.rstrip("/") or p.startswith(source) for p in context), source
    # Compilers stay in the build stage; the run stage gets the finished environment.
    assert "build-essential" not in run_stage and "COPY --from=build /opt/venv" in run_stage
    assert "HF_HUB_OFFLINE=1" in run_stage and "\nUSER erasure" in run_stage


@pytest.mark.parametrize("name", [".env", "secrets/"])
def test_secrets_are_never_committed(name: str) -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT, check=False)
    assert ignored.returncode == 0, f"{name} is not in .gitignore"
