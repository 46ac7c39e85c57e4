"""Production hardening (DEBUG off, the default): cookies, HSTS and browser headers."""
from __future__ import annotations

from django.conf import settings
from django.test import Client


def test_the_tests_run_with_production_settings():
    assert settings.DEBUG is False


def test_the_session_cookie_is_secure_http_only_and_same_site(make_user):
    user = make_user("auditor")
    client = Client()
    response = client.post("/login/", {"username": user.username, "password": "correct horse battery staple"},
                           secure=True)
    assert response.status_code == 302
    cookie = response.cookies[settings.SESSION_COOKIE_NAME]
    assert cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Lax"
    assert client.get("/", secure=True).status_code == 200


def test_a_wrong_password_is_refused_with_a_400_and_no_session(make_user):
    user = make_user("auditor")
    response = Client().post("/login/", {"username": user.username, "password": "wrong"}, secure=True)
    assert response.status_code == 400
    assert settings.SESSION_COOKIE_NAME not in response.cookies


def test_https_responses_carry_hsts_and_the_browser_hardening_headers(client_as):
    response = client_as("auditor").get("/", secure=True)
    assert "max-age=31536000" in response["Strict-Transport-Security"]
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


def test_signing_out_needs_a_post_with_the_csrf_token(make_user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("auditor"))
    assert client.post("/logout/").status_code == 403
    assert client.get("/").status_code == 200


def test_django_tables_live_in_the_same_postgresql_database_as_the_domain(make_user):
    from django.db import connection
    from sqlalchemy.engine import make_url

    make_user("auditor")
    assert connection.vendor == "postgresql"
    assert connection.settings_dict["NAME"] == make_url(settings.DOMAIN_DATABASE_URL).database
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM erasure_requests")  # a domain (alembic) table
        cursor.execute("SELECT count(*) FROM web_api_tokens")
