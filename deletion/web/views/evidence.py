"""The evidence pack: one ZIP per request for an auditor or a regulator."""
from __future__ import annotations

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from deletion.domain.errors import DomainError
from deletion.domain.evidence import evidence_pack_build
from deletion.domain.models import utcnow
from deletion.domain.signing import keyring_from_config
from deletion.web.domain_session import domain_session
from deletion.web.roles import actor_of, requires

HEADS_FILE = "chain-heads.jsonl"  # written by the worker's export (workers/integrity.py)


def _head_lines() -> list[str]:
    path = settings.CONFIG.chain_head_export_dir / HEADS_FILE
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError:  # no export yet: the pack says its events are not yet signed
        return []


@require_GET
@requires("evidence.download")
def evidence_download(request: HttpRequest, reference: str) -> HttpResponse:
    try:
        with domain_session() as session:
            data = evidence_pack_build(session, actor=actor_of(request.user), reference=reference,
                                       keyring=keyring_from_config(settings.CONFIG),
                                       head_lines=_head_lines(), now=utcnow())
    except DomainError as error:
        raise Http404(str(error)) from None
    response = HttpResponse(data, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="evidence-{reference}.zip"'
    return response
