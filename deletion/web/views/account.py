"""A staff member's own account: API tokens (create, list, revoke) and reminder
preferences; for admins, sign-in lock-outs to release.  Every token step is audited."""
from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from deletion.domain.canonical import canonical_time
from deletion.domain.services.access import token_event_record
from deletion.web.access import locked_accounts, lockout_release
from deletion.web.domain_session import domain_session
from deletion.web.forms import PreferencesForm, TokenForm
from deletion.web.models import SCOPE_LABELS, SCOPES, ApiToken, StaffPreferences, api_token_create
from deletion.web.roles import actor_of, requires, user_can


def _scopes_for(user: object) -> list[tuple[str, str]]:
    """Only scopes whose every capability the user's roles grant."""
    return [(name, SCOPE_LABELS[name]) for name, caps in SCOPES.items()
            if all(user_can(user, cap) for cap in caps)]  # type: ignore[arg-type]


def _page(request: HttpRequest, *, form: TokenForm | None = None, created: str | None = None,
          status: int = 200) -> HttpResponse:
    prefs = StaffPreferences.objects.filter(user=request.user).first()
    return render(request, "web/account.html", {
        "tokens": ApiToken.objects.filter(user=request.user).order_by("-created_at"),
        "form": form or TokenForm(scopes=_scopes_for(request.user), initial={"days": 90, "scope": "read"}),
        "created": created, "now": timezone.now(),
        "prefs_form": PreferencesForm(initial={"reminders_enabled": prefs.reminders_enabled if prefs else True}),
        "locked": locked_accounts() if user_can(request.user, "settings.edit") else None,
    }, status=status)


@requires("read")
def account(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _page(request)
    form = TokenForm(request.POST, scopes=_scopes_for(request.user))
    if not form.is_valid():
        return _page(request, form=form, status=400)
    data = form.cleaned_data
    token, plaintext = api_token_create(user=request.user, name=data["name"], scope=data["scope"],
                                        days=data["days"])
    with domain_session() as session:
        token_event_record(session, actor=actor_of(request.user), action="token.created", hint=token.hint,
                           details={"scope": token.scope, "expires_at": canonical_time(token.expires_at)})
    # Shown once, on this response only; the database keeps its hash.
    response = _page(request, created=plaintext)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@requires("read")
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = ApiToken.objects.filter(pk=token_id, user=request.user).first()
    if token is None:
        raise Http404("no such token")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        with domain_session() as session:
            token_event_record(session, actor=actor_of(request.user), action="token.revoked", hint=token.hint,
                               details={"scope": token.scope})
        messages.success(request, f"Token {token.hint}… revoked; it is refused from now on.")
    return redirect("account")


@require_POST
@requires("read")
def preferences(request: HttpRequest) -> HttpResponse:
    form = PreferencesForm(request.POST)
    form.is_valid()
    enabled = bool(form.cleaned_data.get("reminders_enabled"))
    StaffPreferences.objects.update_or_create(user=request.user, defaults={"reminders_enabled": enabled})
    messages.success(request, "Deadline reminders " + ("on." if enabled else "off."))
    return redirect("account")


@require_POST
@requires("settings.edit")
def lockout_release_view(request: HttpRequest) -> HttpResponse:
    username = request.POST.get("username", "")[:150]
    if lockout_release(username=username, actor=actor_of(request.user)):
        messages.success(request, "Sign-in lock-out released.")
    else:
        messages.error(request, "That account is not locked.")
    return redirect("account")
