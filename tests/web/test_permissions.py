"""Role x action matrix: every action a role may not take is refused (403, or a redirect
to the login page for anonymous visitors) and changes nothing; every action it may take
goes through.  "Nothing changes" is read from the audit chain head (every domain change
appends an event) and from the objects the action targets."""
from __future__ import annotations

from datetime import date

import pytest
from django.test import Client

from deletion.domain.chains import AUDIT_CHAIN
from deletion.domain.models import ChainHead
from deletion.web.domain_session import domain_session
from deletion.web.roles import CAPABILITIES
from deletion.web.selectors import model_by_name, request_by_reference

ROLES = ["anonymous", "no-role", "officer", "reviewer", "auditor", "admin"]

# name -> (capability, method, url template, form data template)
ACTIONS = {
    "submit": ("request.submit", "post", "/requests/new/",
               {"name": "Matrix Subject", "ground": "17(1)(a)", "received_at": "{today}",
                "model_name": "{model}", "priority": "batch"}),
    "cancel": ("request.cancel", "post", "/requests/{ref}/cancel/", {"reason": "withdrawn"}),
    "approve": ("request.review", "post", "/review/{ref}/approve/", {}),
    "deny": ("request.review", "post", "/review/{ref}/deny/", {"reason_code": "17(3)(a)", "note": "n"}),
    "extend": ("request.review", "post", "/review/{ref}/extend/", {"months": "1", "reason": "complex"}),
    "schedule": ("settings.edit", "post", "/models/{model}/schedule/", {"batch_window_minutes": "12"}),
    "recipient": ("settings.edit", "post", "/models/{model}/recipients/",
                  {"name": "Matrix Recipient {ref}", "kind": "manual"}),
}
READ_PAGES = ["/", "/requests/", "/review/", "/audit/", "/models/", "/models/{model}/", "/certificates/",
              "/requests/{ref}/", "/requests/{ref}/progress.json", "/audit/export.csv"]


def _client(role: str, client_as) -> Client:
    if role == "anonymous":
        return Client()
    if role == "no-role":
        return client_as()
    return client_as(role)


def _allowed(role: str, capability: str) -> bool:
    return role in CAPABILITIES[capability]


def _state(reference: str, model_name: str) -> tuple[int, str, int | None, int]:
    with domain_session() as session:
        head = session.get(ChainHead, AUDIT_CHAIN)
        request = request_by_reference(session, reference)
        model = model_by_name(session, model_name)
        return (head.seq if head else 0, request.status, request.extension_months, model.batch_window_minutes)


def _fill(value: str, **names: str) -> str:
    return value.format(**names)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_each_role_may_do_exactly_what_its_capabilities_allow(role, action, client_as, model_name, submit_request):
    capability, method, url, data = ACTIONS[action]
    reference = submit_request()
    names = {"ref": reference, "model": model_name, "today": date.today().isoformat()}
    before = _state(reference, model_name)
    response = getattr(_client(role, client_as), method)(
        _fill(url, **names), {k: _fill(v, **names) for k, v in data.items()})
    if _allowed(role, capability):
        assert response.status_code in (200, 302), response.content[:500]
        assert "/login/" not in response.get("Location", "")
        assert _state(reference, model_name) != before, "an allowed action changed nothing"
    else:
        if role == "anonymous":
            assert response.status_code == 302 and response["Location"].startswith("/login/")
        else:
            assert response.status_code == 403
        assert _state(reference, model_name) == before


@pytest.mark.parametrize("role", ROLES)
def test_reading_needs_a_signed_in_user_with_a_role(role, client_as, model_name, submit_request):
    reference = submit_request()
    client = _client(role, client_as)
    for page in READ_PAGES:
        response = client.get(_fill(page, ref=reference, model=model_name))
        if role == "anonymous":
            assert response.status_code == 302 and response["Location"].startswith("/login/"), page
        elif role == "no-role":
            assert response.status_code == 403, page
        else:
            assert response.status_code == 200, page


def test_a_post_without_the_csrf_token_is_refused(make_user, submit_request):
    reference = submit_request()
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("reviewer"))
    response = client.post(f"/review/{reference}/approve/")
    assert response.status_code == 403
    with domain_session() as session:
        assert request_by_reference(session, reference).status == "submitted"


def test_the_login_page_itself_carries_a_csrf_token():
    response = Client().get("/login/")
    assert response.status_code == 200
    assert b"csrfmiddlewaretoken" in response.content


def test_an_inactive_user_is_treated_as_signed_out(make_user, submit_request):
    user = make_user("reviewer")
    client = Client()
    client.force_login(user)
    user.is_active = False
    user.save()
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
