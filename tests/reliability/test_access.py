"""Secrets and access: nothing secret in the repository, the signing key never touched
by the web process, and no API route answers without a valid token.

The routes come from the OpenAPI document itself, so a route added later is covered
without anyone remembering to list it here (tests/web/test_api.py keeps a fixed list).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from deletion.web.models import api_token_create
from tests.web import conftest as web

# The web tests' fixtures (Django on the session's PostgreSQL database), used by name.
web_database_url, django_db_setup, _db_access, make_user = (
    web.web_database_url, web.django_db_setup, web._db_access, web.make_user)
model_name, submit_request, certified = web.model_name, web.submit_request, web.certified

REPO_ROOT = Path(__file__).resolve().parents[2]
# Headers that must not open any route: none, malformed, unknown, wrong scheme, revoked.
BAD_HEADERS = [None, "Bearer", "Bearer ", "Bearer ert_wrong", "Bearer ert_" + "A" * 43,
               "Token ert_x", "Basic dXNlcjpwYXNz", "bearer ert_wrong", "Bearer ert_x\x00y"]
# What a secret looks like when someone commits one.
SECRET_PATTERNS = {
    "PEM private key": re.compile(r"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY-----"),
    "API token": re.compile(r"\bert_[A-Za-z0-9_-]{40,}"),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[baprs]-[A-Za-z0-9-]{10,}"),
    "inline key value": re.compile(
        r"(?i)(?:ENCRYPTION_KEY|BLIND_INDEX_KEY|DJANGO_SECRET_KEY|SECRET_KEY)\s*[=:]\s*"
        r"['\"]?[A-Za-z0-9+/_=-]{32,}"),
}


def _token_client(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_token_create(user=user, name='rel')[1]}")


def _audit_actions_since(seq: int) -> list[str]:
    from sqlalchemy import select

    from deletion.domain.models import AuditEvent
    from deletion.web.domain_session import domain_session

    with domain_session() as session:
        return list(session.scalars(select(AuditEvent.action).where(AuditEvent.seq > seq).order_by(AuditEvent.seq)))


def _audit_seq() -> int:
    from deletion.domain.chains import AUDIT_CHAIN
    from deletion.domain.models import ChainHead
    from deletion.web.domain_session import domain_session

    with domain_session() as session:
        head = session.get(ChainHead, AUDIT_CHAIN)
        return head.seq if head else 0


def _openapi(make_user: Any) -> dict[str, Any]:
    response = _token_client(make_user("auditor")).get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def _every_operation(schema: dict[str, Any], values: dict[str, str]) -> list[tuple[str, str]]:
    operations = []
    for template, item in schema["paths"].items():
        url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], template)
        operations += [(method, url) for method in item if method in ("get", "post", "put",
                                                                      "patch", "delete")]
    return operations


def test_every_documented_api_route_refuses_a_missing_wrong_or_revoked_token(
    make_user: Any, model_name: str, submit_request: Any, certified: dict[str, Any],
) -> None:
    schema = _openapi(make_user)
    values = {"reference": submit_request(), "certificate_id": certified["certificate_id"],
              "name": model_name}
    operations = _every_operation(schema, values)
    revoked_token, revoked = api_token_create(user=make_user("officer", "reviewer", "auditor"),
                                              name="revoked")
    revoked_token.revoked_at = datetime.now(UTC)
    revoked_token.save()
    inactive = make_user("officer", "reviewer", "auditor")
    inactive_plain = api_token_create(user=inactive, name="inactive")[1]
    inactive.is_active = False
    inactive.save()

    before = _audit_seq()
    refused = 0
    for header in [*BAD_HEADERS, f"Bearer {revoked}", f"Bearer {inactive_plain}"]:
        client = Client(HTTP_AUTHORIZATION=header) if header is not None else Client()
        for method, url in operations:
            response = (client.get(url) if method == "get" else
                        getattr(client, method)(url, "{}", content_type="application/json"))
            assert response.status_code == 401, (method, url, header)
            refused += 1
    # An anonymous or malformed call leaves no trace in the trail; a known token that is
    # revoked or belongs to a deactivated account is a security event, one row per attempt.
    new = _audit_actions_since(before)
    assert set(new) <= {"token.refused"}
    assert 0 < len(new) <= 2 * len(operations)
    assert len(operations) >= 9  # the nine routes tests/web/test_api.py knows of, at least
    sys.stderr.write(f"\n{refused} unauthenticated calls over {len(operations)} documented "
                     "operations: all 401\n")


def test_the_web_process_never_opens_or_creates_the_signing_key(
    make_user: Any, certified: dict[str, Any],
) -> None:
    key_file = Path(settings.CONFIG.signing_key_file).resolve()
    existed = key_file.exists()
    opened: list[str] = []
    watch = _opens_of(key_file, opened)
    _AUDIT.append(watch)
    try:
        officer = Client()
        officer.force_login(make_user("officer", "reviewer", "auditor"))
        api = _token_client(make_user("auditor"))
        cert = certified["certificate_id"]
        pages = [officer.get("/certificates/"), officer.get(f"/certificates/{cert}.json"),
                 officer.get(f"/models/{certified['model']}/"), officer.get("/audit/"),
                 api.get("/api/v1/certificates"), api.get(f"/api/v1/certificates/{cert}"),
                 api.get(f"/api/v1/certificates/{cert}/verification")]
        exported = json.loads(pages[1].content)
        verify = api.post("/api/v1/certificates/verify", json.dumps({
            "payload": exported.get("payload", ""), "signature": exported.get("signature", ""),
            "public_key_pem": exported.get("public_key_pem", "x")}), content_type="application/json")
    finally:
        _AUDIT.remove(watch)
    assert [p.status_code for p in pages] == [200] * len(pages)
    assert verify.status_code < 500
    assert opened == []
    assert key_file.exists() == existed


def test_the_open_watcher_sees_a_file_being_read(tmp_path: Path) -> None:
    """The control for the test above: the same watcher does see an open."""
    target = tmp_path / "signing.pem"
    target.write_bytes(b"not a key")
    opened: list[str] = []
    _AUDIT.append(_opens_of(target, opened))
    try:
        target.read_bytes()
    finally:
        _AUDIT.pop()
    assert len(opened) == 1


def _opens_of(target: Path, opened: list[str]) -> Any:
    def watch(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args and isinstance(args[0], str | bytes | Path):
            path = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
            if Path(path).name == target.name and Path(path).resolve() == target:
                opened.append(path)

    return watch


# sys.addaudithook cannot be removed: install one dispatcher once, add hooks to it.
_AUDIT: list[Any] = []


def _dispatch(event: str, args: tuple[Any, ...]) -> None:
    for hook in list(_AUDIT):
        hook(event, args)


sys.addaudithook(_dispatch)


def test_no_tracked_file_holds_a_private_key_or_a_token() -> None:
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=REPO_ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    findings, scanned = [], 0
    for name in filter(None, tracked):
        path = REPO_ROOT / name
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        scanned += 1
        for kind, pattern in SECRET_PATTERNS.items():
            findings += [f"{name}: {kind}" for _ in pattern.finditer(text)]
    assert scanned > 50
    assert findings == []


@pytest.mark.parametrize("kind", sorted(SECRET_PATTERNS))
def test_the_secret_scanner_finds_each_kind_of_secret(kind: str) -> None:
    samples = {
        "PEM private key": "-----BEGIN PRIVATE" + " KEY-----\nMC4CAQAwBQYDK2VwBCIEI\n",
        "API token": "token = ert_" + "x1" * 22,
        "AWS access key": "AKIA" + "ABCDEFGHIJKLMNOP",
        "GitHub token": "ghp_" + "a" * 36,
        "Slack token": "xoxb-" + "1234567890-abc",
        "inline key value": "ENCRYPTION_KEY=" + "Zm9v" * 11,
    }
    assert SECRET_PATTERNS[kind].search(samples[kind])
