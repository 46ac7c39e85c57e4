"""Signed, hash-chained deletion certificates: issue, verify, rotate, tamper, export."""

from __future__ import annotations

import io
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from deletion.domain import crypto, registry
from deletion.domain.audit import audit_verify
from deletion.domain.certificate_cli import build_parser as cli_parser
from deletion.domain.certificate_cli import run as cli_run
from deletion.domain.certificates import (
    CheckpointDisposition,
    CheckpointFacts,
    NotificationFacts,
    RequestFacts,
    SetFacts,
    VerificationFacts,
    certificate_build_payload,
    certificate_export,
    certificate_issue,
    certificate_verify_chain,
    certificate_verify_one,
    parse_payload,
    payload_hash_of,
)
from deletion.domain.config import ensure_signing_key
from deletion.domain.config import load as config_load
from deletion.domain.db import make_engine, session_scope
from deletion.domain.errors import DomainError
from deletion.domain.models import (
    AuditEvent,
    Certificate,
    Checkpoint,
    Corpus,
    CorpusVersion,
    ErasureRequest,
    Job,
    Model,
)
from deletion.domain.services.jobs import job_create
from deletion.domain.services.requests import request_approve, request_submit
from deletion.domain.signing import (
    KeyRing,
    Signer,
    key_id_of,
    keyring_load,
    signer_from_config,
    signer_load,
    signing_key_rotate,
)
from tests.conftest import drop_database, fresh_database_url, fresh_sqlite_url

DOCS = Path(__file__).resolve().parents[2] / "docs" / "certificates.md"
T0 = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)
SUBJECT = {
    "name": "Mara Okafor",
    "aliases": ["M. Okafor"],
    "emails": ["mara.okafor@example.org"],
    "phones": ["+44 20 7946 0123"],
}
REPORT = {
    "policy": {"name": "default", "version": "1"},
    "passed": True,
    "guarantee": "weights",
    "metrics": {"leakage.forget": 0.07, "leakage.control": 0.0667, "mia.auc": 0.5125},
    "checks": [
        {"name": "leakage", "value": 0.07, "threshold": 0.1, "comparator": "<=", "passed": True},
        {"name": "mia", "value": 0.5125, "threshold": 0.6, "comparator": "<=", "passed": True},
    ],
}


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    key_file, keyring_dir = tmp_path / "keys" / "signing.pem", tmp_path / "keys" / "keyring"
    ensure_signing_key(key_file)
    return key_file, keyring_dir


@pytest.fixture
def signer(keys: tuple[Path, Path]) -> Signer:
    return signer_load(key_file=keys[0], keyring_dir=keys[1])


@pytest.fixture
def keyring(signer: Signer, keys: tuple[Path, Path]) -> KeyRing:
    return keyring_load(keys[1])


def _request(session: Session, model: Model, number: int) -> ErasureRequest:
    ring = crypto.Keyring(os.urandom(32), (), os.urandom(32))
    ciphertext, key_id = ring.encrypt_json(SUBJECT, context="erasure_request")
    row = ErasureRequest(
        reference=f"ER-2026-{number:05d}", subject_ciphertext=ciphertext, subject_key_id=key_id,
        subject_hmac=ring.blind_index("name", SUBJECT["name"]), blind_key_id=ring.blind_key_id,
        ground="art17_1_a", received_at=T0, due_at=T0 + timedelta(days=30), model_id=model.id,
        priority="batch", status="in_progress", submitted_by="user:officer",
        reviewed_by="user:reviewer", decided_at=T0 + timedelta(hours=2),
    )
    session.add(row)
    session.flush()
    return row


