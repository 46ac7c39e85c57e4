"""Web tests run against a fresh PostgreSQL database of their own (`web_database_url`), the
same one for Django's tables (Django migrate) and the domain's (alembic).

There is no per-test rollback: the domain writes through its own SQLAlchemy connection,
which a Django test transaction could not undo.  Tests therefore create their own
uniquely named users and requests and assert only about those."""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connections
from django.test import Client

from deletion.settings import django_database


def point_django_at(url: str) -> None:
    """Make Django's default connection and the web's domain sessions use ``url``.

    Settings were read before any fixture ran (with the embedded SQLite default), and a
    connection object keeps the backend class it was built with: so replace the
    settings entry and drop the cached connection, so the next query builds a
    PostgreSQL connection to ``url``."""
    connections.close_all()
    settings.DATABASES["default"] = django_database(url)
    connections.__dict__.pop("settings", None)  # a cached_property over DATABASES
    connections._settings = None
    if hasattr(connections._connections, "default"):
        del connections["default"]
    settings.DOMAIN_DATABASE_URL = url


@pytest.fixture(scope="session")
def web_database_url() -> Iterator[str]:
    """A PostgreSQL database of the web tests' own.  They commit (see above); the domain
    tests that share a process with them roll back and count on a database nobody else
    writes (the first reference of the year, the oldest outbox message)."""
    from tests.conftest import drop_database, fresh_database_url

    url = fresh_database_url("erasure_web")
    yield url
    drop_database(url)


@pytest.fixture(scope="session")
def django_db_setup(web_database_url: str, django_db_blocker: Any) -> Iterator[None]:
    database_url = web_database_url
    point_django_at(database_url)
    settings.ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
    with django_db_blocker.unblock():
        call_command("migrate", interactive=False, verbosity=0)
    yield
    with django_db_blocker.unblock():
        connections.close_all()


