"""Signed, hash-chained deletion certificates (ARCHITECTURE.md section 7).

A certificate is a canonical JSON payload (deletion.domain.canonical) that
states what was erased, how, with what evidence, and its own place in the
chain.  The chain, per row ``n``:

    payload_hash(n) = sha256(payload text)                       (hex)
    prev_hash(n)    = chain_hash(n - 1), or 64 zeros for n = 1
    chain_hash(n)   = sha256("erasure-certificate-chain/1\\n<n>\\n<prev_hash(n)>\\n<payload_hash(n)>")
    signature(n)    = Ed25519 over the 32 raw bytes of chain_hash(n)

The payload repeats ``seq``, ``prev_hash`` and ``signer_key_id``, so one
exported certificate plus its public key verifies offline (docs/certificates.md);
the chain head row pins the last seq and chain hash, so cutting the tail off
the table is detected too.

No plaintext personal data ever enters a payload: a subject appears as the
request reference and the HMAC blind index with its key id.  Floats are
written as strings (Python's shortest round-trip ``repr``), so every reader
parses the same number.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.audit import ChainVerification, audit_append
from deletion.domain.canonical import GENESIS_HASH, canonical_json, canonical_time
from deletion.domain.chains import CERTIFICATE_CHAIN, chain_head_advance, chain_head_lock
from deletion.domain.errors import DomainError, NotFound
from deletion.domain.models import Certificate, ChainHead, ErasureRequest, utcnow
from deletion.domain.signing import (
    KeyRing,
    Signer,
    key_id_of,
    public_key_from_pem,
    public_key_pem,
    signature_valid,
)

logger = logging.getLogger(__name__)

SCHEMA_VERSION = "erasure-certificate/1"
CHAIN_DOMAIN = "erasure-certificate-chain/1"
SIGNATURE_HEX_LENGTH = 128  # 64 raw Ed25519 bytes, stored as lowercase hex
HEX_DIGITS = frozenset("0123456789abcdef")

LIMITS_STATEMENT = (
    "This certificate records approximate machine unlearning. The named model "
    "checkpoint was modified to remove the influence of the listed training "
    "records; it was not retrained from scratch. The residual risk that the "
    "data subject's personal data can be extracted was measured with the "
    "checks listed here, against control people the model never saw, and "
    "judged by the named threshold policy. Measurements bound the risk for "
    "the probes and attacks that were run; they do not prove that no "
    "information about the subject remains in the weights."
)
GUARANTEE_STATEMENTS = {
    "weights": "The checks passed on the candidate weights themselves.",
    "suppression": (
        "The facts are suppressed by an adapter shipped inside the checkpoint; "
        "with the adapter switched off they can be recovered. Serving must keep "
        "the adapter on."
    ),
}


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class RequestFacts:
    """One erasure request, as the certificate may show it: no plaintext subject."""

    reference: str
    subject_hmac: str  # HMAC blind index of the normalised name
    subject_key_id: str  # the id of the blind-index key that made subject_hmac
    ground: str
    received_at: datetime
    due_at: datetime  # the deadline in force
    approved_at: datetime | None = None
    extended_due_at: datetime | None = None  # set when an extension moved the deadline

    @classmethod
    def from_row(cls, row: ErasureRequest) -> RequestFacts:
        """Only the columns that are safe to publish; the ciphertext is never read."""
        return cls(
            reference=row.reference,
            subject_hmac=row.subject_hmac,
            subject_key_id=row.blind_key_id,
            ground=row.ground,
            received_at=row.received_at,
            due_at=row.due_at,
            approved_at=row.decided_at,  # a certified request was approved, never denied
            extended_due_at=row.due_at if row.extension_months else None,
        )


@dataclass(frozen=True)
class SetFacts:
    """The pinned corpus version and the Merkle roots of the forget and retain sets."""

    corpus_name: str
    corpus_version: int
    corpus_manifest_digest: str
    forget_digest: str
    forget_count: int
    retain_digest: str
    retain_count: int
    probe_count: int | None = None

    @classmethod
    def from_job_sets(cls, sets: Mapping[str, Any], *, corpus_name: str, corpus_version: int,
                      corpus_manifest_digest: str) -> SetFacts:
        """The digests and counts a job stored when its sets were built (``jobs.sets``)."""
        return cls(
            corpus_name=corpus_name, corpus_version=corpus_version,
            corpus_manifest_digest=corpus_manifest_digest,
            forget_digest=str(sets["forget_digest"]), forget_count=int(sets["forget"]),
            retain_digest=str(sets["retain_digest"]), retain_count=int(sets["retain"]),
            probe_count=int(sets["probes"]) if "probes" in sets else None,
        )


@dataclass(frozen=True)
class CheckpointFacts:
    version: int
    digest: str


@dataclass(frozen=True)
class CheckVerdict:
    """One check of the verification report: value, threshold, comparator, verdict."""

    name: str
    value: float | None
    threshold: float | None
    comparator: str
    passed: bool


@dataclass(frozen=True)
class VerificationFacts:
    policy_name: str
    policy_version: str
    passed: bool
    guarantee: str
    checks: tuple[CheckVerdict, ...]
    metrics: Mapping[str, float | None] = field(default_factory=dict)

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> VerificationFacts:
        """Read the engine's ``Report.to_json()`` shape (docs/internals.md).

        The one mapping from a report to certificate facts: the certify service
        (``services.certification``) and the tests both use it.  Policy, verdict and
        guarantee class must be stated (a report without them is not evidence, and a
        missing guarantee must never default to ``weights``); check values and
        thresholds are numbers or None; metrics keep only numeric values (as floats).
        """
        policy = report.get("policy")
        if not isinstance(policy, Mapping) or "name" not in policy or "version" not in policy:
            raise DomainError("the verification report names no policy")
        for key in ("passed", "guarantee"):
            if key not in report:
                raise DomainError(f"the verification report has no {key!r}")
        return cls(
            policy_name=str(policy["name"]),
            policy_version=str(policy["version"]),
            passed=bool(report["passed"]),
            guarantee=str(report["guarantee"]),
            checks=tuple(
                CheckVerdict(
                    name=str(c["name"]),
                    value=_number(c.get("value")),
                    threshold=_number(c.get("threshold")),
                    comparator=str(c.get("comparator", "")),
                    passed=bool(c.get("passed")),
                )
                for c in report.get("checks", ())
            ),
            metrics={
                str(k): _number(v) for k, v in (report.get("metrics") or {}).items()
                if v is None or (isinstance(v, int | float) and not isinstance(v, bool))
            },
        )


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DomainError(f"a check value must be a number, not {type(value).__name__}")
    return float(value)


def report_verified_at(report: Mapping[str, Any]) -> datetime | None:
    """When the engine finished verifying (the worker stamps ``verified_at``), if stated."""
    stamp = report.get("verified_at")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp)
    except ValueError:
        raise DomainError(f"verified_at is not an ISO 8601 time: {stamp[:40]!r}") from None


@dataclass(frozen=True)
class CheckpointDisposition:
    """What happens to an older checkpoint that still holds the subject's data."""

    version: int
    digest: str
    disposition: str  # e.g. "destroy_after_grace", "destroyed", "retired"
    destroy_after: datetime | None = None


