"""Login required everywhere: a page nobody remembered to decorate is still closed."""
from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

# The JSON API authenticates with tokens and answers 401 itself; static files and
# the login page must be reachable before signing in.
OPEN_PREFIXES = ("/login/", "/static/", "/api/", "/healthz")


class LoginRequiredMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.user.is_authenticated and not request.path.startswith(OPEN_PREFIXES):
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        return self.get_response(request)


class RejectNulBytesMiddleware:
    """PostgreSQL text cannot hold NUL: a NUL anywhere in the path, query or body would
    otherwise surface as a database error (a 500) far from the input that caused it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        query = request.META.get("QUERY_STRING", "")
        body = request.body if request.method in ("POST", "PUT", "PATCH") else b""
        content_type = request.META.get("CONTENT_TYPE", "")
        encoded_nul = (b"%00" in body if content_type.startswith("application/x-www-form-urlencoded")
                       else b"\\u0000" in body if "json" in content_type else False)
        if "\x00" in request.path or "%00" in query or b"\x00" in body or encoded_nul:
            if request.path.startswith("/api/"):
                return JsonResponse({"error": {"message": "NUL characters are not accepted", "field": None}},
                                    status=400)
            return HttpResponseBadRequest("NUL characters are not accepted", content_type="text/plain")
        return self.get_response(request)
