"""Roles are Django groups; what each role may do is one table, shared by the pages
and the JSON API so that the two can never disagree."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

OFFICER = "officer"
REVIEWER = "reviewer"
AUDITOR = "auditor"
ADMIN = "admin"
ROLES = (OFFICER, REVIEWER, AUDITOR, ADMIN)

# Separation of duties: the admin manages settings and accounts but neither files nor
# decides requests; the auditor reads everything and changes nothing.
CAPABILITIES: dict[str, frozenset[str]] = {
    "read": frozenset(ROLES),
    "request.submit": frozenset({OFFICER}),
    # Withdrawing a request nobody has approved yet.
    "request.cancel": frozenset({OFFICER}),
    # Cancelling after approval undoes a four-eyes decision: a reviewer (never the
    # submitter, which the domain checks) with a reason.
    "request.cancel_approved": frozenset({REVIEWER}),
    "request.review": frozenset({REVIEWER}),
    "batch.start": frozenset({REVIEWER}),
    # A failed erasure: the officer proposes what to do, a reviewer decides.
    "resolution.propose": frozenset({OFFICER}),
    "resolution.decide": frozenset({REVIEWER}),
    # The reply to the data subject holds their name: only the officer who writes to them.
    "letter.issue": frozenset({OFFICER}),
    "letter.edit": frozenset({OFFICER, ADMIN}),
    "evidence.download": frozenset({OFFICER, REVIEWER, AUDITOR}),
    # The full certificate-chain walk costs seconds per 20,000 certificates (pages check
    # from the last signed verified head): the auditor's check, and the admin's.
    "chain.verify_full": frozenset({AUDITOR, ADMIN}),
    "settings.edit": frozenset({ADMIN}),
}


def user_roles(user: AbstractBaseUser | AnonymousUser) -> frozenset[str]:
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    cached = getattr(user, "_erasure_roles", None)
    if cached is None:
        cached = remember_roles(user, user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    return cached


def remember_roles(user: AbstractBaseUser, group_names: Iterable[str]) -> frozenset[str]:
    """Cache on this user object the roles its role groups (names among ROLES) give it:
    for a caller that read the groups already (the API's token look-up)."""
    names = {name for name in group_names if name in ROLES}
    if getattr(user, "is_superuser", False):
        names.add(ADMIN)
    roles = frozenset(names)
    user._erasure_roles = roles  # type: ignore[attr-defined]
    return roles


def user_can(user: AbstractBaseUser | AnonymousUser, capability: str) -> bool:
    return bool(user_roles(user) & CAPABILITIES[capability])


def actor_of(user: AbstractBaseUser) -> str:
    """The domain's actor string: a reference to the account, never a personal name."""
    return f"user:{user.get_username()}"


def actor_id_of(user: AbstractBaseUser) -> int:
    """The account's id, which four-eyes compares (a username can change)."""
    return int(user.pk)


def actor_args(user: AbstractBaseUser) -> dict[str, Any]:
    """``actor`` and ``actor_id`` keyword arguments for a domain service."""
    return {"actor": actor_of(user), "actor_id": actor_id_of(user)}


def requires(capability: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """View decorator: 403 unless the signed-in user's roles grant the capability
    (anonymous users never get here: the login middleware redirects them first)."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not user_can(request.user, capability):
                raise PermissionDenied(capability)
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def roles_context(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None:
        return {}
    return {
        "user_roles": sorted(user_roles(user)),
        "can": {cap.replace(".", "_"): user_can(user, cap) for cap in CAPABILITIES},
    }
