"""The evidence pack: one ZIP per request that an auditor or a regulator checks offline.

Contents (no personal data: references, HMACs, digests, record ids and staff
account names only):

    manifest.json                 format, request, sha256 of every other file
    README.txt                    what is inside and how to check it
    certificate/payload.json      the signed certificate payload, byte for byte
    certificate/certificate.json  seq, hashes, hex signature, key id
    certificate/public_key.pem    the certificate signer's Ed25519 public key
    verification/report.json      every check of the certified round (value, threshold, verdict)
    audit/events.jsonl            the request's audit events, and every row from each of
                                  them up to the next signed chain head (the links)
    audit/chain_heads.jsonl       the signed chain-head records those links end at
    audit/keys/<key id>.pub.pem   the public keys that signed those heads
    lineage.json                  the model's checkpoints: versions, digests, parents, status

``evidence_verify`` checks a pack with nothing but the standard library and
``cryptography`` (docs/evidence.md shows the same steps as a recipe): every file's
hash, the certificate's signature, every audit row's hash and link, that each of the
request's events leads by unbroken links to a head whose Ed25519 signature verifies,
and that the certificate's own issue is one of those audited events.  Events after the
newest signed head are linked but not yet signed: the report says so.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append
from deletion.domain.canonical import canonical_time
from deletion.domain.certificates import CHAIN_DOMAIN, chain_hash_of, parse_payload
from deletion.domain.chains import AUDIT_CHAIN
from deletion.domain.errors import DomainError
from deletion.domain.models import (
    AuditEvent,
    Certificate,
    Checkpoint,
    CheckpointCertificate,
    Job,
    JobRequest,
    VerificationResult,
)
from deletion.domain.services.requests import request_get
from deletion.domain.signing import KeyRing, SigningError, key_id_of, public_key_pem

FORMAT = "erasure-evidence-pack/1"
HEADS_FORMAT = "erasure-chain-heads/1"
MAX_LINK_ROWS = 50_000  # a quarter of an hour of audit rows is far below this


# ----------------------------------------------------------------------- build


def _event_row(event: AuditEvent, *, own: bool) -> dict[str, Any]:
    return {"seq": event.seq, "at": canonical_time(event.at), "actor": event.actor,
            "action": event.action, "object_type": event.object_type,
            "object_ref": event.object_ref, "details": event.details,
            "prev_hash": event.prev_hash, "hash": event.hash, "request_event": own}


def _signed_heads(lines: Iterable[str]) -> list[tuple[int, str, str]]:
    """(audit seq, audit hash, the record's line) of every exported head, oldest first."""
    heads = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("format") != HEADS_FORMAT:
            continue
        for head in record.get("heads", []):
            if isinstance(head, dict) and head.get("chain") == AUDIT_CHAIN and head.get("seq"):
                heads.append((int(head["seq"]), str(head["hash"]), line.strip()))
    return sorted(heads)


def evidence_pack_build(session: Session, *, actor: str, reference: str, keyring: KeyRing,
                        head_lines: Iterable[str], now: datetime | None = None) -> bytes:
    """The ZIP for one request (audited as ``evidence.exported``)."""
    request = request_get(session, reference=reference)
    jobs = list(session.scalars(select(Job).join(JobRequest, JobRequest.job_id == Job.id)
                                .where(JobRequest.request_id == request.id).order_by(Job.id)))
    certificate = session.scalar(
        select(Certificate).where(Certificate.job_id.in_([j.id for j in jobs]))
        .order_by(Certificate.seq.desc()).limit(1)) if jobs else None
    refs = [("erasure_request", reference), *(("job", str(j.id)) for j in jobs)]
    if certificate is not None:
        refs.append(("certificate", certificate.certificate_id))
    own = list(session.scalars(
        select(AuditEvent).where(or_(*(and_(AuditEvent.object_type == t, AuditEvent.object_ref == r)
                                       for t, r in refs))).order_by(AuditEvent.seq)))
    if not own:
        raise DomainError(f"{reference} has no audit events")

    heads = _signed_heads(head_lines)
    wanted: set[int] = set()
    used_heads: dict[int, str] = {}
    uncovered_end = 0
    for event in own:
        head = next((h for h in heads if h[0] >= event.seq), None)
        if head is None:
            uncovered_end = max(uncovered_end, event.seq)
            wanted.update(range(event.seq, event.seq + 1))
            continue
        if head[0] - event.seq > MAX_LINK_ROWS:
            raise DomainError("too many audit rows between an event and its signed head")
        wanted.update(range(event.seq, head[0] + 1))
        used_heads[head[0]] = head[2]
    if uncovered_end:
        # Link the unsigned tail to the newest signed head (or to its first own event).
        start = max((h[0] for h in heads if h[0] < uncovered_end), default=None)
        first_uncovered = min(e.seq for e in own if not any(h[0] >= e.seq for h in heads))
        wanted.update(range(start if start is not None else first_uncovered, uncovered_end + 1))
    own_seqs = {e.seq for e in own}
    rows: list[AuditEvent] = []
    ordered = sorted(wanted)
    for start in range(0, len(ordered), 1000):
        chunk = ordered[start:start + 1000]
        rows.extend(session.scalars(select(AuditEvent).where(AuditEvent.seq.in_(chunk))
                                    .order_by(AuditEvent.seq)))
    events_text = "".join(json.dumps(_event_row(r, own=r.seq in own_seqs), sort_keys=True) + "\n"
                          for r in rows)

    files: dict[str, bytes] = {"audit/events.jsonl": events_text.encode(),
                               "audit/chain_heads.jsonl": "".join(
                                   line + "\n" for _, line in sorted(used_heads.items())).encode()}
    for line in used_heads.values():
        key_id = str(json.loads(line).get("key_id", ""))
        if key_id in keyring:
            files[f"audit/keys/{key_id}.pub.pem"] = public_key_pem(keyring.get(key_id))
    if certificate is not None:
        try:
            public_key = keyring.get(certificate.key_id)
        except SigningError as exc:
            raise DomainError(f"certificate {certificate.certificate_id}: {exc}") from None
        files["certificate/payload.json"] = certificate.payload.encode("utf-8")
        files["certificate/public_key.pem"] = public_key_pem(public_key)
        files["certificate/certificate.json"] = _json({
            "certificate_id": certificate.certificate_id, "seq": certificate.seq,
            "payload_hash": certificate.payload_hash, "prev_hash": certificate.prev_hash,
            "chain_hash": chain_hash_of(certificate.seq, certificate.prev_hash,
                                        certificate.payload_hash),
            "signature": certificate.signature, "key_id": certificate.key_id,
            "signed_at": canonical_time(certificate.signed_at),
        })
        files["verification/report.json"] = _json(_report(session, certificate.job_id))
    files["lineage.json"] = _json(_lineage(session, request.model_id, jobs))
    files["README.txt"] = _readme(reference, certificate).encode()
    manifest = {
        "format": FORMAT, "reference": reference, "model": request.model.name,
        "status": request.status,
        "certificate_id": certificate.certificate_id if certificate else None,
        "created_at": canonical_time(now) if now else None,
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("manifest.json", _json(manifest))
        for name, data in sorted(files.items()):
            archive.writestr(name, data)
    audit_append(session, actor=actor, action="evidence.exported", object_type="erasure_request",
                 object_ref=reference,
                 details={"sha256": hashlib.sha256(buffer.getvalue()).hexdigest(),
                          "events": len(own), "rows": len(rows), "signed_heads": len(used_heads),
                          "certificate": manifest["certificate_id"]})
    return buffer.getvalue()


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _report(session: Session, job_id: int | None) -> dict[str, Any]:
    rows = list(session.scalars(select(VerificationResult).where(VerificationResult.job_id == job_id)
                                .order_by(VerificationResult.round, VerificationResult.metric)))
    last = max((r.round for r in rows), default=0)
    return {
        "job": job_id,
        "round": last,
        "policy": {"name": rows[0].policy_name, "version": rows[0].policy_version} if rows else None,
        "results": [{"metric": r.metric, "check": (r.details or {}).get("check"), "value": r.value,
                     "threshold": r.threshold, "comparator": r.comparator, "passed": r.passed,
                     # a metric judged on both sides: each bound with its own verdict
                     **({"checks": (r.details or {})["checks"]} if "checks" in (r.details or {}) else {})}
                    for r in rows if r.round == last],
        "note": "the signed certificate carries the same checks; it is the authoritative copy",
    }


def _lineage(session: Session, model_id: int, jobs: Sequence[Job]) -> dict[str, Any]:
    checkpoints = list(session.scalars(select(Checkpoint).where(Checkpoint.model_id == model_id)
                                       .order_by(Checkpoint.version)))
    by_id = {c.id: c for c in checkpoints}
    embodied: dict[int, list[str]] = {}
    for checkpoint_id, certificate_id in session.execute(
        select(CheckpointCertificate.checkpoint_id, Certificate.certificate_id)
        .join(Certificate, Certificate.id == CheckpointCertificate.certificate_id)
        .where(CheckpointCertificate.checkpoint_id.in_(list(by_id)))
    ):
        embodied.setdefault(checkpoint_id, []).append(certificate_id)

    def when(moment: datetime | None) -> str | None:
        return canonical_time(moment) if moment else None

    return {
        "checkpoints": [{
            "version": c.version, "digest": c.digest, "status": c.status,
            "parent_version": by_id[c.parent_id].version if c.parent_id in by_id else None,
            "created_at": when(c.created_at), "promoted_at": when(c.promoted_at),
            "retired_at": when(c.retired_at), "destroy_after": when(c.destroy_after),
            "destroyed_at": when(c.destroyed_at), "certificates": sorted(embodied.get(c.id, [])),
        } for c in checkpoints],
        "jobs": [{"job": j.id, "method": j.method, "stage": j.stage,
                  "base_version": by_id[j.base_checkpoint_id].version
                  if j.base_checkpoint_id in by_id else None,
                  "candidate_version": by_id[j.candidate_checkpoint_id].version
                  if j.candidate_checkpoint_id in by_id else None} for j in jobs],
    }


def _readme(reference: str, certificate: Certificate | None) -> str:
    cert = (f"the deletion certificate {certificate.certificate_id} and its signer's public key"
            if certificate else "no certificate (the request was not completed)")
    return f"""Evidence pack for erasure request {reference}

Inside: {cert}; the verification report; the request's audit events with the
chain rows that link each of them to a signed chain head; the signed heads and
their public keys; the model's checkpoint lineage.  manifest.json lists the
sha256 of every file.  No personal data is included.

Check it offline:
    python manage.py evidence verify THIS-FILE.zip
or, with nothing but Python and the `cryptography` package, the recipe in
docs/evidence.md.  First make sure the public keys are the controller's: their
key ids (sha256 of the 32 raw key bytes) must match the ones it publishes.
"""


# ----------------------------------------------------------------------- verify


@dataclass
class EvidenceReport:
    ok: bool = True
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def good(self, text: str) -> None:
        self.lines.append("ok    " + text)

    def bad(self, text: str) -> None:
        self.ok = False
        self.lines.append("FAIL  " + text)

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.lines.append("warn  " + text)


def audit_row_hash(row: dict[str, Any]) -> str:
    """sha256 of the canonical JSON (RFC 8785) of the hashed fields; with only strings
    and integers in it, Python's sorted compact json.dumps is exactly that form."""
    fields = {k: row[k] for k in ("seq", "at", "actor", "action", "object_type", "object_ref",
                                  "details", "prev_hash")}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _load_key(data: bytes) -> Ed25519PublicKey | None:
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        return None
    return key if isinstance(key, Ed25519PublicKey) else None


def _verified(key: Ed25519PublicKey, signature_hex: str, message: bytes) -> bool:
    try:
        key.verify(bytes.fromhex(signature_hex), message)
    except (InvalidSignature, ValueError):
        return False
    return True


def evidence_verify(data: bytes) -> EvidenceReport:
    """Check a pack's bytes offline; the report lists every check and its verdict."""
    report = EvidenceReport()
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        files = {name: archive.read(name) for name in archive.namelist()}
        manifest = json.loads(files.pop("manifest.json"))
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        report.bad(f"not an evidence pack ({type(exc).__name__})")
        return report
    if manifest.get("format") != FORMAT:
        report.bad(f"unknown format {manifest.get('format')!r}")
        return report
    listed = manifest.get("files", {})
    for name in sorted(set(listed) | set(files)):
        if name not in files:
            report.bad(f"{name}: listed in the manifest, missing from the pack")
        elif name not in listed:
            report.bad(f"{name}: in the pack, not in the manifest")
        elif hashlib.sha256(files[name]).hexdigest() != listed[name]:
            report.bad(f"{name}: sha256 differs from the manifest")
    if report.ok:
        report.good(f"{len(listed)} files match the manifest")

    payload_hash = _verify_certificate(files, manifest, report)
    rows = [json.loads(line) for line in files.get("audit/events.jsonl", b"").decode().splitlines()
            if line.strip()]
    by_seq = {r["seq"]: r for r in rows}
    broken = [r["seq"] for r in rows if audit_row_hash(r) != r["hash"]]
    broken += [r["seq"] for r in rows if r["seq"] - 1 in by_seq
               and by_seq[r["seq"] - 1]["hash"] != r["prev_hash"]]
    if broken:
        report.bad(f"audit rows whose hash or link is wrong: seq {sorted(set(broken))}")
    else:
        report.good(f"{len(rows)} audit rows: every hash recomputes and every link holds")

    heads = _verify_heads(files, report)
    own = [r for r in rows if r.get("request_event")]
    unsigned = []
    for event in own:
        head = next((h for h in sorted(heads) if h >= event["seq"]), None)
        if head is None:
            unsigned.append(event["seq"])
            continue
        seq = event["seq"]
        while seq < head and seq + 1 in by_seq and by_seq[seq + 1]["prev_hash"] == by_seq[seq]["hash"]:
            seq += 1
        if seq != head or by_seq[head]["hash"] != heads[head]:
            report.bad(f"audit event seq {event['seq']} does not lead to the signed head at seq {head}")
    if own and len(unsigned) < len(own):
        report.good(f"{len(own) - len(unsigned)} of the request's {len(own)} audit events lead "
                    "to a signed chain head")
    if unsigned:
        report.warn(f"{len(unsigned)} event(s) (seq {unsigned[0]}..{unsigned[-1]}) came after the "
                    "newest signed chain head: linked, not yet signed; download the pack again "
                    "after the next export")
    if payload_hash is not None:
        issued = [r for r in own if r["action"] == "certificate.issued"
                  and json.loads(r["details"]).get("payload_hash") == payload_hash]
        if issued:
            report.good("the certificate's issue is recorded in the audit trail")
        else:
            report.bad("no audit event records the issue of this certificate")
    return report


def _verify_certificate(files: dict[str, bytes], manifest: dict[str, Any],
                        report: EvidenceReport) -> str | None:
    if "certificate/payload.json" not in files:
        if manifest.get("certificate_id"):
            report.bad("the manifest names a certificate the pack does not hold")
        return None
    payload = files["certificate/payload.json"]
    certificate = json.loads(files.get("certificate/certificate.json", b"{}"))
    key = _load_key(files.get("certificate/public_key.pem", b""))
    fields = parse_payload(payload.decode("utf-8")) or {}
    payload_hash = hashlib.sha256(payload).hexdigest()
    if key is None:
        report.bad("certificate/public_key.pem is not an Ed25519 public key")
        return None
    if payload_hash != certificate.get("payload_hash"):
        report.bad("certificate payload was changed (its sha256 differs)")
        return None
    if key_id_of(key) != fields.get("signer_key_id"):
        report.bad("certificate/public_key.pem is not the key that signed the certificate")
        return None
    chain = f"{CHAIN_DOMAIN}\n{fields.get('seq')}\n{fields.get('prev_hash')}\n{payload_hash}"
    if not _verified(key, str(certificate.get("signature", "")),
                     hashlib.sha256(chain.encode("ascii")).digest()):
        report.bad("certificate signature does not verify")
        return None
    report.good(f"certificate {fields.get('certificate_id')} (seq {fields.get('seq')}) is signed "
                f"by key {key_id_of(key)[:16]}...")
    return payload_hash


def _verify_heads(files: dict[str, bytes], report: EvidenceReport) -> dict[int, str]:
    """Audit (seq -> hash) of every head record whose signature verifies."""
    keys = {name.rsplit("/", 1)[-1].removesuffix(".pub.pem"): _load_key(data)
            for name, data in files.items() if name.startswith("audit/keys/")}
    heads: dict[int, str] = {}
    lines = [line for line in files.get("audit/chain_heads.jsonl", b"").decode().splitlines()
             if line.strip()]
    for number, line in enumerate(lines, start=1):
        record = json.loads(line)
        key = keys.get(str(record.get("key_id")))
        unsigned = {k: v for k, v in record.items() if k != "signature"}
        message = json.dumps(unsigned, sort_keys=True, separators=(",", ":"),
                             ensure_ascii=False).encode()
        if key is None or key_id_of(key) != record.get("key_id"):
            report.bad(f"chain head {number}: signed by a key the pack does not hold")
        elif not _verified(key, str(record.get("signature", "")), message):
            report.bad(f"chain head {number}: signature does not verify")
        else:
            for head in record.get("heads", []):
                if head.get("chain") == AUDIT_CHAIN:
                    heads[int(head["seq"])] = str(head["hash"])
    if heads:
        report.good(f"{len(heads)} signed chain head(s) verify")
    return heads
