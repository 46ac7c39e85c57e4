"""The role matrix, extended to every action of the officer's case: each role may do
exactly what its capabilities allow, and a refused action changes nothing (read from
the audit chain head, the request's status and the model's settings)."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from django.test import Client

from deletion.domain.chains import AUDIT_CHAIN
from deletion.domain.models import ChainHead
from deletion.domain.registry import checkpoint_register, model_register
from deletion.domain.services import job_claim, job_reject, request_approve, request_deny
from deletion.domain.services.batches import batch_start_now
from deletion.domain.services.resolutions import resolution_propose
from deletion.web.domain_session import domain_session
from deletion.web.roles import CAPABILITIES
from deletion.web.selectors import model_by_name, request_by_reference

ROLES = ["anonymous", "no-role", "officer", "reviewer", "auditor", "admin"]

# name -> (capability, method, url, data, the state the request is put in first)
ACTIONS = {
    "cancel_approved": ("request.cancel_approved", "post", "/requests/{ref}/cancel/",
                        {"reason": "the subject withdrew it"}, "approved"),
    "batch_start": ("batch.start", "post", "/models/{model}/batch/start/", {}, "approved"),
    "propose": ("resolution.propose", "post", "/requests/{ref}/resolutions/",
                {"kind": "retry", "method": "kif", "preset": "standard"}, "rejected"),
    "decide": ("resolution.decide", "post", "/requests/{ref}/resolutions/{res}/decision/",
               {"decision": "approve"}, "proposed"),
    "letter_pdf": ("letter.issue", "get", "/requests/{ref}/letter/en.pdf", None, "denied"),
    "letter_html": ("letter.issue", "get", "/requests/{ref}/letter/de/", None, "denied"),
    "evidence": ("evidence.download", "get", "/requests/{ref}/evidence.zip", None, "denied"),
    "template_edit": ("letter.edit", "post", "/letters/en/refused/",
                      {"subject": "Decision on {reference}", "body": "Dear {subject_name}, {reference}."},
                      "submitted"),
    "owner": ("settings.edit", "post", "/models/{model}/owner/", {"owner_email": "ml-team@example.org"},
              "submitted"),
}


def _fresh_model(tmp_path: Path) -> str:
    name = f"case-{uuid.uuid4().hex[:6]}"
    directory = tmp_path / name
    directory.mkdir()
    (directory / "w.bin").write_bytes(b"w")
    with domain_session() as session:
        model_register(session, actor="system:test", name=name, batch_window_hours=24)
        checkpoint_register(session, actor="system:test", model_name=name, directory=str(directory), serving=True)
    return name


def _prepare(state: str, model: str, submit_request) -> dict[str, str]:
    reference = submit_request(model)
    names = {"ref": reference, "model": model, "res": "0"}
    with domain_session() as session:
        if state == "denied":
            request_deny(session, actor="user:reviewer-x", reference=reference, reason_code="17(3)(e)",
                         note="needed for legal claims")
        elif state != "submitted":
            request_approve(session, actor="user:reviewer-x", reference=reference)
    if state in ("rejected", "proposed"):
        with domain_session() as session:
            job = batch_start_now(session, actor="user:reviewer-x", model_name=model)
            job_claim(session, job_id=job.id, expected_stage="queued", next_stage="building_sets")
            job_reject(session, job_id=job.id, reason="verification failed")
    if state == "proposed":
        with domain_session() as session:
            names["res"] = str(resolution_propose(session, actor="user:officer-x", reference=reference,
                                                  kind="retry", method="asu", preset="thorough").id)
    return names


def _state(reference: str, model: str) -> tuple[object, ...]:
    with domain_session() as session:
        head = session.get(ChainHead, AUDIT_CHAIN)
        row = model_by_name(session, model)
        return (head.seq if head else 0, request_by_reference(session, reference).status, row.owner_email)


def _client(role: str, client_as) -> Client:
    if role == "anonymous":
        return Client()
    return client_as() if role == "no-role" else client_as(role)


@pytest.fixture
def submit_on(model_name: str):
    from datetime import UTC, datetime

    from deletion.domain.services.requests import request_submit

    def submit(model: str) -> str:
        with domain_session() as session:
            return request_submit(session, actor="user:someone-else", name=f"Case Subject {uuid.uuid4().hex[:8]}",
                                  ground="17(1)(b)", received_at=datetime.now(UTC), model_name=model).reference

    return submit


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_each_role_may_take_exactly_the_case_actions_its_capabilities_allow(
        role, action, client_as, submit_on, tmp_path):
    capability, method, url, data, state = ACTIONS[action]
    model = _fresh_model(tmp_path)
    names = _prepare(state, model, submit_on)
    before = _state(names["ref"], model)
    client = _client(role, client_as)
    target = url.format(**names)
    response = client.get(target) if method == "get" else client.post(target, data or {})
    if role in CAPABILITIES[capability]:
        assert response.status_code in (200, 302), (response.status_code, response.content[:400])
        assert "/login/" not in response.get("Location", "")
        assert _state(names["ref"], model) != before, "an allowed action changed nothing"
    else:
        if role == "anonymous":
            assert response.status_code == 302 and response["Location"].startswith("/login/")
        else:
            assert response.status_code == 403
        assert _state(names["ref"], model) == before