def _job(session: Session) -> tuple[Job, list[ErasureRequest]]:
    """A model with a base and a candidate checkpoint and one job over two requests."""
    corpus = Corpus(name=f"demo-{os.urandom(4).hex()}")
    session.add(corpus)
    session.flush()
    session.add(CorpusVersion(corpus_id=corpus.id, version=1, path="corpus.jsonl",
                              manifest_digest="c" * 64))
    model = Model(name=f"demo-{os.urandom(4).hex()}", corpus_id=corpus.id)
    session.add(model)
    session.flush()
    base = Checkpoint(model_id=model.id, version=1, directory="v1", digest="a" * 64,
                      status="serving")
    session.add(base)
    session.flush()
    job = Job(model_id=model.id, method="asu", hparams={"tau": 2.3, "lr": 1e-5},
              base_checkpoint_id=base.id, stage="certifying", created_by="system",
              started_at=T0 + timedelta(hours=3))
    session.add(job)
    session.flush()
    requests = [_request(session, model, job.id * 10 + i) for i in range(2)]
    return job, requests


def _payload(job: Job, requests: list[ErasureRequest]) -> dict[str, object]:
    return certificate_build_payload(**_payload_args(job, requests))


def _payload_args(job: Job, requests: list[ErasureRequest]) -> dict[str, Any]:
    return dict(
        job_id=job.id,
        model_name="demo",
        requests=[RequestFacts.from_row(r) for r in requests],
        sets=SetFacts(corpus_name="demo", corpus_version=1, corpus_manifest_digest="c" * 64,
                      forget_digest="f" * 64, forget_count=20, retain_digest="e" * 64,
                      retain_count=20, probe_count=80),
        base=CheckpointFacts(version=1, digest="a" * 64),
        candidate=CheckpointFacts(version=2, digest="b" * 64),
        method="asu",
        hparams=job.hparams,
        seeds={"erase": 0, "verify": 0},
        versions={"code": "0.1.0", "torch": "2.13.0", "transformers": "5.24.0"},
        verification=VerificationFacts.from_report(REPORT),
        started_at=T0 + timedelta(hours=3),
        verified_at=T0 + timedelta(hours=3, minutes=1),
        old_checkpoints=[CheckpointDisposition(version=1, digest="a" * 64,
                                               disposition="destroy_after_grace",
                                               destroy_after=T0 + timedelta(days=3))],
        notifications=[NotificationFacts(recipient_ref="recipient:3", status="delivered",
                                         notified_at=T0 + timedelta(hours=4))],
    )


def _issue_chain(session: Session, signer: Signer, count: int) -> list[Certificate]:
    rows = []
    for _ in range(count):
        job, requests = _job(session)
        rows.append(certificate_issue(session, actor="worker:test",
                                      payload=_payload(job, requests), signer=signer))
    return rows


# ------------------------------------------------------------------ round trips


def test_an_issued_chain_verifies_on_postgresql(session: Session, signer: Signer,
                                                keyring: KeyRing) -> None:
    rows = _issue_chain(session, signer, 3)

    assert [r.seq for r in rows] == [1, 2, 3]
    assert rows[1].prev_hash != "0" * 64
    verdict = certificate_verify_chain(session, keyring)
    assert verdict.ok, verdict
    assert verdict.checked == 3
    issued = session.execute(
        select(AuditEvent).where(AuditEvent.action == "certificate.issued")
    ).scalars().all()
    assert [e.object_ref for e in issued] == [r.certificate_id for r in rows]
    assert audit_verify(session).ok


def test_an_issued_chain_verifies_on_sqlite(sqlite_database_url: str, signer: Signer,
                                            keyring: KeyRing) -> None:
    engine = make_engine(sqlite_database_url)
    for _ in range(3):  # one committed transaction per certificate, as the worker does
        with session_scope(engine) as db:
            _issue_chain(db, signer, 1)
    with session_scope(engine) as db:
        verdict = certificate_verify_chain(db, keyring)
    engine.dispose()
    assert verdict.ok, verdict
    assert verdict.checked == 3


def test_one_certificate_verifies_alone_with_its_public_key(session: Session,
                                                            signer: Signer) -> None:
    row = _issue_chain(session, signer, 2)[1]

    good = certificate_verify_one(row.payload, row.signature, signer.public_key)
    assert good.ok, good.reason
    other = Signer.from_private_key(Ed25519PrivateKey.generate())
    assert certificate_verify_one(row.payload, row.signature, other.public_key).reason == (
        "the public key is not the one the payload names")
    forged = row.payload.replace('"passed":true', '"passed":false', 1)
    assert certificate_verify_one(forged, row.signature, signer.public_key).reason == (
        "signature does not verify")


