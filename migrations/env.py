"""Alembic environment for the domain tables (deletion.domain.models).

The URL is, in order: a connection handed in by ``deletion.domain.migrate``, ``-x url=``
on the command line, else ``DATABASE_URL`` through the domain settings.  Tables that the
models do not declare (Django's auth and session tables share the database) are
ignored, so autogenerate and ``alembic check`` never propose dropping them.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from deletion.domain import config as domain_config
from deletion.domain.db import make_engine
from deletion.domain.migrate import include_name
from deletion.domain.models import Base

target_metadata = Base.metadata
alembic_config = context.config
if alembic_config.config_file_name is not None and not alembic_config.attributes.get(
    "skip_logging"
):
    fileConfig(alembic_config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    return context.get_x_argument(as_dictionary=True).get("url") or (
        domain_config.current().database_url
    )


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=include_name,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        include_name=include_name,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = alembic_config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
