"""The officer's case through the pages and the API: tokens made in the UI, sign-in
lock-outs, the API docs behind a login, the audited duplicate check, cancelling after
approval, reply letters, evidence packs, batch start times, honest progress, and the
deadline reminders."""
from __future__ import annotations

import io
import json
import threading
import zipfile
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.conf import settings
from django.core import mail
from django.core.management import call_command
from django.test import Client
from sqlalchemy import select

from deletion.domain.evidence import evidence_verify
from deletion.domain.models import AuditEvent
from deletion.domain.services import job_claim, job_reject, request_approve
from deletion.domain.services.batches import batch_start_now
from deletion.web.domain_session import domain_session
from deletion.web.models import ApiToken
from deletion.web.selectors import request_by_reference


def _events(action: str, ref: str | None = None) -> list[AuditEvent]:
    with domain_session() as session:
        query = select(AuditEvent).where(AuditEvent.action == action)
        if ref is not None:
            query = query.where(AuditEvent.object_ref == ref)
        rows = list(session.scalars(query.order_by(AuditEvent.seq)))
        session.expunge_all()
        return rows


# ------------------------------------------------------------------- API tokens


def test_a_token_made_in_the_ui_works_until_it_is_revoked(make_user, submit_request):
    """Fails on the old code: there was no account page, tokens came only from a command."""
    user = make_user("officer")
    client = Client()
    client.force_login(user)
    response = client.post("/account/", {"name": "serving eu-1", "scope": "read", "days": "30"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    plaintext = response.context["created"]
    assert plaintext.startswith("ert_") and plaintext.encode() in response.content
    assert plaintext.encode() not in client.get("/account/").content  # shown once
    token = ApiToken.objects.get(user=user)
    assert token.scope == "read" and token.expires_at > datetime.now(UTC) + timedelta(days=29)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    reference = submit_request()
    assert api.get(f"/api/v1/requests/{reference}").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=None)
    api.get(f"/api/v1/requests/{reference}")
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None
    # a read token cannot submit, whatever its user's roles
    body = {"name": "Scoped Out", "ground": "17(1)(a)", "received_at": datetime.now(UTC).date().isoformat(),
            "model_name": "x"}
    assert api.post("/api/v1/requests", json.dumps(body), content_type="application/json").status_code == 403
    assert client.post(f"/account/tokens/{token.pk}/revoke/").status_code == 302
    refused = api.get(f"/api/v1/requests/{reference}")
    assert refused.status_code == 401 and refused.json()["error"]["message"]
    assert [e.details_dict.get("scope") for e in _events("token.created", token.hint)] == ["read"]
    assert _events("token.revoked", token.hint) and _events("token.refused", token.hint)


def test_an_expired_token_gets_401(make_user):
    from deletion.web.models import api_token_create

    token, plaintext = api_token_create(user=make_user("auditor"), name="old", scope="read", days=1)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=datetime.now(UTC) - timedelta(seconds=1))
    assert Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}").get("/api/v1/certificates").status_code == 401
    assert _events("token.refused", token.hint)[-1].details_dict["state"] == "expired"


def test_a_user_cannot_pick_a_scope_beyond_their_roles_or_revoke_anothers_token(make_user):
    from deletion.web.models import api_token_create

    auditor = Client()
    auditor.force_login(make_user("auditor"))
    response = auditor.post("/account/", {"name": "x", "scope": "review", "days": "30"})
    assert response.status_code == 400
    other, _ = api_token_create(user=make_user("officer"), name="theirs")
    assert auditor.post(f"/account/tokens/{other.pk}/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=other.pk).revoked_at is None


# ------------------------------------------------------------------ sign-in lock-out


def test_repeated_failed_sign_ins_lock_the_account_and_the_release_is_audited(make_user):
    """Fails on the old code: nothing throttled sign-ins."""
    user = make_user("reviewer")
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        assert client.post("/login/", {"username": user.username, "password": "wrong"}).status_code in (400, 429)
    locked = client.post("/login/", {"username": user.username, "password": "correct horse battery staple"})
    assert locked.status_code == 429 and b"locked" in locked.content
    assert _events("auth.locked_out", f"user:{user.username}")
    call_command("unlock_account", user.username, stdout=io.StringIO())
    assert _events("auth.lockout_released", f"user:{user.username}")
    ok = client.post("/login/", {"username": user.username, "password": "correct horse battery staple"})
    assert ok.status_code == 302


def test_a_lockout_of_a_name_that_is_no_account_records_no_name():
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):
        client.post("/login/", {"username": "someone@example.org", "password": "x"})
    events = _events("auth.locked_out")
    assert events and events[-1].object_ref.startswith("unknown:")
    assert all("someone" not in e.details and "someone" not in e.object_ref for e in events)


# ------------------------------------------------------------------- API docs