@dataclass(frozen=True)
class NotificationFacts:
    """Art. 19: a recipient (by reference, never a person's name) and the outcome."""

    recipient_ref: str
    status: str  # e.g. "pending", "delivered", "impossible", "disproportionate"
    notified_at: datetime | None = None
    reason: str = ""


# ---------------------------------------------------------------- payload


def certificate_build_payload(
    *,
    job_id: int,
    model_name: str,
    requests: Sequence[RequestFacts],
    sets: SetFacts,
    base: CheckpointFacts,
    candidate: CheckpointFacts,
    method: str,
    hparams: Mapping[str, Any],
    seeds: Mapping[str, int],
    versions: Mapping[str, str],
    verification: VerificationFacts,
    started_at: datetime,
    verified_at: datetime,
    old_checkpoints: Sequence[CheckpointDisposition] = (),
    notifications: Sequence[NotificationFacts] = (),
) -> dict[str, Any]:
    """Every field of ARCHITECTURE.md section 7 except those the chain fills in.

    ``certificate_issue`` adds ``certificate_id``, ``seq``, ``prev_hash``,
    ``signer_key_id`` and ``timestamps.signed`` when it appends the row.
    """
    if not requests:
        raise DomainError("a certificate covers at least one request")
    if not verification.passed:
        # A rejected job gets no certificate: nothing was erased that could be attested.
        raise DomainError("verification did not pass; there is nothing to certify")
    if verification.guarantee not in GUARANTEE_STATEMENTS:
        raise DomainError(f"unknown guarantee class {verification.guarantee!r}")
    approved = [r.approved_at for r in requests if r.approved_at is not None]
    payload: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "job_id": job_id,
        "model": {
            "name": model_name,
            "base_checkpoint": {"version": base.version, "digest": base.digest},
            "candidate_checkpoint": {"version": candidate.version, "digest": candidate.digest},
        },
        "requests": [
            {
                "reference": r.reference,
                "subject_hmac": r.subject_hmac,
                "subject_hmac_key_id": r.subject_key_id,
                "ground": r.ground,
                "received_at": r.received_at,
                "due_at": r.due_at,
                "extended_due_at": r.extended_due_at,
                "approved_at": r.approved_at,
            }
            for r in sorted(requests, key=lambda r: r.reference)
        ],
        "data": {
            "corpus": {
                "name": sets.corpus_name,
                "version": sets.corpus_version,
                "manifest_digest": sets.corpus_manifest_digest,
            },
            "forget_set": {"merkle_root": sets.forget_digest, "count": sets.forget_count},
            "retain_set": {"merkle_root": sets.retain_digest, "count": sets.retain_count},
            "probe_count": sets.probe_count,
        },
        "method": {"name": method, "hparams": dict(hparams), "seeds": dict(seeds)},
        "versions": dict(versions),
        "verification": {
            "policy": {"name": verification.policy_name, "version": verification.policy_version},
            "passed": verification.passed,
            "checks": [
                {
                    "name": c.name,
                    "value": c.value,
                    "threshold": c.threshold,
                    "comparator": c.comparator,
                    "passed": c.passed,
                }
                for c in sorted(verification.checks, key=lambda c: c.name)
            ],
            "metrics": dict(verification.metrics),
        },
        "guarantee": {
            "class": verification.guarantee,
            "statement": GUARANTEE_STATEMENTS[verification.guarantee],
        },
        "timestamps": {
            "received": min(r.received_at for r in requests),
            "due": min(r.due_at for r in requests),
            "approved": max(approved) if approved else None,
            "started": started_at,
            "verified": verified_at,
        },
        "old_checkpoints": [
            {
                "version": d.version,
                "digest": d.digest,
                "disposition": d.disposition,
                "destroy_after": d.destroy_after,
            }
            for d in sorted(old_checkpoints, key=lambda d: d.version)
        ],
        "notifications": [
            {
                "recipient_ref": n.recipient_ref,
                "status": n.status,
                "notified_at": n.notified_at,
                "reason": n.reason,
            }
            for n in sorted(notifications, key=lambda n: n.recipient_ref)
        ],
        "limits": LIMITS_STATEMENT,
    }
    plain: dict[str, Any] = plain_value(payload)
    return plain


