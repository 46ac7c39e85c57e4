"""Beat's integrity checks on a real PostgreSQL database, without a worker: serving
checkpoints re-hashed between jobs, and chain heads signed and kept off the database."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, select, text, update
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.audit import audit_append, audit_event_hash, audit_verify
from deletion.domain.certificates import certificate_verify_chain
from deletion.domain.chains import AUDIT_CHAIN, CERTIFICATE_CHAIN
from deletion.domain.config import ensure_signing_key
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import AuditEvent, Certificate, ChainHead, Checkpoint
from deletion.domain.signing import KeyRing, Signer, keyring_load, signer_load
from tests.conftest import drop_database, fresh_database_url
from tests.domain.test_certificates import _issue_chain
from workers import beat, routing
from workers.integrity import (
    HEADS_FILE,
    INTEGRITY_FAILED,
    INTEGRITY_RESTORED,
    chain_heads_check,
    chain_heads_check_file,
    chain_heads_export,
    checkpoints_check_serving,
)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    url = fresh_database_url("erasure_integrity")
    engine = make_engine(url)
    yield engine
    engine.dispose()
    drop_database(url)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Signer, KeyRing]:
    folder = tmp_path_factory.mktemp("integrity-keys")
    ensure_signing_key(folder / "signing.pem")
    signer = signer_load(key_file=folder / "signing.pem", keyring_dir=folder / "ring")
    return signer, keyring_load(folder / "ring")


def a_serving_checkpoint(engine: Engine, tmp_path: Path) -> tuple[str, int, Path]:
    name = f"m-{uuid.uuid4().hex[:8]}"
    directory = tmp_path / name / "v1"
    directory.mkdir(parents=True)
    (directory / "weights.bin").write_bytes(b"weights")
    with session_scope(engine) as session:
        registry.corpus_register(session, actor="test", name=f"c-{name}", path="/dev/null",
                                 manifest_digest="0" * 64, record_count=1)
        registry.model_register(session, actor="test", name=name, corpus_name=f"c-{name}",
                                batch_window_hours=24)
        checkpoint = registry.checkpoint_register(session, actor="test", model_name=name,
                                                  directory=str(directory), serving=True)
        checkpoint_id = checkpoint.id
    return name, checkpoint_id, directory


def integrity_events(engine: Engine, model: str) -> list[AuditEvent]:
    with session_scope(engine) as session:
        return list(session.execute(
            select(AuditEvent).where(AuditEvent.object_ref == f"{model}@1",
                                     AuditEvent.action.in_((INTEGRITY_FAILED, INTEGRITY_RESTORED)))
            .order_by(AuditEvent.seq)
        ).scalars())


# ------------------------------------------------------------- serving checkpoints


def test_an_intact_serving_checkpoint_adds_no_audit_event(engine: Engine, tmp_path: Path) -> None:
    model, checkpoint_id, _ = a_serving_checkpoint(engine, tmp_path)

    report = checkpoints_check_serving(engine=engine)

    assert checkpoint_id not in report.mismatched
    assert report.checked >= 1
    assert integrity_events(engine, model) == []


def test_a_changed_serving_checkpoint_is_reported_once_until_its_files_match_again(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    model, checkpoint_id, directory = a_serving_checkpoint(engine, tmp_path)
    with session_scope(engine) as session:
        expected = session.get(Checkpoint, checkpoint_id).digest  # type: ignore[union-attr]
    (directory / "weights.bin").write_bytes(b"weightz")
    actual = registry.checkpoint_digest(directory)

    with caplog.at_level(logging.ERROR, logger="workers.integrity"):
        first = checkpoints_check_serving(engine=engine)
    second = checkpoints_check_serving(engine=engine)

    assert checkpoint_id in first.reported and checkpoint_id in second.mismatched
    assert checkpoint_id not in second.reported  # idempotent: no flood on the chain
    [event] = integrity_events(engine, model)
    assert (event.action, event.actor) == (INTEGRITY_FAILED, "system:integrity")
    assert json.loads(event.details) == {"model": model, "checkpoint_id": checkpoint_id,
                                         "version": 1, "expected": expected[:12],
                                         "actual": actual[:12]}
    assert str(tmp_path) not in event.details  # digests and ids only, no paths
    assert any(r.levelno == logging.ERROR and str(checkpoint_id) in r.getMessage()
               for r in caplog.records)

    (directory / "weights.bin").write_bytes(b"weights")
    restored = checkpoints_check_serving(engine=engine)
    again = checkpoints_check_serving(engine=engine)

    assert checkpoint_id in restored.restored and checkpoint_id not in again.restored
    assert [e.action for e in integrity_events(engine, model)] == [INTEGRITY_FAILED,
                                                                   INTEGRITY_RESTORED]

    (directory / "weights.bin").write_bytes(b"weightz")  # broken again: a new event
    assert checkpoint_id in checkpoints_check_serving(engine=engine).reported
    with session_scope(engine) as session:
        assert audit_verify(session).ok


def test_a_different_mismatch_and_a_missing_directory_are_each_reported(
    engine: Engine, tmp_path: Path,
) -> None:
    model, checkpoint_id, directory = a_serving_checkpoint(engine, tmp_path)
    (directory / "weights.bin").write_bytes(b"one")
    checkpoints_check_serving(engine=engine)
    (directory / "weights.bin").unlink()
    directory.rmdir()

    report = checkpoints_check_serving(engine=engine)

    assert checkpoint_id in report.reported
    events = integrity_events(engine, model)
    assert [json.loads(e.details)["actual"] for e in events][-1] == "missing"
    assert len(events) == 2


# ------------------------------------------------------------------- chain heads


def a_few_chain_rows(engine: Engine, signer: Signer, count: int = 4) -> None:
    with session_scope(engine) as session:
        for i in range(count):
            audit_append(session, actor="test", action="request.approved",
                         object_type="erasure_request", object_ref=f"ER-T-{i}", details={"i": i})
        _issue_chain(session, signer, count)


def current_heads(engine: Engine) -> dict[str, tuple[int, str]]:
    with session_scope(engine) as session:
        return {h.name: (h.seq, h.hash) for h in session.execute(select(ChainHead)).scalars()}


def test_exported_heads_are_signed_appended_and_hold_while_the_chains_grow(
    engine: Engine, keys: tuple[Signer, KeyRing], tmp_path: Path,
) -> None:
    signer, ring = keys
    a_few_chain_rows(engine, signer)
    first = chain_heads_export(engine=engine, signer=signer, export_dir=tmp_path)
    a_few_chain_rows(engine, signer, count=2)
    chain_heads_export(engine=engine, signer=signer, export_dir=tmp_path)

    lines = (tmp_path / HEADS_FILE).read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == first
    assert {h["chain"]: (h["seq"], h["hash"]) for h in json.loads(lines[1])["heads"]} \
        == current_heads(engine)
    with session_scope(engine) as session:
        verdict = chain_heads_check_file(session, path=tmp_path / HEADS_FILE, keyring=ring)
    assert verdict.ok, verdict.problems
    assert (verdict.records, verdict.checked) == (2, 4)


@pytest.mark.parametrize("chain", [AUDIT_CHAIN, CERTIFICATE_CHAIN])
def test_a_cut_tail_with_a_rewound_head_row_passes_the_chain_but_not_the_exported_heads(
    engine: Engine, keys: tuple[Signer, KeyRing], tmp_path: Path, chain: str,
) -> None:
    signer, ring = keys
    a_few_chain_rows(engine, signer)
    chain_heads_export(engine=engine, signer=signer, export_dir=tmp_path)
    lines = (tmp_path / HEADS_FILE).read_text().splitlines()
    table: Any = AuditEvent if chain == AUDIT_CHAIN else Certificate
    with Session(engine) as session:
        session.begin()
        session.execute(text("SET LOCAL session_replication_role = replica"))  # superuser
        last = session.execute(select(ChainHead.seq).where(ChainHead.name == chain)).scalar_one()
        keep = last - 2
        if chain == AUDIT_CHAIN:
            kept_hash = session.execute(select(AuditEvent.hash)
                                        .where(AuditEvent.seq == keep)).scalar_one()
        else:
            following = session.execute(select(Certificate.prev_hash)
                                        .where(Certificate.seq == keep + 1)).scalar_one()
            kept_hash = following  # the chain hash after row `keep`
        session.execute(delete(table).where(table.seq > keep))
        session.execute(update(ChainHead).where(ChainHead.name == chain)
                        .values(seq=keep, hash=kept_hash))
        if chain == AUDIT_CHAIN:
            assert audit_verify(session).ok  # the chain alone cannot tell
        else:
            assert certificate_verify_chain(session, ring).ok

        verdict = chain_heads_check(session, lines=lines, keyring=ring)
        session.rollback()

    assert not verdict.ok
    assert f"{chain} seq {last}: exported, no longer in the database" in verdict.problems
    assert f"{chain}: head at seq {keep}, behind the exported seq {last}" in verdict.problems


def test_a_consistent_rewrite_of_the_audit_chain_fails_the_exported_heads(
    engine: Engine, keys: tuple[Signer, KeyRing], tmp_path: Path,
) -> None:
    signer, ring = keys
    a_few_chain_rows(engine, signer)
    record = chain_heads_export(engine=engine, signer=signer, export_dir=tmp_path)
    exported_seq = record["heads"][0]["seq"]
    with Session(engine) as session:
        session.begin()
        session.execute(text("SET LOCAL session_replication_role = replica"))
        events = session.execute(select(AuditEvent).where(AuditEvent.seq >= exported_seq - 2)
                                 .order_by(AuditEvent.seq)).scalars().all()
        prev = events[0].prev_hash
        for event in events:
            actor = "someone.else" if event.seq == exported_seq - 2 else event.actor
            digest = audit_event_hash(seq=event.seq, at=event.at, actor=actor,
                                      action=event.action, object_type=event.object_type,
                                      object_ref=event.object_ref, details=event.details,
                                      prev_hash=prev)
            session.execute(update(AuditEvent).where(AuditEvent.seq == event.seq)
                            .values(actor=actor, prev_hash=prev, hash=digest))
            prev = digest
        session.execute(update(ChainHead).where(ChainHead.name == AUDIT_CHAIN).values(hash=prev))
        assert audit_verify(session).ok
        verdict = chain_heads_check(session, lines=[json.dumps(record)], keyring=ring)
        session.rollback()

    assert verdict.problems == (f"audit seq {exported_seq}: hash differs from the exported head",)


def test_an_edited_or_foreign_export_line_is_refused(
    engine: Engine, keys: tuple[Signer, KeyRing], tmp_path: Path,
) -> None:
    signer, ring = keys
    record = chain_heads_export(engine=engine, signer=signer, export_dir=tmp_path)
    edited = json.loads(json.dumps(record))
    edited["heads"][0]["seq"] -= 1  # a forger moving the mark back to fit a cut chain
    ensure_signing_key(tmp_path / "other.pem")
    other = signer_load(key_file=tmp_path / "other.pem")
    foreign = chain_heads_export(engine=engine, signer=other, export_dir=tmp_path / "o")

    with session_scope(engine) as session:
        verdict = chain_heads_check(session, keyring=ring, lines=[
            json.dumps(record), json.dumps(edited), json.dumps(foreign), "{not json",
        ])

    assert verdict.problems == ("line 2: bad signature", "line 3: signed by an unknown key",
                                "line 4: not JSON")
    assert verdict.records == 4


def test_beat_runs_both_checks_on_the_default_queue_expiring_with_their_period() -> None:
    entries = {e["task"]: e for e in beat.SCHEDULE.values()}
    for task, period in ((routing.CHECK_SERVING_DIGESTS, 3600.0),
                         (routing.EXPORT_CHAIN_HEADS, 900.0)):
        entry = entries[task]
        assert entry["schedule"].total_seconds() == period
        assert entry["options"] == {"expires": period, "queue": routing.DEFAULT_QUEUE}
    from workers import tasks

    assert tasks.check_serving_digests.name == routing.CHECK_SERVING_DIGESTS
    assert tasks.export_chain_heads.name == routing.EXPORT_CHAIN_HEADS


def test_the_beat_tasks_run_both_checks_with_the_worker_settings(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from deletion.domain.config import load
    from workers import runtime, tasks

    cfg = load({"VAR_DIR": str(tmp_path)})
    monkeypatch.setattr(runtime, "config", lambda: cfg)
    runtime.use_database(engine.url.render_as_string(hide_password=False))
    try:
        assert tasks.export_chain_heads.run() == 2
        mismatched = tasks.check_serving_digests.run()
    finally:
        runtime.use_database(None)

    [line] = (tmp_path / "chain-heads" / HEADS_FILE).read_text().splitlines()
    ring = keyring_load(cfg.signing_keyring_dir)
    with session_scope(engine) as session:
        assert chain_heads_check(session, lines=[line], keyring=ring).ok
        serving = session.execute(select(Checkpoint).where(Checkpoint.status == "serving"))
        broken = sum(registry.checkpoint_digest(c.directory) != c.digest
                     if Path(c.directory).is_dir() else 1 for c in serving.scalars())
    assert mismatched == broken


def test_beat_seals_the_audit_chain_and_checks_the_exported_heads(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from deletion.domain.config import load
    from deletion.domain.models import AuditSeal
    from workers import integrity_tasks, runtime
    from workers.celery_app import app

    entries = {e["task"]: e for e in beat.SCHEDULE.values()}
    for task, period in ((routing.SEAL_AUDIT_CHAIN, 300.0), (routing.CHECK_CHAIN_HEADS, 3600.0)):
        assert entries[task]["schedule"].total_seconds() == period
        assert entries[task]["options"] == {"expires": period, "queue": routing.DEFAULT_QUEUE}
        assert task in app.tasks  # registered with the app the worker runs

    cfg = load({"VAR_DIR": str(tmp_path)})
    monkeypatch.setattr(runtime, "config", lambda: cfg)
    runtime.use_database(engine.url.render_as_string(hide_password=False))
    try:
        with session_scope(engine) as session:
            audit_append(session, actor="system:test", action="test.sealed", object_type="t",
                         object_ref="1")
            head = session.get(ChainHead, AUDIT_CHAIN).seq
        assert integrity_tasks.check_chain_heads.run() == 0  # nothing exported yet
        assert integrity_tasks.seal_audit_chain.run() == head
        from workers import tasks

        tasks.export_chain_heads.run()
        assert integrity_tasks.check_chain_heads.run() == 0
        with session_scope(engine) as session:
            sealed = session.execute(select(AuditSeal).order_by(AuditSeal.id.desc())).scalars().first()
            session.execute(text("SET LOCAL session_replication_role = replica"))
            session.execute(delete(AuditSeal).where(AuditSeal.id == sealed.id))
        assert integrity_tasks.check_chain_heads.run() == 1  # the exported seal is gone
    finally:
        runtime.use_database(None)
    assert (tmp_path / "keys" / "audit-seal.key").is_file()  # the sealer made its own key


def test_beat_verifies_the_certificate_chain_from_its_last_head_and_daily_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from deletion.domain.certificate_heads import certificate_chain_check
    from deletion.domain.config import load
    from deletion.domain.models import CertificateVerifiedHead
    from deletion.domain.signing import keyring_from_config
    from workers import integrity_tasks, runtime
    from workers.celery_app import app

    every = [e for e in beat.SCHEDULE.values() if e["task"] == routing.VERIFY_CERTIFICATE_CHAIN]
    assert sorted((e["schedule"].total_seconds(), e.get("kwargs", {})) for e in every) == [
        (900.0, {}), (86400.0, {"full": True})]
    assert all(e["options"]["queue"] == routing.DEFAULT_QUEUE for e in every)
    assert routing.VERIFY_CERTIFICATE_CHAIN in app.tasks

    cfg = load({"VAR_DIR": str(tmp_path)})
    monkeypatch.setattr(runtime, "config", lambda: cfg)
    url = fresh_database_url("erasure_vouch")  # a chain signed by this test's key only
    engine = make_engine(url)
    runtime.use_database(url)
    try:
        with session_scope(engine) as session:
            _issue_chain(session, runtime.signer(), 2)
            head = session.get(ChainHead, CERTIFICATE_CHAIN).seq
        assert integrity_tasks.verify_certificate_chain.run() == head
        assert integrity_tasks.verify_certificate_chain.run() == 0  # nothing new
        assert integrity_tasks.verify_certificate_chain.run(full=True) == head
        with session_scope(engine) as session:
            newest = session.execute(select(CertificateVerifiedHead)
                                     .order_by(CertificateVerifiedHead.id.desc())).scalars().first()
            check = certificate_chain_check(session, keyring_from_config(cfg))
            assert (newest.verified_seq, newest.from_seq) == (head, 0)
    finally:
        runtime.use_database(None)
        engine.dispose()
        drop_database(url)
    assert (check.ok, check.mode, check.verified_from, check.checked) == (True, "incremental", head, 0)
