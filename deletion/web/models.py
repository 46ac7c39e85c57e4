"""Web-owned tables: API tokens and each staff member's notification preferences.
Everything about erasure lives in the domain (SQLAlchemy) tables; roles are Django
groups created by a data migration."""
from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "ert_"
MAX_TOKEN_DAYS = 365
DEFAULT_TOKEN_DAYS = 90

# What a token may do, on top of what its user's roles allow (never more than those).
SCOPES: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "submit": frozenset({"read", "request.submit"}),
    "review": frozenset({"read", "request.review"}),
}
SCOPE_LABELS = {
    "read": "read: requests, certificates, serving checkpoints",
    "submit": "submit: read, and file erasure requests",
    "review": "review: read, and approve or deny requests",
}

# last_used_at is recorded to this resolution: a token in steady use costs one UPDATE
# a minute instead of one per request (a write, and a commit, on every API call).
LAST_USED_RESOLUTION = timedelta(minutes=1)


def token_digest(token: str) -> str:
    # Tokens are long random strings, so a plain sha256 is enough (no password hashing):
    # a leaked table reveals nothing usable.
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    # The note that says what the token is for ("serving cluster eu-1").
    name = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True)
    # The first characters are shown in listings so a token can be recognised.
    hint = models.CharField(max_length=12)
    scope = models.CharField(max_length=16, default="read")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "web_api_tokens"

    def __str__(self) -> str:
        return f"{self.hint}… ({self.name})"

    def state(self, now: datetime | None = None) -> str:
        now = now or timezone.now()
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def allows(self, capability: str) -> bool:
        return capability in SCOPES.get(self.scope, frozenset())


class StaffPreferences(models.Model):
    """Per-user switches: deadline reminders by e-mail."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preferences")
    reminders_enabled = models.BooleanField(default=True)

    class Meta:
        db_table = "web_staff_preferences"


def default_scope_for(roles: frozenset[str]) -> str:
    """The widest scope a user's roles make sense of (tokens made by the CLI)."""
    if "officer" in roles:
        return "submit"
    if "reviewer" in roles:
        return "review"
    return "read"


def api_token_create(*, user: models.Model, name: str, scope: str | None = None,
                     expires_at: datetime | None = None, days: int | None = None) -> tuple[ApiToken, str]:
    """Create a token and return it with its plaintext, which is never stored."""
    from deletion.web.roles import user_roles

    scope = scope or default_scope_for(user_roles(user))  # type: ignore[arg-type]
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    if expires_at is None and days is not None:
        expires_at = timezone.now() + timedelta(days=days)
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, digest=token_digest(plaintext), hint=plaintext[:10],
                                    scope=scope, expires_at=expires_at)
    return token, plaintext


def api_token_find(plaintext: str) -> ApiToken | None:
    """The token with this plaintext, whatever its state (None for a string never issued)."""
    if not plaintext.startswith(TOKEN_PREFIX) or len(plaintext) > 200:
        return None
    return ApiToken.objects.select_related("user").filter(digest=token_digest(plaintext)).first()


def api_token_authenticate(plaintext: str) -> ApiToken | None:
    """An active token of an active user, its last use stamped; None otherwise."""
    token = api_token_find(plaintext)
    if token is None or token.state() != "active" or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def reminders_enabled(user: models.Model) -> bool:
    prefs = StaffPreferences.objects.filter(user=user).first()
    return True if prefs is None else prefs.reminders_enabled
