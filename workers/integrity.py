"""Beat integrity checks: serving checkpoints re-hashed, chain heads signed off-database.

A serving checkpoint's files are otherwise only re-hashed when the next job starts
from them, which may be days away; the hourly re-hash alerts in between.

The chains catch any change to a row, but not a tail cut together with a rewound
``chain_heads`` row: every remaining row and the head then agree.  A signed copy of
each head, appended to a file outside the database every 15 minutes, catches that:
the row it names must still exist with the same hash.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.audit import audit_append
from deletion.domain.canonical import GENESIS_HASH, canonical_bytes, canonical_json, canonical_time
from deletion.domain.certificates import chain_hash_of
from deletion.domain.chains import AUDIT_CHAIN, CERTIFICATE_CHAIN, chain_head_lock
from deletion.domain.db import session_scope
from deletion.domain.errors import ValidationError
from deletion.domain.models import AuditEvent, Certificate, ChainHead, Checkpoint, Model, utcnow
from deletion.domain.signing import KeyRing, Signer, signature_valid
from deletion.domain.states import CheckpointStatus

log = logging.getLogger(__name__)

ACTOR = "system:integrity"
INTEGRITY_FAILED = "checkpoint.integrity_failed"
INTEGRITY_RESTORED = "checkpoint.integrity_restored"
DIGEST_PREFIX = 12  # enough to tell digests apart in an alert; the full one is in the registry
MISSING = "missing"

HEADS_FORMAT = "erasure-chain-heads/1"
HEADS_FILE = "chain-heads.jsonl"
CHAINS = (AUDIT_CHAIN, CERTIFICATE_CHAIN)
SEQ_CHUNK = 1000


# --------------------------------------------------------------- serving checkpoints


@dataclass(frozen=True)
class IntegrityReport:
    checked: int
    mismatched: tuple[int, ...]  # checkpoint ids whose files differ now
    reported: tuple[int, ...]  # of those, the ones that got a new audit event this run
    restored: tuple[int, ...]  # ids whose files match again after a reported mismatch


def _actual_digest(directory: str) -> str:
    try:
        return registry.checkpoint_digest(directory)
    except ValidationError:
        return MISSING


def _last_integrity_event(session: Session, object_ref: str) -> AuditEvent | None:
    return session.execute(
        select(AuditEvent)
        .where(AuditEvent.object_type == "checkpoint", AuditEvent.object_ref == object_ref,
               AuditEvent.action.in_((INTEGRITY_FAILED, INTEGRITY_RESTORED)))
        .order_by(AuditEvent.seq.desc()).limit(1)
    ).scalar_one_or_none()


def checkpoints_check_serving(*, engine: Any) -> IntegrityReport:
    """Re-hash every serving checkpoint; audit each new mismatch once, and its repair.

    Idempotent per checkpoint and mismatch: while the files keep hashing to the same
    wrong digest, later runs add nothing.  Hashing runs outside any transaction (it
    can take minutes); the decision runs under the audit chain's lock, so two
    overlapping runs cannot both append the same event.
    """
    with session_scope(engine) as session:
        serving = [
            (c.id, c.version, c.directory, c.digest, m.name)
            for c, m in session.execute(
                select(Checkpoint, Model).join(Model, Checkpoint.model_id == Model.id)
                .where(Checkpoint.status == CheckpointStatus.SERVING.value)
                .order_by(Checkpoint.id)
            ).all()
        ]
    mismatched: list[int] = []
    reported: list[int] = []
    restored: list[int] = []
    for checkpoint_id, version, directory, expected, model_name in serving:
        actual = _actual_digest(directory)
        ok = actual == expected
        if not ok:
            mismatched.append(checkpoint_id)
        object_ref = f"{model_name}@{version}"
        with session_scope(engine) as session:
            chain_head_lock(session, name=AUDIT_CHAIN)
            last = _last_integrity_event(session, object_ref)
            last_failed = last is not None and last.action == INTEGRITY_FAILED
            last_actual = json.loads(last.details).get("actual") if last is not None else None
            details = {"model": model_name, "checkpoint_id": checkpoint_id, "version": version,
                       "expected": expected[:DIGEST_PREFIX], "actual": actual[:DIGEST_PREFIX]}
            if not ok:
                if last_failed and last_actual == details["actual"]:
                    continue  # already reported, nothing changed since
                audit_append(session, actor=ACTOR, action=INTEGRITY_FAILED,
                             object_type="checkpoint", object_ref=object_ref, details=details)
                reported.append(checkpoint_id)
                log.error("serving checkpoint %s of model %s (v%s) no longer matches its "
                          "digest %s (files now: %s)", checkpoint_id, model_name, version,
                          details["expected"], details["actual"])
            elif last_failed:
                audit_append(session, actor=ACTOR, action=INTEGRITY_RESTORED,
                             object_type="checkpoint", object_ref=object_ref, details=details)
                restored.append(checkpoint_id)
                log.warning("serving checkpoint %s of model %s (v%s) matches its digest again",
                            checkpoint_id, model_name, version)
    return IntegrityReport(checked=len(serving), mismatched=tuple(mismatched),
                           reported=tuple(reported), restored=tuple(restored))


# ------------------------------------------------------------------- chain heads


def _heads(session: Session) -> list[dict[str, Any]]:
    rows = {h.name: h for h in session.execute(select(ChainHead)).scalars()}
    return [
        {"chain": name, "seq": rows[name].seq if name in rows else 0,
         "hash": rows[name].hash if name in rows else GENESIS_HASH}
        for name in CHAINS
    ]


def chain_heads_export(*, engine: Any, signer: Signer, export_dir: Path,
                       now: datetime | None = None) -> dict[str, Any]:
    """Sign both chains' current heads and append them as one JSON line; returns the record.

    The signature covers the canonical JSON of every field but itself.  The file is
    only ever opened for appending; shipping it off the host is the deployment's job.
    """
    with session_scope(engine) as session:
        heads = _heads(session)
    record: dict[str, Any] = {"format": HEADS_FORMAT, "exported_at": canonical_time(now or utcnow()),
                              "key_id": signer.key_id, "heads": heads}
    record["signature"] = signer.sign(canonical_bytes(record)).hex()
    export_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(export_dir / HEADS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(canonical_json(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    log.info("exported chain heads %s", ", ".join(f"{h['chain']}@{h['seq']}" for h in heads))
    return record


@dataclass(frozen=True)
class HeadCheck:
    ok: bool
    records: int  # exported lines read
    checked: int  # distinct (chain, seq) pairs compared with the database
    problems: tuple[str, ...]


def _record_problem(record: Any, keyring: KeyRing) -> str | None:
    if not isinstance(record, dict) or record.get("format") != HEADS_FORMAT:
        return "not a chain-head record"
    unsigned = {k: v for k, v in record.items() if k != "signature"}
    key_id = record.get("key_id")
    if key_id not in keyring:
        return "signed by an unknown key"
    try:
        signature = bytes.fromhex(str(record.get("signature")))
    except ValueError:
        return "malformed signature"
    if not signature_valid(keyring.get(str(key_id)), signature, canonical_bytes(unsigned)):
        return "bad signature"
    return None


def _stored_hashes(session: Session, chain: str, seqs: list[int]) -> dict[int, str]:
    found: dict[int, str] = {0: GENESIS_HASH}
    for start in range(0, len(seqs), SEQ_CHUNK):
        chunk = seqs[start:start + SEQ_CHUNK]
        if chain == AUDIT_CHAIN:
            for seq, hash_hex in session.execute(
                select(AuditEvent.seq, AuditEvent.hash).where(AuditEvent.seq.in_(chunk))
            ):
                found[seq] = hash_hex
        else:
            for seq, prev_hash, payload_hash in session.execute(
                select(Certificate.seq, Certificate.prev_hash, Certificate.payload_hash)
                .where(Certificate.seq.in_(chunk))
            ):
                found[seq] = chain_hash_of(seq, prev_hash, payload_hash)
    return found


def chain_heads_check(session: Session, *, lines: Iterable[str], keyring: KeyRing) -> HeadCheck:
    """Compare a database with every exported head: each row named must still be there
    with the same hash, and each chain's head at or past it.

    Catches what a chain walk cannot: a tail cut with the head row rewound to match,
    and (for the unsigned audit chain) a consistent rewrite of earlier rows.
    """
    problems: list[str] = []
    exported: dict[str, dict[int, str]] = {name: {} for name in CHAINS}
    records = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        records += 1
        try:
            record = json.loads(line)
        except ValueError:
            problems.append(f"line {number}: not JSON")
            continue
        problem = _record_problem(record, keyring)
        if problem:
            problems.append(f"line {number}: {problem}")
            continue
        for head in record["heads"]:
            seen = exported.setdefault(head["chain"], {})
            if seen.get(head["seq"], head["hash"]) != head["hash"]:
                problems.append(f"line {number}: {head['chain']} seq {head['seq']} exported "
                                "twice with different hashes")
            seen[head["seq"]] = head["hash"]
    current = {h["chain"]: h["seq"] for h in _heads(session)}
    checked = 0
    for chain, wanted in exported.items():
        if not wanted:
            continue
        if chain not in CHAINS:
            problems.append(f"{chain}: unknown chain")
            continue
        stored = _stored_hashes(session, chain, sorted(wanted))
        for seq, hash_hex in sorted(wanted.items()):
            checked += 1
            if seq not in stored:
                problems.append(f"{chain} seq {seq}: exported, no longer in the database")
            elif stored[seq] != hash_hex:
                problems.append(f"{chain} seq {seq}: hash differs from the exported head")
        if current[chain] < max(wanted):
            problems.append(f"{chain}: head at seq {current[chain]}, behind the exported "
                            f"seq {max(wanted)}")
    for problem in problems:
        log.error("chain heads check: %s", problem)
    return HeadCheck(ok=not problems, records=records, checked=checked, problems=tuple(problems))


def chain_heads_check_file(session: Session, *, path: Path, keyring: KeyRing) -> HeadCheck:
    """``chain_heads_check`` over an exported file (a copy kept off this host)."""
    with path.open(encoding="utf-8") as handle:
        return chain_heads_check(session, lines=handle, keyring=keyring)
