"""The application's PostgreSQL role can write rows but cannot rewrite the evidence.

A role of its own (created here, dropped at the end) gets the application's grants
(`deletion.domain.roles.app_role_grant`) on a freshly migrated database, runs the
service's normal writes through the domain services, and is then refused every way of
changing the append-only tables: UPDATE, DELETE, TRUNCATE, disabling or dropping their
triggers, skipping triggers with session_replication_role, creating tables of its own.
On today's main the compose file connected everything as the database owner, a
superuser, which can do all of that.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from deletion.domain import registry
from deletion.domain.audit import audit_verify
from deletion.domain.db import make_engine, session_scope
from deletion.domain.migrate import upgrade
from deletion.domain.roles import APPEND_ONLY_TABLES, app_role_grant
from deletion.domain.services.requests import request_approve, request_submit
from tests.conftest import POSTGRES_SERVER_URL, _admin_connection, drop_database, fresh_database_url

INIT_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "postgres" / "10-roles.sh"


@pytest.fixture(scope="module")
def roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The compose init script, run against the test server with names of our own: the
    owner and application roles and the database it creates (all dropped afterwards)."""
    suffix = uuid.uuid4().hex[:10]
    names = {"owner": f"erasure_owner_{suffix}", "app": f"erasure_app_{suffix}",
             "database": f"erasure_roles_{suffix}"}
    folder = tmp_path_factory.mktemp("roles")
    script = INIT_SCRIPT.read_text(encoding="utf-8")
    script = re.sub(r"\berasure_owner\b", names["owner"], script)
    script = re.sub(r"\berasure_app\b", names["app"], script)
    script = re.sub(r"\berasure\b", names["database"], script)
    (folder / "init.sh").write_text(script, encoding="utf-8")
    for role in ("owner", "app"):
        (folder / role).write_text(f"pw-{role}-{suffix}\n", encoding="utf-8")
    server = make_url(POSTGRES_SERVER_URL)
    env = {**os.environ, "PGHOST": server.host or "127.0.0.1", "PGPORT": str(server.port or 5432),
           "POSTGRES_USER": server.username or "postgres",
           "POSTGRES_OWNER_PASSWORD_FILE": str(folder / "owner"),
           "POSTGRES_APP_PASSWORD_FILE": str(folder / "app")}
    try:
        done = subprocess.run(["sh", str(folder / "init.sh")], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        yield names
    finally:
        with _admin_connection() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{names["database"]}" WITH (FORCE)')
            for role in ("app", "owner"):
                admin.execute(f'DROP ROLE IF EXISTS "{names[role]}"')


def _url(names: dict[str, str], role: str) -> str:
    return make_url(POSTGRES_SERVER_URL).set(username=names[role], password=None,
                                             database=names["database"]).render_as_string(
                                                 hide_password=False)


@pytest.fixture(scope="module")
def app_engine(roles: dict[str, str]) -> Iterator[Engine]:
    """Migrated by the owner role, granted as the compose `migrate` service does it."""
    owner_url = _url(roles, "owner")
    upgrade(owner_url)
    owner = make_engine(owner_url)
    engine = make_engine(_url(roles, "app"))
    try:
        app_role_grant(owner, role=roles["app"])
        yield engine
    finally:
        engine.dispose()
        owner.dispose()


def test_the_init_script_makes_two_plain_roles_and_the_owner_owns_every_table(
    roles: dict[str, str], app_engine: Engine,
) -> None:
    with _admin_connection() as admin:
        flags = admin.execute(
            "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles "
            "WHERE rolname IN (%s, %s)", (roles["owner"], roles["app"])).fetchall()
    assert sorted(flags) == sorted((roles[r], False, False, False, False) for r in ("owner", "app"))
    with app_engine.connect() as connection:
        owners = set(connection.execute(text(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'")).scalars())
    assert owners == {roles["owner"]}


def test_the_application_role_does_the_services_normal_writes(app_engine: Engine, tmp_path) -> None:
    directory = tmp_path / "v1"
    directory.mkdir()
    (directory / "weights.bin").write_bytes(b"weights")
    with session_scope(app_engine) as session:
        registry.corpus_register(session, actor="admin", name="c", path="/dev/null",
                                 manifest_digest="0" * 64, record_count=1)
        registry.model_register(session, actor="admin", name="m", corpus_name="c")
        registry.checkpoint_register(session, actor="admin", model_name="m",
                                     directory=str(directory), serving=True)
        reference = request_submit(session, actor="user:a", name="Role Test", ground="17(1)(a)",
                                   received_at=datetime.now(UTC), model_name="m").reference
    with session_scope(app_engine) as session:
        request_approve(session, actor="user:b", reference=reference)
    with session_scope(app_engine) as session:
        assert audit_verify(session).ok


REFUSED = [
    *(f"UPDATE {t} SET id = id" if t != "audit_events" else "UPDATE audit_events SET actor = 'x'"
      for t in APPEND_ONLY_TABLES),
    *(f"DELETE FROM {t}" for t in APPEND_ONLY_TABLES),
    *(f"TRUNCATE {t}" for t in APPEND_ONLY_TABLES),
    *(f"ALTER TABLE {t} DISABLE TRIGGER ALL" for t in APPEND_ONLY_TABLES),
    "DROP TRIGGER audit_events_append_only ON audit_events",
    "ALTER TABLE certificates ADD COLUMN stray integer",
    "SET session_replication_role = replica",
    "CREATE TABLE shadow (id integer)",
    "ALTER ROLE CURRENT_USER SUPERUSER",
]


@pytest.mark.parametrize("statement", REFUSED)
def test_the_application_role_cannot_change_the_evidence(app_engine: Engine,
                                                         statement: str) -> None:
    url = app_engine.url
    with psycopg.connect(host=url.host, port=url.port, user=url.username, dbname=url.database,
                         autocommit=True) as connection:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute(statement)


def test_a_superuser_or_owner_is_never_given_the_application_grant(tmp_path) -> None:
    url = make_url(POSTGRES_SERVER_URL)
    owner = make_engine(fresh_database_url("roles_refuse", migrate=False))
    try:
        with pytest.raises(ValueError, match="superuser"):
            app_role_grant(owner, role=url.username or "postgres")
    finally:
        owner.dispose()
        drop_database(owner.url.render_as_string(hide_password=False))