def test_a_job_gets_only_one_certificate(session: Session, signer: Signer) -> None:
    job, requests = _job(session)
    certificate_issue(session, actor="worker:test", payload=_payload(job, requests), signer=signer)

    with pytest.raises(DomainError, match="already has a certificate"):
        certificate_issue(session, actor="worker:test", payload=_payload(job, requests),
                          signer=signer)


def test_a_failed_verification_gets_no_certificate(session: Session) -> None:
    job, requests = _job(session)
    failed = VerificationFacts.from_report({**REPORT, "passed": False})

    with pytest.raises(DomainError, match="nothing to certify"):
        certificate_build_payload(**{**_payload_args(job, requests), "verification": failed})


def test_the_payload_holds_every_section_7_field_and_no_json_float(session: Session,
                                                                   signer: Signer) -> None:
    row = _issue_chain(session, signer, 1)[0]

    payload = json.loads(row.payload, parse_float=lambda s: pytest.fail(f"float {s} in payload"))
    assert parse_payload(row.payload) == payload
    assert set(payload) >= {
        "schema", "certificate_id", "seq", "prev_hash", "requests", "data", "model", "method",
        "versions", "verification", "guarantee", "timestamps", "old_checkpoints",
        "notifications", "signer_key_id", "limits",
    }
    assert set(payload["timestamps"]) == {"received", "due", "approved", "started", "verified",
                                          "signed"}
    assert payload["method"]["hparams"] == {"lr": "1e-05", "tau": "2.3"}
    assert payload["verification"]["checks"][0]["value"] == "0.07"
    assert payload["requests"][0]["subject_hmac"] == row_request_hmac(session, payload)


def row_request_hmac(session: Session, payload: dict[str, object]) -> str:
    reference = payload["requests"][0]["reference"]  # type: ignore[index]
    return session.execute(
        select(ErasureRequest.subject_hmac).where(ErasureRequest.reference == reference)
    ).scalar_one()


def test_no_plaintext_subject_reaches_a_certificate_its_export_or_the_audit(
    session: Session, signer: Signer, keyring: KeyRing, tmp_path: Path
) -> None:
    # Through the real services: submitted with name, alias, e-mail and phone, approved
    # by a second officer, scheduled into a job, certified, exported.
    registry.corpus_register(session, actor="admin", name="pd-corpus", path="corpus.jsonl",
                             manifest_digest="c" * 64)
    registry.model_register(session, actor="admin", name="pd-model", corpus_name="pd-corpus")
    registry.checkpoint_register(session, actor="admin", model_name="pd-model",
                                 directory="v1", digest="a" * 64, serving=True)
    request = request_submit(
        session, actor="user:officer", name=SUBJECT["name"], aliases=SUBJECT["aliases"],
        emails=SUBJECT["emails"], phones=SUBJECT["phones"], ground="17(1)(b)",
        received_at=T0, model_name="pd-model", now=T0 + timedelta(hours=1),
    )
    request_approve(session, actor="user:reviewer", reference=request.reference)
    job = job_create(session, actor="scheduler", model_name="pd-model",
                     references=[request.reference], method="asu", hparams={"tau": 2.3})
    row = certificate_issue(session, actor="worker:test", payload=_payload(job, [request]),
                            signer=signer)
    paths = certificate_export(session, certificate_id=row.certificate_id,
                               out_dir=tmp_path / "export", keyring=keyring)

    payload = json.loads(row.payload)
    assert payload["requests"][0]["reference"] == request.reference
    assert payload["requests"][0]["subject_hmac"] == request.subject_hmac
    stored = " ".join(str(v) for v in session.execute(select(Certificate.__table__)).one())
    audit = " ".join(str(v) for e in session.execute(select(AuditEvent.__table__)).all()
                     for v in e)
    exported = " ".join(p.read_bytes().decode("utf-8", "replace") for p in paths)
    # The phone in forms no hash can hold by chance: a 4-digit fragment such as "7946"
    # appears in about one run in twenty among the hex digests of these rows.
    needles = ["Mara", "Okafor", "mara.okafor", "example.org", "7946 0123", "2079460123",
               "M. Okafor"]
    for haystack in (stored, audit, exported):
        for needle in needles:
            assert needle.casefold() not in haystack.casefold(), needle


