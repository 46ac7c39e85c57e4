"""The review queue: a second officer approves, denies with a coded reason, or extends
the deadline.  The domain enforces four-eyes; a refusal shows as a 403 page."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from deletion.domain.errors import DomainError
from deletion.domain.services.requests import request_approve, request_deny, request_extend
from deletion.web import selectors
from deletion.web.domain_session import domain_session
from deletion.web.forms import DenyForm, ExtendForm
from deletion.web.roles import actor_of, requires
from deletion.web.views.common import raise_http


@require_GET
@requires("read")
def review_queue(request: HttpRequest) -> HttpResponse:
    with domain_session() as session:
        rows = selectors.review_queue(session)
        models = {m.id: m.name for m in selectors.model_all(session)}
        return render(request, "web/review_queue.html", {
            "rows": rows, "models": models, "deny_form": DenyForm(), "extend_form": ExtendForm(),
            "me": actor_of(request.user),
        })


@require_POST
@requires("request.review")
def review_approve(request: HttpRequest, reference: str) -> HttpResponse:
    try:
        with domain_session() as session:
            request_approve(session, actor=actor_of(request.user), reference=reference)
    except DomainError as error:
        raise_http(error)
        messages.error(request, f"{reference}: {error}")
        return redirect("review_queue")
    messages.success(request, f"Request {reference} approved; it will be scheduled for erasure.")
    return redirect("request_detail", reference=reference)


@require_POST
@requires("request.review")
def review_deny(request: HttpRequest, reference: str) -> HttpResponse:
    form = DenyForm(request.POST)
    if not form.is_valid():
        return _invalid(request, form, reference)
    try:
        with domain_session() as session:
            request_deny(session, actor=actor_of(request.user), reference=reference,
                         reason_code=form.cleaned_data["reason_code"], note=form.cleaned_data["note"])
    except DomainError as error:
        raise_http(error)
        messages.error(request, f"{reference}: {error}")
        return redirect("review_queue")
    messages.success(request, f"Request {reference} denied.")
    return redirect("request_detail", reference=reference)


@require_POST
@requires("request.review")
def review_extend(request: HttpRequest, reference: str) -> HttpResponse:
    form = ExtendForm(request.POST)
    if not form.is_valid():
        return _invalid(request, form, reference)
    try:
        with domain_session() as session:
            row = request_extend(session, actor=actor_of(request.user), reference=reference,
                                 months=form.cleaned_data["months"], reason=form.cleaned_data["reason"])
            due = row.due_at
    except DomainError as error:
        raise_http(error)
        messages.error(request, f"{reference}: {error}")
        return redirect("request_detail", reference=reference)
    messages.success(request, f"Deadline of {reference} extended to {due:%d %b %Y}.")
    return redirect("request_detail", reference=reference)


def _invalid(request: HttpRequest, form: DenyForm | ExtendForm, reference: str) -> HttpResponse:
    return render(request, "web/form_errors.html", {"form": form, "reference": reference}, status=400)
