"""Keyed seals over the audit chain: what a database owner cannot forge.

The audit chain's public sha256 links (``audit.py``) let anyone recompute it without a
key, which is what auditors checking an evidence pack need; but whoever can write the
table can also rewrite a tail and recompute every later hash.  A *seal* closes that:
the sealing worker, which alone holds ``AUDIT_SEAL_KEY``, verifies the chain
incrementally from its previous seal and appends a row to ``audit_seals`` with
HMAC-SHA256 over (sealed seq, the event hash at that seq, key id, time).  Since each
hash covers every earlier event, a seal vouches for the whole prefix up to its seq.

Verification (``audit_seals_verify``) reports:

- a seal whose HMAC does not verify, or that names a key this process does not hold
  (only where the key is given: the web process has none and says so);
- a chain rewritten at or before the last seal: the row at the sealed seq no longer has
  the sealed hash, is gone, or the head is behind it;
- a tail after the last seal that does not link or hash (the walk is incremental:
  only rows after the last seal are read);
- how many events are unsealed: a consistent rewrite of *those* is what the key
  cannot catch, so the sealing period bounds the exposure (``docs/security.md``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain import config as settings
from deletion.domain.audit import audit_verify
from deletion.domain.canonical import GENESIS_HASH, canonical_bytes, canonical_time
from deletion.domain.chains import AUDIT_CHAIN, chain_head_of
from deletion.domain.crypto import key_id
from deletion.domain.models import AuditEvent, AuditSeal, utcnow

log = logging.getLogger(__name__)

SEAL_FORMAT = "erasure-audit-seal/1"
SEAL_KEY_FILE = "audit-seal.key"
# Beat seals every SEAL_PERIOD; a newest seal older than twice that while events wait
# means sealing stopped (or recent seals were removed).
SEAL_PERIOD = timedelta(minutes=5)
# What a page may check on its own: at most this many events after the last seal.
PAGE_TAIL_LIMIT = 10_000


# ------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class SealKeys:
    """The current seal key and older ones (for seals made before a rotation)."""

    current: bytes
    old: tuple[bytes, ...] = ()

    @classmethod
    def from_config(cls, cfg: settings.Config) -> SealKeys | None:
        """The configured key, else an embedded default the sealer made earlier; None
        where there is no key at all (the web process in production)."""
        if cfg.audit_seal_key is None and not (cfg.var_dir / "keys" / SEAL_KEY_FILE).is_file():
            return None
        return cls.for_sealer(cfg)

    @classmethod
    def for_sealer(cls, cfg: settings.Config) -> SealKeys:
        """The sealing worker's keys: ``AUDIT_SEAL_KEY``, else the embedded default under
        ``VAR_DIR/keys``, created on first use (``make run``)."""
        if cfg.audit_seal_key is not None:
            return cls(cfg.audit_seal_key, cfg.audit_seal_old_keys)
        path = cfg.var_dir / "keys" / SEAL_KEY_FILE
        return cls(settings.embedded_key(path, "AUDIT_SEAL_KEY"), cfg.audit_seal_old_keys)

    @property
    def key_id(self) -> str:
        return key_id(self.current)

    def get(self, wanted: str) -> bytes | None:
        for key in (self.current, *self.old):
            if key_id(key) == wanted:
                return key
        return None


def seal_message(*, sealed_seq: int, chain_hash: str, key_id_: str, sealed_at: datetime) -> bytes:
    """The canonical JSON a seal's HMAC covers (everything stored but the MAC)."""
    return canonical_bytes({"format": SEAL_FORMAT, "sealed_seq": sealed_seq,
                            "chain_hash": chain_hash, "key_id": key_id_,
                            "sealed_at": canonical_time(sealed_at)})


