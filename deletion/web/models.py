"""Web-owned tables: API tokens and each staff member's notification preferences.
Everything about erasure lives in the domain (SQLAlchemy) tables; roles are Django
groups created by a data migration."""
from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, models
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
    """The token with this plaintext, whatever its state (None for a string never issued).

    Its user comes with it, and so do the user's roles (``roles.user_roles`` answers from
    them without a query of its own): one SELECT per API call instead of two, written
    once as plain SQL because compiling the ORM's join cost more than the database did."""
    if not plaintext.startswith(TOKEN_PREFIX) or len(plaintext) > 200:
        return None
    from deletion.web.roles import ROLES, remember_roles

    shape = _token_query()
    # Prepared on PostgreSQL (deletion.web.postgresql): planned once per connection, not per call.
    with getattr(connection, "prepared_cursor", connection.cursor)() as cursor:
        cursor.execute(shape.sql, [*ROLES, token_digest(plaintext)])
        rows = cursor.fetchall()
    if not rows:
        return None
    first = rows[0]
    token = ApiToken.from_db(connection.alias, shape.token_fields, _db_values(first[:shape.split], shape.token_dates, shape.token_flags))
    user = get_user_model().from_db(connection.alias, shape.user_fields,
                                    _db_values(first[shape.split:-1], shape.user_dates, shape.user_flags))
    remember_roles(user, {row[-1] for row in rows if row[-1] is not None})
    token.user = user  # the relation's cache: no query on token.user
    return token


@dataclass(frozen=True)
class _TokenQuery:
    sql: str
    token_fields: list[str]
    user_fields: list[str]
    split: int  # where the user's columns start in a row
    # Positions of the datetime and boolean columns (SQLite hands back text and integers).
    token_dates: frozenset[int]
    user_dates: frozenset[int]
    token_flags: frozenset[int]
    user_flags: frozenset[int]


@functools.cache
def _token_query() -> _TokenQuery:
    """token JOIN user LEFT JOIN (their groups that are roles): one row per role held."""
    from deletion.web.roles import ROLES

    user_model = get_user_model()
    quote = connection.ops.quote_name
    token_cols = list(ApiToken._meta.concrete_fields)
    user_cols = list(user_model._meta.concrete_fields)
    through = user_model._meta.get_field("groups").remote_field.through
    group_model = user_model._meta.get_field("groups").related_model
    user_fk = through._meta.get_field("user").column
    group_fk = through._meta.get_field("group").column
    columns = [f"t.{quote(f.column)}" for f in token_cols] + [f"u.{quote(f.column)}" for f in user_cols]
    placeholders = ", ".join(["%s"] * len(ROLES))
    sql = (
        f"SELECT {', '.join(columns)}, g.{quote('name')} "
        f"FROM {quote(ApiToken._meta.db_table)} t "
        f"JOIN {quote(user_model._meta.db_table)} u ON u.{quote(user_model._meta.pk.column)} = t.{quote('user_id')} "
        f"LEFT JOIN {quote(through._meta.db_table)} ug ON ug.{quote(user_fk)} = u.{quote(user_model._meta.pk.column)} "
        f"LEFT JOIN {quote(group_model._meta.db_table)} g ON g.{quote(group_model._meta.pk.column)} = "
        f"ug.{quote(group_fk)} AND g.{quote('name')} IN ({placeholders}) "
        f"WHERE t.{quote('digest')} = %s"
    )

    def positions(fields: list[Any], kind: type[models.Field[Any, Any]]) -> frozenset[int]:
        return frozenset(i for i, f in enumerate(fields) if isinstance(f, kind))

    return _TokenQuery(sql=sql, token_fields=[f.attname for f in token_cols],
                       user_fields=[f.attname for f in user_cols], split=len(token_cols),
                       token_dates=positions(token_cols, models.DateTimeField),
                       user_dates=positions(user_cols, models.DateTimeField),
                       token_flags=positions(token_cols, models.BooleanField),
                       user_flags=positions(user_cols, models.BooleanField))


def _db_values(values: Sequence[Any], dates: frozenset[int], flags: frozenset[int]) -> list[Any]:
    """What the ORM's converters would make of these values (SQLite returns times as text
    and booleans as integers; PostgreSQL's driver already returns both typed)."""
    out = list(values)
    for i in dates:
        if isinstance(out[i], str):
            out[i] = connection.ops.convert_datetimefield_value(out[i], None, connection)
    for i in flags:
        if isinstance(out[i], int) and not isinstance(out[i], bool):
            out[i] = bool(out[i])
    return out


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
