"""Erasure requests: list, the submission form, the detail page and its progress feed."""
from __future__ import annotations

from datetime import UTC, datetime, time

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from deletion.domain.errors import DomainError
from deletion.domain.models import utcnow
from deletion.domain.services.requests import request_cancel as service_request_cancel
from deletion.domain.services.requests import request_find_earlier, request_submit
from deletion.domain.states import JOB_PIPELINE, OPEN_REQUEST_STATUSES, RequestStatus
from deletion.web import charts, selectors
from deletion.web.certificate_status import certificate_status
from deletion.web.domain_session import domain_session
from deletion.web.forms import RequestForm
from deletion.web.progress import job_progress_json
from deletion.web.roles import actor_of, requires
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
            earlier = request_find_earlier(session, name=data["name"], aliases=data["aliases"],
                                           emails=data["emails"])
            earlier_refs = [r.reference for r in earlier]
            # The blind index found the same subject before: say so, and let the officer
            # confirm rather than silently filing a duplicate.
            if earlier_refs and request.POST.get("confirm_duplicate") != "yes":
                context["earlier"] = [(r.reference, r.status) for r in earlier]
                return render(request, "web/request_new.html", {**context, "form": form}, status=409)
            created = request_submit(
                session, actor=actor_of(request.user), name=data["name"], aliases=data["aliases"],
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
        context = {
            "r": row, "model_name": row.model.name, "job": job, "jobs": jobs,
            "progress": job_progress_json(job) if job else None,
            "stages": [s.value for s in JOB_PIPELINE[1:]],
            "results": results,
            "checks": [v for v in results if v.threshold is not None or v.passed is not None],
            "measurements": [v for v in results if v.threshold is None and v.passed is None],
            "chart": charts.verification_chart(results),
            "certificate": certificate, "cert_status": cert_status,
            "timeline": timeline, "notifications": notifications,
            "is_open": row.status in OPEN_REQUEST_STATUSES,
            "overdue": row.status in OPEN_REQUEST_STATUSES and row.due_at < utcnow(),
            "can_cancel": row.status in (RequestStatus.SUBMITTED, RequestStatus.APPROVED,
                                          RequestStatus.NEEDS_ATTENTION),
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
        return JsonResponse({
            "reference": row.reference, "status": row.status,
            "job": job_progress_json(job) if job else None,
            "certificate_id": certificate.certificate_id if certificate else None,
        })


@require_POST
@requires("request.cancel")
def request_cancel(request: HttpRequest, reference: str) -> HttpResponse:
    reason = request.POST.get("reason", "")[:2000]
    try:
        with domain_session() as session:
            service_request_cancel(session, actor=actor_of(request.user), reference=reference, reason=reason)
    except DomainError as error:
        raise_http(error)
        messages.error(request, str(error))
    else:
        messages.success(request, f"Request {reference} canceled.")
    return redirect("request_detail", reference=reference)