@pytest.mark.parametrize("path", ["/api/v1/openapi.json", "/api/v1/docs"])
def test_the_api_description_does_not_answer_anonymously(path, client_as, make_user):
    """Fails on the old code: both answered 200 to anyone."""
    from deletion.web.models import api_token_create

    assert Client().get(path).status_code == 401
    assert client_as("auditor").get(path).status_code == 200
    plaintext = api_token_create(user=make_user("auditor"), name="docs")[1]
    assert Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}").get(path).status_code == 200


# ------------------------------------------------------------- duplicate check


def test_the_forms_duplicate_warning_is_audited(client_as, model_name, submit_request):
    """Fails on the old code: the 409 listed earlier references without any audit row."""
    earlier = submit_request(name="Duplicate Dora Check")
    officer = client_as("officer")
    response = officer.post("/requests/new/", {
        "name": "duplicate dora  check", "ground": "17(1)(a)", "model_name": model_name, "priority": "batch",
        "received_at": datetime.now(UTC).date().isoformat()})
    assert response.status_code == 409 and earlier.encode() in response.content
    assert any(earlier in e.details_dict["answered"] for e in _events("request.duplicate_check"))


# -------------------------------------------------------- cancel after approval


def test_an_officer_cannot_cancel_an_approved_request_and_a_reviewer_needs_a_reason(client_as, submit_request):
    """Fails on the old code: any officer canceled it, approved or not, with no reason."""
    reference = submit_request()
    with domain_session() as session:
        request_approve(session, actor="user:reviewer-x", reference=reference)
    assert client_as("officer").post(f"/requests/{reference}/cancel/", {"reason": "x"}).status_code == 403
    reviewer = client_as("reviewer")
    assert reviewer.post(f"/requests/{reference}/cancel/", {"reason": ""}).status_code == 400
    with domain_session() as session:
        assert request_by_reference(session, reference).status == "approved"
    assert reviewer.post(f"/requests/{reference}/cancel/", {"reason": "withdrawn in writing"}).status_code == 302
    with domain_session() as session:
        assert request_by_reference(session, reference).status == "canceled"


def test_a_reviewer_who_filed_the_request_cannot_cancel_it_after_approval(make_user, model_name):
    from deletion.domain.services.requests import request_submit

    both = make_user("officer", "reviewer")
    with domain_session() as session:
        reference = request_submit(session, actor=f"user:{both.username}", actor_id=both.pk, name="Own Case",
                                   ground="17(1)(a)", received_at=datetime.now(UTC), model_name=model_name).reference
        request_approve(session, actor="user:reviewer-x", reference=reference)
    client = Client()
    client.force_login(both)
    assert client.post(f"/requests/{reference}/cancel/", {"reason": "mine"}).status_code == 403


# ---------------------------------------------------------------- letters, evidence


def test_the_reply_letter_names_the_certificate_in_both_languages(certified, client_as):
    officer = client_as("officer")
    for language in ("en", "de"):
        page = officer.get(f"/requests/{certified['reference']}/letter/{language}/")
        assert page.status_code == 200 and certified["certificate_id"].encode() in page.content
        assert page["Cache-Control"] == "no-store" and b"Cert Subject" in page.content
        pdf = officer.get(f"/requests/{certified['reference']}/letter/{language}.pdf")
        assert pdf.status_code == 200 and pdf["Content-Type"] == "application/pdf"
        assert pdf.content.startswith(b"%PDF")
    issued = _events("letter.issued", certified["reference"])
    assert [(e.details_dict["language"], e.details_dict["format"]) for e in issued][-4:] == [
        ("en", "html"), ("en", "pdf"), ("de", "html"), ("de", "pdf")]
    assert all("Cert Subject" not in e.details for e in issued)


def test_a_template_with_an_unknown_placeholder_is_refused_on_save(client_as):
    response = client_as("officer").post("/letters/de/completed/", {
        "subject": "Antrag {reference}", "body": "Guten Tag {subject_name}, {reference} {schuhgroesse}"})
    assert response.status_code == 400 and b"{schuhgroesse}" in response.content


def test_the_evidence_pack_downloads_and_verifies_offline(certified, client_as, tmp_path):
    response = client_as("auditor").get(f"/requests/{certified['reference']}/evidence.zip")
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    report = evidence_verify(response.content)
    assert report.ok, report.lines
    names = zipfile.ZipFile(io.BytesIO(response.content)).namelist()
    assert "certificate/payload.json" in names and "lineage.json" in names
    path = tmp_path / "pack.zip"
    path.write_bytes(response.content)
    out = io.StringIO()
    call_command("evidence", "verify", str(path), stdout=out)
    assert "evidence pack VERIFIES" in out.getvalue()
    (tmp_path / "bad.zip").write_bytes(b"nope")
    with pytest.raises(SystemExit) as exit_code:
        call_command("evidence", "verify", str(tmp_path / "bad.zip"), stdout=io.StringIO())
    assert exit_code.value.code == 2
    assert _events("evidence.exported", certified["reference"])


