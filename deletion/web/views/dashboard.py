"""The dashboard: where the work stands, what is late, what is running."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from sqlalchemy import text

from deletion.domain.services.batches import batch_plans
from deletion.domain.states import RequestStatus
from deletion.web import selectors
from deletion.web.domain_session import domain_session
from deletion.web.progress import job_progress_json
from deletion.web.roles import requires


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    with domain_session() as session:
        session.execute(text("SELECT 1"))
    return JsonResponse({"ok": True})


@require_GET
@requires("read")
def dashboard(request: HttpRequest) -> HttpResponse:
    with domain_session() as session:
        counts = selectors.request_counts_by_status(session)
        deadlines = selectors.request_deadlines(session, within_days=7)
        jobs = selectors.jobs_running(session)
        models = {m.id: m.name for m in selectors.model_all(session)}
        running = [{"job": j, "p": job_progress_json(j), "model": models.get(j.model_id, "?"),
                    "refs": [r.reference for r in j.requests]} for j in jobs]
        return render(request, "web/dashboard.html", {
            "counts": [(s.value, counts.get(s.value, 0)) for s in RequestStatus],
            "total": sum(counts.values()),
            "open": sum(counts.get(s, 0) for s in ("submitted", "approved", "scheduled", "in_progress", "needs_attention",
                                                   "retraining")),
            "deadlines": deadlines, "running": running, "models": models,
            "plans": batch_plans(session),
        })