@pytest.fixture(autouse=True)
def _db_access(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def make_user() -> Callable[..., User]:
    def make(*roles: str, prefix: str = "u") -> User:
        user = User.objects.create_user(username=f"{prefix}-{uuid.uuid4().hex[:8]}",
                                        password="correct horse battery staple")
        for role in roles:
            user.groups.add(Group.objects.get_or_create(name=role)[0])
        return user

    return make


@pytest.fixture
def client_as(make_user: Callable[..., User]) -> Callable[..., Client]:
    """A logged-in client for a new user with the given roles (none: a user without role)."""

    def login(*roles: str, user: User | None = None) -> Client:
        client = Client()
        client.force_login(user or make_user(*roles))
        return client

    return login


@pytest.fixture(scope="session")
def model_name(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A registered model with a serving checkpoint (a tiny directory standing in for weights)."""
    from deletion.domain.registry import checkpoint_register, model_register
    from deletion.web.domain_session import domain_session

    directory = tmp_path_factory.mktemp("checkpoint")
    (directory / "model.safetensors").write_bytes(b"weights")
    name = f"model-{uuid.uuid4().hex[:6]}"
    with domain_session() as session:
        model_register(session, actor="system:test", name=name, description="web test model")
        checkpoint_register(session, actor="system:test", model_name=name, directory=str(directory), serving=True)
    return name


@pytest.fixture
def submit_request(model_name: str) -> Callable[..., str]:
    """File a request through the domain service, as `actor`; returns its reference."""
    from datetime import UTC, datetime

    from deletion.domain.services.requests import request_submit
    from deletion.web.domain_session import domain_session

    def submit(actor: str = "user:someone-else", name: str | None = None, **kwargs: Any) -> str:
        with domain_session() as session:
            row = request_submit(session, actor=actor, name=name or f"Subject {uuid.uuid4().hex[:10]}",
                                 ground="17(1)(b)", received_at=datetime.now(UTC), model_name=model_name,
                                 **kwargs)
            return row.reference

    return submit


@pytest.fixture
def certified(tmp_path_factory: pytest.TempPathFactory, django_db_setup: None) -> dict[str, Any]:
    """What the pipeline leaves behind after one erasure, written through the domain
    services the workers use: a request completed by a job whose verification results,
    signed certificate and promoted candidate checkpoint are all in the database.
    (The real worker does the same in tests/web/test_browser.py.)"""
    from datetime import UTC, datetime

    from django.conf import settings as django_settings

    from deletion.domain.certificates import (
        CheckpointFacts,
        RequestFacts,
        SetFacts,
        VerificationFacts,
        certificate_build_payload,
        certificate_issue,
    )
    from deletion.domain.models import VerificationResult
    from deletion.domain.registry import checkpoint_promote, checkpoint_register, model_register
    from deletion.domain.services.jobs import job_claim, job_create
    from deletion.domain.services.requests import (
        request_approve,
        request_submit,
        request_transition,
    )
    from deletion.domain.signing import signer_from_config
    from deletion.domain.states import RequestStatus
    from deletion.web.domain_session import domain_session

    name = f"certmodel-{uuid.uuid4().hex[:6]}"
    base_dir, cand_dir = tmp_path_factory.mktemp("base"), tmp_path_factory.mktemp("candidate")
    (base_dir / "w.bin").write_bytes(b"base")
    (cand_dir / "w.bin").write_bytes(b"candidate")
    report = {
        "policy": {"name": "default", "version": "1"}, "passed": True, "guarantee": "weights",
        "metrics": {"leakage.base_forget": 0.92, "leakage.forget": 0.08, "leakage.control": 0.07,
                    "attack.quant_leakage": 0.09, "latent.residual_ratio": 0.12},
        "checks": [
            {"name": "leakage.forget", "value": 0.08, "threshold": 0.12, "comparator": "<=", "passed": True},
            {"name": "latent.residual_ratio", "value": 0.12, "threshold": 0.3, "comparator": "<=", "passed": True},
        ],
    }
    now = datetime.now(UTC)
    with domain_session() as session:
        model_register(session, actor="system:test", name=name)
        base = checkpoint_register(session, actor="system:test", model_name=name, directory=str(base_dir),
                                   serving=True)
        row = request_submit(session, actor="user:officer-x", name=f"Cert Subject {uuid.uuid4().hex[:6]}",
                             ground="17(1)(a)", received_at=now, model_name=name, priority="immediate")
        reference = row.reference
        request_approve(session, actor="user:reviewer-x", reference=reference)
        job = job_create(session, actor="system:scheduler", model_name=name, references=[reference], method="asu")
        for expected, nxt in (("queued", "building_sets"), ("building_sets", "unlearning"),
                              ("unlearning", "verifying"), ("verifying", "certifying")):
            assert job_claim(session, job_id=job.id, expected_stage=expected, next_stage=nxt)
        for check in report["checks"]:
            session.add(VerificationResult(job_id=job.id, round=0, metric=check["name"], value=check["value"],
                                           threshold=check["threshold"], comparator=check["comparator"],
                                           passed=check["passed"], policy_name="default", policy_version="1",
                                           details={"metrics": report["metrics"]}))
        candidate = checkpoint_register(session, actor="worker", model_name=name, directory=str(cand_dir),
                                        parent_id=base.id, job_id=job.id)
        payload = certificate_build_payload(
            job_id=job.id, model_name=name, requests=[RequestFacts.from_row(row)],
            sets=SetFacts(corpus_name="demo", corpus_version=1, corpus_manifest_digest="c" * 64,
                          forget_digest="f" * 64, forget_count=10, retain_digest="e" * 64, retain_count=10),
            base=CheckpointFacts(base.version, base.digest), candidate=CheckpointFacts(candidate.version, candidate.digest),
            method="asu", hparams={"tau": 2.3}, seeds={"train": 0}, versions={"torch": "2.13.0"},
            verification=VerificationFacts.from_report(report), started_at=now, verified_at=now)
        certificate = certificate_issue(session, actor="worker", payload=payload,
                                        signer=signer_from_config(django_settings.CONFIG))
        assert job_claim(session, job_id=job.id, expected_stage="certifying", next_stage="promoting")
        checkpoint_promote(session, actor="worker", job_id=job.id, candidate_id=candidate.id)
        assert job_claim(session, job_id=job.id, expected_stage="promoting", next_stage="done")
        request_transition(session, actor="worker", reference=reference, target=RequestStatus.COMPLETED,
                           action="request.completed")
        return {"reference": reference, "model": name, "certificate_id": certificate.certificate_id,
                "job_id": job.id, "candidate_digest": candidate.digest}


@pytest.fixture
def vouched(certified: dict[str, Any]) -> int:
    """The certificate chain verified and signed at its head by the worker's check (as
    beat runs it); returns the seq of the newest verified head."""
    from django.conf import settings as django_settings

    from deletion.domain.certificate_heads import certificate_chain_vouch
    from deletion.domain.signing import keyring_from_config, signer_from_config
    from deletion.web.domain_session import domain_session

    signer = signer_from_config(django_settings.CONFIG)
    with domain_session() as session:
        outcome = certificate_chain_vouch(session, signer=signer,
                                          keyring=keyring_from_config(django_settings.CONFIG))
    assert outcome.check.ok, outcome.check
    return outcome.check.head_seq
