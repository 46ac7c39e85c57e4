"""Fixtures for the domain tests: a registered model that serves a checkpoint."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.models import AuditEvent, Model
from deletion.domain.services import request_approve, request_submit

SUBMITTER = "officer.ana"
REVIEWER = "officer.ben"


def make_checkpoint_dir(root: Path, name: str, content: bytes = b"weights") -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(content)
    (directory / "config.json").write_text('{"layers": 2}')
    return directory


def register_model(session: Session, root: Path, name: str = "demo") -> Model:
    registry.corpus_register(
        session, actor="admin", name=f"{name}-corpus", path=str(root / "corpus.jsonl"),
        manifest_digest="a" * 64, record_count=10,
    )
    model = registry.model_register(session, actor="admin", name=name, corpus_name=f"{name}-corpus")
    registry.checkpoint_register(
        session, actor="admin", model_name=name, directory=str(make_checkpoint_dir(root, f"{name}-v1")),
        serving=True,
    )
    return model


def submit(session: Session, model_name: str = "demo", name: str = "Mara Okafor", **extra: object):
    values: dict[str, object] = {
        "actor": SUBMITTER, "name": name, "ground": "17(1)(b)",
        "received_at": datetime(2026, 11, 2, 9, 30, tzinfo=UTC), "model_name": model_name,
        "now": datetime(2026, 11, 3, tzinfo=UTC),
    }
    values.update(extra)
    return request_submit(session, **values)  # type: ignore[arg-type]


def submit_approved(session: Session, model_name: str = "demo", name: str = "Mara Okafor"):
    request = submit(session, model_name=model_name, name=name)
    request_approve(session, actor=REVIEWER, reference=request.reference)
    return request


def audit_count(session: Session) -> int:
    return session.execute(select(func.count()).select_from(AuditEvent)).scalar_one()


@pytest.fixture
def model(session: Session, tmp_path: Path) -> Model:
    return register_model(session, tmp_path)
