from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.errors import DomainError, InvalidTransition, ValidationError
from deletion.domain.models import Certificate, CheckpointCertificate, Model, utcnow
from deletion.domain.services import job_claim, job_create
from deletion.domain.states import CheckpointStatus
from tests.domain.conftest import make_checkpoint_dir, submit_approved


def test_the_checkpoint_digest_follows_the_documented_recipe(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.bin").write_bytes(b"\x00\x01")
    (tmp_path / "sub" / "a.json").write_text("{}")
    lines = sorted(
        f"{name}:{hashlib.sha256(data).hexdigest()}\n"
        for name, data in (("b.bin", b"\x00\x01"), ("sub/a.json", b"{}"))
    )
    assert registry.checkpoint_digest(tmp_path) == hashlib.sha256("".join(lines).encode()).hexdigest()
    (tmp_path / "sub" / "a.json").write_text("{ }")
    assert registry.checkpoint_digest(tmp_path) != hashlib.sha256("".join(lines).encode()).hexdigest()


def test_it_agrees_with_the_engines_checkpoint_digest(tmp_path: Path) -> None:
    from unlearning import checkpoints as engine

    make_checkpoint_dir(tmp_path, "ckpt")
    assert registry.checkpoint_digest(tmp_path / "ckpt") == engine.checkpoint_digest(tmp_path / "ckpt")


@pytest.mark.parametrize("target", ["file inside", "file outside", "folder outside"])
def test_both_digests_refuse_a_symlink_instead_of_skipping_it(tmp_path: Path, target: str) -> None:
    """Fails on the old code, which skipped links: code or weights outside the digest
    could then load with a checkpoint whose digest still matched."""
    from unlearning import checkpoints as engine

    directory = make_checkpoint_dir(tmp_path, "ckpt")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kif_remote.py").write_text("import os  # not what was registered\n")
    before = registry.checkpoint_digest(directory)
    link = directory / ("sub" if target == "folder outside" else "kif_remote.py")
    link.symlink_to({"file inside": directory / "config.json",
                     "file outside": outside / "kif_remote.py",
                     "folder outside": outside}[target])

    with pytest.raises(ValidationError, match="symlink"):
        registry.checkpoint_digest(directory)
    with pytest.raises(engine.CheckpointFileRefused, match="symlink"):
        engine.checkpoint_digest(directory)
    assert registry.checkpoint_files_digest(str(directory)) == registry.REFUSED != before


def issue_certificate(session: Session, job_id: int, seq: int) -> Certificate:
    # A stand-in row: the certificates module (another layer) writes real ones.
    certificate = Certificate(seq=seq, certificate_id=f"C-{seq}", payload="{}", payload_hash="1" * 64,
                              prev_hash="0" * 64, signature="sig", key_id="k", signed_at=utcnow(),
                              job_id=job_id)
    session.add(certificate)
    session.flush()
    return certificate


def run_to_promotion(session: Session, tmp_path: Path, name: str):
    request = submit_approved(session, name=name)
    job = job_create(session, actor="scheduler", model_name="demo", references=[request.reference],
                     method="asu")
    order = ["queued", "building_sets", "unlearning", "verifying", "certifying", "promoting"]
    for current, following in zip(order, order[1:], strict=False):
        job_claim(session, job_id=job.id, expected_stage=current, next_stage=following)
    candidate = registry.checkpoint_register(
        session, actor="worker", model_name="demo", job_id=job.id, parent_id=job.base_checkpoint_id,
        directory=str(make_checkpoint_dir(tmp_path, f"cand-{job.id}", name.encode())),
    )
    return job, candidate


def test_promotion_moves_the_serving_pointer_and_schedules_the_old_checkpoint_for_destruction(
    session: Session, model: Model, tmp_path: Path
) -> None:
    job, candidate = run_to_promotion(session, tmp_path, "First Person")
    assert job.candidate_checkpoint_id == candidate.id and candidate.version == 2
    with pytest.raises(DomainError, match="no certificate"):
        registry.checkpoint_promote(session, actor="worker", job_id=job.id, candidate_id=candidate.id)
    first_cert = issue_certificate(session, job.id, 1)
    old_id = job.base_checkpoint_id
    registry.checkpoint_promote(session, actor="worker", job_id=job.id, candidate_id=candidate.id,
                                grace_hours=0)
    assert model.serving_checkpoint_id == candidate.id
    assert candidate.status == CheckpointStatus.SERVING
    due = registry.checkpoints_due_for_destruction(session, now=utcnow())
    assert [c.id for c in due] == [old_id]
    registry.checkpoint_destroy(session, actor="beat", checkpoint_id=old_id)
    assert due[0].status == CheckpointStatus.DESTROYED and due[0].destroyed_at is not None

    # The next checkpoint embodies both certificates (its own and its parent's).
    job_claim(session, job_id=job.id, expected_stage="promoting", next_stage="done")
    job2, candidate2 = run_to_promotion(session, tmp_path, "Second Person")
    second_cert = issue_certificate(session, job2.id, 2)
    registry.checkpoint_promote(session, actor="worker", job_id=job2.id, candidate_id=candidate2.id)
    embodied = set(session.execute(
        select(CheckpointCertificate.certificate_id)
        .where(CheckpointCertificate.checkpoint_id == candidate2.id)
    ).scalars())
    assert embodied == {first_cert.id, second_cert.id}


def test_promotion_refuses_a_job_built_on_a_checkpoint_that_no_longer_serves(
    session: Session, model: Model, tmp_path: Path
) -> None:
    job, candidate = run_to_promotion(session, tmp_path, "First Person")
    issue_certificate(session, job.id, 1)
    model.serving_checkpoint_id = candidate.id  # someone else moved the pointer
    with pytest.raises(registry.StaleBase):
        registry.checkpoint_promote(session, actor="worker", job_id=job.id, candidate_id=candidate.id)


def test_a_destroyed_checkpoint_never_comes_back(session: Session, model: Model) -> None:
    serving = model.serving_checkpoint
    with pytest.raises(InvalidTransition):
        registry.checkpoint_destroy(session, actor="beat", checkpoint_id=serving.id)


def test_tombstones_make_a_new_corpus_version(session: Session, model: Model) -> None:
    first = registry.corpus_current(session, name="demo-corpus")
    second = registry.corpus_tombstone(session, actor="worker", corpus="demo-corpus",
                                       record_ids=["p1-a", "p1-b"])
    assert (second.version, second.tombstoned_count) == (2, 2)
    assert second.manifest_digest != first.manifest_digest
    assert registry.corpus_tombstoned_ids(session, name="demo-corpus") == {"p1-a", "p1-b"}
    same = registry.corpus_tombstone(session, actor="worker", corpus="demo-corpus", record_ids=["p1-a"])
    assert same.id == second.id
    third = registry.corpus_tombstone(session, actor="worker", corpus="demo-corpus",
                                      record_ids=["p1-a", "p2-a"])
    assert (third.version, third.tombstoned_count) == (3, 3)


def test_a_model_cannot_serve_twice_without_a_certificate(session: Session, model: Model, tmp_path: Path) -> None:
    with pytest.raises(DomainError):
        registry.checkpoint_register(session, actor="admin", model_name="demo", serving=True,
                                     directory=str(make_checkpoint_dir(tmp_path, "sneaky")))


def test_it_changes_a_models_batch_window_within_bounds(session: Session, model: Model) -> None:
    registry.model_schedule_update(session, actor="admin", name="demo", batch_window_hours=6)
    assert model.batch_window_hours == 6
    from deletion.domain.errors import ValidationError

    for bad in (0, 24 * 14 + 1):
        with pytest.raises(ValidationError):
            registry.model_schedule_update(session, actor="admin", name="demo", batch_window_hours=bad)
