"""What one request-creation call costs the database (issue 15: the service under load).

Counted, not timed: the statements the domain runs and the writes Django makes.  On the
first build a call ran 13 domain statements (the request read back, the blind-index
look-up twice, the job and model re-read) and an UPDATE of the token on every call;
the token and its user's roles were two queries until they became one."""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from deletion.web.domain_session import PING_AFTER_IDLE, domain_engine
from deletion.web.models import api_token_create
from deletion.web.roles import OFFICER


@contextmanager
def domain_statements() -> Iterator[list[str]]:
    """Every statement the domain's connections send, counted at the driver: the filing
    talks to psycopg directly on PostgreSQL, which SQLAlchemy's events do not see."""
    engine = domain_engine()
    assert engine.dialect.name == "postgresql"
    django_driver = connection.connection
    # ";" is the pool's liveness ping on check-out, not a statement of the filing.
    with _driver_statements(lambda cursor, query: cursor.connection is not django_driver and query != ";") as seen:
        yield seen


@contextmanager
def _driver_statements(keep: Callable[[Any, str], bool]) -> Iterator[list[str]]:
    """The statements psycopg executes for which `keep(cursor, query)` holds."""
    seen: list[str] = []
    original = psycopg.Cursor.execute

    def execute(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if keep(cursor, str(query)):
            seen.append(str(query))
        return original(cursor, query, *args, **kwargs)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def _file(client: Any, token: str, model_name: str, name: str) -> Any:
    body = {"name": name, "ground": "17(1)(b)", "received_at": "2026-11-01", "model_name": model_name}
    return client.post("/api/v1/requests", data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")


def test_filing_a_request_runs_each_domain_statement_once_and_reads_nothing_back(
        client: Any, make_user: Any, model_name: str) -> None:
    _, token = api_token_create(user=make_user(OFFICER), name="cost")
    _file(client, token, model_name, f"Warm Up {uuid.uuid4().hex[:8]}")
    with domain_statements() as statements:
        response = _file(client, token, model_name, f"Cost Subject {uuid.uuid4().hex[:8]}")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "submitted" and body["job"] is None and body["model"] == model_name
    # The model with the next reference number and the blind-index matches; the chain
    # head FOR UPDATE; the request with its index rows, its audit event and the head's
    # move; and the transaction's own BEGIN and COMMIT, sent in the same pipeline.
    assert len(statements) == 5 and (statements[0], statements[-1]) == ("BEGIN", "COMMIT"), statements
    assert "INSERT INTO audit_events" in statements[3] and "UPDATE chain_heads" in statements[3], statements
    assert sum("FROM subject_index WHERE hmac" in s for s in statements) == 1
    # The first statement reads the earlier requests the blind index matched (none here);
    # nothing reads the new row back.
    assert not any("FROM erasure_requests" in s for s in statements[2:]), "a row was read back"


def test_filing_a_request_awaits_the_database_twice(client: Any, make_user: Any, model_name: str) -> None:
    """One pipeline, two round trips: the reads that take the row locks, then the writes
    with the COMMIT.  psycopg, left to begin the transaction itself, awaited its BEGIN
    apart, and leaving a pipeline between the two cost a third while the locks were held."""
    from psycopg._pipeline_base import BasePipeline

    _, token = api_token_create(user=make_user(OFFICER), name="round-trips")
    _file(client, token, model_name, f"Warm Up {uuid.uuid4().hex[:8]}")
    django_driver = connection.connection
    syncs: list[Any] = []
    original = BasePipeline._enqueue_sync

    def enqueue_sync(pipeline: Any) -> None:
        if pipeline.pgconn is not django_driver.pgconn:
            syncs.append(pipeline)
        original(pipeline)

    BasePipeline._enqueue_sync = enqueue_sync  # type: ignore[method-assign]
    try:
        with domain_statements() as statements:
            assert _file(client, token, model_name, f"Trips {uuid.uuid4().hex[:8]}").status_code == 201
    finally:
        BasePipeline._enqueue_sync = original  # type: ignore[method-assign]
    assert len(syncs) == 2 and len(statements) == 5, (len(syncs), statements)
    driver = domain_engine().raw_connection()
    try:  # the pooled connection went back in its ordinary (transactional) mode
        assert driver.driver_connection.autocommit is False  # type: ignore[union-attr]
    finally:
        driver.close()


def test_filing_a_request_opens_no_orm_session(client: Any, make_user: Any, model_name: str) -> None:
    """The filing runs on a pooled connection of the domain's engine (request_file): a
    Session's transaction, connection object and two commits cost the filing about as much
    CPU as binding and sending its statements did, for a row it only answers with."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    _, token = api_token_create(user=make_user(OFFICER), name="no-session")
    _file(client, token, model_name, f"Warm Up {uuid.uuid4().hex[:8]}")
    began: list[Any] = []

    def on_begin(session: Any, *_: Any) -> None:
        began.append(session)

    event.listen(Session, "after_begin", on_begin)
    try:
        response = _file(client, token, model_name, f"No Session {uuid.uuid4().hex[:8]}")
    finally:
        event.remove(Session, "after_begin", on_begin)
    assert response.status_code == 201, response.content
    assert began == []


def test_a_token_in_steady_use_is_not_rewritten_on_every_call(
        client: Any, make_user: Any, model_name: str) -> None:
    _, token = api_token_create(user=make_user(OFFICER), name="steady")
    assert _file(client, token, model_name, f"First {uuid.uuid4().hex[:8]}").status_code == 201
    with CaptureQueriesContext(connection) as queries:
        assert _file(client, token, model_name, f"Second {uuid.uuid4().hex[:8]}").status_code == 201
    writes = [q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"].upper()]
    assert writes == []


def test_the_token_its_user_and_roles_are_one_query(client: Any, make_user: Any, model_name: str) -> None:
    _, token = api_token_create(user=make_user(OFFICER), name="one-query")
    assert _file(client, token, model_name, f"First {uuid.uuid4().hex[:8]}").status_code == 201
    with CaptureQueriesContext(connection) as queries:
        assert _file(client, token, model_name, f"Second {uuid.uuid4().hex[:8]}").status_code == 201
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]


@contextmanager
def django_statements() -> Iterator[list[str]]:
    """Every statement sent on Django's connection, its health check's SELECT 1 included
    (which Django sends to the driver directly, past CaptureQueriesContext)."""
    with _driver_statements(lambda cursor, query: cursor.connection is connection.connection) as seen:
        yield seen


def _next_request_query() -> None:
    """What a request does with Django's connection: start (the health check is due
    again), then one query."""
    connection.close_if_unusable_or_obsolete()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 2")


def test_django_health_checks_a_connection_only_after_it_sat_idle(transactional_db: Any) -> None:
    assert connection.settings_dict["CONN_HEALTH_CHECKS"]
    _next_request_query()
    with django_statements() as sent:
        _next_request_query()
    assert sent == ["SELECT 2"]
    connection._last_used -= PING_AFTER_IDLE + 1  # type: ignore[attr-defined]
    with django_statements() as sent:
        _next_request_query()
    assert sent == ["SELECT 1", "SELECT 2"]


def test_the_token_look_up_is_prepared_and_nothing_else_of_djangos(
        client: Any, make_user: Any, model_name: str) -> None:
    """Planned once per connection (it cost the server about 0.7 ms a call, planned anew);
    Django's own statements still bind on the client and are never prepared."""
    from deletion.web.models import ApiToken

    _, token = api_token_create(user=make_user(OFFICER), name="prepared")
    assert _file(client, token, model_name, f"Prepared {uuid.uuid4().hex[:8]}").status_code == 201
    User.objects.filter(username__startswith="nobody-").exists()  # an ordinary ORM query
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert len(prepared) == 1, prepared
    assert ApiToken._meta.db_table in prepared[0] and "digest" in prepared[0]


def test_the_token_look_up_reads_binary_results_as_the_orm_reads_them(make_user: Any) -> None:
    """Its results come in binary (psycopg's C loaders, not Django's text time-zone loader
    in Python): the same values, the times aware and in UTC, as the ORM loads them."""
    from datetime import timedelta

    from django.utils import timezone

    from deletion.web.models import ApiToken, api_token_find

    user = make_user(OFFICER)
    User.objects.filter(pk=user.pk).update(last_login=timezone.now() - timedelta(hours=1))
    token, plaintext = api_token_create(user=user, name="binary", days=30)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now() - timedelta(minutes=3))
    found = api_token_find(plaintext)
    assert found is not None
    stored, stored_user = ApiToken.objects.get(pk=token.pk), User.objects.get(pk=user.pk)
    for field in ("id", "user_id", "name", "digest", "hint", "scope", "created_at", "expires_at", "last_used_at",
                  "revoked_at"):
        assert getattr(found, field) == getattr(stored, field), field
    for field in ("id", "username", "password", "is_active", "is_superuser", "last_login", "date_joined"):
        assert getattr(found.user, field) == getattr(stored_user, field), field
    for moment in (found.created_at, found.expires_at, found.last_used_at, found.user.last_login):
        assert moment is not None and moment.utcoffset() == timedelta(0)
    with connection.prepared_cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("SELECT now()", [])
        assert cursor.cursor.pgresult.fformat(0) == 1  # binary


def test_the_token_look_up_reuses_its_connections_prepared_cursor(make_user: Any) -> None:
    """One prepared cursor per connection, kept open from one look-up to the next (a new
    cursor looked its result loaders up again for every column on every API call): each
    look-up still finds its own token, and a new connection gets a cursor of its own."""
    from deletion.web.models import api_token_find

    tokens = [api_token_create(user=make_user(OFFICER), name=f"reuse-{i}") for i in range(2)]
    seen = []
    for token, plaintext in (*tokens, *tokens):
        found = api_token_find(plaintext)
        assert found is not None and found.pk == token.pk and found.user.pk == token.user_id
        with connection.prepared_cursor() as cursor:  # type: ignore[attr-defined]
            seen.append(cursor.cursor)
    assert all(c is seen[0] for c in seen) and not seen[0].closed
    assert api_token_find("ert_never-issued") is None
    connection.close()
    assert api_token_find(tokens[0][1]) is not None
    with connection.prepared_cursor() as cursor:  # type: ignore[attr-defined]
        assert cursor.cursor is not seen[0]
