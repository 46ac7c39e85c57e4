"""Signed chain heads kept off the database: what catches a cut tail with a rewound head.

The chains catch any change to a row, but not a tail cut together with a rewound
``chain_heads`` row: every remaining row and the head then agree.  A signed copy of
each head, appended to a file outside the database (beat, every 15 minutes, on the
worker that holds the signing key), catches that: the row it names must still exist
with the same hash.  Each record also names the newest audit seal (``seals.py``), so
removing recent seals to reopen a sealed stretch of the chain is caught the same way.

``chain_heads_check`` runs wherever the file and the public key ring are: the beat
task on the worker, and ``manage.py chain_heads_check``.
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

from deletion.domain.canonical import GENESIS_HASH, canonical_bytes, canonical_json, canonical_time
from deletion.domain.certificates import chain_hash_of
from deletion.domain.chains import AUDIT_CHAIN, CERTIFICATE_CHAIN
from deletion.domain.config import ConfigError
from deletion.domain.db import session_scope
from deletion.domain.models import AuditEvent, AuditSeal, Certificate, ChainHead, utcnow
from deletion.domain.signing import KeyRing, Signer, signature_valid

log = logging.getLogger(__name__)

HEADS_FORMAT = "erasure-chain-heads/1"
HEADS_FILE = "chain-heads.jsonl"
CHAINS = (AUDIT_CHAIN, CERTIFICATE_CHAIN)
SEQ_CHUNK = 1000


def _heads(session: Session) -> list[dict[str, Any]]:
    rows = {h.name: h for h in session.execute(select(ChainHead)).scalars()}
    return [
        {"chain": name, "seq": rows[name].seq if name in rows else 0,
         "hash": rows[name].hash if name in rows else GENESIS_HASH}
        for name in CHAINS
    ]


def _newest_seal(session: Session) -> dict[str, Any] | None:
    seal = session.execute(select(AuditSeal).order_by(AuditSeal.id.desc()).limit(1)).scalar_one_or_none()
    return None if seal is None else {"id": seal.id, "sealed_seq": seal.sealed_seq, "mac": seal.mac}


def chain_heads_export(*, engine: Any, signer: Signer, export_dir: Path,
                       now: datetime | None = None) -> dict[str, Any]:
    """Sign both chains' current heads (and the newest audit seal) and append them as one
    JSON line; returns the record.

    The signature covers the canonical JSON of every field but itself.  The file is
    only ever opened for appending; shipping it off the host is the deployment's job.
    A folder that cannot be written is a ``ConfigError`` naming CHAIN_HEAD_EXPORT_DIR.
    """
    with session_scope(engine) as session:
        heads = _heads(session)
        seal = _newest_seal(session)
    record: dict[str, Any] = {"format": HEADS_FORMAT, "exported_at": canonical_time(now or utcnow()),
                              "key_id": signer.key_id, "heads": heads, "seal": seal}
    record["signature"] = signer.sign(canonical_bytes(record)).hex()
    try:
        export_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(export_dir / HEADS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise ConfigError("CHAIN_HEAD_EXPORT_DIR",
                          f"cannot write {export_dir / HEADS_FILE}: {exc.strerror}") from None
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
    seals: dict[int, tuple[int, str]] = {}
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
        seal = record.get("seal")
        if isinstance(seal, dict):
            seals[int(seal["id"])] = (int(seal["sealed_seq"]), str(seal["mac"]))
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
    problems += _seal_problems(session, seals)
    checked += len(seals)
    for problem in problems:
        log.error("chain heads check: %s", problem)
    return HeadCheck(ok=not problems, records=records, checked=checked, problems=tuple(problems))


def _seal_problems(session: Session, exported: dict[int, tuple[int, str]]) -> list[str]:
    """Each exported seal must still be in the database, unchanged: removing recent seals
    would otherwise leave a sealed stretch of the chain open to a consistent rewrite."""
    problems: list[str] = []
    ids = sorted(exported)
    stored: dict[int, tuple[int, str]] = {}
    for start in range(0, len(ids), SEQ_CHUNK):
        for seal_id, sealed_seq, mac in session.execute(
            select(AuditSeal.id, AuditSeal.sealed_seq, AuditSeal.mac)
            .where(AuditSeal.id.in_(ids[start:start + SEQ_CHUNK]))
        ):
            stored[seal_id] = (sealed_seq, mac)
    for seal_id in ids:
        if seal_id not in stored:
            problems.append(f"audit seal {seal_id}: exported, no longer in the database")
        elif stored[seal_id] != exported[seal_id]:
            problems.append(f"audit seal {seal_id}: differs from the exported copy")
    return problems


def chain_heads_check_file(session: Session, *, path: Path, keyring: KeyRing) -> HeadCheck:
    """``chain_heads_check`` over an exported file (a copy kept off this host)."""
    with path.open(encoding="utf-8") as handle:
        return chain_heads_check(session, lines=handle, keyring=keyring)
