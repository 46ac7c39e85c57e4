"""PostgreSQL roles: the table owner migrates, the application only reads and writes rows.

    python -m deletion.domain.roles grant-app ROLE      # after `manage.py migrate_all`

Production runs two roles (docker-compose.yml, deploy/postgres/10-roles.sh): the
*owner* owns the database and every table and runs the migrations; the *application*
role (web, workers) logs in for everything else.  ``app_role_grant`` gives the
application role

- SELECT, INSERT, UPDATE, DELETE on every table of the schema, except
- SELECT and INSERT only on the append-only evidence: ``audit_events``,
  ``audit_seals``, ``certificates``, ``certificate_verified_heads`` and
  ``verification_reports`` (no UPDATE, DELETE or TRUNCATE);
- USAGE on the sequences (serial ids), and nothing else: no CREATE on the schema, no
  TRUNCATE, REFERENCES or TRIGGER anywhere.

Because the application role owns no table it cannot ``ALTER TABLE ... DISABLE
TRIGGER`` or drop the append-only triggers, and because it is no superuser it cannot
``SET session_replication_role = replica`` (which skips triggers) either; the triggers
are the second wall behind the missing grants.  The grant is idempotent: run it after
every migration (the compose `migrate` service does), so new tables are covered.
"""

from __future__ import annotations

import argparse
import re
import sys

from sqlalchemy import Engine, text

from deletion.domain.db import make_engine

APPEND_ONLY_TABLES = ("audit_events", "audit_seals", "certificates", "certificate_verified_heads",
                      "verification_reports")
_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _quoted(role: str) -> str:
    if not _ROLE.match(role):
        raise ValueError(f"not a plain role name: {role!r}")
    return f'"{role}"'


def app_role_grant(engine: Engine, *, role: str, schema: str = "public") -> None:
    """Give ``role`` the application's rights (module docstring); run as the owner."""
    if engine.dialect.name != "postgresql":
        raise ValueError("database roles exist on PostgreSQL only")
    who, where = _quoted(role), _quoted(schema)
    with engine.begin() as connection:
        found = connection.execute(text(
            "SELECT rolsuper, rolcreaterole, rolbypassrls FROM pg_roles WHERE rolname = :r"),
            {"r": role}).first()
        if found is None:
            raise ValueError(f"role {role} does not exist")
        if any(found):
            raise ValueError(f"role {role} is a superuser, may create roles or bypasses row "
                             "security: it would get around every grant")
        owns = connection.execute(text(
            "SELECT count(*) FROM pg_tables WHERE schemaname = :s AND tableowner = :r"),
            {"s": schema, "r": role}).scalar()
        if owns:
            raise ValueError(f"role {role} owns tables in {schema}: it could alter them")
        connection.execute(text(f"REVOKE ALL ON ALL TABLES IN SCHEMA {where} FROM {who}"))
        connection.execute(text(f"REVOKE CREATE ON SCHEMA {where} FROM PUBLIC"))
        connection.execute(text(f"REVOKE CREATE ON SCHEMA {where} FROM {who}"))
        connection.execute(text(f"GRANT USAGE ON SCHEMA {where} TO {who}"))
        connection.execute(text(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {where} TO {who}"))
        for table in APPEND_ONLY_TABLES:
            connection.execute(text(f"REVOKE UPDATE, DELETE ON {where}.{table} FROM {who}"))
        connection.execute(text(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {where} TO {who}"))


def main(argv: list[str] | None = None) -> int:
    from deletion.domain.config import current

    parser = argparse.ArgumentParser(prog="python -m deletion.domain.roles",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    grant = sub.add_parser("grant-app", help="grant the application role its rights (as the owner)")
    grant.add_argument("role")
    args = parser.parse_args(argv)
    engine = make_engine(current().database_url)
    try:
        app_role_grant(engine, role=args.role)
    except ValueError as exc:
        sys.stderr.write(f"role: {exc}\n")
        return 2
    finally:
        engine.dispose()
    sys.stdout.write(f"granted the application's rights to {args.role}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
