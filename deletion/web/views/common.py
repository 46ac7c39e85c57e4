"""Small pieces every view module shares: turning domain errors into form errors or
HTTP answers, and rendering an invalid form with a 4xx status."""
from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from deletion.domain.errors import DomainError, NotFound, PermissionDenied, ValidationError


def attach_domain_error(form: forms.Form, error: DomainError) -> None:
    """Show a domain refusal beside the field it names, or above the form."""
    if isinstance(error, ValidationError) and error.field in form.fields:
        form.add_error(error.field, error.message)
    else:
        form.add_error(None, str(error))


def raise_http(error: DomainError) -> None:
    """For actions without a form: not-found and forbidden become Django's 404/403."""
    if isinstance(error, NotFound):
        raise Http404(str(error))
    if isinstance(error, PermissionDenied):
        raise DjangoPermissionDenied(str(error))


def render_form(request: HttpRequest, template: str, context: dict[str, Any], form: forms.Form) -> HttpResponse:
    # An invalid submission answers 400, so clients and tests can tell it from success.
    status = 400 if form.is_bound and form.errors else 200
    return render(request, template, {**context, "form": form}, status=status)
