"""Hostile input in every form and API field: each is refused with a 4xx or stored and
rendered escaped; none reaches a 500."""
from __future__ import annotations

import json
from datetime import date

import pytest
from django.test import Client

from deletion.web.models import api_token_create

SCRIPT = "<script>alert('x')</script>"
HOSTILE = {
    "script": SCRIPT,
    "attribute": "\" onmouseover=\"alert(1)\" x=\"",
    "sql": "'; DROP TABLE erasure_requests; --",
    "sql_or": "x' OR '1'='1",
    "rtl_override": "\u202egnp.exe",
    "rtl_text": "مريم الحسن",
    "zero_width": "Ma\u200bry\ufeff",
    "nul": "a\x00b",
    "megabyte": "A" * 1_000_000,
    "huge_number": "9" * 40,
    "negative": "-1",
}


def _no_500(response, what: str) -> None:
    assert response.status_code < 500, f"{what}: {response.status_code} {response.content[:300]!r}"


def _valid_request_form(model_name: str) -> dict[str, str]:
    return {"name": "Hostile Test Subject", "aliases": "", "emails": "", "ground": "17(1)(a)",
            "received_at": date.today().isoformat(), "model_name": model_name, "priority": "batch",
            "notes": "", "confirm_duplicate": "yes"}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_values_in_every_form_field_never_reach_a_500(kind, client_as, make_user, model_name,
                                                               submit_request):
    value = HOSTILE[kind]
    officer, reviewer, admin = client_as("officer"), client_as("reviewer"), client_as("admin")
    base = _valid_request_form(model_name)
    for field in base:
        _no_500(officer.post("/requests/new/", {**base, field: value}), f"new request {field}")
    for field, form in (("reason_code", {"reason_code": "17(3)(a)", "note": "n"}),
                        ("note", {"reason_code": "17(3)(a)", "note": "n"})):
        _no_500(reviewer.post(f"/review/{submit_request()}/deny/", {**form, field: value}), f"deny {field}")
    for field in ("months", "reason"):
        form = {"months": "1", "reason": "complex", field: value}
        _no_500(reviewer.post(f"/review/{submit_request()}/extend/", form), f"extend {field}")
    _no_500(officer.post(f"/requests/{submit_request()}/cancel/", {"reason": value}), "cancel reason")
    _no_500(admin.post(f"/models/{model_name}/schedule/", {"batch_window_minutes": value}), "schedule")
    for field in ("name", "kind", "endpoint_url", "secret"):
        form = {"name": f"Recipient {kind} {field}", "kind": "webhook", "endpoint_url": "https://example.org/hook",
                "secret": "s3cret", field: value}
        _no_500(admin.post(f"/models/{model_name}/recipients/", form), f"recipient {field}")
    for field in ("actor", "action", "object", "since", "until", "before", "after"):
        _no_500(officer.get("/audit/", {field: value}), f"audit filter {field}")
        _no_500(officer.get("/audit/export.csv", {field: value}), f"audit export {field}")
    _no_500(officer.get("/requests/", {"status": value}), "request list status")
    for field in ("username", "password"):
        _no_500(Client().post("/login/", {"username": "x", "password": "y", field: value}), f"login {field}")
    if len(value) < 2000:  # a megabyte URL is refused by any real server before Django
        for path in (f"/requests/{value}/", f"/review/{value}/approve/", f"/models/{value}/",
                     f"/certificates/{value}.json"):
            _no_500(officer.get(path), f"path {path[:40]}")


def test_hostile_text_that_is_stored_is_rendered_escaped(client_as, model_name, submit_request):
    reviewer, admin = client_as("reviewer"), client_as("admin")
    reference = submit_request()
    assert reviewer.post(f"/review/{reference}/deny/", {"reason_code": "17(3)(a)", "note": SCRIPT}).status_code == 302
    assert admin.post(f"/models/{model_name}/recipients/",
                      {"name": f"Org {SCRIPT}", "kind": "manual"}).status_code == 302
    pages = [reviewer.get(f"/requests/{reference}/"), reviewer.get(f"/models/{model_name}/"),
             reviewer.get("/audit/", {"actor": SCRIPT})]
    for page in pages:
        assert page.status_code in (200, 400)
        assert SCRIPT.encode() not in page.content
        assert b"&lt;script&gt;" in page.content


