"""The JSON API: token authentication on every route, the request workflow, the
certificate routes, and the error shape."""
from __future__ import annotations

import json
from datetime import date

import pytest
from django.test import Client

from deletion.domain.chains import AUDIT_CHAIN
from deletion.domain.models import ChainHead
from deletion.domain.signing import keyring_from_config, public_key_pem
from deletion.web.domain_session import domain_session
from deletion.web.models import ApiToken, api_token_create

# Every route, with a body where it takes one (placeholders filled per test).
ROUTES = [
    ("post", "/api/v1/requests", {"name": "X", "ground": "17(1)(a)", "received_at": "{today}", "model_name": "{model}"}),
    ("get", "/api/v1/requests/{ref}", None),
    ("post", "/api/v1/requests/{ref}/approve", {}),
    ("post", "/api/v1/requests/{ref}/deny", {"reason_code": "17(3)(a)", "note": ""}),
    ("get", "/api/v1/certificates", None),
    ("get", "/api/v1/certificates/{cert}", None),
    ("get", "/api/v1/certificates/{cert}/verification", None),
    ("post", "/api/v1/certificates/verify", {"payload": "{}", "signature": "00", "public_key_pem": "x"}),
    ("get", "/api/v1/models/{model}/serving", None),
]


def _token_client(make_user, *roles: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {api_token_create(user=make_user(*roles), name='t')[1]}")


def _call(client: Client, method: str, url: str, body: dict | None, **names: str):
    url = url.format(**names)
    if method == "get":
        return client.get(url)
    filled = json.loads(json.dumps(body).replace("{today}", date.today().isoformat())
                        .replace("{model}", names["model"])) if body is not None else None
    return client.post(url, json.dumps(filled), content_type="application/json")


def _audit_seq() -> int:
    with domain_session() as session:
        head = session.get(ChainHead, AUDIT_CHAIN)
        return head.seq if head else 0


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer ert_wrong", "Token ert_x", "Basic dXNlcjpwYXNz"])
def test_every_route_refuses_a_missing_or_wrong_token(header, make_user, model_name, submit_request, certified):
    reference = submit_request()
    client = Client(HTTP_AUTHORIZATION=header) if header else Client()
    before = _audit_seq()
    for method, url, body in ROUTES:
        response = _call(client, method, url, body, ref=reference, cert=certified["certificate_id"],
                         model=model_name, today="")
        assert response.status_code == 401, url
        assert response.json()["error"]["message"]
    assert _audit_seq() == before


def test_a_revoked_token_or_an_inactive_user_is_refused(make_user):
    user = make_user("auditor")
    token, plaintext = api_token_create(user=user, name="t")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert client.get("/api/v1/certificates").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(revoked_at="2026-01-01T00:00:00Z")
    assert client.get("/api/v1/certificates").status_code == 401
    other = api_token_create(user=user, name="t2")[1]
    user.is_active = False
    user.save()
    assert Client(HTTP_AUTHORIZATION=f"Bearer {other}").get("/api/v1/certificates").status_code == 401


def test_tokens_are_stored_only_as_digests(make_user):
    token, plaintext = api_token_create(user=make_user("auditor"), name="t")
    stored = ApiToken.objects.get(pk=token.pk)
    assert plaintext not in (stored.digest, stored.hint) and len(stored.digest) == 64


def test_the_filings_answer_is_the_requests_rendered_as_its_schema(make_user, model_name):
    """The filing answers from the row it wrote, rendered directly: byte for byte what the
    request's own route answers (read back from the database and validated as RequestOut),
    and what RequestOut renders from the answer itself."""
    from deletion.web.api import RequestOut, api

    client = _token_client(make_user, "officer")
    filed = client.post("/api/v1/requests", json.dumps({
        "name": "Answer Shape", "aliases": ["A. Shape"], "ground": "17(1)(b)", "received_at": "2026-11-01",
        "model_name": model_name, "priority": "immediate", "notes": "n"}), content_type="application/json")
    assert filed.status_code == 201 and filed["Content-Type"] == "application/json; charset=utf-8"
    body = filed.json()
    assert body["status"] == "submitted" and body["received_at"] == "2026-11-01T00:00:00Z"
    read = client.get(f"/api/v1/requests/{body['reference']}")
    assert read.status_code == 200 and filed.content == read.content
    validated = RequestOut.model_validate(body).model_dump()
    assert filed.content == api.renderer.render(None, validated, response_status=201).encode()


@pytest.mark.parametrize("role", ["auditor", "reviewer", "admin"])
def test_only_officer_tokens_create_requests(role, make_user, model_name):
    body = {"name": "Someone", "ground": "17(1)(a)", "received_at": date.today().isoformat(), "model_name": model_name}
    before = _audit_seq()
    response = _token_client(make_user, role).post("/api/v1/requests", json.dumps(body), content_type="application/json")
    assert response.status_code == 403
    assert _audit_seq() == before


@pytest.mark.parametrize("role", ["auditor", "officer", "admin"])
def test_only_reviewer_tokens_decide_requests(role, make_user, submit_request):
    reference = submit_request()
    client = _token_client(make_user, role)
    before = _audit_seq()
    assert client.post(f"/api/v1/requests/{reference}/approve").status_code == 403
    assert client.post(f"/api/v1/requests/{reference}/deny", json.dumps({"reason_code": "17(3)(a)"}),
                       content_type="application/json").status_code == 403
    assert _audit_seq() == before


def test_an_officer_files_and_a_reviewer_approves_through_the_api(make_user, model_name):
    officer = _token_client(make_user, "officer")
    body = {"name": "Api Subject One", "aliases": ["A. S. One"], "emails": ["one@example.org"],
            "ground": "17(1)(c)", "received_at": date.today().isoformat(), "model_name": model_name,
            "priority": "immediate"}
    created = officer.post("/api/v1/requests", json.dumps(body), content_type="application/json")
    assert created.status_code == 201, created.content
    data = created.json()
    assert data["status"] == "submitted" and data["reference"].startswith("ER-")
    assert "Api Subject One" not in created.content.decode()
    again = officer.post("/api/v1/requests", json.dumps(body), content_type="application/json")
    assert data["reference"] in again.json()["earlier_requests"]

    reviewer = _token_client(make_user, "reviewer")
    approved = reviewer.post(f"/api/v1/requests/{data['reference']}/approve")
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    # The state machine forbids deciding twice: 409, not 500.
    second = reviewer.post(f"/api/v1/requests/{data['reference']}/deny", json.dumps({"reason_code": "17(3)(a)"}),
                           content_type="application/json")
    assert second.status_code == 409
    assert officer.get(f"/api/v1/requests/{data['reference']}").json()["reviewed_by"].startswith("user:")


def test_domain_errors_map_to_4xx_with_the_field_named(make_user, model_name, submit_request):
    officer = _token_client(make_user, "officer")
    bad_ground = {"name": "X Y", "ground": "nonsense", "received_at": date.today().isoformat(), "model_name": model_name}
    response = officer.post("/api/v1/requests", json.dumps(bad_ground), content_type="application/json")
    assert response.status_code == 422 and response.json()["error"]["field"] == "ground"
    missing = officer.post("/api/v1/requests", json.dumps({"name": "X"}), content_type="application/json")
    assert missing.status_code == 422 and missing.json()["error"]["field"]
    assert officer.get("/api/v1/requests/ER-1999-99999").status_code == 404
    user = make_user("officer", "reviewer")
    own = submit_request(actor=f"user:{user.username}")
    selfie = Client(HTTP_AUTHORIZATION=f"Bearer {api_token_create(user=user, name='t')[1]}")
    assert selfie.post(f"/api/v1/requests/{own}/approve").status_code == 403
    assert officer.post("/api/v1/requests", b"{not json", content_type="application/json").status_code in (400, 422)


def test_certificates_are_listed_fetched_and_verified(make_user, certified):
    client = _token_client(make_user, "auditor")
    listed = client.get("/api/v1/certificates").json()
    assert certified["certificate_id"] in [c["certificate_id"] for c in listed]
    fetched = client.get(f"/api/v1/certificates/{certified['certificate_id']}").json()
    assert fetched["document"]["requests"][0]["reference"] == certified["reference"]
    verdict = client.get(f"/api/v1/certificates/{certified['certificate_id']}/verification").json()
    assert verdict["valid"] is True and verdict["chain_valid"] is True

    from django.conf import settings
    pem = public_key_pem(keyring_from_config(settings.CONFIG).get(fetched["key_id"])).decode()
    offline = {"payload": fetched["payload"], "signature": fetched["signature"], "public_key_pem": pem}
    ok = client.post("/api/v1/certificates/verify", json.dumps(offline), content_type="application/json").json()
    assert ok["valid"] is True
    tampered = {**offline, "payload": fetched["payload"].replace('"asu"', '"npo"')}
    bad = client.post("/api/v1/certificates/verify", json.dumps(tampered), content_type="application/json").json()
    assert bad["valid"] is False and bad["reason"]


def test_the_chain_is_checked_from_the_last_verified_head_and_whole_on_request(make_user, certified,
                                                                              vouched):
    client = _token_client(make_user, "auditor")
    url = f"/api/v1/certificates/{certified['certificate_id']}/verification"

    incremental = client.get(url).json()
    full = client.get(url, {"full": "1"}).json()

    assert incremental["valid"] is True and incremental["chain_valid"] is True
    assert incremental["chain_mode"] == "incremental" and incremental["chain_verified_from"] == vouched
    assert incremental["chain_verified_at"] is not None and incremental["chain_warnings"] == []
    assert incremental["chain_checked"] == incremental["chain_head_seq"] - vouched
    assert incremental["chain_summary"].startswith(f"verified from seq {vouched} (signed verified head of ")
    assert full["chain_valid"] is True and full["chain_mode"] == "full"
    assert full["chain_verified_from"] == 0 and full["chain_checked"] == full["chain_head_seq"]
    assert full["chain_summary"].startswith("verified from seq 1 (the whole chain) to the head")
    assert client.get(url, {"full": "0"}).json()["chain_mode"] == "incremental"
    bad = client.get(url, {"full": "maybe"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "full"


def test_only_an_auditor_or_an_admin_walks_the_whole_chain(make_user, certified):
    url = f"/api/v1/certificates/{certified['certificate_id']}/verification"
    officer = _token_client(make_user, "officer")
    assert officer.get(url).json()["chain_valid"] is True
    refused = officer.get(url, {"full": "1"})
    assert refused.status_code == 403 and "chain.verify_full" in refused.content.decode()
    assert _token_client(make_user, "admin").get(url, {"full": "1"}).json()["chain_mode"] == "full"


def test_a_serving_system_reads_the_checkpoint_to_load(make_user, certified):
    served = _token_client(make_user, "auditor").get(f"/api/v1/models/{certified['model']}/serving").json()
    assert served["digest"] == certified["candidate_digest"] and served["version"] == 2
    assert certified["certificate_id"] in served["certificates"]


def test_the_openapi_document_describes_every_route(make_user):
    schema = _token_client(make_user, "auditor").get("/api/v1/openapi.json").json()
    paths = schema["paths"]
    for route in ("/api/v1/requests", "/api/v1/requests/{reference}", "/api/v1/requests/{reference}/approve",
                  "/api/v1/requests/{reference}/deny", "/api/v1/certificates", "/api/v1/certificates/verify",
                  "/api/v1/certificates/{certificate_id}", "/api/v1/models/{name}/serving"):
        assert route in paths
    assert "BearerAuth" in json.dumps(schema["components"]) or "TokenAuth" in json.dumps(schema["components"])


def test_a_verification_read_rechecks_at_most_its_limit_and_the_full_walk_everything(
        make_user, certified, monkeypatch):
    from deletion.web import certificate_status

    # With a limit of 0 a read re-checks nothing after its starting point (genesis, or a verified
    # head that another test's worker signed: the database is shared, so the chain may be longer).
    monkeypatch.setattr(certificate_status, "PAGE_TAIL_LIMIT", 0)
    client = _token_client(make_user, "auditor")
    url = f"/api/v1/certificates/{certified['certificate_id']}/verification"

    read = client.get(url).json()
    full = client.get(url, {"full": "1"}).json()

    assert read["chain_valid"] is True and read["chain_checked"] == 0
    assert read["chain_unchecked"] == read["chain_head_seq"] - read["chain_verified_from"] >= 1
    assert "left to the worker's check" in read["chain_summary"]
    assert full["chain_checked"] == full["chain_head_seq"] and full["chain_unchecked"] == 0
