"""The officer's case after approval: start a batch now, and the resolution path of a
failed erasure (propose, decide, export what a retraining must exclude)."""
from __future__ import annotations

import json
import logging

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from deletion.domain.errors import DomainError
from deletion.domain.services.batches import batch_start_now
from deletion.domain.services.notices import notice_record
from deletion.domain.services.resolutions import (
    OwnerNotice,
    resolution_decide,
    resolution_propose,
    retraining_exclusions_export,
)
from deletion.web import selectors
from deletion.web.domain_session import domain_session
from deletion.web.forms import DecisionForm, ResolutionForm
from deletion.web.notify import email_send, webhook_post
from deletion.web.roles import actor_args, actor_of, requires
from deletion.web.views.common import attach_domain_error, raise_http

logger = logging.getLogger(__name__)


@require_POST
@requires("batch.start")
def batch_start(request: HttpRequest, name: str) -> HttpResponse:
    back = request.POST.get("next", "")
    try:
        with domain_session() as session:
            job = batch_start_now(session, actor=actor_of(request.user), model_name=name)
            job_id, count = job.id, len(job.requests)
    except DomainError as error:
        raise_http(error)
        messages.error(request, str(error))
    else:
        messages.success(request, f"Batch started: job #{job_id} with {count} request(s).")
    if back.startswith("/requests/") and len(back) < 80:
        return redirect(back)
    return redirect("model_detail", name=name)


def _form_error_page(request: HttpRequest, form: ResolutionForm | DecisionForm, reference: str) -> HttpResponse:
    return render(request, "web/form_errors.html", {"form": form, "reference": reference}, status=400)


@require_POST
@requires("resolution.propose")
def resolution_new(request: HttpRequest, reference: str) -> HttpResponse:
    form = ResolutionForm(request.POST)
    if not form.is_valid():
        return _form_error_page(request, form, reference)
    data = form.cleaned_data
    try:
        with domain_session() as session:
            resolution_propose(session, **actor_args(request.user), reference=reference, kind=data["kind"],
                               method=data["method"] or None, preset=data["preset"] or None,
                               reason_code=data["reason_code"] or None, note=data["note"] or "")
    except DomainError as error:
        raise_http(error)
        attach_domain_error(form, error)
        return _form_error_page(request, form, reference)
    messages.success(request, "Proposal recorded; it waits for a reviewer's decision.")
    return redirect("request_detail", reference=reference)


def _tell_owner(notice: OwnerNotice, actor: str) -> None:
    cfg = settings.CONFIG
    body = (f"Erasure request {notice.event['reference']} on model {notice.model_name} could not be "
            "carried out by unlearning; a reviewer decided that the model must be retrained without "
            f"the subject's records ({notice.event['tombstoned_records']} record(s), now tombstoned; "
            f"forget-set digest {notice.event['forget_digest']}).\n\nThe deadline is "
            f"{notice.event['due_at']}. The exclusions for the next training run: "
            f"{cfg.public_base_url}/requests/{notice.event['reference']}/exclusions.json\n")
    mail = email_send(to=[notice.owner_email] if notice.owner_email else [],
                      subject=f"[erasure] retraining required: model {notice.model_name}", body=body)
    url = notice.owner_webhook_url or cfg.event_webhook_url
    hook = webhook_post(url=url, event=notice.event, secret=cfg.event_webhook_secret)
    with domain_session() as session:
        notice_record(session, actor=actor, event=notice.event,
                      outcomes={"email": mail.ok, "email_error": mail.detail, "webhook": hook.ok,
                                "webhook_error": hook.detail})


@require_POST
@requires("resolution.decide")
def resolution_decision(request: HttpRequest, reference: str, resolution_id: int) -> HttpResponse:
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _form_error_page(request, form, reference)
    approve = form.cleaned_data["decision"] == "approve"
    try:
        with domain_session() as session:
            row = selectors.request_by_reference(session, reference)
            if row is None:
                raise Http404("no such request")
            decision = resolution_decide(session, **actor_args(request.user), resolution_id=resolution_id,
                                         approve=approve, note=form.cleaned_data["note"] or "")
            if decision.resolution.request_id != row.id:
                raise Http404("no such proposal for this request")
            kind, job_id, notice = decision.resolution.kind, decision.job.id if decision.job else None, decision.notice
    except DomainError as error:
        raise_http(error)
        attach_domain_error(form, error)
        return _form_error_page(request, form, reference)
    if notice is not None:
        _tell_owner(notice, actor_of(request.user))
    if not approve:
        messages.success(request, "Proposal declined.")
    elif kind == "retry":
        messages.success(request, f"Retry approved: job #{job_id} starts now.")
    elif kind == "retraining":
        messages.success(request, "Retraining required: recorded, records tombstoned, the model's owner told.")
    else:
        messages.success(request, "Refusal approved; the reply letter can be issued.")
    return redirect("request_detail", reference=reference)


@require_GET
@requires("read")
def exclusions_download(request: HttpRequest, reference: str) -> HttpResponse:
    try:
        with domain_session() as session:
            document = retraining_exclusions_export(session, actor=actor_of(request.user), reference=reference)
    except DomainError as error:
        raise_http(error)
        raise Http404(str(error)) from None
    response = HttpResponse(json.dumps(document, indent=2, sort_keys=True) + "\n", content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="exclusions-{reference}.json"'
    return response