def test_an_officer_can_file_a_request_for_a_subject_with_a_right_to_left_name(client_as, model_name):
    response = client_as("officer").post("/requests/new/", {**_valid_request_form(model_name),
                                                            "name": HOSTILE["rtl_text"]})
    assert response.status_code == 302


def test_invisible_formatting_characters_are_refused_beside_the_field(client_as, model_name):
    for value in (HOSTILE["rtl_override"], HOSTILE["zero_width"]):
        response = client_as("officer").post("/requests/new/", {**_valid_request_form(model_name), "name": value})
        assert response.status_code == 400
        assert b'id="id_name_errors"' in response.content


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_values_in_every_api_field_never_reach_a_500(kind, make_user, model_name, submit_request):
    value = HOSTILE[kind]
    officer_token = api_token_create(user=make_user("officer"), name="t")[1]
    reviewer_token = api_token_create(user=make_user("reviewer"), name="t")[1]
    officer = Client(HTTP_AUTHORIZATION=f"Bearer {officer_token}")
    reviewer = Client(HTTP_AUTHORIZATION=f"Bearer {reviewer_token}")
    base = {"name": "Api Hostile Subject", "aliases": [], "emails": [], "ground": "17(1)(a)",
            "received_at": date.today().isoformat(), "model_name": model_name, "priority": "batch", "notes": ""}
    variants = [(field, {**base, field: value}) for field in base]
    variants += [("aliases[]", {**base, "aliases": [value]}), ("emails[]", {**base, "emails": [value]}),
                 ("aliases as text", {**base, "aliases": value})]
    for field, body in variants:
        response = officer.post("/api/v1/requests", json.dumps(body), content_type="application/json")
        _no_500(response, f"create {field}")
        if response.status_code >= 400:
            assert "error" in response.json() and "message" in response.json()["error"]
    for field in ("reason_code", "note"):
        body = {"reason_code": "17(3)(a)", "note": "n", field: value}
        response = reviewer.post(f"/api/v1/requests/{submit_request()}/deny", json.dumps(body),
                                 content_type="application/json")
        _no_500(response, f"deny {field}")
    for field in ("payload", "signature", "public_key_pem"):
        body = {"payload": "{}", "signature": "00", "public_key_pem": "x", field: value}
        _no_500(reviewer.post("/api/v1/certificates/verify", json.dumps(body), content_type="application/json"),
                f"verify {field}")
    _no_500(officer.post("/api/v1/requests", value.encode("utf-8", "surrogatepass"),
                         content_type="application/json"), "raw body")
    if len(value) < 2000:
        for path in (f"/api/v1/requests/{value}", f"/api/v1/certificates/{value}",
                     f"/api/v1/certificates/{value}/verification", f"/api/v1/models/{value}/serving"):
            response = reviewer.get(path)
            _no_500(response, f"path {path[:40]}")
            assert "error" in response.json()


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_values_in_the_case_forms_never_reach_a_500_and_render_escaped(kind, client_as, submit_request,
                                                                             model_name):
    value = HOSTILE[kind]
    officer, reviewer, admin = client_as("officer"), client_as("reviewer"), client_as("admin")
    reference = submit_request()
    for field in ("kind", "method", "preset", "reason_code", "note"):
        form = {"kind": "retry", "method": "kif", "preset": "standard", "note": "n", field: value}
        _no_500(officer.post(f"/requests/{reference}/resolutions/", form), f"resolution {field}")
    _no_500(reviewer.post(f"/requests/{reference}/resolutions/1/decision/", {"decision": value}), "decision")
    _no_500(reviewer.post(f"/requests/{reference}/cancel/", {"reason": value}), "cancel reason")
    for field in ("subject", "body"):
        form = {"subject": "About {reference}", "body": "Dear {subject_name}, {reference}", field: value}
        response = officer.post("/letters/en/completed/", form)
        _no_500(response, f"letter template {field}")
        assert SCRIPT.encode() not in response.content
    for field in ("name", "scope", "days"):
        form = {"name": "note", "scope": "read", "days": "30", field: value}
        response = officer.post("/account/", form)
        _no_500(response, f"token {field}")
        assert SCRIPT.encode() not in response.content
    for field in ("owner_email", "owner_webhook_url"):
        _no_500(admin.post(f"/models/{model_name}/owner/", {field: value}), f"owner {field}")
    _no_500(officer.get(f"/requests/{reference}/letter/{value[:50]}/"), "letter language")
    _no_500(client_as("reviewer").post(f"/models/{model_name}/batch/start/", {"next": value}), "batch next")
