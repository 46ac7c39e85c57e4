"""Web-owned tables only: API tokens.  Everything about erasure lives in the domain
(SQLAlchemy) tables; roles are Django groups created by a data migration."""
from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "ert_"


def token_digest(token: str) -> str:
    # Tokens are long random strings, so a plain sha256 is enough (no password hashing):
    # a leaked table reveals nothing usable.
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True)
    # The first characters are shown in listings so a token can be recognised.
    hint = models.CharField(max_length=12)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "web_api_tokens"

    def __str__(self) -> str:
        return f"{self.hint}… ({self.name})"


def api_token_create(*, user: models.Model, name: str) -> tuple[ApiToken, str]:
    """Create a token and return it with its plaintext, which is never stored."""
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, digest=token_digest(plaintext), hint=plaintext[:10])
    return token, plaintext


def api_token_authenticate(plaintext: str) -> ApiToken | None:
    if not plaintext.startswith(TOKEN_PREFIX) or len(plaintext) > 200:
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(digest=token_digest(plaintext), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is not None:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token
