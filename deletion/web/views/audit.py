"""The audit trail: filters, keyset pagination on seq, the chain's status, and
streamed CSV/JSON export."""
from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django import forms
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from deletion.domain.audit import audit_event_hash
from deletion.domain.chains import AUDIT_CHAIN
from deletion.domain.models import AuditEvent, ChainHead
from deletion.domain.seals import PAGE_TAIL_LIMIT, audit_seals_verify
from deletion.web import selectors
from deletion.web.domain_session import domain_session
from deletion.web.forms import BoundedCharField
from deletion.web.roles import requires
from deletion.web.selectors import AuditFilter

EXPORT_BATCH = 2000


class AuditFilterForm(forms.Form):
    actor = BoundedCharField(max_length=150, required=False)
    action = BoundedCharField(max_length=64, required=False)
    object = BoundedCharField(max_length=64, required=False, label="Object reference")
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    # Bounded to BIGINT: a larger number would be a database error, not an empty page.
    before = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1, widget=forms.HiddenInput)
    after = forms.IntegerField(required=False, min_value=0, max_value=2**63 - 1, widget=forms.HiddenInput)

    def to_filter(self) -> AuditFilter:
        data = self.cleaned_data
        since = datetime.combine(data["since"], time(0), tzinfo=UTC) if data.get("since") else None
        # "until" is inclusive of the whole day.
        until = datetime.combine(data["until"], time(0), tzinfo=UTC) + timedelta(days=1) if data.get("until") else None
        return AuditFilter(actor=data.get("actor") or "", action=data.get("action") or "",
                           object_ref=data.get("object") or "", since=since, until=until)


def _rows_consistent(rows: list[AuditEvent]) -> dict[int, bool]:
    """Recompute each shown row's hash, and its link to the next older row when that row
    is also on the page (the events since the last seal are the 'verify' button)."""
    ok: dict[int, bool] = {}
    by_seq = {r.seq: r for r in rows}
    for row in rows:
        recomputed = audit_event_hash(seq=row.seq, at=row.at, actor=row.actor, action=row.action,
                                      object_type=row.object_type, object_ref=row.object_ref,
                                      details=row.details, prev_hash=row.prev_hash)
        older = by_seq.get(row.seq - 1)
        ok[row.seq] = recomputed == row.hash and (older is None or older.hash == row.prev_hash)
    return ok


@require_GET
@requires("read")
def audit_trail(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return render(request, "web/audit.html", {"form": form, "rows": []}, status=400)
    flt = form.to_filter() if form.is_bound else AuditFilter()
    before = form.cleaned_data.get("before") if form.is_bound else None
    after = form.cleaned_data.get("after") if form.is_bound else None
    with domain_session() as session:
        rows = selectors.audit_page(session, flt, before_seq=before, after_seq=after)
        newest = selectors.audit_newest_seq(session, flt)
        oldest = selectors.audit_oldest_seq(session, flt)
        head = session.get(ChainHead, AUDIT_CHAIN)
        # Never a whole-chain walk from a page: the last seal (written and HMAC-checked
        # by the sealing worker) and at most PAGE_TAIL_LIMIT events after it.  The full
        # walk is `manage.py audit_chain verify --full`.
        full = (audit_seals_verify(session, keys=None, tail_limit=PAGE_TAIL_LIMIT)
                if request.GET.get("verify") == "chain" else None)
        seal = selectors.audit_last_seal(session)
        consistent = _rows_consistent(rows)
    query = request.GET.copy()
    for key in ("before", "after", "verify"):
        query.pop(key, None)
    base = query.urlencode()
    return render(request, "web/audit.html", {
        "form": form, "rows": [(r, consistent[r.seq]) for r in rows],
        "head": head, "full": full, "seal": seal, "page_ok": all(consistent.values()),
        "unsealed": (head.seq if head else 0) - (seal.sealed_seq if seal else 0),
        "newer_url": f"?{base}&after={rows[0].seq}" if rows and newest is not None and rows[0].seq < newest else None,
        "older_url": f"?{base}&before={rows[-1].seq}" if rows and oldest is not None and rows[-1].seq > oldest else None,
        "first_url": f"?{base}" if (before or after) else None,
        "last_url": f"?{base}&after={oldest - 1}" if oldest is not None and rows and rows[-1].seq > oldest else None,
        "export_query": base,
    })


def _export_rows(flt: AuditFilter) -> Iterator[AuditEvent]:
    """Oldest first, in keyset batches, one short transaction per batch."""
    after = 0
    while True:
        with domain_session() as session:
            batch = selectors.audit_page(session, flt, after_seq=after, limit=EXPORT_BATCH)
        if not batch:
            return
        yield from batch
        after = batch[-1].seq


def _as_dict(row: AuditEvent) -> dict[str, Any]:
    return {"seq": row.seq, "at": row.at.isoformat(), "actor": row.actor, "action": row.action,
            "object_type": row.object_type, "object_ref": row.object_ref,
            "details": row.details_dict, "prev_hash": row.prev_hash, "hash": row.hash}


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_cell(value: Any) -> str:
    # Spreadsheet formula injection (OWASP CSV injection): a cell starting with = + - @
    # would be evaluated by Excel; prefix it so it stays text.
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


@require_GET
@requires("read")
def audit_export(request: HttpRequest, fmt: str) -> StreamingHttpResponse | HttpResponse:
    if fmt not in ("csv", "json"):
        raise Http404("export as csv or json")
    form = AuditFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return HttpResponse("invalid filter", status=400, content_type="text/plain")
    flt = form.to_filter() if form.is_bound else AuditFilter()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if fmt == "csv":
        writer = csv.writer(_Echo())
        header = ["seq", "at", "actor", "action", "object_type", "object_ref", "details", "prev_hash", "hash"]

        def csv_lines() -> Iterator[str]:
            yield writer.writerow(header)
            for row in _export_rows(flt):
                yield writer.writerow([row.seq, row.at.isoformat(), _csv_cell(row.actor), _csv_cell(row.action),
                                       row.object_type, _csv_cell(row.object_ref), _csv_cell(row.details),
                                       row.prev_hash, row.hash])

        response = StreamingHttpResponse(csv_lines(), content_type="text/csv; charset=utf-8")
    else:
        def json_lines() -> Iterator[str]:
            yield "["
            first = True
            for row in _export_rows(flt):
                yield ("" if first else ",") + "\n" + json.dumps(_as_dict(row), sort_keys=True)
                first = False
            yield "\n]\n"

        response = StreamingHttpResponse(json_lines(), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.{fmt}"'
    return response
