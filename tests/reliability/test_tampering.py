"""Random tampering with the stored audit trail and certificate chain.

Someone with write access to the database (triggers switched off, as a superuser
can) changes rows at random: one byte of a column, two rows swapped, a row deleted
from the middle, rows cut off the tail.  Every such change must be detected and the
first changed row named.  Two kinds are beyond any chain stored next to the rows it
protects, and the last tests pin that limit down rather than hide it: cutting the
tail *and* rewinding the chain-head row, and (for the unsigned audit chain) a
consistent rewrite that recomputes every later hash.  Only a head copied somewhere
the attacker cannot write (docs/reliability.md) catches those.

Each trial runs in a savepoint that is rolled back, so one chain serves all trials.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, select, text, update
from sqlalchemy.orm import Session

from deletion.domain.audit import ChainVerification, audit_append, audit_event_hash, audit_verify
from deletion.domain.canonical import GENESIS_HASH
from deletion.domain.certificates import certificate_verify_chain, chain_hash_of
from deletion.domain.chains import AUDIT_CHAIN, CERTIFICATE_CHAIN
from deletion.domain.config import ensure_signing_key
from deletion.domain.db import make_engine
from deletion.domain.models import AuditEvent, Certificate, ChainHead
from deletion.domain.signing import KeyRing, keyring_load, signer_load
from tests.conftest import drop_database, fresh_database_url
from tests.domain.test_certificates import _issue_chain

TRIALS = 400
SEED = 20261129
CHAIN_LENGTH = 12
AUDIT_TEXT = ("actor", "action", "object_type", "object_ref", "details", "prev_hash", "hash")
CERT_TEXT = ("payload", "payload_hash", "prev_hash", "signature", "key_id")


@dataclass(frozen=True)
class Chain:
    """What one trial needs to know about a chain: its table, its text columns, its
    verifier and the (seq, hash) head after every append."""
    name: str
    model: type
    columns: tuple[str, ...]
    verify: Callable[[Session], ChainVerification]
    heads: dict[int, str]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    url = fresh_database_url("reliability_tamper")
    engine = make_engine(url)
    yield engine
    engine.dispose()
    drop_database(url)


@pytest.fixture(scope="module")
def keyring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KeyRing, object]]:
    keys = tmp_path_factory.mktemp("tamper-keys")
    ensure_signing_key(keys / "signing.pem")
    signer = signer_load(key_file=keys / "signing.pem", keyring_dir=keys / "ring")
    yield keyring_load(keys / "ring"), signer


@pytest.fixture
def session(engine: Engine, keyring: tuple[KeyRing, object]) -> Iterator[Session]:
    """A chain of CHAIN_LENGTH certificates (and the audit events they write), in one
    transaction rolled back at the end, with the append-only triggers off."""
    with Session(engine, expire_on_commit=False) as db:
        db.begin()
        for i in range(CHAIN_LENGTH):
            audit_append(db, actor=f"officer.{i % 3}", action="request.approved",
                         object_type="erasure_request", object_ref=f"ER-2026-{i:05d}",
                         details={"i": i})
        _issue_chain(db, keyring[1], CHAIN_LENGTH)  # type: ignore[arg-type]
        db.execute(text("SET LOCAL session_replication_role = replica"))
        yield db
        db.rollback()


def chains(session: Session, ring: KeyRing) -> list[Chain]:
    audit_heads = {e.seq: e.hash for e in session.scalars(select(AuditEvent))}
    cert_heads = _certificate_chain_hashes(session)
    return [
        Chain("audit", AuditEvent, AUDIT_TEXT, audit_verify, audit_heads),
        Chain("certificates", Certificate, CERT_TEXT,
              lambda s: certificate_verify_chain(s, ring), cert_heads),
    ]


def _certificate_chain_hashes(session: Session) -> dict[int, str]:
    """The chain hash after each certificate, as the head row held it at the time."""
    hashes, prev = {}, GENESIS_HASH
    for row in session.scalars(select(Certificate).order_by(Certificate.seq)):
        prev = hashes[row.seq] = chain_hash_of(row.seq, prev, row.payload_hash)
    return hashes


# ----------------------------------------------------------------- mutations


def _flip_one_character(value: str, rng: random.Random) -> str:
    index = rng.randrange(len(value))
    choices = [chr(c) for c in range(0x21, 0x7F) if chr(c) != value[index]]
    return value[:index] + rng.choice(choices) + value[index + 1:]


def mutate_content(session: Session, chain: Chain, n: int, rng: random.Random) -> int:
    seq, column = rng.randint(1, n), rng.choice(chain.columns)
    value = session.scalar(select(getattr(chain.model, column)).where(chain.model.seq == seq))
    session.execute(update(chain.model).where(chain.model.seq == seq)
                    .values({column: _flip_one_character(str(value), rng)}))
    return seq


def mutate_order(session: Session, chain: Chain, n: int, rng: random.Random) -> int:
    first, second = sorted(rng.sample(range(1, n + 1), 2))
    for old, new in ((first, -1), (second, first), (-1, second)):
        session.execute(update(chain.model).where(chain.model.seq == old).values(seq=new))
    return first


def mutate_delete_middle(session: Session, chain: Chain, n: int, rng: random.Random) -> int:
    seq = rng.randint(1, n - 1)
    session.execute(chain.model.__table__.delete().where(chain.model.seq == seq))
    return seq


def mutate_delete_tail(session: Session, chain: Chain, n: int, rng: random.Random) -> int:
    first = rng.randint(2, n)
    session.execute(chain.model.__table__.delete().where(chain.model.seq >= first))
    return first


MUTATIONS = {
    "content": mutate_content,
    "order": mutate_order,
    "delete_middle": mutate_delete_middle,
    "delete_tail": mutate_delete_tail,
}


def test_random_content_order_and_deletion_changes_are_all_detected_and_located(
    session: Session, keyring: tuple[KeyRing, object],
) -> None:
    rng = random.Random(SEED)
    the_chains = chains(session, keyring[0])
    for chain in the_chains:
        assert chain.verify(session).ok, chain.name
    tried: Counter[str] = Counter()
    located: Counter[str] = Counter()
    for _ in range(TRIALS):
        chain = rng.choice(the_chains)
        kind = rng.choice(list(MUTATIONS))
        savepoint = session.begin_nested()
        expected = MUTATIONS[kind](session, chain, max(chain.heads), rng)
        verdict = chain.verify(session)
        savepoint.rollback()
        tried[f"{chain.name}.{kind}"] += 1
        assert not verdict.ok, (chain.name, kind, expected)
        assert verdict.first_bad_seq == expected, (chain.name, kind, expected, verdict)
        located[f"{chain.name}.{kind}"] += 1
    assert located == tried and len(tried) == 8
    sys.stderr.write(f"\n{sum(located.values())}/{TRIALS} random mutations detected at the "
                     f"changed row: {dict(sorted(located.items()))}\n")


# ------------------------------------------------------- beyond the chain alone


def _exported_head_holds(session: Session, chain: Chain, exported: tuple[int, str]) -> bool:
    """What an auditor holding an earlier head (seq, hash) can check: the chain still
    reaches that seq, with the same hash there."""
    seq, digest = exported
    return _heads_now(session, chain).get(seq) == digest


def _heads_now(session: Session, chain: Chain) -> dict[int, str]:
    if chain.name == "audit":
        return {e.seq: e.hash for e in session.scalars(
            select(AuditEvent).execution_options(populate_existing=True))}
    return _certificate_chain_hashes(session)


@pytest.mark.parametrize("chain_name", ["audit", "certificates"])
def test_cutting_the_tail_and_rewinding_the_head_row_passes_the_chain_but_not_an_exported_head(
    session: Session, keyring: tuple[KeyRing, object], chain_name: str,
) -> None:
    chain = next(c for c in chains(session, keyring[0]) if c.name == chain_name)
    last = max(chain.heads)
    exported = (last, chain.heads[last])
    keep = last - 3
    name = AUDIT_CHAIN if chain_name == "audit" else CERTIFICATE_CHAIN
    session.execute(chain.model.__table__.delete().where(chain.model.seq > keep))
    session.execute(update(ChainHead).where(ChainHead.name == name)
                    .values(seq=keep, hash=chain.heads[keep]))

    # The chain alone cannot tell: every remaining row and the head agree.
    assert chain.verify(session).ok
    assert not _exported_head_holds(session, chain, exported)


def test_a_consistent_rewrite_of_the_unsigned_audit_chain_passes_it_but_not_an_exported_head(
    session: Session, keyring: tuple[KeyRing, object],
) -> None:
    chain = next(c for c in chains(session, keyring[0]) if c.name == "audit")
    exported = (max(chain.heads), chain.heads[max(chain.heads)])
    events = session.scalars(select(AuditEvent).order_by(AuditEvent.seq)).all()
    prev = events[2].prev_hash
    for event in events[2:]:  # rewrite row 3's actor, then re-hash everything after it
        actor = "officer.nobody" if event.seq == 3 else event.actor
        digest = audit_event_hash(seq=event.seq, at=event.at, actor=actor, action=event.action,
                                  object_type=event.object_type, object_ref=event.object_ref,
                                  details=event.details, prev_hash=prev)
        session.execute(update(AuditEvent).where(AuditEvent.seq == event.seq)
                        .values(actor=actor, prev_hash=prev, hash=digest))
        prev = digest
    session.execute(update(ChainHead).where(ChainHead.name == AUDIT_CHAIN).values(hash=prev))

    assert audit_verify(session).ok
    assert not _exported_head_holds(session, chain, exported)