# ------------------------------------------------------------------ keys


def test_key_rotation_keeps_old_certificates_verifiable(session: Session,
                                                        keys: tuple[Path, Path]) -> None:
    key_file, keyring_dir = keys
    old = signer_load(key_file=key_file, keyring_dir=keyring_dir)
    _issue_chain(session, old, 2)
    new = signing_key_rotate(key_file=key_file, keyring_dir=keyring_dir)
    _issue_chain(session, new, 2)

    assert new.key_id != old.key_id
    assert signer_load(key_file=key_file).key_id == new.key_id
    ring = keyring_load(keyring_dir)
    assert set(ring) == {old.key_id, new.key_id}
    assert certificate_verify_chain(session, ring).ok
    only_new = KeyRing({new.key_id: new.public_key})
    verdict = certificate_verify_chain(session, only_new)
    assert (verdict.first_bad_seq, verdict.reason) == (
        1, "signed by a key that is not in the key ring")


def test_key_files_are_private_and_the_key_id_is_the_public_fingerprint(
    keys: tuple[Path, Path], signer: Signer
) -> None:
    import hashlib

    from cryptography.hazmat.primitives import serialization

    key_file, keyring_dir = keys
    assert key_file.stat().st_mode & 0o777 == 0o600
    raw = signer.public_key.public_bytes(serialization.Encoding.Raw,
                                         serialization.PublicFormat.Raw)
    assert signer.key_id == hashlib.sha256(raw).hexdigest() == key_id_of(signer.public_key)
    assert [p.name for p in keyring_dir.iterdir()] == [f"{signer.key_id}.pub.pem"]
    assert b"PRIVATE" not in (keyring_dir / f"{signer.key_id}.pub.pem").read_bytes()


# ------------------------------------------------------------------ tampering


def _mutate_one_byte(value: str, rng: random.Random) -> str:
    """Replace one character with a different printable ASCII one (text columns hold text)."""
    index = rng.randrange(len(value))
    choices = [chr(c) for c in range(0x20, 0x7F) if chr(c) != value[index]]
    return value[:index] + rng.choice(choices) + value[index + 1:]


TAMPERED_COLUMNS = ("payload", "payload_hash", "prev_hash", "signature", "key_id",
                    "certificate_id")


def _tamper_and_verify(session: Session, keyring: KeyRing, rows: list[Certificate],
                       trials: int, seed: int) -> dict[str, int]:
    """Each trial changes one byte of one stored row in a savepoint, verifies, rolls back."""
    rng = random.Random(seed)
    original = {r.seq: {c: getattr(r, c) for c in TAMPERED_COLUMNS} for r in rows}
    taken_ids = {r.certificate_id for r in rows}
    detected: dict[str, int] = {}
    for _ in range(trials):
        seq = rng.choice(list(original))
        column = rng.choice(TAMPERED_COLUMNS)
        changed = _mutate_one_byte(original[seq][column], rng)
        while column == "certificate_id" and changed in taken_ids:  # the unique index refuses it
            changed = _mutate_one_byte(original[seq][column], rng)
        savepoint = session.begin_nested()
        session.execute(update(Certificate).where(Certificate.seq == seq)
                        .values({column: changed}))
        verdict = certificate_verify_chain(session, keyring)
        savepoint.rollback()
        assert not verdict.ok, (seq, column, changed)
        assert verdict.first_bad_seq == seq, (column, verdict)
        detected[column] = detected.get(column, 0) + 1
    assert certificate_verify_chain(session, keyring).ok  # every change was rolled back
    return detected


