"""Evidence packs: built from a certified request, verified offline by the domain's
checker and by the recipe in docs/evidence.md as written, and refused once changed."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append
from deletion.domain.canonical import canonical_bytes, canonical_json, canonical_time
from deletion.domain.certificates import (
    CheckpointFacts,
    RequestFacts,
    SetFacts,
    VerificationFacts,
    certificate_build_payload,
    certificate_issue,
)
from deletion.domain.chains import AUDIT_CHAIN, CERTIFICATE_CHAIN, chain_head_lock
from deletion.domain.evidence import evidence_pack_build, evidence_verify
from deletion.domain.models import Model
from deletion.domain.services import job_claim, job_create
from deletion.domain.signing import KeyRing, Signer
from tests.domain.conftest import submit_approved

RECIPE = re.search(r"```python\n(.*?)```", (Path(__file__).resolve().parents[2] / "docs" / "evidence.md")
                   .read_text(encoding="utf-8"), re.S)
REPORT = {"policy": {"name": "default", "version": "1"}, "passed": True, "guarantee": "weights",
          "metrics": {"leakage.forget": 0.05}, "checks": [
              {"name": "leakage.forget", "value": 0.05, "threshold": 0.1, "comparator": "<=", "passed": True}]}


def _signed_heads(session: Session, signer: Signer) -> str:
    """A chain-head record as workers/integrity.py exports it (format, time, key, heads)."""
    heads = [{"chain": name, "seq": head.seq, "hash": head.hash}
             for name in (AUDIT_CHAIN, CERTIFICATE_CHAIN)
             for head in [chain_head_lock(session, name=name)]]
    record = {"format": "erasure-chain-heads/1", "exported_at": canonical_time(datetime.now(UTC)),
              "key_id": signer.key_id, "heads": heads}
    record["signature"] = signer.sign(canonical_bytes(record)).hex()
    return canonical_json(record)


@pytest.fixture
def pack(session: Session, model: Model) -> tuple[bytes, str]:
    signer = Signer.from_private_key(Ed25519PrivateKey.generate())
    ring = KeyRing()
    ring.add(signer.public_key)
    request = submit_approved(session, name="Mara Okafor")
    job = job_create(session, actor="system:scheduler", model_name=model.name,
                     references=[request.reference], method="asu")
    for expected, nxt in (("queued", "building_sets"), ("building_sets", "unlearning"),
                          ("unlearning", "verifying"), ("verifying", "certifying")):
        assert job_claim(session, job_id=job.id, expected_stage=expected, next_stage=nxt)
    now = datetime.now(UTC)
    payload = certificate_build_payload(
        job_id=job.id, model_name=model.name, requests=[RequestFacts.from_row(request)],
        sets=SetFacts(corpus_name="c", corpus_version=1, corpus_manifest_digest="c" * 64,
                      forget_digest="f" * 64, forget_count=3, retain_digest="e" * 64, retain_count=3),
        base=CheckpointFacts(1, "b" * 64), candidate=CheckpointFacts(2, "d" * 64), method="asu",
        hparams={}, seeds={}, versions={}, verification=VerificationFacts.from_report(REPORT),
        started_at=now, verified_at=now)
    certificate_issue(session, actor="worker", payload=payload, signer=signer)
    for i in range(3):  # other requests' business between the certificate and the head
        audit_append(session, actor="user:x", action="noise", object_type="erasure_request",
                     object_ref=f"ER-OTHER-{i}")
    heads = _signed_heads(session, signer)
    audit_append(session, actor="user:ana", action="letter.issued", object_type="erasure_request",
                 object_ref=request.reference, details={"language": "en"})  # after the head
    data = evidence_pack_build(session, actor="user:audrey", reference=request.reference,
                               keyring=ring, head_lines=[heads], now=now)
    return data, request.reference


def _rewrite(data: bytes, name: str, change, *, fix_manifest: bool) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    files = {n: source.read(n) for n in source.namelist()}
    files[name] = change(files[name])
    if fix_manifest:
        import hashlib

        manifest = json.loads(files["manifest.json"])
        manifest["files"][name] = hashlib.sha256(files[name]).hexdigest()
        files["manifest.json"] = json.dumps(manifest).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for n, content in files.items():
            archive.writestr(n, content)
    return out.getvalue()


def _recipe(data: bytes, folder: Path) -> subprocess.CompletedProcess[str]:
    assert RECIPE is not None
    zipfile.ZipFile(io.BytesIO(data)).extractall(folder)
    return subprocess.run([sys.executable, "-c", RECIPE.group(1)], cwd=folder, capture_output=True,
                          text=True, check=False)


def test_a_pack_verifies_and_names_what_is_not_yet_signed(pack: tuple[bytes, str]) -> None:
    data, reference = pack
    report = evidence_verify(data)
    assert report.ok, report.lines
    text = "\n".join(report.lines)
    assert "certificate DC-" in text and "lead to a signed chain head" in text
    assert "issue is recorded in the audit trail" in text
    assert len(report.warnings) == 1 and "after the newest signed chain head" in report.warnings[0]
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert {"manifest.json", "certificate/payload.json", "certificate/public_key.pem", "lineage.json",
            "verification/report.json", "audit/events.jsonl", "audit/chain_heads.jsonl"} <= set(names)
    everything = b"".join(zipfile.ZipFile(io.BytesIO(data)).read(n) for n in names)
    assert b"Mara" not in everything and b"Okafor" not in everything
    assert reference.encode() in everything


def test_the_documented_recipe_verifies_a_pack_as_written(pack: tuple[bytes, str], tmp_path: Path) -> None:
    done = _recipe(pack[0], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "evidence pack verifies" in done.stdout and "certificate DC-" in done.stdout


def test_a_changed_audit_row_fails_both_checks_even_with_a_matching_manifest(
        pack: tuple[bytes, str], tmp_path: Path) -> None:
    changed = _rewrite(pack[0], "audit/events.jsonl",
                       lambda b: b.replace(b'"actor": "user:x"', b'"actor": "user:y"', 1), fix_manifest=True)
    report = evidence_verify(changed)
    assert not report.ok and any("hash or link is wrong" in line for line in report.lines)
    assert _recipe(changed, tmp_path).returncode != 0


def test_a_cut_link_between_an_event_and_its_head_is_noticed(pack: tuple[bytes, str]) -> None:
    def drop_noise(text: bytes) -> bytes:
        return b"".join(line + b"\n" for line in text.splitlines() if b"ER-OTHER-1" not in line)

    report = evidence_verify(_rewrite(pack[0], "audit/events.jsonl", drop_noise, fix_manifest=True))
    assert not report.ok and any("does not lead to the signed head" in line for line in report.lines)


def test_a_changed_file_is_caught_by_the_manifest(pack: tuple[bytes, str]) -> None:
    changed = _rewrite(pack[0], "lineage.json", lambda b: b.replace(b'"version": 1', b'"version": 7'),
                       fix_manifest=False)
    report = evidence_verify(changed)
    assert not report.ok and any("sha256 differs" in line for line in report.lines)


def test_a_forged_certificate_signature_fails(pack: tuple[bytes, str]) -> None:
    def forge(text: bytes) -> bytes:
        document = json.loads(text)
        document["signature"] = "00" * 64
        return json.dumps(document).encode()

    report = evidence_verify(_rewrite(pack[0], "certificate/certificate.json", forge, fix_manifest=True))
    assert not report.ok and any("signature does not verify" in line for line in report.lines)


def test_not_a_pack_is_a_clear_failure() -> None:
    report = evidence_verify(b"PK not really")
    assert not report.ok and "not an evidence pack" in report.lines[0]
