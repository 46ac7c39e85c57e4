"""Hostile API input: schemathesis generates requests from the service's own OpenAPI
document (valid by the schema, and deliberately invalid), sent with a valid token of a
user holding every role, straight into the Django app.  No answer may be a 5xx.

tests/web/test_hostile_input.py sends a fixed list of nasty values per field; this run
lets hypothesis search the whole input space of every documented operation.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any
from urllib.parse import urlencode

import pytest
import schemathesis
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from deletion.web.models import api_token_create
from tests.web import conftest as web

# The web tests' fixtures (Django on the session's PostgreSQL database), used by name.
web_database_url, django_db_setup, _db_access, make_user, client_as = (
    web.web_database_url, web.django_db_setup, web._db_access, web.make_user, web.client_as)
model_name = web.model_name

EXAMPLES_PER_OPERATION = 40  # per generation mode


@pytest.fixture
def api_schema(client_as: Any) -> Any:
    # The document is for signed-in users (it is refused anonymously, see test_access).
    response = client_as("auditor").get("/api/v1/openapi.json")
    assert response.status_code == 200
    return schemathesis.openapi.from_dict(response.json())


def _send(client: Client, case: Any) -> Any:
    url = case.formatted_path
    if case.query:
        url += "?" + urlencode(case.query, doseq=True)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (case.headers or {}).items()
             if k.lower() != "authorization"}
    method = case.method.lower()
    if method == "get":
        return client.get(url, **extra)
    body = case.body if case.body is not None and not _is_not_set(case.body) else {}
    data = json.dumps(body, default=str) if not isinstance(body, str | bytes) else body
    return getattr(client, method)(url, data, content_type="application/json", **extra)


def _is_not_set(value: Any) -> bool:
    return type(value).__name__ == "NotSet"


def test_no_generated_api_request_gets_a_server_error(api_schema: Any, make_user: Any,
                                                      model_name: str) -> None:
    plaintext = api_token_create(user=make_user("officer", "reviewer", "auditor"), name="fuzz")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}", raise_request_exception=False)
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 9

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode)

            @given(case=strategy, real_model=st.booleans())
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def one(case: Any, real_model: bool) -> None:
                # Half the time point at the registered model, so requests get past the
                # "no such model" check and into the services.
                if real_model and isinstance(case.body, dict) and "model_name" in case.body:
                    case.body["model_name"] = model_name
                response = _send(client, case)
                statuses[response.status_code] += 1
                if response.status_code >= 500:
                    server_errors.append(f"{case.method} {case.formatted_path} "
                                         f"{str(case.body)[:200]} -> {response.status_code}")

            one()
    sys.stderr.write(f"\n{sum(statuses.values())} generated API requests over "
                     f"{len(operations)} operations; statuses {dict(sorted(statuses.items()))}\n")
    assert server_errors == []
    assert sum(statuses.values()) >= len(operations) * 2 * 10
