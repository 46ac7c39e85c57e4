"""Signed verified heads of the certificate chain: where a check may start instead of genesis.

``certificate_verify_chain`` recomputes every row's hash and Ed25519 signature from
genesis, a cost that grows with the chain; a page or an API read must not pay it on
every request.  So the worker that holds the signing key walks the chain (beat: every
VERIFY_PERIOD from the last verified head, and once a day in full) and, when the walk
holds, appends a row to ``certificate_verified_heads``: the seq and chain hash it
reached, the seq it began after, the time, and an Ed25519 signature over all of them
(``verified_head_message``).  Since each chain hash covers every earlier row, a
verified head vouches for the whole prefix up to its seq.

A reader (``certificate_chain_check``) needs only the public key ring.  By default it
checks the newest verified head's signature and then:

- the row at the verified seq must still be there, sound on its own (hash, stored
  fields, signature) and with the verified chain hash;
- every certificate after it, up to the chain head read at the start, is re-checked
  (hash, link, stored fields, signature), and the head's hash must be the last row's;
- a row after a head that did not move meanwhile means the head was rewound.

A verified head whose signature does not verify (forged, altered, or by a key not in
the ring) is never trusted; nor is any row without one.  The reader then says so and
walks from genesis, as it does while there is no verified head yet.  A page or an API
read passes ``tail_limit`` (``PAGE_TAIL_LIMIT``), as the audit pages do with their seals
(``seals.audit_seals_verify``): it re-checks at most that many certificates after its
starting point and says how many it left to the worker (``unchecked``), so no read walks
a whole chain, not even one without a trusted head.  By design the
incremental check does not re-read rows before the verified head: the full walk does
(``full=True``: ``?full=1`` on the certificate page and the API, the daily beat run,
and ``manage.py certificates verify``).  A cut tail with the head rewound *before* the
newest verified head is caught by that head (its row is gone, or the head is behind
it); one after it only by the signed chain heads exported off the database
(``chain_heads``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from deletion.domain.canonical import GENESIS_HASH, canonical_bytes, canonical_time
from deletion.domain.certificates import SIGNATURE_HEX_LENGTH, certificate_verify_chain
from deletion.domain.chains import CERTIFICATE_CHAIN, chain_head_of
from deletion.domain.models import Certificate, CertificateVerifiedHead, utcnow
from deletion.domain.signing import KeyRing, Signer, signature_valid

log = logging.getLogger(__name__)

VERIFIED_HEAD_FORMAT = "erasure-certificate-verified-head/1"
INCREMENTAL, FULL = "incremental", "full"
# Beat verifies every VERIFY_PERIOD; a newest verified head older than twice that while
# certificates wait means the worker's check stopped (or fails, or recent heads were removed).
VERIFY_PERIOD = timedelta(minutes=15)
FULL_VERIFY_PERIOD = timedelta(days=1)
# What a page or an API read re-checks at most (each certificate is an Ed25519
# verification, a few thousand a second); the worker verifies every VERIFY_PERIOD.
PAGE_TAIL_LIMIT = 1_000
_HEX = frozenset("0123456789abcdef")


def verified_head_message(*, verified_seq: int, chain_hash: str, from_seq: int, key_id: str,
                          verified_at: datetime) -> bytes:
    """The canonical JSON a verified head's signature covers (everything stored but the
    signature and the row id)."""
    return canonical_bytes({"format": VERIFIED_HEAD_FORMAT, "chain": CERTIFICATE_CHAIN,
                            "verified_seq": verified_seq, "chain_hash": chain_hash,
                            "from_seq": from_seq, "key_id": key_id,
                            "verified_at": canonical_time(verified_at)})


def verified_head_sign(signer: Signer, *, verified_seq: int, chain_hash: str, from_seq: int,
                       verified_at: datetime) -> CertificateVerifiedHead:
    """A new verified head (not yet added to a session), signed by ``signer``."""
    message = verified_head_message(verified_seq=verified_seq, chain_hash=chain_hash,
                                    from_seq=from_seq, key_id=signer.key_id,
                                    verified_at=verified_at)
    return CertificateVerifiedHead(verified_seq=verified_seq, chain_hash=chain_hash,
                                   from_seq=from_seq, key_id=signer.key_id,
                                   signature=signer.sign(message).hex(), verified_at=verified_at)


def _signature_problem(head: CertificateVerifiedHead, keyring: KeyRing) -> str | None:
    if head.key_id not in keyring:
        return f"verified head {head.id} is signed by a key that is not in the key ring"
    signature = head.signature
    if (not isinstance(signature, str) or len(signature) != SIGNATURE_HEX_LENGTH
            or not set(signature) <= _HEX):
        return f"verified head {head.id} has a malformed signature"
    message = verified_head_message(verified_seq=head.verified_seq, chain_hash=head.chain_hash,
                                    from_seq=head.from_seq, key_id=head.key_id,
                                    verified_at=head.verified_at)
    if not signature_valid(keyring.get(head.key_id), bytes.fromhex(signature), message):
        return (f"verified head {head.id} (seq {head.verified_seq}) does not verify: "
                "forged or altered")
    return None


# ----------------------------------------------------------------- verification


@dataclass(frozen=True)
class CertificateChainCheck:
    ok: bool
    mode: str  # INCREMENTAL (from a signed verified head) or FULL (from genesis)
    head_seq: int  # the chain head when the check began
    verified_from: int  # the seq the walk began after (0: genesis)
    checked: int  # certificates after verified_from recomputed by this check
    verified_head_id: int | None = None  # the verified head the walk began at
    verified_at: datetime | None = None  # when that head was signed
    first_bad_seq: int | None = None
    reason: str | None = None
    warnings: tuple[str, ...] = ()
    last_hash: str | None = None  # the chain hash at head_seq, when the check held
    unchecked: int = 0  # certificates before the head this check left to the worker (tail_limit)


def _head(session: Session) -> tuple[int, str]:
    return chain_head_of(session, CERTIFICATE_CHAIN)


def certificate_verified_head_last(session: Session) -> CertificateVerifiedHead | None:
    """The newest verified head, whether or not its signature holds."""
    return session.execute(
        select(CertificateVerifiedHead).order_by(CertificateVerifiedHead.id.desc()).limit(1)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def certificate_chain_check(
    session: Session,
    keyring: KeyRing,
    *,
    full: bool = False,
    tail_limit: int | None = None,
    now: datetime | None = None,
) -> CertificateChainCheck:
    """Check the certificate chain from its newest signed verified head to the chain head.

    ``full=True`` walks from genesis instead: the walk that runs only when asked.  The
    head is read first and the walk stops there, so a certificate issued meanwhile is
    neither read nor mistaken for damage.  ``tail_limit`` (not with ``full``): re-check at
    most that many certificates after the starting point; the rest up to the head are
    counted in ``unchecked`` and named in a warning.  See the module docstring for what
    each mode does and does not read.
    """
    if full and tail_limit is not None:
        raise ValueError("the full walk has no tail limit")
    head_seq, head_hash = _head(session)
    last = certificate_verified_head_last(session)
    warnings: list[str] = []
    start: CertificateVerifiedHead | None = None
    if last is None:
        if not full:
            warnings.append("no signed verified head yet: the chain was walked from genesis")
    else:
        problem = _signature_problem(last, keyring)
        if problem is not None:
            log.error("certificate chain: %s", problem)
            warnings.append(f"{problem}; it was not trusted"
                            + ("" if full else ", and the chain was walked from genesis"))
        elif not full:
            start = last
    mode = INCREMENTAL if start is not None else FULL
    after = (start.verified_seq, start.chain_hash) if start is not None else None
    from_seq = after[0] if after is not None else 0

    until = head_seq if tail_limit is None else min(head_seq, from_seq + tail_limit)

    def result(ok: bool, checked: int, first_bad: int | None = None, reason: str | None = None,
               last_hash: str | None = None) -> CertificateChainCheck:
        return CertificateChainCheck(
            ok, mode, head_seq, from_seq, checked,
            start.id if start is not None else None,
            start.verified_at if start is not None else None,
            first_bad, reason, tuple(warnings), last_hash, max(head_seq - until, 0))

    if start is not None and start.verified_seq > head_seq:
        return result(False, 0, head_seq + 1,
                      f"chain head at seq {head_seq}, behind the verified seq "
                      f"{start.verified_seq}: rows were cut")
    walk = certificate_verify_chain(session, keyring, after=after, until_seq=until)
    if not walk.ok:
        return result(False, walk.checked, walk.first_bad_seq, walk.reason)
    if until < head_seq:
        warnings.append(f"{head_seq - until} certificates after seq {until} were left to the "
                        "worker's check: this read re-checks at most "
                        f"{tail_limit} (the whole chain: ?full=1)")
    elif walk.last_hash != head_hash:
        return result(False, walk.checked, head_seq,
                      "chain head hash does not match the last certificate")
    stray = session.execute(
        select(func.min(Certificate.seq)).where(Certificate.seq > head_seq)
    ).scalar_one_or_none()
    if stray is not None and _head(session)[0] == head_seq:
        # A certificate issued meanwhile moves the head in the same transaction.
        return result(False, walk.checked, stray,
                      f"a row claims seq {stray}, after the chain head at seq {head_seq}: "
                      "the head was rewound")
    if start is not None:
        warnings.extend(_stale_warning(start, head_seq, now))
    return result(True, walk.checked, last_hash=walk.last_hash if until == head_seq else None)


def _stale_warning(start: CertificateVerifiedHead, head_seq: int,
                   now: datetime | None) -> tuple[str, ...]:
    waiting = head_seq - start.verified_seq
    age = (now or utcnow()) - start.verified_at
    if waiting <= 0 or age <= 2 * VERIFY_PERIOD:
        return ()
    return (f"the newest verified head is {int(age.total_seconds() // 60)} minutes old and "
            f"{waiting} certificates were issued since: the worker's chain check has stopped "
            "or fails, or recent verified heads were removed",)


# -------------------------------------------------------------------- vouching


@dataclass(frozen=True)
class VouchOutcome:
    check: CertificateChainCheck
    head: CertificateVerifiedHead | None  # the verified head written, None if none was


def certificate_chain_vouch(
    session: Session,
    *,
    signer: Signer,
    keyring: KeyRing,
    full: bool = False,
    now: datetime | None = None,
) -> VouchOutcome:
    """Check the chain (from the last verified head, or in full) and, if it holds, append a
    verified head at the seq it reached, signed by ``signer``.

    Never signs over a failed check (that would launder a broken chain).  An incremental
    check that found nothing new since the last verified head writes nothing; a full
    walk always leaves a record, whose ``from_seq`` 0 dates the last full walk.  Takes
    no lock: certificates issued meanwhile are left for the next run.
    """
    check = certificate_chain_check(session, keyring, full=full, now=now)
    if not check.ok:
        log.error("certificate chain check failed at seq %s: %s", check.first_bad_seq,
                  check.reason)
        return VouchOutcome(check, None)
    if check.mode == INCREMENTAL and check.head_seq == check.verified_from:
        return VouchOutcome(check, None)
    head = verified_head_sign(signer, verified_seq=check.head_seq,
                              chain_hash=check.last_hash or GENESIS_HASH,
                              from_seq=check.verified_from, verified_at=now or utcnow())
    session.add(head)
    session.flush()
    log.info("verified the certificate chain from seq %s to seq %s (%s walk, %s certificates "
             "checked; verified head %s)", check.verified_from, check.head_seq, check.mode,
             check.checked, head.id)
    return VouchOutcome(check, head)