def seal_mac(key: bytes, *, sealed_seq: int, chain_hash: str, key_id_: str,
             sealed_at: datetime) -> str:
    message = seal_message(sealed_seq=sealed_seq, chain_hash=chain_hash, key_id_=key_id_,
                           sealed_at=sealed_at)
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _mac_problem(seal: AuditSeal, keys: SealKeys) -> str | None:
    key = keys.get(seal.key_id)
    if key is None:
        return f"seal {seal.id} is made with key {seal.key_id}, which this process does not hold"
    expected = seal_mac(key, sealed_seq=seal.sealed_seq, chain_hash=seal.chain_hash,
                        key_id_=seal.key_id, sealed_at=seal.sealed_at)
    if not hmac.compare_digest(expected, seal.mac):
        return f"seal {seal.id} (seq {seal.sealed_seq}) does not authenticate: forged or altered"
    return None


# ----------------------------------------------------------------- verification


@dataclass(frozen=True)
class SealCheck:
    ok: bool
    head_seq: int
    sealed_seq: int  # the last seal's seq (0: none)
    checked: int  # events read and recomputed by this check
    unchecked: int  # events after the last seal this check left to the sealer (a page's limit)
    keyed: bool  # whether the seals' HMACs were checked (only with the key)
    seal_id: int | None = None
    sealed_at: datetime | None = None
    first_bad_seq: int | None = None
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def unsealed(self) -> int:
        """Events after the last seal: a consistent rewrite of these is not detectable."""
        return max(self.head_seq - self.sealed_seq, 0)


def _head(session: Session) -> tuple[int, str]:
    return chain_head_of(session, AUDIT_CHAIN)


