"""The pages an officer, a reviewer and an auditor use, through real URLs."""
from __future__ import annotations

from datetime import date

from deletion.web.domain_session import domain_session
from deletion.web.selectors import request_by_reference


def test_every_page_renders_for_an_auditor(client_as, model_name, submit_request):
    reference = submit_request()
    client = client_as("auditor")
    for url in ["/", "/requests/", "/review/", "/audit/", "/models/", f"/models/{model_name}/",
                "/certificates/", f"/requests/{reference}/", f"/requests/{reference}/progress.json"]:
        response = client.get(url)
        assert response.status_code == 200, url


def test_an_officer_submits_a_request_and_sees_it(client_as, model_name):
    client = client_as("officer")
    response = client.post("/requests/new/", {
        "name": "Ada Example", "aliases": "A. Example", "emails": "ada@example.org", "ground": "17(1)(b)",
        "received_at": date.today().isoformat(), "model_name": model_name, "priority": "batch", "notes": "",
    })
    assert response.status_code == 302, response.content[:2000]
    reference = response["Location"].strip("/").split("/")[-1]
    page = client.get(response["Location"])
    assert reference.encode() in page.content
    assert b"Ada Example" not in page.content  # the page shows references, never the name


def test_the_form_shows_errors_beside_the_field(client_as, model_name):
    response = client_as("officer").post("/requests/new/", {
        "name": "", "ground": "17(1)(b)", "received_at": "2999-01-01", "model_name": model_name, "priority": "batch",
    })
    assert response.status_code == 400
    assert b'id="id_name_errors"' in response.content
    assert b'id="id_received_at_errors"' in response.content


def test_a_second_request_for_the_same_subject_warns_first(client_as, model_name, submit_request):
    submit_request(name="Grace Duplicate-Subject")
    client = client_as("officer")
    form = {"name": "grace  duplicate-subject", "ground": "17(1)(a)", "received_at": date.today().isoformat(),
            "model_name": model_name, "priority": "batch"}
    warned = client.post("/requests/new/", form)
    assert warned.status_code == 409
    assert b"Earlier requests for the same subject" in warned.content
    confirmed = client.post("/requests/new/", {**form, "confirm_duplicate": "yes"})
    assert confirmed.status_code == 302


def test_a_reviewer_approves_and_denies_from_the_queue(client_as, submit_request):
    approve_ref, deny_ref = submit_request(), submit_request()
    client = client_as("reviewer")
    assert approve_ref.encode() in client.get("/review/").content
    assert client.post(f"/review/{approve_ref}/approve/").status_code == 302
    denied = client.post(f"/review/{deny_ref}/deny/", {"reason_code": "17(3)(e)", "note": "legal claim pending"})
    assert denied.status_code == 302
    with domain_session() as session:
        assert request_by_reference(session, approve_ref).status == "approved"
        row = request_by_reference(session, deny_ref)
        assert (row.status, row.reason_code) == ("denied", "17(3)(e)")


def test_a_reviewer_cannot_approve_their_own_request(client_as, make_user, submit_request):
    user = make_user("officer", "reviewer")
    reference = submit_request(actor=f"user:{user.username}")
    response = client_as(user=user).post(f"/review/{reference}/approve/")
    assert response.status_code == 403
    with domain_session() as session:
        assert request_by_reference(session, reference).status == "submitted"


def test_a_reviewer_extends_a_deadline_with_a_reason(client_as, submit_request):
    reference = submit_request()
    response = client_as("reviewer").post(f"/review/{reference}/extend/", {"months": "2", "reason": "complex request"})
    assert response.status_code == 302
    with domain_session() as session:
        assert request_by_reference(session, reference).extension_months == 2


def test_the_api_docs_are_served_without_a_cdn(client_as):
    client = client_as("auditor")
    schema = client.get("/api/v1/openapi.json")
    assert schema.status_code == 200
    assert "/api/v1/requests" in schema.json()["paths"]
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200
    assert b"cdn." not in docs.content


def test_a_completed_request_shows_its_evidence_and_certificate(client_as, certified):
    client = client_as("auditor")
    page = client.get(f"/requests/{certified['reference']}/").content.decode()
    assert "signature and hash verified" in page
    assert 'class="chart"' in page and "control level" in page
    assert "latent.residual_ratio" in page
    assert "Request completed" in page  # the timeline, from the audit events
    download = client.get(f"/certificates/{certified['certificate_id']}.json")
    assert download.status_code == 200 and "attachment" in download["Content-Disposition"]
    document = download.json()
    assert document["certificate_id"] == certified["certificate_id"] and document["payload"].startswith("{")


def test_the_certificate_list_says_what_its_chain_check_read(client_as, certified, vouched):
    client = client_as("auditor")

    page = client.get("/certificates/").content.decode()
    full = client.get("/certificates/", {"full": "1"}).content.decode()

    assert 'data-chain-mode="incremental"' in page
    assert f"Verified from seq {vouched} (signed verified head of " in page
    assert 'href="?full=1">Verify the whole chain</a>' in page
    assert 'data-chain-mode="full"' in full and "Verified from seq 1 (the whole chain) to the head" in full
    assert "the whole chain verifies" in full
    assert client.get("/certificates/", {"full": "yes"}).status_code == 400

    officer = client_as("officer")
    assert "Verify the whole chain" not in officer.get("/certificates/").content.decode()
    refused = officer.get("/certificates/", {"full": "1"})
    assert refused.status_code == 403 and "auditor or an admin" in refused.content.decode()


def test_the_registry_shows_lineage_serving_pointer_and_embodied_certificates(client_as, certified):
    page = client_as("auditor").get(f"/models/{certified['model']}/").content.decode()
    assert page.count('class="lineage"') == 1 and "v2 · serving" in page and "v1 · retired" in page
    assert certified["certificate_id"][:12] in page


def test_an_admin_changes_the_batch_window_and_it_is_audited(client_as, model_name):
    client = client_as("admin")
    assert client.post(f"/models/{model_name}/schedule/", {"batch_window_minutes": "6"}).status_code == 302
    audit = client.get("/audit/", {"action": "model.schedule_changed", "object": model_name}).content.decode()
    assert "model.schedule_changed" in audit and '&quot;batch_window_minutes&quot;:6' in audit


def test_the_audit_trail_filters_and_exports(client_as, submit_request):
    reference = submit_request()
    client = client_as("auditor")
    page = client.get("/audit/", {"object": reference}).content.decode()
    assert "request.submitted" in page and "hashes and links on this page recomputed" in page
    csv_body = b"".join(client.get("/audit/export.csv", {"object": reference}).streaming_content).decode()
    assert csv_body.splitlines()[0].startswith("seq,at,actor") and reference in csv_body
    import json as _json
    exported = _json.loads(b"".join(client.get("/audit/export.json", {"object": reference}).streaming_content))
    assert [e["action"] for e in exported] == ["request.submitted"]
    full = client.get("/audit/", {"verify": "chain"}).content.decode()
    assert "The chain verifies" in full


def test_the_certificate_list_rechecks_at_most_its_limit_and_says_what_it_left(client_as, certified,
                                                                              monkeypatch):
    from deletion.web import certificate_status

    monkeypatch.setattr(certificate_status, "PAGE_TAIL_LIMIT", 0)  # re-check nothing after the start
    client = client_as("auditor")

    page = client.get("/certificates/").content.decode()
    full = client.get("/certificates/", {"full": "1"}).content.decode()

    assert "0 certificates re-checked" in page and "left to the worker&#x27;s check" in page
    assert "the whole chain verifies" not in page and "verifies as far as this page checked" in page
    assert "the whole chain verifies" in full