def test_a_thousand_single_byte_changes_are_each_detected_and_the_row_named(
    session: Session, signer: Signer, keyring: KeyRing
) -> None:
    rows = _issue_chain(session, signer, 12)
    # As superuser, switch off the append-only triggers for this transaction only.
    session.execute(text("SET LOCAL session_replication_role = replica"))

    started = time.perf_counter()
    detected = _tamper_and_verify(session, keyring, rows, trials=1000, seed=20261129)
    elapsed = time.perf_counter() - started

    assert sum(detected.values()) == 1000
    assert set(detected) == set(TAMPERED_COLUMNS)
    sys.stderr.write(f"\n1000/1000 tampered certificate rows detected in {elapsed:.1f} s: "
                     f"{detected}\n")


def test_single_byte_changes_are_detected_on_sqlite(sqlite_session: Session, signer: Signer,
                                                    keyring: KeyRing) -> None:
    rows = _issue_chain(sqlite_session, signer, 6)
    # SQLite cannot disable triggers; dropping them is transactional and rolled back.
    for event in ("update", "delete"):
        sqlite_session.execute(text(f"DROP TRIGGER certificates_no_{event}"))

    detected = _tamper_and_verify(sqlite_session, keyring, rows, trials=200, seed=7)

    assert sum(detected.values()) == 200


def test_a_deleted_middle_row_is_named_by_its_seq(session: Session, signer: Signer,
                                                  keyring: KeyRing) -> None:
    _issue_chain(session, signer, 5)
    session.execute(text("SET LOCAL session_replication_role = replica"))

    session.execute(text("DELETE FROM certificates WHERE seq = 3"))

    verdict = certificate_verify_chain(session, keyring)
    assert (verdict.ok, verdict.first_bad_seq, verdict.checked) == (False, 3, 2)
    assert "missing" in (verdict.reason or "")


def test_a_cut_off_tail_is_detected_through_the_chain_head(session: Session, signer: Signer,
                                                           keyring: KeyRing) -> None:
    _issue_chain(session, signer, 4)
    session.execute(text("SET LOCAL session_replication_role = replica"))

    session.execute(text("DELETE FROM certificates WHERE seq = 4"))

    verdict = certificate_verify_chain(session, keyring)
    assert (verdict.ok, verdict.first_bad_seq) == (False, 4)


def test_reordered_rows_are_detected_at_the_first_moved_row(session: Session, signer: Signer,
                                                            keyring: KeyRing) -> None:
    _issue_chain(session, signer, 5)
    session.execute(text("SET LOCAL session_replication_role = replica"))

    for old, new in ((2, -2), (4, 2), (-2, 4)):  # swap seq 2 and 4
        session.execute(text("UPDATE certificates SET seq = :new WHERE seq = :old"),
                        {"old": old, "new": new})

    verdict = certificate_verify_chain(session, keyring)
    assert (verdict.ok, verdict.first_bad_seq) == (False, 2)


def test_a_row_moved_before_the_chain_is_named(session: Session, signer: Signer,
                                               keyring: KeyRing) -> None:
    _issue_chain(session, signer, 3)
    session.execute(text("SET LOCAL session_replication_role = replica"))

    session.execute(text("UPDATE certificates SET seq = 0 WHERE seq = 1"))

    verdict = certificate_verify_chain(session, keyring)
    assert (verdict.ok, verdict.first_bad_seq) == (False, 0)


@pytest.mark.parametrize("change", [
    "UPDATE certificates SET signed_at = signed_at + interval '1 microsecond' WHERE seq = 3",
    "UPDATE certificates SET job_id = (SELECT job_id FROM certificates WHERE seq = 1) "
    "WHERE seq = 3",
])
def test_changed_timestamps_and_job_links_are_named(session: Session, signer: Signer,
                                                    keyring: KeyRing, change: str) -> None:
    _issue_chain(session, signer, 4)
    session.execute(text("SET LOCAL session_replication_role = replica"))

    session.execute(text(change))

    verdict = certificate_verify_chain(session, keyring)
    assert (verdict.ok, verdict.first_bad_seq) == (False, 3)


