"""The reply to the data subject: the letter (HTML to print, PDF) and its templates."""
from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from deletion.domain.errors import DomainError
from deletion.domain.services.letters import (
    KINDS,
    LANGUAGES,
    PLACEHOLDERS,
    letter_issue_record,
    letter_render,
    letter_template_get,
    letter_template_save,
)
from deletion.web.domain_session import domain_session
from deletion.web.forms import LetterTemplateForm
from deletion.web.letter_pdf import letter_pdf
from deletion.web.roles import actor_of, requires
from deletion.web.views.common import attach_domain_error, raise_http


def _letter(request: HttpRequest, reference: str, language: str, fmt: str) -> HttpResponse:
    if language not in LANGUAGES:
        raise Http404("no such language")
    controller = settings.CONFIG.controller_name
    try:
        with domain_session() as session:
            letter = letter_render(session, reference=reference, language=language, controller=controller)
            pdf = letter_pdf(letter, controller=controller) if fmt == "pdf" else None
            letter_issue_record(session, actor=actor_of(request.user), letter=letter, fmt=fmt)
    except DomainError as error:
        raise_http(error)
        messages.error(request, str(error))
        return redirect("request_detail", reference=reference)
    if pdf is not None:
        response = HttpResponse(pdf, content_type="application/pdf")
        response["Content-Disposition"] = f'attachment; filename="letter-{reference}-{language}.pdf"'
    else:
        response = render(request, "web/letter.html", {"letter": letter, "controller": controller,
                                                       "lang": language})
    # The letter holds the subject's name: no cache may keep it.
    response["Cache-Control"] = "no-store"
    return response


@require_GET
@requires("letter.issue")
def letter_html(request: HttpRequest, reference: str, language: str) -> HttpResponse:
    return _letter(request, reference, language, "html")


@require_GET
@requires("letter.issue")
def letter_download(request: HttpRequest, reference: str, language: str) -> HttpResponse:
    return _letter(request, reference, language, "pdf")


@require_GET
@requires("read")
def letter_templates(request: HttpRequest) -> HttpResponse:
    with domain_session() as session:
        rows = [letter_template_get(session, language=lang, kind=kind) for lang in LANGUAGES for kind in KINDS]
    return render(request, "web/letter_templates.html", {"templates": rows, "languages": LANGUAGES})


@requires("letter.edit")
def letter_template_edit(request: HttpRequest, language: str, kind: str) -> HttpResponse:
    if language not in LANGUAGES or kind not in KINDS:
        raise Http404("no such template")
    with domain_session() as session:
        current = letter_template_get(session, language=language, kind=kind)
    form = LetterTemplateForm(request.POST if request.method == "POST" else None,
                              initial={"subject": current.subject, "body": current.body})
    if request.method == "POST" and form.is_valid():
        try:
            with domain_session() as session:
                saved = letter_template_save(session, actor=actor_of(request.user), language=language, kind=kind,
                                             subject=form.cleaned_data["subject"], body=form.cleaned_data["body"])
        except DomainError as error:
            attach_domain_error(form, error)
        else:
            messages.success(request, f"Template saved as version {saved.version}.")
            return redirect("letter_templates")
    status = 400 if form.is_bound and form.errors else 200
    return render(request, "web/letter_template_edit.html", {
        "form": form, "current": current, "language": language, "kind": kind,
        "language_name": LANGUAGES[language], "placeholders": PLACEHOLDERS,
    }, status=status)
