"""Erasure requests: list, the submission form, the detail page and its progress feed."""
from __future__ import annotations

from datetime import UTC, datetime, time

from django.contrib import messages
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from deletion.domain.errors import DomainError
from deletion.domain.gdpr import DENIAL_REASONS
from deletion.domain.methods import METHODS, PRESETS
from deletion.domain.models import utcnow
from deletion.domain.services.batches import batch_plan
from deletion.domain.services.letters import LANGUAGES
from deletion.domain.services.requests import request_cancel as service_request_cancel
from deletion.domain.services.requests import request_duplicate_check, request_submit
from deletion.domain.services.resolutions import resolution_open, resolutions_of
from deletion.domain.states import (
    CANCEL_NEEDS_REVIEW,
    JOB_PIPELINE,
    OPEN_REQUEST_STATUSES,
    RequestStatus,
)
from deletion.web import charts, explain, selectors
from deletion.web.certificate_status import certificate_status
from deletion.web.domain_session import domain_session
from deletion.web.forms import CancelForm, DecisionForm, RequestForm, ResolutionForm
from deletion.web.progress import job_progress_json
from deletion.web.roles import actor_args, requires, user_can
from deletion.web.views.common import attach_domain_error, raise_http, render_form


@require_GET
@requires("read")
def request_list(request: HttpRequest) -> HttpResponse:
    status = request.GET.get("status", "")
    if status and status not in {s.value for s in RequestStatus}:
        status = ""
    with domain_session() as session:
        rows = selectors.request_page(session, status=status or None)
        models = {m.id: m.name for m in selectors.model_all(session)}
        return render(request, "web/request_list.html", {
            "rows": rows, "models": models, "status": status,
            "statuses": [s.value for s in RequestStatus],
        })


@requires("request.submit")
def request_new(request: HttpRequest) -> HttpResponse:
    with domain_session() as session:
        model_names = [m.name for m in selectors.model_all(session)]
    context: dict[str, object] = {"earlier": []}
    if request.method != "POST":
        form = RequestForm(model_names=model_names, initial={"received_at": utcnow().date()})
        return render_form(request, "web/request_new.html", context, form)
    form = RequestForm(request.POST, model_names=model_names)
    if not form.is_valid():
        return render_form(request, "web/request_new.html", context, form)
    data = form.cleaned_data
    received = datetime.combine(data["received_at"], time(0, 0), tzinfo=UTC)
    try:
        with domain_session() as session:
            # Audited: answering "has this person asked before?" is a look-up by identifiers.
            earlier = request_duplicate_check(session, actor=actor_args(request.user)["actor"],
                                              name=data["name"], aliases=data["aliases"],
                                              emails=data["emails"])
            earlier_refs = [r.reference for r in earlier]
            # The blind index found the same subject before: say so, and let the officer
            # confirm rather than silently filing a duplicate.
            if earlier_refs and request.POST.get("confirm_duplicate") != "yes":
                context["earlier"] = [(r.reference, r.status) for r in earlier]
                return render(request, "web/request_new.html", {**context, "form": form}, status=409)
            created = request_submit(
                session, **actor_args(request.user), name=data["name"], aliases=data["aliases"],
                emails=data["emails"], ground=data["ground"], received_at=received,
                model_name=data["model_name"], priority=data["priority"], notes=data["notes"],
            )
            reference = created.reference
    except DomainError as error:
        attach_domain_error(form, error)
        return render_form(request, "web/request_new.html", context, form)
    messages.success(request, f"Request {reference} submitted; it now waits for a second officer's review.")
    if earlier_refs:
        messages.warning(request, "Earlier requests for the same subject: " + ", ".join(earlier_refs))
    return redirect("request_detail", reference=reference)


