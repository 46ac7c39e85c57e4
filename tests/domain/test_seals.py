"""Keyed seals over the audit chain: a database owner who rewrites the chain and
recomputes every sha256 link still cannot make the seals agree without the key."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append, audit_event_hash, audit_verify
from deletion.domain.chain_heads import chain_heads_check, chain_heads_export
from deletion.domain.chains import AUDIT_CHAIN
from deletion.domain.config import ensure_signing_key, load
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import AuditEvent, AuditSeal, ChainHead
from deletion.domain.seals import SealKeys, audit_seal, audit_seals_verify, seal_mac
from deletion.domain.signing import keyring_load, signer_load
from tests.conftest import drop_database, fresh_database_url

KEY = SealKeys(b"k" * 32)
OTHER = SealKeys(b"o" * 32)


@pytest.fixture
def engine() -> Iterator[Engine]:
    url = fresh_database_url("seal_test")
    engine = make_engine(url)
    yield engine
    engine.dispose()
    drop_database(url)


def append(engine: Engine, count: int) -> None:
    with session_scope(engine) as session:
        for i in range(count):
            audit_append(session, actor=f"user:officer-{i % 3}", action="request.approved",
                         object_type="erasure_request", object_ref=f"ER-2026-{i:05d}",
                         details={"i": i})


def seal(engine: Engine, keys: SealKeys = KEY) -> AuditSeal | None:
    with session_scope(engine) as session:
        return audit_seal(session, keys=keys).seal


def check(engine: Engine, keys: SealKeys | None = KEY, **kwargs: object):
    with session_scope(engine) as session:
        return audit_seals_verify(session, keys=keys, **kwargs)  # type: ignore[arg-type]


def as_owner(session: Session) -> None:
    """What a database owner can do: switch the append-only triggers off."""
    session.execute(text("SET LOCAL session_replication_role = replica"))


def rewrite_from(session: Session, first_seq: int) -> None:
    """Change one event and recompute every later hash and the head: consistent."""
    rows = session.execute(select(AuditEvent).where(AuditEvent.seq >= first_seq)
                           .order_by(AuditEvent.seq)).scalars().all()
    prev = rows[0].prev_hash
    for row in rows:
        actor = "user:someone-else" if row.seq == first_seq else row.actor
        digest = audit_event_hash(seq=row.seq, at=row.at, actor=actor, action=row.action,
                                  object_type=row.object_type, object_ref=row.object_ref,
                                  details=row.details, prev_hash=prev)
        session.execute(update(AuditEvent).where(AuditEvent.seq == row.seq)
                        .values(actor=actor, prev_hash=prev, hash=digest))
        prev = digest
    session.execute(update(ChainHead).where(ChainHead.name == AUDIT_CHAIN).values(hash=prev))


def test_a_seal_vouches_for_the_prefix_and_the_next_check_reads_only_the_tail(engine: Engine) -> None:
    append(engine, 30)
    first = seal(engine)
    assert first is not None and first.sealed_seq == 30
    append(engine, 4)
    verdict = check(engine)
    assert verdict.ok, verdict.problems
    assert (verdict.sealed_seq, verdict.head_seq, verdict.unsealed, verdict.checked) == (30, 34, 4, 4)
    second = seal(engine)
    assert second is not None and second.sealed_seq == 34
    assert seal(engine) is None  # nothing new: no second seal over the same head


def test_a_tail_rewritten_consistently_across_the_last_seal_is_caught_by_the_seal(engine: Engine) -> None:
    append(engine, 20)
    seal(engine)
    append(engine, 5)
    with Session(engine) as session, session.begin():
        as_owner(session)
        rewrite_from(session, 15)
        assert audit_verify(session).ok  # the public sha256 links alone cannot tell
        verdict = audit_seals_verify(session, keys=KEY)
        session.rollback()
    assert not verdict.ok
    assert verdict.first_bad_seq == 20
    assert "seq 20 no longer has the hash seal 1 vouches for" in verdict.problems[0]


def test_a_seal_rewritten_to_match_does_not_authenticate_without_the_key(engine: Engine) -> None:
    append(engine, 10)
    seal(engine)
    with Session(engine) as session, session.begin():
        as_owner(session)
        rewrite_from(session, 3)
        forged = session.execute(select(AuditEvent.hash).where(AuditEvent.seq == 10)).scalar_one()
        session.execute(update(AuditSeal).values(chain_hash=forged))
        keyed = audit_seals_verify(session, keys=KEY)
        unkeyed = audit_seals_verify(session, keys=None)
        # A seal of the forger's own, under a key the sealer does not know.
        at = datetime.now(UTC)
        session.add(AuditSeal(sealed_seq=10, chain_hash=forged, key_id=OTHER.key_id, sealed_at=at,
                              mac=seal_mac(OTHER.current, sealed_seq=10, chain_hash=forged,
                                           key_id_=OTHER.key_id, sealed_at=at)))
        session.flush()
        own_key = audit_seals_verify(session, keys=KEY)
        session.rollback()
    assert not keyed.ok and "does not authenticate" in keyed.problems[0]
    # The web process holds no key: it sees a consistent chain and says it did not check.
    assert unkeyed.ok and not unkeyed.keyed
    assert not own_key.ok and "which this process does not hold" in own_key.problems[0]


def test_a_tail_cut_below_the_last_seal_is_reported(engine: Engine) -> None:
    append(engine, 12)
    seal(engine)
    with Session(engine) as session, session.begin():
        as_owner(session)
        kept = session.execute(select(AuditEvent.hash).where(AuditEvent.seq == 8)).scalar_one()
        session.execute(text("DELETE FROM audit_events WHERE seq > 8"))
        session.execute(update(ChainHead).where(ChainHead.name == AUDIT_CHAIN).values(seq=8, hash=kept))
        assert audit_verify(session).ok
        verdict = audit_seals_verify(session, keys=None)
        session.rollback()
    assert not verdict.ok
    assert "seq 12 is sealed (seal 1) but no longer in the table" in verdict.problems[0]


def test_after_the_last_seal_a_broken_link_is_found_and_a_consistent_rewrite_is_the_unsealed_tail(
        engine: Engine) -> None:
    append(engine, 10)
    seal(engine)
    append(engine, 6)
    with Session(engine) as session, session.begin():
        as_owner(session)
        rewrite_from(session, 13)
        consistent = audit_seals_verify(session, keys=KEY)
        session.execute(update(AuditEvent).where(AuditEvent.seq == 14).values(object_ref="ER-X"))
        broken = audit_seals_verify(session, keys=KEY)
        session.rollback()
    # What the key cannot catch, stated as a number: the events no seal covers yet.
    assert consistent.ok and consistent.unsealed == 6
    assert not broken.ok and broken.first_bad_seq == 14


def test_the_sealer_never_seals_over_a_broken_chain(engine: Engine) -> None:
    append(engine, 5)
    with Session(engine) as session, session.begin():
        as_owner(session)
        session.execute(update(AuditEvent).where(AuditEvent.seq == 2).values(actor="user:x"))
        outcome = audit_seal(session, keys=KEY)
        assert outcome.seal is None and not outcome.check.ok
        assert session.execute(select(func.count()).select_from(AuditSeal)).scalar_one() == 0
        session.rollback()


def test_a_rotated_key_still_checks_old_seals_when_kept(engine: Engine) -> None:
    append(engine, 3)
    seal(engine, KEY)
    assert check(engine, SealKeys(OTHER.current, (KEY.current,))).ok
    forgotten = check(engine, OTHER)
    assert not forgotten.ok and "does not hold" in forgotten.problems[0]


def test_the_full_walk_checks_every_seal_and_names_the_earliest_broken(engine: Engine) -> None:
    for _ in range(3):
        append(engine, 5)
        seal(engine)
    with Session(engine) as session, session.begin():
        as_owner(session)
        rewrite_from(session, 7)
        incremental = audit_seals_verify(session, keys=KEY)
        full = audit_seals_verify(session, keys=KEY, full=True)
        session.rollback()
    assert not incremental.ok and incremental.first_bad_seq == 15  # the newest seal only
    assert not full.ok and full.first_bad_seq == 10 and full.checked == 15  # dates the rewrite


def test_an_old_seal_with_events_waiting_warns_that_sealing_stopped(engine: Engine) -> None:
    append(engine, 2)
    seal(engine)
    append(engine, 1)
    later = datetime.now(UTC) + timedelta(hours=1)
    verdict = check(engine, now=later)
    assert verdict.ok and verdict.warnings and "sealing has stopped" in verdict.warnings[0]


def test_postgres_refuses_to_change_or_remove_seals(engine: Engine) -> None:
    append(engine, 1)
    seal(engine)
    for statement in ("UPDATE audit_seals SET mac = mac", "DELETE FROM audit_seals",
                      "TRUNCATE audit_seals"):
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as connection:
            connection.execute(text(statement))


def test_removing_recent_seals_is_caught_by_the_signed_heads_exported_off_the_database(
        engine: Engine, tmp_path) -> None:
    ensure_signing_key(tmp_path / "signing.pem")
    signer = signer_load(key_file=tmp_path / "signing.pem", keyring_dir=tmp_path / "ring")
    ring = keyring_load(tmp_path / "ring")
    append(engine, 4)
    seal(engine)
    append(engine, 2)
    seal(engine)
    record = chain_heads_export(engine=engine, signer=signer, export_dir=tmp_path / "heads")
    assert record["seal"]["id"] == 2
    with Session(engine) as session, session.begin():
        assert chain_heads_check(session, lines=[_line(record)], keyring=ring).ok
        as_owner(session)
        session.execute(text("DELETE FROM audit_seals WHERE id = 2"))
        verdict = chain_heads_check(session, lines=[_line(record)], keyring=ring)
        session.rollback()
    assert verdict.problems == ("audit seal 2: exported, no longer in the database",)


def _line(record: dict) -> str:
    import json

    return json.dumps(record)


def test_the_embedded_seal_key_is_made_by_the_sealer_only(tmp_path) -> None:
    cfg = load({"VAR_DIR": str(tmp_path)})
    assert cfg.audit_seal_key is None
    assert SealKeys.from_config(cfg) is None  # a reader (the web) never creates it
    made = SealKeys.for_sealer(cfg)
    assert (tmp_path / "keys" / "audit-seal.key").stat().st_mode & 0o777 == 0o600
    assert SealKeys.from_config(cfg) == made


def test_without_a_seal_a_bounded_check_says_how_many_events_it_left(engine: Engine) -> None:
    append(engine, 40)
    verdict = check(engine, None, tail_limit=25)
    assert verdict.ok and (verdict.checked, verdict.unchecked, verdict.sealed_seq) == (25, 15, 0)
    assert verdict.warnings == ("no seal yet: 40 events are unsealed",)
