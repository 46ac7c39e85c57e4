"""Run the domain's alembic migrations from code (``manage.py migrate_all`` wraps this)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config as AlembicConfig
from alembic.migration import MigrationContext

from deletion.domain.config import REPO_ROOT
from deletion.domain.db import make_engine, normalise_url
from deletion.domain.models import Base

ALEMBIC_INI = REPO_ROOT / "alembic.ini"


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Only the domain's tables: Django's auth/session tables share the database."""
    if type_ == "table":
        return name in Base.metadata.tables
    return True


def drift(url: str) -> list[Any]:
    """What autogenerate would change to make the database match the models ([] = none)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={"compare_type": True, "include_name": include_name,
                      "target_metadata": Base.metadata},
            )
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def alembic_config(url: str) -> AlembicConfig:
    cfg = AlembicConfig(str(ALEMBIC_INI))
    cfg.set_main_option("script_location", str(Path(REPO_ROOT, "migrations")))
    cfg.attributes["skip_logging"] = True  # leave the caller's logging alone
    cfg.cmd_opts = None
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (creating a SQLite file's folder)."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    cfg = alembic_config(url)
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def downgrade(url: str, revision: str = "base") -> None:
    cfg = alembic_config(url)
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.downgrade(cfg, revision)
    finally:
        engine.dispose()