@require_GET
@requires("read")
def request_detail(request: HttpRequest, reference: str) -> HttpResponse:
    with domain_session() as session:
        row = selectors.request_by_reference(session, reference)
        if row is None:
            raise Http404("no such request")
        jobs = selectors.jobs_of_request(session, row.id)
        job = jobs[-1] if jobs else None
        results = selectors.verification_results(session, job.id) if job else []
        certificate = selectors.certificate_of_job(session, job.id) if job else None
        cert_status = certificate_status(certificate) if certificate else None
        refs = [("erasure_request", row.reference)] + [("job", str(j.id)) for j in jobs]
        if certificate is not None:
            refs.append(("certificate", certificate.certificate_id))
        timeline = selectors.audit_events_for(session, refs)
        notifications = selectors.notifications_of(session, row.id)
        plan = batch_plan(session, model=row.model) if row.status == RequestStatus.APPROVED else None
        now = utcnow()
        context = {
            "r": row, "model_name": row.model.name, "job": job, "jobs": jobs,
            "progress": job_progress_json(job) if job else None,
            "history": [job_progress_json(j) for j in jobs[:-1]],
            "stages": [s.value for s in JOB_PIPELINE[1:]],
            "results": results,
            "checks": [v for v in results if v.threshold is not None or v.passed is not None],
            "measurements": [v for v in results if v.threshold is None and v.passed is None],
            "failed": explain.failed_checks(results) if job and job.stage == "rejected" else [],
            "chart": charts.verification_chart(results),
            "certificate": certificate, "cert_status": cert_status,
            "timeline": timeline, "notifications": notifications,
            "is_open": row.status in OPEN_REQUEST_STATUSES,
            "overdue": row.status in OPEN_REQUEST_STATUSES and row.due_at < now,
            "time_left": row.due_at - now,
            "plan": plan,
            "plan_in_window": plan is not None and plan.reason == "window" and plan.starts_at > now,
            "can_withdraw": row.status == RequestStatus.SUBMITTED and user_can(request.user, "request.cancel"),
            "can_cancel_approved": row.status in CANCEL_NEEDS_REVIEW
            and user_can(request.user, "request.cancel_approved"),
            "cancel_form": CancelForm(),
            "resolutions": resolutions_of(session, request_id=row.id),
            "open_resolution": resolution_open(session, request_id=row.id),
            "can_propose": row.status in (RequestStatus.NEEDS_ATTENTION, RequestStatus.RETRAINING)
            and user_can(request.user, "resolution.propose"),
            "resolution_form": ResolutionForm(initial={"method": "kif", "preset": "standard"}),
            "decision_form": DecisionForm(),
            "methods": METHODS, "presets": PRESETS, "denial_reasons": DENIAL_REASONS,
            "letter_ready": row.status in (RequestStatus.COMPLETED, RequestStatus.DENIED),
            "languages": LANGUAGES,
        }
        return render(request, "web/request_detail.html", context)


@require_GET
@requires("read")
def request_progress(request: HttpRequest, reference: str) -> JsonResponse:
    """Polled by the detail page: status and the running job's progress."""
    with domain_session() as session:
        row = selectors.request_by_reference(session, reference)
        if row is None:
            return JsonResponse({"error": {"message": "no such request", "field": None}}, status=404)
        jobs = selectors.jobs_of_request(session, row.id)
        job = jobs[-1] if jobs else None
        certificate = selectors.certificate_of_job(session, job.id) if job else None
        plan = batch_plan(session, model=row.model) if row.status == RequestStatus.APPROVED else None
        return JsonResponse({
            "reference": row.reference, "status": row.status,
            "job": job_progress_json(job) if job else None,
            "certificate_id": certificate.certificate_id if certificate else None,
            "batch_starts_at": plan.starts_at.isoformat() if plan else None,
        })


@require_POST
def request_cancel(request: HttpRequest, reference: str) -> HttpResponse:
    """Withdraw before review (officer), or cancel after approval (a reviewer who is
    not the submitter, with a reason: the domain checks both)."""
    with domain_session() as session:
        row = selectors.request_by_reference(session, reference)
        if row is None:
            raise Http404("no such request")
        status = row.status
    capability = "request.cancel_approved" if status in CANCEL_NEEDS_REVIEW else "request.cancel"
    if not user_can(request.user, capability):
        raise DjangoPermissionDenied(capability)
    form = CancelForm(request.POST)
    if not form.is_valid():
        return render(request, "web/form_errors.html", {"form": form, "reference": reference}, status=400)
    try:
        with domain_session() as session:
            service_request_cancel(session, **actor_args(request.user), reference=reference,
                                   reason=form.cleaned_data["reason"] or "")
    except DomainError as error:
        raise_http(error)
        attach_domain_error(form, error)
        return render(request, "web/form_errors.html", {"form": form, "reference": reference}, status=400)
    messages.success(request, f"Request {reference} canceled.")
    return redirect("request_detail", reference=reference)