# -------------------------------------------------------- batches and progress


def test_an_approved_batch_request_shows_its_start_and_a_reviewer_starts_it_now(client_as, tmp_path):
    from deletion.domain.services.requests import request_submit
    from tests.web.test_case_permissions import _fresh_model

    model = _fresh_model(tmp_path)
    with domain_session() as session:
        reference = request_submit(session, actor="user:someone-else", name="Batched Bea", ground="17(1)(a)",
                                   received_at=datetime.now(UTC), model_name=model).reference
        request_approve(session, actor="user:reviewer-x", reference=reference)
    reviewer = client_as("reviewer")
    page = reviewer.get(f"/requests/{reference}/").content.decode()
    assert 'id="batch-start"' in page and "UTC" in page and "batch window of 24 hours" in page
    assert 'id="batch-start-now"' in page and "data-countdown" in page
    assert f'data-model="{model}"' in reviewer.get("/").content.decode()
    response = reviewer.post(f"/models/{model}/batch/start/", {"next": f"/requests/{reference}/"})
    assert response.status_code == 302 and response["Location"] == f"/requests/{reference}/"
    with domain_session() as session:
        assert request_by_reference(session, reference).status == "scheduled"
    assert _events("batch.started", model)


def test_a_rejected_job_shows_its_outcome_not_a_step_counter(client_as, submit_request, tmp_path):
    from tests.web.test_case_permissions import _fresh_model

    model = _fresh_model(tmp_path)
    from deletion.domain.services.requests import request_submit

    with domain_session() as session:
        reference = request_submit(session, actor="user:someone-else", name="Rejected Rita", ground="17(1)(a)",
                                   received_at=datetime.now(UTC), model_name=model).reference
        request_approve(session, actor="user:reviewer-x", reference=reference)
    with domain_session() as session:
        job = batch_start_now(session, actor="user:reviewer-x", model_name=model)
        job_claim(session, job_id=job.id, expected_stage="queued", next_stage="building_sets")
        job.progress_step, job.progress_total = 9, 9
        job_reject(session, job_id=job.id, reason="verification failed: membership inference")
    client = client_as("officer")
    feed = client.get(f"/requests/{reference}/progress.json").json()
    assert feed["job"]["outcome"] == "rejected" and feed["job"]["step"] is None and feed["job"]["percent"] is None
    page = client.get(f"/requests/{reference}/").content.decode()
    assert "step 9 of 9" not in page and "rejected" in page and 'id="resolution-form"' in page


# ------------------------------------------------------------------- reminders


class _Hook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append({"body": json.loads(body), "signature": self.headers.get("X-Erasure-Signature")})
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def test_reminders_go_by_e_mail_and_webhook_once_and_respect_the_switch(make_user, model_name, monkeypatch):
    from deletion.domain.services.requests import request_submit
    from deletion.web.models import StaffPreferences

    officer, reviewer = make_user("officer"), make_user("reviewer")
    officer.email, reviewer.email = "officer@example.org", "reviewer@example.org"
    officer.save()
    reviewer.save()
    StaffPreferences.objects.create(user=reviewer, reminders_enabled=False)
    received = datetime.now(UTC) - timedelta(days=25)
    with domain_session() as session:
        reference = request_submit(session, actor=f"user:{officer.username}", actor_id=officer.pk,
                                   name="Reminded Rosa", ground="17(1)(a)", received_at=received,
                                   model_name=model_name).reference
        request_approve(session, actor=f"user:{reviewer.username}", actor_id=reviewer.pk, reference=reference)
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(settings, "EMAIL_BACKEND", "django.core.mail.backends.locmem.EmailBackend")
    monkeypatch.setattr(settings, "CONFIG", replace(settings.CONFIG, event_webhook_secret="s3cret",
                                                    event_webhook_url=f"http://127.0.0.1:{server.server_port}/"))
    _Hook.received.clear()
    mail.outbox = []
    try:
        call_command("send_reminders", stdout=io.StringIO())
        call_command("send_reminders", stdout=io.StringIO())  # nothing new
    finally:
        server.shutdown()
    mine = [m for m in mail.outbox if reference in m.subject]
    assert len(mine) == 1 and mine[0].to == ["officer@example.org"] and "in 7 days" in mine[0].subject
    assert "Reminded Rosa" not in mine[0].body
    hooks = [h for h in _Hook.received if h["body"]["reference"] == reference]
    assert len(hooks) == 1 and hooks[0]["body"]["kind"] == "7d" and hooks[0]["signature"].startswith("sha256=")
    assert [e.details_dict["kind"] for e in _events("request.deadline_reminder", reference)] == ["7d"]
