"""Signed verified heads of the certificate chain: a check reads only the tail after the
newest one, never trusts one whose signature fails, and walks the whole chain on request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from deletion.domain.certificate_heads import (
    FULL,
    INCREMENTAL,
    certificate_chain_check,
    certificate_chain_vouch,
    verified_head_sign,
)
from deletion.domain.certificates import certificate_verify_chain, chain_hash_of
from deletion.domain.chains import CERTIFICATE_CHAIN
from deletion.domain.config import ensure_signing_key
from deletion.domain.models import Certificate, CertificateVerifiedHead, ChainHead
from deletion.domain.signing import KeyRing, Signer, keyring_load, signer_load
from tests.domain.test_certificates import _issue_chain


@pytest.fixture
def signer(tmp_path: Path) -> Signer:
    ensure_signing_key(tmp_path / "keys" / "signing.pem")
    return signer_load(key_file=tmp_path / "keys" / "signing.pem",
                       keyring_dir=tmp_path / "keys" / "ring")


@pytest.fixture
def keyring(signer: Signer, tmp_path: Path) -> KeyRing:
    return keyring_load(tmp_path / "keys" / "ring")


@pytest.fixture
def stranger(tmp_path: Path) -> Signer:
    """A key the ring does not hold: what a forger with database access signs with."""
    ensure_signing_key(tmp_path / "other" / "signing.pem")
    return signer_load(key_file=tmp_path / "other" / "signing.pem",
                       keyring_dir=tmp_path / "other" / "ring")


def vouched_chain(session: Session, signer: Signer, keyring: KeyRing, *, before: int,
                  after: int) -> CertificateVerifiedHead:
    """``before`` certificates, a full walk signed at their head, then ``after`` more."""
    _issue_chain(session, signer, before)
    head = certificate_chain_vouch(session, signer=signer, keyring=keyring, full=True).head
    assert head is not None and (head.verified_seq, head.from_seq) == (before, 0)
    _issue_chain(session, signer, after)
    return head


def as_owner(session: Session) -> None:
    """What a database owner can do: switch the append-only triggers off."""
    session.execute(text("SET LOCAL session_replication_role = replica"))


def flip(session: Session, seq: int, column: str = "payload") -> None:
    """Change one stored row: the payload's method, or the last hex digit of a hash or
    signature."""
    value = session.execute(select(getattr(Certificate, column))
                            .where(Certificate.seq == seq)).scalar_one()
    if column == "payload":
        changed = value.replace('"asu"', '"npo"', 1)
    else:
        changed = value[:-1] + ("0" if value[-1] != "0" else "1")
    assert changed != value
    session.execute(update(Certificate).where(Certificate.seq == seq).values({column: changed}))


# ------------------------------------------------------------------ untouched chains


def test_the_incremental_check_reads_only_the_tail_and_agrees_with_the_full_walk(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    head = vouched_chain(session, signer, keyring, before=5, after=3)

    incremental = certificate_chain_check(session, keyring)
    full = certificate_chain_check(session, keyring, full=True)

    assert (incremental.ok, incremental.mode, incremental.verified_from, incremental.checked) == (
        True, INCREMENTAL, 5, 3)
    assert (incremental.verified_head_id, incremental.verified_at) == (head.id, head.verified_at)
    assert (full.ok, full.mode, full.verified_from, full.checked) == (True, FULL, 0, 8)
    assert incremental.head_seq == full.head_seq == 8
    assert incremental.last_hash == full.last_hash == certificate_verify_chain(
        session, keyring).last_hash
    assert incremental.warnings == full.warnings == ()


def test_the_worker_vouches_from_its_last_head_and_writes_nothing_when_nothing_is_new(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    vouched_chain(session, signer, keyring, before=2, after=2)

    second = certificate_chain_vouch(session, signer=signer, keyring=keyring)
    third = certificate_chain_vouch(session, signer=signer, keyring=keyring)

    assert second.head is not None
    assert (second.head.verified_seq, second.head.from_seq, second.check.checked) == (4, 2, 2)
    assert third.head is None and third.check.ok and third.check.checked == 0
    stored = session.execute(select(Certificate).where(Certificate.seq == 4)).scalar_one()
    assert second.head.chain_hash == chain_hash_of(4, stored.prev_hash, stored.payload_hash)
    check = certificate_chain_check(session, keyring)
    assert (check.mode, check.verified_from, check.checked) == (INCREMENTAL, 4, 0)


def test_without_a_verified_head_the_whole_chain_is_walked_and_said(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    _issue_chain(session, signer, 3)

    check = certificate_chain_check(session, keyring)

    assert (check.ok, check.mode, check.checked, check.verified_from) == (True, FULL, 3, 0)
    assert check.warnings == ("no signed verified head yet: the chain was walked from genesis",)


def test_a_head_that_stopped_moving_while_certificates_wait_is_warned_about(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    head = vouched_chain(session, signer, keyring, before=1, after=2)

    check = certificate_chain_check(session, keyring, now=head.verified_at + timedelta(hours=2))

    assert check.ok
    assert check.warnings and "120 minutes old and 2 certificates" in check.warnings[0]
    assert certificate_chain_check(session, keyring,
                                   now=head.verified_at + timedelta(minutes=10)).warnings == ()


# ------------------------------------------------------------------ tampering


@pytest.mark.parametrize("column", ["payload", "signature", "prev_hash", "payload_hash"])
def test_a_tampered_row_after_the_verified_head_is_named(
    session: Session, signer: Signer, keyring: KeyRing, column: str,
) -> None:
    vouched_chain(session, signer, keyring, before=4, after=3)
    as_owner(session)

    flip(session, 6, column)

    check = certificate_chain_check(session, keyring)
    assert (check.ok, check.mode, check.first_bad_seq) == (False, INCREMENTAL, 6)
    assert check.reason


def test_a_tampered_row_at_the_verified_head_is_named(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    vouched_chain(session, signer, keyring, before=4, after=1)
    as_owner(session)

    flip(session, 4)

    check = certificate_chain_check(session, keyring)
    assert (check.ok, check.first_bad_seq) == (False, 4)
    assert check.reason == "payload_hash does not match the payload"


def test_a_consistent_rewrite_before_the_verified_head_is_caught_by_its_chain_hash(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    """Relinking the verified row to a changed predecessor changes its chain hash."""
    vouched_chain(session, signer, keyring, before=4, after=1)
    as_owner(session)

    session.execute(update(Certificate).where(Certificate.seq == 4).values(prev_hash="e" * 64))

    check = certificate_chain_check(session, keyring)
    assert (check.ok, check.first_bad_seq) == (False, 4)


def test_tampering_before_the_verified_head_is_left_to_the_full_walk(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    vouched_chain(session, signer, keyring, before=5, after=2)
    as_owner(session)

    flip(session, 2)

    incremental = certificate_chain_check(session, keyring)
    full = certificate_chain_check(session, keyring, full=True)
    assert incremental.ok and incremental.checked == 2  # by design: rows 1-5 are not re-read
    assert (full.ok, full.mode, full.first_bad_seq) == (False, FULL, 2)


def test_a_cut_tail_after_the_verified_head_is_detected(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    vouched_chain(session, signer, keyring, before=3, after=3)
    as_owner(session)

    session.execute(text("DELETE FROM certificates WHERE seq = 6"))

    check = certificate_chain_check(session, keyring)
    assert (check.ok, check.first_bad_seq) == (False, 6)
    assert "missing" in (check.reason or "")


def test_a_cut_tail_with_the_head_rewound_before_the_verified_head_is_detected(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    vouched_chain(session, signer, keyring, before=4, after=2)
    as_owner(session)
    kept = session.execute(select(Certificate).where(Certificate.seq == 2)).scalar_one()

    session.execute(text("DELETE FROM certificates WHERE seq > 2"))
    session.execute(update(ChainHead).where(ChainHead.name == CERTIFICATE_CHAIN).values(
        seq=2, hash=chain_hash_of(2, kept.prev_hash, kept.payload_hash)))

    check = certificate_chain_check(session, keyring)
    assert (check.ok, check.first_bad_seq) == (False, 3)
    assert check.reason == "chain head at seq 2, behind the verified seq 4: rows were cut"
    assert certificate_verify_chain(session, keyring).ok  # what a walk alone cannot see


def test_a_head_rewound_over_rows_that_remain_is_detected(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    vouched_chain(session, signer, keyring, before=2, after=3)
    as_owner(session)
    kept = session.execute(select(Certificate).where(Certificate.seq == 3)).scalar_one()

    session.execute(update(ChainHead).where(ChainHead.name == CERTIFICATE_CHAIN).values(
        seq=3, hash=chain_hash_of(3, kept.prev_hash, kept.payload_hash)))

    check = certificate_chain_check(session, keyring)
    assert (check.ok, check.first_bad_seq) == (False, 4)
    assert "the head was rewound" in (check.reason or "")


def test_a_wrong_head_hash_is_detected(session: Session, signer: Signer,
                                       keyring: KeyRing) -> None:
    vouched_chain(session, signer, keyring, before=2, after=1)
    as_owner(session)

    session.execute(update(ChainHead).where(ChainHead.name == CERTIFICATE_CHAIN)
                    .values(hash="d" * 64))

    check = certificate_chain_check(session, keyring)
    assert (check.ok, check.first_bad_seq, check.reason) == (
        False, 3, "chain head hash does not match the last certificate")


# ------------------------------------------------------------------ forged verified heads


def _forge(session: Session, forger: Signer, *, seq: int) -> CertificateVerifiedHead:
    row = session.execute(select(Certificate).where(Certificate.seq == seq)).scalar_one()
    forged = verified_head_sign(forger, verified_seq=seq,
                                chain_hash=chain_hash_of(seq, row.prev_hash, row.payload_hash),
                                from_seq=0, verified_at=datetime.now(UTC))
    session.add(forged)
    session.flush()
    return forged


def test_a_verified_head_signed_by_a_stranger_is_refused_and_the_whole_chain_walked(
    session: Session, signer: Signer, keyring: KeyRing, stranger: Signer,
) -> None:
    """A forger tampers with row 2 and adds a head after it, to keep the check off row 2."""
    vouched_chain(session, signer, keyring, before=1, after=4)
    as_owner(session)
    flip(session, 2)

    forged = _forge(session, stranger, seq=5)

    check = certificate_chain_check(session, keyring)
    assert (check.ok, check.mode, check.first_bad_seq) == (False, FULL, 2)
    assert check.warnings == (f"verified head {forged.id} is signed by a key that is not in the "
                              "key ring; it was not trusted, and the chain was walked from genesis",)


@pytest.mark.parametrize("change", [{"verified_seq": 4}, {"from_seq": 2},
                                    {"signature": "0" * 128}, {"signature": "zz"}])
def test_an_altered_verified_head_is_refused_and_the_whole_chain_walked(
    session: Session, signer: Signer, keyring: KeyRing, change: dict[str, object],
) -> None:
    head = vouched_chain(session, signer, keyring, before=5, after=1)
    as_owner(session)

    session.execute(update(CertificateVerifiedHead)
                    .where(CertificateVerifiedHead.id == head.id).values(change))

    check = certificate_chain_check(session, keyring)
    assert (check.ok, check.mode, check.checked, check.verified_from) == (True, FULL, 6, 0)
    assert len(check.warnings) == 1 and f"verified head {head.id}" in check.warnings[0]
    assert "not trusted" in check.warnings[0]


def test_the_worker_never_signs_over_a_failed_check(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    vouched_chain(session, signer, keyring, before=2, after=2)
    as_owner(session)
    flip(session, 3)
    count = session.execute(select(func.count()).select_from(CertificateVerifiedHead)).scalar_one()

    outcome = certificate_chain_vouch(session, signer=signer, keyring=keyring)

    assert outcome.head is None and not outcome.check.ok and outcome.check.first_bad_seq == 3
    assert session.execute(select(func.count())
                           .select_from(CertificateVerifiedHead)).scalar_one() == count


def test_verified_heads_are_append_only(session: Session, signer: Signer,
                                        keyring: KeyRing) -> None:
    head = vouched_chain(session, signer, keyring, before=1, after=0)
    savepoint = session.begin_nested()
    with pytest.raises(Exception, match="append-only"):
        session.execute(update(CertificateVerifiedHead)
                        .where(CertificateVerifiedHead.id == head.id).values(verified_seq=9))
    savepoint.rollback()



def test_verified_heads_work_on_sqlite(sqlite_session: Session, signer: Signer,
                                       keyring: KeyRing) -> None:
    """The embedded default (make run): the signed time reads back the same from SQLite."""
    vouched_chain(sqlite_session, signer, keyring, before=2, after=1)
    sqlite_session.expire_all()

    check = certificate_chain_check(sqlite_session, keyring)

    assert (check.ok, check.mode, check.verified_from, check.checked) == (True, INCREMENTAL, 2, 1)
    assert check.warnings == ()


# ------------------------------------------------------------ what a read may walk


def test_a_read_without_a_verified_head_checks_at_most_its_limit_and_says_what_it_left(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    _issue_chain(session, signer, 6)
    as_owner(session)
    flip(session, 5)  # beyond what the read re-checks

    read = certificate_chain_check(session, keyring, tail_limit=3)
    full = certificate_chain_check(session, keyring, full=True)

    assert (read.ok, read.checked, read.unchecked, read.head_seq) == (True, 3, 3, 6)
    assert any("3 certificates after seq 3 were left to the worker" in w for w in read.warnings)
    assert (full.ok, full.first_bad_seq, full.unchecked) == (False, 5, 0)


def test_a_read_from_a_verified_head_checks_at_most_its_limit(
    session: Session, signer: Signer, keyring: KeyRing,
) -> None:
    vouched_chain(session, signer, keyring, before=3, after=5)

    read = certificate_chain_check(session, keyring, tail_limit=2)
    whole_tail = certificate_chain_check(session, keyring)

    assert (read.ok, read.mode, read.verified_from, read.checked, read.unchecked) == (True, INCREMENTAL, 3, 2, 3)
    assert (whole_tail.checked, whole_tail.unchecked) == (5, 0)


def test_a_forged_verified_head_does_not_make_a_read_walk_the_whole_chain(
    session: Session, signer: Signer, stranger: Signer, keyring: KeyRing,
) -> None:
    _issue_chain(session, signer, 6)
    head_hash = session.execute(select(ChainHead.hash).where(ChainHead.name == CERTIFICATE_CHAIN)).scalar_one()
    session.add(verified_head_sign(stranger, verified_seq=6, chain_hash=head_hash, from_seq=0,
                                   verified_at=datetime.now(UTC)))
    session.flush()

    read = certificate_chain_check(session, keyring, tail_limit=2)

    assert (read.mode, read.checked, read.unchecked) == (FULL, 2, 4)
    assert any("not trusted" in w for w in read.warnings)


def test_the_full_walk_takes_no_limit(session: Session, keyring: KeyRing) -> None:
    with pytest.raises(ValueError):
        certificate_chain_check(session, keyring, full=True, tail_limit=10)