def plain_value(value: Any) -> Any:
    """JSON values with nothing ambiguous: floats and decimals become strings.

    ``repr`` of a float is the shortest text that parses back to the same
    double, so ``"0.1"`` means exactly the double 0.1 to every reader.
    Datetimes become UTC ISO 8601 with microseconds and a ``Z``.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return canonical_time(value)
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    raise TypeError(f"cannot put a {type(value).__name__} into a certificate")


# ---------------------------------------------------------------- chain arithmetic


def payload_hash_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chain_hash_of(seq: int, prev_hash: str, payload_hash: str) -> str:
    """What each row signs: its place in the chain and its payload, in one digest."""
    message = f"{CHAIN_DOMAIN}\n{seq}\n{prev_hash}\n{payload_hash}"
    return hashlib.sha256(message.encode("ascii")).hexdigest()


def parse_payload(text: str) -> dict[str, Any] | None:
    """The payload object, or None unless the text is exactly its canonical JSON."""
    try:
        value = json.loads(text)
        if isinstance(value, dict) and canonical_json(value) == text:
            return value
    except ValueError:  # CanonicalError is a ValueError too
        pass
    return None


def _is_hex(text: object, length: int) -> bool:
    # Strict lowercase hex: bytes.fromhex would also accept "AB", which would let a
    # changed byte of a stored hash or signature go unnoticed.
    return isinstance(text, str) and len(text) == length and all(c in HEX_DIGITS for c in text)


# ---------------------------------------------------------------- issuing


def certificate_issue(
    session: Session,
    *,
    actor: str,
    payload: Mapping[str, Any],
    signer: Signer,
    at: datetime | None = None,
) -> Certificate:
    """Append the next certificate in the caller's transaction and audit it.

    ``payload`` comes from ``certificate_build_payload``.  The chain head row is
    locked first, so concurrent issuers queue instead of forking the chain.  A
    job gets at most one certificate: a second call for it raises.
    """
    job_id = payload.get("job_id")
    head = chain_head_lock(session, name=CERTIFICATE_CHAIN)
    if job_id is not None and certificate_get_for_job(session, job_id=job_id) is not None:
        raise DomainError(f"job {job_id} already has a certificate")
    signed_at = at or utcnow()
    seq = head.seq + 1
    certificate_id = f"DC-{signed_at.year}-{seq:06d}"
    document = plain_value(
        {
            **payload,
            "certificate_id": certificate_id,
            "seq": seq,
            "prev_hash": head.hash,
            "signer_key_id": signer.key_id,
            "timestamps": {**payload.get("timestamps", {}), "signed": signed_at},
        }
    )
    text = canonical_json(document)
    payload_hash = payload_hash_of(text)
    chain_hash = chain_hash_of(seq, head.hash, payload_hash)
    row = Certificate(
        seq=seq,
        certificate_id=certificate_id,
        payload=text,
        payload_hash=payload_hash,
        prev_hash=head.hash,
        signature=signer.sign(bytes.fromhex(chain_hash)).hex(),
        key_id=signer.key_id,
        signed_at=signed_at,
        job_id=job_id,
    )
    session.add(row)
    session.flush()
    chain_head_advance(session, head, seq=seq, hash_hex=chain_hash)
    audit_append(
        session,
        actor=actor,
        action="certificate.issued",
        object_type="certificate",
        object_ref=certificate_id,
        details={
            "seq": seq,
            "job_id": job_id,
            "payload_hash": payload_hash,
            "chain_hash": chain_hash,
            "key_id": signer.key_id,
        },
        at=signed_at,
    )
    logger.info("issued certificate %s seq=%s job=%s", certificate_id, seq, job_id)
    return row


def certificate_get(session: Session, *, certificate_id: str) -> Certificate:
    row = session.execute(
        select(Certificate).where(Certificate.certificate_id == certificate_id)
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"certificate {certificate_id} does not exist")
    return row


def certificate_get_for_job(session: Session, *, job_id: int) -> Certificate | None:
    return session.execute(
        select(Certificate).where(Certificate.job_id == job_id)
    ).scalar_one_or_none()


# ---------------------------------------------------------------- verifying


@dataclass(frozen=True)
class CertificateCheck:
    """One certificate checked on its own: its hash, its chain hash, its signature."""

    ok: bool
    reason: str | None
    payload_hash: str
    chain_hash: str | None


def certificate_verify_one(
    payload_json: str | bytes,
    signature: str | bytes,
    public_key: Ed25519PublicKey | bytes,
) -> CertificateCheck:
    """Offline / API check of one certificate: no database, no key ring.

    ``signature`` is the stored hex (or the raw 64 bytes), ``public_key`` a key
    or its PEM.  The payload itself says its seq and prev_hash, from which the
    signed chain hash is recomputed; the key must be the one the payload names.
    """
    if isinstance(payload_json, bytes):
        try:
            text = payload_json.decode("utf-8")
        except UnicodeDecodeError:
            digest = hashlib.sha256(payload_json).hexdigest()
            return CertificateCheck(False, "payload is not UTF-8 text", digest, None)
    else:
        text = payload_json
    payload_hash = payload_hash_of(text)
    key = public_key_from_pem(public_key) if isinstance(public_key, bytes) else public_key
    raw_signature = signature if isinstance(signature, bytes) else _signature_bytes(signature)

    def bad(reason: str, chain_hash: str | None = None) -> CertificateCheck:
        return CertificateCheck(False, reason, payload_hash, chain_hash)

    payload = parse_payload(text)
    if payload is None:
        return bad("payload is not canonical JSON")
    seq, prev_hash = payload.get("seq"), payload.get("prev_hash")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return bad("payload has no valid seq")
    if not _is_hex(prev_hash, 64):
        return bad("payload has no valid prev_hash")
    chain_hash = chain_hash_of(seq, str(prev_hash), payload_hash)
    if payload.get("signer_key_id") != key_id_of(key):
        return bad("the public key is not the one the payload names", chain_hash)
    if raw_signature is None or not signature_valid(key, raw_signature, bytes.fromhex(chain_hash)):
        return bad("signature does not verify", chain_hash)
    return CertificateCheck(True, None, payload_hash, chain_hash)


def certificate_verify_chain(
    session: Session,
    keyring: KeyRing,
    *,
    batch_size: int = 500,
    after: tuple[int, str] | None = None,
    until_seq: int | None = None,
) -> ChainVerification:
    """Recompute every hash and signature in seq order; name the first bad row.

    A missing row is named by its seq; rows cut off the end are caught by
    comparing the last row with the chain head.

    Without ``after`` the walk starts at genesis.  With ``after=(seq, chain_hash)``
    (a point already verified, e.g. a signed verified head, ``certificate_heads``)
    the row at that seq is checked on its own (hash, stored fields, signature) and
    must still have that chain hash; the walk then starts at the row after it, so a
    check costs the length of the tail, not of the chain.  Rows before ``after`` are
    not read: a change to them is for the full walk to find.  Without ``until_seq``
    the walk runs to the end of the table and checks the chain head too; with it,
    every row up to that seq must be there, and the walk stops there (the caller
    read the head first and compares ``last_hash`` with it).  ``checked`` counts
    the rows after ``after``.
    """
    expected_seq, prev_hash, checked = 1, GENESIS_HASH, 0
    stray = session.execute(
        select(Certificate.seq).where(Certificate.seq < 1).order_by(Certificate.seq).limit(1)
    ).scalar_one_or_none()
    if stray is not None:
        return ChainVerification(False, 0, stray, f"a row claims seq {stray}, before the chain")
    if after is not None and after[0] > 0:
        problem = _verified_row_problem(session, after, keyring=keyring)
        if problem is not None:
            return ChainVerification(False, 0, after[0], problem)
    if after is not None:
        expected_seq, prev_hash = after[0] + 1, after[1]
    last_seq = until_seq
    while last_seq is None or expected_seq <= last_seq:
        query = select(Certificate).where(Certificate.seq >= expected_seq)
        if last_seq is not None:
            query = query.where(Certificate.seq <= last_seq)
        rows = session.execute(
            query.order_by(Certificate.seq).limit(batch_size)
            .execution_options(populate_existing=True)
        ).scalars().all()
        if not rows:
            break
        for row in rows:
            if row.seq != expected_seq:
                return ChainVerification(
                    False, checked, expected_seq,
                    f"certificate seq {expected_seq} is missing (next stored seq is {row.seq})",
                )
            problem, chain_hash = _row_problem(row, prev_hash=prev_hash, keyring=keyring)
            if problem is not None:
                return ChainVerification(False, checked, row.seq, problem)
            checked += 1
            expected_seq, prev_hash = row.seq + 1, chain_hash
    if last_seq is not None:
        if expected_seq <= last_seq:
            return ChainVerification(
                False, checked, expected_seq,
                f"certificate seq {expected_seq} is missing (the chain reaches seq {last_seq})",
            )
        return ChainVerification(True, checked, last_hash=prev_hash)
    head = session.get(ChainHead, CERTIFICATE_CHAIN, populate_existing=True)
    head_seq, head_hash = (head.seq, head.hash) if head else (0, GENESIS_HASH)
    if head_seq != expected_seq - 1:
        return ChainVerification(
            False, checked, expected_seq,
            f"chain head says seq {head_seq}, the table ends at seq {expected_seq - 1}",
        )
    if head_hash != prev_hash:
        return ChainVerification(
            False, checked, head_seq, "chain head hash does not match the last certificate"
        )
    return ChainVerification(True, checked, last_hash=prev_hash)


def _verified_row_problem(
    session: Session, after: tuple[int, str], *, keyring: KeyRing
) -> str | None:
    """Why the row at an already verified point no longer stands (or None): it must be
    there, be sound on its own, and still have the chain hash that was verified."""
    seq, chain_hash = after
    row = session.execute(
        select(Certificate).where(Certificate.seq == seq).execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if row is None:
        return f"certificate seq {seq} was verified but is no longer in the table: rows were cut"
    problem, recomputed = _row_problem(row, prev_hash=row.prev_hash, keyring=keyring)
    if problem is not None:
        return problem
    if recomputed != chain_hash:
        return (f"certificate seq {seq} no longer has the chain hash that was verified: "
                "the chain was rewritten at or before it")
    return None


def _row_problem(
    row: Certificate, *, prev_hash: str, keyring: KeyRing
) -> tuple[str | None, str]:
    """Why a stored row is bad (or None), and the chain hash the next row must link to."""
    if not _is_hex(row.payload_hash, 64) or payload_hash_of(row.payload) != row.payload_hash:
        return "payload_hash does not match the payload", ""
    if row.prev_hash != prev_hash:
        return "prev_hash does not match the previous certificate's chain hash", ""
    chain_hash = chain_hash_of(row.seq, row.prev_hash, row.payload_hash)
    payload = parse_payload(row.payload)
    if payload is None:
        return "payload is not canonical JSON", chain_hash
    stated = {
        "seq": payload.get("seq"),
        "prev_hash": payload.get("prev_hash"),
        "certificate_id": payload.get("certificate_id"),
        "signer_key_id": payload.get("signer_key_id"),
        "job_id": payload.get("job_id"),
        "signed": (payload.get("timestamps") or {}).get("signed"),
    }
    stored = {
        "seq": row.seq,
        "prev_hash": row.prev_hash,
        "certificate_id": row.certificate_id,
        "signer_key_id": row.key_id,
        "job_id": row.job_id,
        "signed": canonical_time(row.signed_at),
    }
    for name, value in stored.items():
        if stated[name] != value:
            return f"stored {name} differs from the payload's", chain_hash
    if row.key_id not in keyring:
        return "signed by a key that is not in the key ring", chain_hash
    raw_signature = _signature_bytes(row.signature)
    if raw_signature is None or not signature_valid(
        keyring.get(row.key_id), raw_signature, bytes.fromhex(chain_hash)
    ):
        return "signature does not verify", chain_hash
    return None, chain_hash


def _signature_bytes(text: str) -> bytes | None:
    return bytes.fromhex(text) if _is_hex(text, SIGNATURE_HEX_LENGTH) else None


# ---------------------------------------------------------------- export


def certificate_export(
    session: Session, *, certificate_id: str, out_dir: Path, keyring: KeyRing
) -> list[Path]:
    """Write what an outsider needs to check one certificate offline.

    ``payload.json`` holds the signed bytes exactly; ``certificate.json`` the
    row (hashes, hex signature, key id) with the payload parsed for reading;
    ``signature.bin`` the raw signature (for openssl); ``public_key.pem`` the
    signer's public key.  The recipe is in docs/certificates.md.
    """
    row = certificate_get(session, certificate_id=certificate_id)
    public_key = keyring.get(row.key_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "certificate_id": row.certificate_id,
        "seq": row.seq,
        "payload_hash": row.payload_hash,
        "prev_hash": row.prev_hash,
        "chain_hash": chain_hash_of(row.seq, row.prev_hash, row.payload_hash),
        "chain_hash_recipe": f"sha256('{CHAIN_DOMAIN}\\n' + seq + '\\n' + prev_hash "
        "+ '\\n' + payload_hash), signed raw with Ed25519",
        "signature": row.signature,
        "key_id": row.key_id,
        "payload": parse_payload(row.payload) or row.payload,
    }
    files = {
        "payload.json": row.payload.encode("utf-8"),
        "certificate.json": (json.dumps(document, indent=2, sort_keys=True) + "\n").encode(),
        "signature.bin": _signature_bytes(row.signature) or b"",
        "public_key.pem": public_key_pem(public_key),
    }
    paths = []
    for name, data in files.items():
        path = out_dir / name
        path.write_bytes(data)
        paths.append(path)
    logger.info("exported certificate %s to %s", certificate_id, out_dir)
    return paths
