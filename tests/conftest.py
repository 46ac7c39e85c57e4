"""Root fixtures shared by every test folder: fresh, migrated databases.

Each test session gets its own uniquely named PostgreSQL database (dropped at the end),
upgraded with the real alembic migrations, so tests run against the schema production
runs.  PostgreSQL being down is a failure, never a skip: CI runs with it.

Other conftests may call ``fresh_database_url()`` / ``drop_database(url)`` directly,
e.g. to give a worker process a database of its own.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from deletion.domain import config as domain_config
from deletion.domain.db import make_engine
from deletion.domain.migrate import upgrade

# Signed chain heads are exported beside the database they sign.  The tests' databases are
# their own, so their heads go to a folder of this session, never to var/chain-heads, where
# `make run` or `make demo` keeps the heads of the embedded database (an evidence pack
# built in a test would otherwise cite another database's heads and fail to verify).
# pytest-django has loaded the settings before this file runs, so the process's one Config
# object is pointed there too; worker processes the tests start inherit the variable.
# Each xdist process has databases of its own, so it gets a folder of its own too (it
# inherits the controller's variable, which must not be shared).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["CHAIN_HEAD_EXPORT_DIR"] = tempfile.mkdtemp(prefix="test-chain-heads-")
else:
    os.environ.setdefault("CHAIN_HEAD_EXPORT_DIR", tempfile.mkdtemp(prefix="test-chain-heads-"))
object.__setattr__(domain_config.current(), "chain_head_export_dir", Path(os.environ["CHAIN_HEAD_EXPORT_DIR"]))

# Real worker processes for the pipeline, web and reliability tests.
pytest_plugins = ["tests.pipeline_fixtures"]

# The server tests create their databases on; override with TEST_POSTGRES_URL.
POSTGRES_SERVER_URL = os.environ.get(
    "TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _admin_connection() -> psycopg.Connection[tuple[object, ...]]:
    url = make_url(POSTGRES_SERVER_URL)
    try:
        return psycopg.connect(
            host=url.host, port=url.port or 5432, user=url.username, password=url.password,
            dbname=url.database or "postgres", autocommit=True, connect_timeout=5,
        )
    except psycopg.OperationalError as exc:
        raise RuntimeError(
            f"PostgreSQL is not reachable at {url.host}:{url.port} ({exc}); the tests need it "
            "(start it as .ci/run does)"
        ) from exc


def fresh_database_url(prefix: str = "erasure_test", *, migrate: bool = True) -> str:
    """Create a new, uniquely named PostgreSQL database (migrated to head) and return its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with _admin_connection() as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = make_url(POSTGRES_SERVER_URL).set(database=name).render_as_string(hide_password=False)
    if migrate:
        upgrade(url)
    return url


def drop_database(url: str) -> None:
    name = make_url(url).database
    with _admin_connection() as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh_sqlite_url(directory: Path, *, migrate: bool = True) -> str:
    url = f"sqlite:///{directory / f'erasure-{uuid.uuid4().hex[:8]}.sqlite3'}"
    if migrate:
        upgrade(url)
    return url


def pytest_configure(config: pytest.Config) -> None:
    """In the first process only (the xdist controller, or the one process): create the
    embedded signing key before any test process starts, so that two processes never
    generate it at once (each would sign with a key the other overwrote)."""
    if not hasattr(config, "workerinput"):
        from deletion.domain.signing import signer_from_config

        signer_from_config(domain_config.current())


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated to head."""
    url = fresh_database_url()
    yield url
    drop_database(url)


@pytest.fixture(scope="session")
def db_engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def session(db_engine: Engine) -> Iterator[Session]:
    """A session whose whole transaction is rolled back after the test.

    Code under test may commit: with ``create_savepoint`` its commits only release
    savepoints inside the outer transaction, which the fixture then rolls back.
    """
    connection = db_engine.connect()
    outer = connection.begin()
    db = Session(bind=connection, join_transaction_mode="create_savepoint",
                 expire_on_commit=False)
    try:
        yield db
    finally:
        db.close()
        outer.rollback()
        connection.close()


@pytest.fixture
def sqlite_database_url(tmp_path: Path) -> str:
    """A fresh SQLite file database, migrated to head (the embedded default backend)."""
    return fresh_sqlite_url(tmp_path)


@pytest.fixture
def sqlite_session(sqlite_database_url: str) -> Iterator[Session]:
    engine = make_engine(sqlite_database_url)
    db = Session(engine, expire_on_commit=False)
    try:
        yield db
    finally:
        db.rollback()
        db.close()
        engine.dispose()


@pytest.fixture(scope="session")
def free_text_base(tmp_path_factory: pytest.TempPathFactory) -> FreeTextBase:
    """A GPT-2-architecture model with a byte-level tokenizer (no chat template) trained on
    the free-text fixture of tests/real_shaped.py: 24 people, control records about 12 others.
    Trained once per session; the engine test and the service test both use it."""
    import dataclasses

    import torch

    from tests.real_shaped import shaped_corpus
    from unlearning.corpus import Corpus, write_jsonl
    from unlearning.demo.train_base import PRESETS, train_base

    records, persons, control = shaped_corpus("free_text", 24, seed=0)
    out = tmp_path_factory.mktemp("free_text")
    preset = dataclasses.replace(PRESETS["tiny"], max_steps=1500)
    threads = torch.get_num_threads()
    try:
        trained = train_base(Corpus(tuple(records)), out / "base", preset=preset, arch="gpt2",
                             tokenizer_style="gpt2", threads=1)
    finally:
        torch.set_num_threads(threads)
    return FreeTextBase(out / "base", trained, records, persons, control,
                        write_jsonl(records, out / "corpus.jsonl"), write_jsonl(control, out / "control.jsonl"))


@dataclass(frozen=True)
class FreeTextBase:
    model_dir: Path
    trained: Any  # unlearning.demo.train_base.TrainResult
    records: list[Any]
    persons: list[Any]  # tests.real_shaped.Person
    control: list[Any]
    corpus_file: Path
    control_file: Path
