"""The model registry (lineage, serving pointer, certificates, destroyed checkpoints),
Art. 19 recipients and batch schedules per model, and the certificate list."""
from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from deletion.domain.certificates import parse_payload
from deletion.domain.errors import DomainError
from deletion.domain.services.batches import batch_plan, batch_window
from deletion.domain.services.model_settings import model_batch_window_set, model_owner_set
from deletion.domain.services.recipients import recipient_register
from deletion.domain.signing import keyring_from_config
from deletion.web import charts, selectors
from deletion.web.certificate_status import (
    certificate_chain_status,
    certificate_status,
    chain_summary,
)
from deletion.web.domain_session import domain_session
from deletion.web.forms import OwnerForm, RecipientForm, ScheduleForm
from deletion.web.roles import actor_of, requires, user_can
from deletion.web.views.common import attach_domain_error


@require_GET
@requires("read")
def model_list(request: HttpRequest) -> HttpResponse:
    with domain_session() as session:
        models = selectors.model_all(session)
        return render(request, "web/model_list.html", {"models": models})


def _model_page(request: HttpRequest, name: str, *, schedule_form: ScheduleForm | None = None,
                recipient_form: RecipientForm | None = None, owner_form: OwnerForm | None = None,
                status: int = 200) -> HttpResponse:
    with domain_session() as session:
        model = selectors.model_by_name(session, name)
        if model is None:
            raise Http404("no such model")
        checkpoints = selectors.checkpoints_of(session, model.id)
        certificates = selectors.certificates_by_checkpoint(session, [c.id for c in checkpoints])
        return render(request, "web/model_detail.html", {
            "model": model, "checkpoints": checkpoints, "certificates": certificates,
            "graph": charts.lineage_graph(checkpoints, model.serving_checkpoint_id),
            "serving": model.serving_checkpoint,
            "recipients": selectors.recipients_of(session, model.id),
            "window_minutes": int(batch_window(model).total_seconds() // 60),
            "plan": batch_plan(session, model=model),
            "continual": charts.continual_chart(selectors.continual_record(session, model)),
            "schedule_form": schedule_form or ScheduleForm(
                initial={"batch_window_minutes": int(batch_window(model).total_seconds() // 60)}),
            "recipient_form": recipient_form or RecipientForm(),
            "owner_form": owner_form or OwnerForm(initial={"owner_email": model.owner_email,
                                                           "owner_webhook_url": model.owner_webhook_url}),
        }, status=status)


@require_GET
@requires("read")
def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    return _model_page(request, name)


@require_POST
@requires("settings.edit")
def model_schedule(request: HttpRequest, name: str) -> HttpResponse:
    form = ScheduleForm(request.POST)
    if form.is_valid():
        try:
            with domain_session() as session:
                model_batch_window_set(session, actor=actor_of(request.user), name=name,
                                       minutes=form.cleaned_data["batch_window_minutes"])
        except DomainError as error:
            attach_domain_error(form, error)
    if form.errors:
        return _model_page(request, name, schedule_form=form, status=400)
    messages.success(request, "Batch schedule saved.")
    return redirect("model_detail", name=name)


@require_POST
@requires("settings.edit")
def model_owner(request: HttpRequest, name: str) -> HttpResponse:
    form = OwnerForm(request.POST)
    if form.is_valid():
        try:
            with domain_session() as session:
                model_owner_set(session, actor=actor_of(request.user), name=name,
                                email=form.cleaned_data["owner_email"],
                                webhook_url=form.cleaned_data["owner_webhook_url"])
        except DomainError as error:
            attach_domain_error(form, error)
    if form.errors:
        return _model_page(request, name, owner_form=form, status=400)
    messages.success(request, "Model owner saved; they are told when an erasure needs a retraining.")
    return redirect("model_detail", name=name)


@require_POST
@requires("settings.edit")
def recipient_add(request: HttpRequest, name: str) -> HttpResponse:
    form = RecipientForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            with domain_session() as session:
                recipient_register(session, actor=actor_of(request.user), name=data["name"], kind=data["kind"],
                                   endpoint_url=data["endpoint_url"] or None, secret=data["secret"] or None,
                                   model_name=name)
        except DomainError as error:
            attach_domain_error(form, error)
    if form.errors:
        return _model_page(request, name, recipient_form=form, status=400)
    messages.success(request, "Recipient registered; it will be notified of completed erasures (Art. 19).")
    return redirect("model_detail", name=name)


@require_GET
@requires("read")
def certificate_list(request: HttpRequest) -> HttpResponse:
    """The newest certificates, each checked on its own, and the chain checked from its
    newest signed verified head; ``?full=1`` walks the whole chain instead."""
    full = request.GET.get("full", "0")
    if full not in ("0", "1"):
        return render(request, "web/error.html", {
            "status": 400, "title": "Bad request",
            "message": "full must be 0 (check from the last verified head) or 1 (the whole chain)."},
            status=400)
    if full == "1" and not user_can(request.user, "chain.verify_full"):
        return render(request, "web/error.html", {
            "status": 403, "title": "Not allowed",
            "message": "Only an auditor or an admin may walk the whole certificate chain; "
                       "this page checks it from the last signed verified head."}, status=403)
    with domain_session() as session:
        rows = selectors.certificate_page(session)
        chain = certificate_chain_status(session, full=full == "1")
        keyring = keyring_from_config(settings.CONFIG)
        items = []
        for row in rows:
            payload = parse_payload(row.payload) or {}
            refs = [r.get("reference") for r in payload.get("requests", []) if isinstance(r, dict)]
            items.append({"row": row, "refs": refs, "model": payload.get("model", {}).get("name")
                          if isinstance(payload.get("model"), dict) else payload.get("model_name"),
                          "status": certificate_status(row, keyring)})
        return render(request, "web/certificate_list.html", {
            "items": items, "chain": chain, "chain_summary": chain_summary(chain),
            "full_requested": full == "1", "can_verify_full": user_can(request.user, "chain.verify_full")})


@require_GET
@requires("read")
def certificate_download(request: HttpRequest, certificate_id: str) -> HttpResponse:
    """The certificate as an outsider verifies it: the signed canonical payload (exact
    bytes, as a string), its hashes, the signature and the key id."""
    with domain_session() as session:
        row = selectors.certificate_by_id(session, certificate_id)
        if row is None:
            raise Http404("no such certificate")
        document = {
            "certificate_id": row.certificate_id, "seq": row.seq, "payload": row.payload,
            "payload_hash": row.payload_hash, "prev_hash": row.prev_hash,
            "signature": row.signature, "key_id": row.key_id,
            "signed_at": row.signed_at.isoformat(),
        }
    response = HttpResponse(json.dumps(document, indent=2, sort_keys=True) + "\n",
                            content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="certificate-{row.certificate_id}.json"'
    return response