def _last_seal(session: Session) -> AuditSeal | None:
    return session.execute(
        select(AuditSeal).order_by(AuditSeal.id.desc()).limit(1)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def _sealed_row_problem(session: Session, seal: AuditSeal, head_seq: int) -> str | None:
    stored = session.execute(
        select(AuditEvent.hash).where(AuditEvent.seq == seal.sealed_seq)
    ).scalar_one_or_none()
    if stored is None:
        return (f"seq {seal.sealed_seq} is sealed (seal {seal.id}) but no longer in the table: "
                "rows were cut")
    if stored != seal.chain_hash:
        return (f"seq {seal.sealed_seq} no longer has the hash seal {seal.id} vouches for: "
                "the chain was rewritten at or before it")
    if head_seq < seal.sealed_seq:
        return f"chain head at seq {head_seq}, behind the sealed seq {seal.sealed_seq}: rows were cut"
    return None


def audit_seals_verify(
    session: Session,
    *,
    keys: SealKeys | None,
    full: bool = False,
    tail_limit: int | None = None,
    now: datetime | None = None,
) -> SealCheck:
    """Check the chain against its seals.

    Default (incremental): the last seal (its HMAC with ``keys``), the row it seals, and
    only the events after it, up to ``tail_limit`` of them (None: all).  ``full=True``:
    every event from genesis and every seal - the walk that runs only when asked.
    """
    head_seq, head_hash = _head(session)
    last = _last_seal(session)
    keyed = keys is not None
    problems: list[str] = []
    first_bad: int | None = None
    if full:
        return _verify_full(session, keys=keys, head=(head_seq, head_hash), last=last, now=now)
    start_seq, start_hash = 0, GENESIS_HASH
    if last is not None:
        problem = _mac_problem(last, keys) if keys is not None else None
        problem = problem or _sealed_row_problem(session, last, head_seq)
        if problem is not None:
            return SealCheck(False, head_seq, last.sealed_seq, 0, 0, keyed, last.id,
                             last.sealed_at, last.sealed_seq, (problem,))
        start_seq, start_hash = last.sealed_seq, last.chain_hash
    until = head_seq if tail_limit is None else min(head_seq, start_seq + tail_limit)
    walk = audit_verify(session, after=(start_seq, start_hash), until_seq=until)
    if not walk.ok:
        problems.append(f"seq {walk.first_bad_seq}: {walk.reason}")
        first_bad = walk.first_bad_seq
    elif walk.checked < until - start_seq:
        first_bad = start_seq + walk.checked + 1
        problems.append(f"chain head says seq {head_seq}, the table ends at seq {first_bad - 1}: "
                        "rows are missing at the end")
    elif until == head_seq and (walk.last_hash if walk.checked else start_hash) != head_hash:
        first_bad = head_seq
        problems.append("chain head hash does not match the last event")
    return SealCheck(
        not problems, head_seq, start_seq, walk.checked, head_seq - until, keyed,
        last.id if last else None, last.sealed_at if last else None, first_bad, tuple(problems),
        _stale_warning(last, head_seq, now),
    )


def _verify_full(session: Session, *, keys: SealKeys | None, head: tuple[int, str],
                 last: AuditSeal | None, now: datetime | None) -> SealCheck:
    head_seq, _ = head
    problems: list[str] = []
    first_bad: int | None = None
    walk = audit_verify(session)
    if not walk.ok:
        problems.append(f"seq {walk.first_bad_seq}: {walk.reason}")
        first_bad = walk.first_bad_seq
    # Every seal against the row it names: the earliest that fails dates the rewrite.
    rows = session.execute(
        select(AuditSeal, AuditEvent.hash)
        .outerjoin(AuditEvent, AuditEvent.seq == AuditSeal.sealed_seq).order_by(AuditSeal.id)
    ).all()
    for seal, stored in rows:
        problem = _mac_problem(seal, keys) if keys is not None else None
        if problem is None and stored != seal.chain_hash:
            problem = (f"seq {seal.sealed_seq} no longer has the hash seal {seal.id} vouches for"
                       if stored is not None else
                       f"seq {seal.sealed_seq} is sealed (seal {seal.id}) but no longer in the table")
        if problem is not None:
            problems.append(problem)
            first_bad = seal.sealed_seq if first_bad is None else min(first_bad, seal.sealed_seq)
    return SealCheck(
        not problems, head_seq, last.sealed_seq if last else 0, walk.checked, 0, keys is not None,
        last.id if last else None, last.sealed_at if last else None, first_bad, tuple(problems),
        _stale_warning(last, head_seq, now),
    )


def _stale_warning(last: AuditSeal | None, head_seq: int, now: datetime | None) -> tuple[str, ...]:
    sealed_seq = last.sealed_seq if last else 0
    if head_seq <= sealed_seq:
        return ()
    if last is None:
        return (f"no seal yet: {head_seq} events are unsealed",)
    age = (now or utcnow()) - last.sealed_at
    if age > 2 * SEAL_PERIOD:
        return (f"the last seal is {int(age.total_seconds() // 60)} minutes old and "
                f"{head_seq - sealed_seq} events wait: sealing has stopped, or recent seals "
                "were removed",)
    return ()


# ---------------------------------------------------------------------- sealing


@dataclass(frozen=True)
class SealOutcome:
    check: SealCheck
    seal: AuditSeal | None  # the seal written, None when the check failed or nothing was new


def audit_seal(session: Session, *, keys: SealKeys, now: datetime | None = None) -> SealOutcome:
    """Verify the chain from the last seal and, if it holds, seal it up to its head.

    Never seals over a failed check (that would launder a rewrite).  Takes no lock:
    events appended meanwhile are simply left for the next run.
    """
    check = audit_seals_verify(session, keys=keys, now=now)
    if not check.ok:
        for problem in check.problems:
            log.error("audit chain seal check failed: %s", problem)
        return SealOutcome(check, None)
    if check.head_seq == check.sealed_seq:
        return SealOutcome(check, None)
    head_seq, head_hash = check.head_seq, _head_hash_at(session, check.head_seq)
    moment = now or utcnow()
    seal = AuditSeal(sealed_seq=head_seq, chain_hash=head_hash, key_id=keys.key_id,
                     mac=seal_mac(keys.current, sealed_seq=head_seq, chain_hash=head_hash,
                                  key_id_=keys.key_id, sealed_at=moment),
                     sealed_at=moment)
    session.add(seal)
    session.flush()
    log.info("sealed the audit chain at seq %s (seal %s, %s events checked)", head_seq, seal.id,
             check.checked)
    return SealOutcome(check, seal)


def _head_hash_at(session: Session, seq: int) -> str:
    return session.execute(select(AuditEvent.hash).where(AuditEvent.seq == seq)).scalar_one()
