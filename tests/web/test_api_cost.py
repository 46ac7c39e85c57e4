"""What one request-creation call costs the database (issue 15: the service under load).

Counted, not timed: the statements the domain runs and the writes Django makes.  On the
first build a call ran 13 domain statements (the request read back, the blind-index
look-up twice, the job and model re-read) and an UPDATE of the token on every call."""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext
from sqlalchemy import event

from deletion.web.domain_session import domain_engine
from deletion.web.models import api_token_create
from deletion.web.roles import OFFICER


@contextmanager
def domain_statements() -> Iterator[list[str]]:
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    engine = domain_engine()
    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


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
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    # model, earlier requests (blind index), chain head FOR UPDATE; nothing read back.
    assert len(selects) == 3, selects
    assert sum("subject_index" in s and s.lstrip().upper().startswith("SELECT") for s in statements) == 1
    assert len(statements) <= 9, statements


def test_a_token_in_steady_use_is_not_rewritten_on_every_call(
        client: Any, make_user: Any, model_name: str) -> None:
    _, token = api_token_create(user=make_user(OFFICER), name="steady")
    assert _file(client, token, model_name, f"First {uuid.uuid4().hex[:8]}").status_code == 201
    with CaptureQueriesContext(connection) as queries:
        assert _file(client, token, model_name, f"Second {uuid.uuid4().hex[:8]}").status_code == 201
    writes = [q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"].upper()]
    assert writes == []