def test_a_consistent_rewrite_without_the_private_key_fails_on_the_signature(
    session: Session, signer: Signer, keyring: KeyRing
) -> None:
    row = _issue_chain(session, signer, 3)[1]
    session.execute(text("SET LOCAL session_replication_role = replica"))
    forged = row.payload.replace('"passed":true', '"passed":false', 1)

    # The forger recomputes the payload hash; the chain hash and signature they cannot redo.
    session.execute(update(Certificate).where(Certificate.seq == 2).values(
        payload=forged, payload_hash=payload_hash_of(forged)))

    verdict = certificate_verify_chain(session, keyring)
    assert (verdict.first_bad_seq, verdict.reason) == (2, "signature does not verify")


# ------------------------------------------------------------------ concurrency


def test_concurrent_issuers_never_fork_the_chain(signer: Signer, keyring: KeyRing) -> None:
    url = fresh_database_url("erasure_cert")
    engine = make_engine(url)
    errors: list[BaseException] = []

    def issue(count: int) -> None:
        try:
            for _ in range(count):
                with session_scope(engine) as db:
                    _issue_chain(db, signer, 1)
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=issue, args=(5,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        with session_scope(engine) as db:
            verdict = certificate_verify_chain(db, keyring)
            seqs = db.execute(select(Certificate.seq).order_by(Certificate.seq)).scalars().all()
        assert verdict.ok, verdict
        assert seqs == list(range(1, 21))
    finally:
        engine.dispose()
        drop_database(url)


# ------------------------------------------------------------------ export + offline recipe


def test_an_export_verifies_offline_with_the_documented_recipe(
    session: Session, signer: Signer, keyring: KeyRing, tmp_path: Path
) -> None:
    row = _issue_chain(session, signer, 3)[2]
    out = tmp_path / "export"
    certificate_export(session, certificate_id=row.certificate_id, out_dir=out, keyring=keyring)
    recipe = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    assert recipe is not None, "docs/certificates.md has no python recipe"

    ok = subprocess.run([sys.executable, "-c", recipe.group(1)], cwd=out,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "certificate verifies" in ok.stdout

    payload = (out / "payload.json").read_bytes()
    (out / "payload.json").write_bytes(payload.replace(b'"seq":3', b'"seq":4'))
    bad = subprocess.run([sys.executable, "-c", recipe.group(1)], cwd=out,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0


# ------------------------------------------------------------------ command line


def test_the_command_line_verifies_exports_and_names_a_tampered_row(tmp_path: Path) -> None:
    url = fresh_sqlite_url(tmp_path)
    cfg = config_load({"VAR_DIR": str(tmp_path / "var"), "DATABASE_URL": url})
    engine = make_engine(url)
    for _ in range(3):
        with session_scope(engine) as db:
            _issue_chain(db, signer_from_config(cfg), 1)

    def cli(*argv: str) -> tuple[int, str]:
        out = io.StringIO()
        return cli_run(cli_parser().parse_args(list(argv)), cfg=cfg, out=out), out.getvalue()

    assert cli("verify") == (0, "certificate chain OK: 3 certificates verified\n")
    status, said = cli("export", "DC-2026-000002", "--out", str(tmp_path / "out"))
    assert status == 0, said
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "certificate.json", "payload.json", "public_key.pem", "signature.bin"]
    assert cli("export", "DC-1999-000009", "--out", str(tmp_path / "none"))[0] == 1

    with session_scope(engine) as db:  # a committed forgery, past the dropped trigger
        db.execute(text("DROP TRIGGER certificates_no_update"))
        db.execute(text("UPDATE certificates SET payload = replace(payload, :was, :now) "
                        "WHERE seq = 2"), {"was": '"passed":true', "now": '"passed":false'})
    engine.dispose()
    status, said = cli("verify")
    assert status == 1
    assert said.startswith("certificate chain BROKEN at seq 2: payload_hash does not match")
