"""Serialised appends to a hash chain (the audit trail, the certificates).

Every appender first locks the chain's row in ``chain_heads``: ``SELECT ... FOR UPDATE``
on PostgreSQL, and on SQLite the write lock that ``BEGIN IMMEDIATE`` already holds.
Two writers therefore can never read the same tip and fork the chain; the second one
waits until the first commits and then sees the new tip.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from deletion.domain.canonical import GENESIS_HASH
from deletion.domain.models import ChainHead

AUDIT_CHAIN = "audit"
CERTIFICATE_CHAIN = "certificates"


def chain_head_of(session: Session, name: str) -> tuple[int, str]:
    """(seq, hash) of the chain's tip as stored now (genesis when it has no row yet); unlocked."""
    head = session.get(ChainHead, name, populate_existing=True)
    return (head.seq, head.hash) if head is not None else (0, GENESIS_HASH)


def chain_head_lock(session: Session, *, name: str) -> ChainHead:
    """The chain's tip, locked until the caller's transaction ends (created at genesis).

    One ``SELECT ... FOR UPDATE`` on every append but the very first: the genesis row is
    inserted (``ON CONFLICT DO NOTHING``, so two first appenders cannot both create it)
    only when the lock finds no row.
    """
    head = _locked_head(session, name)
    if head is not None:
        return head
    dialect = session.get_bind().dialect.name
    values = {"name": name, "seq": 0, "hash": GENESIS_HASH}
    if dialect in ("postgresql", "sqlite"):
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        session.execute(
            insert(ChainHead).values(**values).on_conflict_do_nothing(index_elements=["name"])
        )
    elif session.get(ChainHead, name) is None:
        session.add(ChainHead(**values))
        session.flush()
    head = _locked_head(session, name)
    if head is None:  # pragma: no cover - the row was inserted just above
        raise RuntimeError(f"chain {name}: head row vanished")
    return head


def _locked_head(session: Session, name: str) -> ChainHead | None:
    return session.execute(
        select(ChainHead).where(ChainHead.name == name).with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def chain_head_advance(session: Session, head: ChainHead, *, seq: int, hash_hex: str) -> None:
    """Move the locked tip to the row just appended (``seq`` must be ``head.seq + 1``)."""
    if seq != head.seq + 1:
        raise ValueError(f"chain {head.name}: expected seq {head.seq + 1}, got {seq}")
    head.seq = seq
    head.hash = hash_hex
    session.flush()
