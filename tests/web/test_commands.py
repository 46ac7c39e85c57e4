"""The management commands: migrate_all, ensure_demo_users, create_api_token, certificates,
audit_chain, chain_heads_check."""
from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from deletion.domain.certificates import certificate_verify_one
from deletion.domain.signing import public_key_from_pem
from tests.conftest import drop_database, fresh_database_url

REPO_ROOT = Path(__file__).resolve().parents[2]


def _manage(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, check=False, timeout=120)


def test_migrate_all_builds_an_empty_sqlite_file_with_both_sets_of_tables(tmp_path):
    url = f"sqlite:///{tmp_path / 'embedded.sqlite3'}"
    for _ in range(2):  # the second run finds nothing to do
        done = _manage(url, "migrate_all", "-v", "0")
        assert done.returncode == 0, done.stderr[-3000:]
    with sqlite3.connect(tmp_path / "embedded.sqlite3") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"erasure_requests", "audit_events", "alembic_version", "auth_user", "django_session",
            "web_api_tokens"} <= tables


def test_migrate_all_builds_an_empty_postgresql_database():
    url = fresh_database_url("erasure_migrate_all", migrate=False)
    try:
        done = _manage(url, "migrate_all", "-v", "0")
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        drop_database(url)


def test_ensure_demo_users_is_idempotent_and_its_passwords_sign_in(tmp_path):
    out1, out2 = io.StringIO(), io.StringIO()
    call_command("ensure_demo_users", "--json", "--file", str(tmp_path / "c.json"), stdout=out1)
    call_command("ensure_demo_users", "--json", "--file", str(tmp_path / "c.json"), stdout=out2)
    first, second = json.loads(out1.getvalue()), json.loads(out2.getvalue())
    assert first == second and set(first) == {"demo-officer", "demo-reviewer", "demo-auditor", "demo-admin"}
    assert oct((tmp_path / "c.json").stat().st_mode & 0o777) == "0o600"
    client = Client()
    assert client.post("/login/", {"username": "demo-reviewer", "password": first["demo-reviewer"]}).status_code == 302
    assert "reviewer" in client.get("/").content.decode()


def test_create_api_token_prints_a_working_token_once(make_user):
    user = make_user("auditor")
    out = io.StringIO()
    call_command("create_api_token", user.username, "--name", "serving", stdout=out)
    token = out.getvalue().strip()
    assert Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/certificates").status_code == 200
    with pytest.raises(CommandError):
        call_command("create_api_token", make_user().username)  # a user without a role
    with pytest.raises(CommandError):
        call_command("create_api_token", "nobody-by-this-name")


def test_certificates_verify_and_export_wrap_the_domain_cli(certified, tmp_path):
    out = io.StringIO()
    call_command("certificates", "verify", stdout=out)
    assert "certificate chain OK" in out.getvalue()
    call_command("certificates", "export", certified["certificate_id"], "--out", str(tmp_path), stdout=io.StringIO())
    payload = (tmp_path / "payload.json").read_text(encoding="utf-8")
    document = json.loads((tmp_path / "certificate.json").read_text(encoding="utf-8"))
    key = public_key_from_pem((tmp_path / "public_key.pem").read_bytes())
    assert certificate_verify_one(payload, document["signature"], key).ok
    with pytest.raises(CommandError):
        call_command("certificates", "export", "DC-1999-999999", "--out", str(tmp_path / "x"), stdout=io.StringIO())


def test_audit_chain_seal_then_verify_and_a_seal_under_another_key_fails(submit_request, tmp_path):
    import dataclasses

    from django.conf import settings
    from django.test import override_settings

    from tests.web.test_audit_chain_status import KEY

    submit_request()
    keyed = dataclasses.replace(settings.CONFIG, audit_seal_key=KEY.current, var_dir=tmp_path)
    with override_settings(CONFIG=keyed):
        out = io.StringIO()
        call_command("audit_chain", "seal", stdout=out)
        assert "sealed seq" in out.getvalue()
        out = io.StringIO()
        call_command("audit_chain", "verify", stdout=out)
        assert "audit chain OK" in out.getvalue() and "0 events unsealed" in out.getvalue()
    rotated_away = dataclasses.replace(keyed, audit_seal_key=b"r" * 32)
    with override_settings(CONFIG=rotated_away):
        out = io.StringIO()
        with pytest.raises(CommandError) as failed:
            call_command("audit_chain", "verify", "--full", stdout=out)
    assert failed.value.returncode == 1 and "which this process does not hold" in out.getvalue()


def test_chain_heads_check_compares_the_export_and_names_a_missing_file(submit_request, tmp_path):
    import dataclasses

    from django.conf import settings
    from django.test import override_settings

    from deletion.domain.chain_heads import chain_heads_export
    from deletion.domain.signing import signer_from_config
    from deletion.web.domain_session import domain_engine

    submit_request()
    cfg = dataclasses.replace(settings.CONFIG, chain_head_export_dir=tmp_path)
    chain_heads_export(engine=domain_engine(), signer=signer_from_config(cfg), export_dir=tmp_path)
    with override_settings(CONFIG=cfg):
        out = io.StringIO()
        call_command("chain_heads_check", stdout=out)
        assert "chain heads: 1 exported records" in out.getvalue() and "OK" in out.getvalue()
        out = io.StringIO()
        with pytest.raises(CommandError) as missing:
            call_command("chain_heads_check", "--file", str(tmp_path / "nope.jsonl"), stdout=out)
        assert missing.value.returncode == 2 and "nope.jsonl: cannot read" in out.getvalue()
