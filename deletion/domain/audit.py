"""The append-only, hash-chained audit trail.

Each event stores the previous event's hash and its own hash over the canonical JSON
of every stored field, so changing, removing or reordering any row breaks the chain at
that row.  ``audit_append`` runs inside the caller's transaction: the event lands if
and only if the state change it describes lands.  Details must never contain personal
data: references, HMACs and digests only.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Generator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any

from sqlalchemy import insert, null, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from deletion.domain.canonical import (
    GENESIS_HASH,
    CanonicalError,
    canonical_json,
    canonical_time,
)
from deletion.domain.chains import AUDIT_CHAIN, chain_head_lock
from deletion.domain.models import AuditEvent, ChainHead, utcnow

logger = logging.getLogger(__name__)


# The canonical JSON (RFC 8785) of an event is an object with eight fixed keys, seven
# strings and one integer, so it is written with one format string instead of the
# general encoder: keys in their sorted order, and each string through the json module's
# C escaper, which escapes exactly what RFC 8785 requires (quote, backslash, controls
# as \b \f \n \r \t or lowercase \u00xx) and nothing else.  The test suite checks
# byte equality with ``canonical_hash`` on controls, Latin, combining, RTL, zero-width,
# astral and line-separator text.
_EVENT_FORMAT = (
    '{"action":%s,"actor":%s,"at":"%s","details":%s,"object_ref":%s,'
    '"object_type":%s,"prev_hash":%s,"seq":%d}'
)


_FLAT_TYPES = (str, int, bool, type(None))
# Keys sorted, no whitespace, strings through the json module's C escaper (the same
# escapes as RFC 8785, see _EVENT_FORMAT above), no NaN.
_FLAT_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True,
                                 allow_nan=False, check_circular=False)


def canonical_json_flat(value: Mapping[str, Any]) -> str:
    """``canonical_json`` of ``value``, written by the json module's C encoder when the
    value is a flat object (ASCII keys; strings, integers, booleans, nulls and lists of
    them), which is what audit details and a request's identifiers are; anything else
    goes to ``canonical_json`` itself.  For ASCII keys RFC 8785's UTF-16 key order is
    the code-point order ``sort_keys`` uses; the test suite checks byte equality."""
    if type(value) is not dict or not all(type(k) is str and k.isascii() for k in value):
        return canonical_json(value)
    for item in value.values():
        kind = type(item)
        if kind in _FLAT_TYPES:
            continue
        if (kind is list or kind is tuple) and all(type(x) in _FLAT_TYPES for x in item):
            continue
        return canonical_json(value)
    text = _FLAT_ENCODER.encode(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalError("lone surrogate in string") from None
    return text


def audit_event_hash(
    *,
    seq: int,
    at: datetime,
    actor: str,
    action: str,
    object_type: str,
    object_ref: str,
    details: str,
    prev_hash: str,
) -> str:
    """sha256 over the canonical JSON of every stored field but the hash itself."""
    return _event_digest(seq, canonical_time(at), actor, action, object_type, object_ref,
                         details, prev_hash)


def _event_digest(seq: int, at_text: str, actor: str, action: str, object_type: str,
                  object_ref: str, details: str, prev_hash: str) -> str:
    if type(seq) is not int:  # bool is an int too, and would be written as a number
        raise CanonicalError(f"seq must be an integer, got {type(seq).__name__}")
    text = _EVENT_FORMAT % (
        encode_basestring(action), encode_basestring(actor), at_text,  # digits, - : . T Z only
        encode_basestring(details), encode_basestring(object_ref),
        encode_basestring(object_type), encode_basestring(prev_hash), seq,
    )
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalError("lone surrogate in string") from None
    return hashlib.sha256(data).hexdigest()


def audit_append(
    session: Session,
    *,
    actor: str,
    action: str,
    object_type: str,
    object_ref: str,
    details: Mapping[str, Any] | None = None,
    at: datetime | None = None,
) -> AuditEvent:
    """Append one event at the tip of the chain, in the caller's transaction.

    Written as two Core statements (the event, the head) rather than through the unit
    of work: every officer action pays for this, and the ORM flush cost more than the
    database did.  The returned event is a detached copy of the row.
    """
    head = chain_head_lock(session, name=AUDIT_CHAIN)
    values = _next_event(head.seq, head.hash, actor=actor, action=action, object_type=object_type,
                         object_ref=object_ref, details=details, at=at)
    session.execute(insert(AuditEvent).values(**values))
    session.execute(update(ChainHead).where(ChainHead.name == AUDIT_CHAIN)
                    .values(seq=values["seq"], hash=values["hash"]))
    # Keep the locked head object in step with its row for callers that hold it.
    set_committed_value(head, "seq", values["seq"])
    set_committed_value(head, "hash", values["hash"])
    audit_logged(actor=actor, action=action, object_type=object_type, object_ref=object_ref, seq=values["seq"])
    return AuditEvent(**values)


def _next_event(head_seq: int, head_hash: str, *, actor: str, action: str, object_type: str,
                object_ref: str, details: Mapping[str, Any] | None, at: datetime | None) -> dict[str, Any]:
    """Every stored field of the event that follows the head (head_seq, head_hash)."""
    moment = at or utcnow()
    details_text = canonical_json_flat(dict(details or {}))
    seq = head_seq + 1
    values: dict[str, Any] = {"seq": seq, "at": moment, "actor": actor, "action": action,
                              "object_type": object_type, "object_ref": object_ref,
                              "details": details_text, "prev_hash": head_hash}
    values["hash"] = audit_event_hash(
        seq=seq, at=moment, actor=actor, action=action, object_type=object_type,
        object_ref=object_ref, details=details_text, prev_hash=head_hash,
    )
    return values


# The same append on PostgreSQL for a caller that talks to the driver itself (the API's
# request filing sends its statements in two pipelined round trips): lock the head with
# AUDIT_HEAD_LOCK_PG, then hand the row it returned to ``audit_append_pg``.
AUDIT_HEAD_LOCK_PG = "SELECT seq, hash FROM chain_heads WHERE name = %s FOR UPDATE"
# The event and the head's move as two data-modifying CTEs, for a caller's own statement to
# carry: the API's filing sends them with its request's INSERT, a statement fewer to send,
# bind and execute while the head's lock is held.  PostgreSQL runs a data-modifying CTE to
# completion whether or not the statement reads it.
AUDIT_APPEND_PG_CTES = (
    "event AS (INSERT INTO audit_events (seq, at, actor, action, object_type, object_ref, details, "
    "prev_hash, hash) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)), "
    "head AS (UPDATE chain_heads SET seq = %s, hash = %s WHERE name = %s)"
)


def audit_append_pg(
    *,
    head: tuple[int, str],
    actor: str,
    action: str,
    object_type: str,
    object_ref: str,
    details: Mapping[str, Any] | None = None,
    at: datetime | None = None,
) -> tuple[int, tuple[Any, ...]]:
    """``audit_append`` for a caller that talks to the driver itself in a transaction that
    already holds the audit head's lock (``head`` is the (seq, hash) that AUDIT_HEAD_LOCK_PG
    returned, read in this transaction): the event's seq, and the parameters of
    AUDIT_APPEND_PG_CTES, which the caller sends in a statement of its own (in a pipeline,
    their errors surface at its next sync).  No ORM object, as the other ``audit_append``
    returns: building it cost its one caller (the API's filing, inside the head's lock) more
    than hashing the event did.  The caller logs the event with ``audit_logged`` once the
    database has taken it (the log line cost more than the hash too, and the head's lock
    need not wait for it)."""
    values = _next_event(head[0], head[1], actor=actor, action=action, object_type=object_type,
                         object_ref=object_ref, details=details, at=at)
    return int(values["seq"]), (
        values["seq"], values["at"].astimezone(UTC), actor, action, object_type, object_ref,
        values["details"], values["prev_hash"], values["hash"], values["seq"], values["hash"], AUDIT_CHAIN)


def audit_logged(*, actor: str, action: str, object_type: str, object_ref: str, seq: int) -> None:
    """The log line ``audit_append`` writes for each event, for ``audit_append_pg``'s caller."""
    logger.info("audit %s %s %s:%s seq=%s", actor, action, object_type, object_ref, seq)


@dataclass(frozen=True)
class ChainVerification:
    ok: bool
    checked: int
    first_bad_seq: int | None = None
    reason: str | None = None
    last_hash: str | None = None  # the hash of the last row checked (walks that say it)


VERIFY_BATCH = 10_000
_COLUMNS = ("seq", "at", "actor", "action", "object_type", "object_ref", "details",
            "prev_hash", "hash")
# On PostgreSQL the walk reads each event's time as its canonical text, written by the
# database from the stored value (UTC, microseconds: what ``canonical_time`` writes for
# years 1000-9999), instead of a timestamp the driver parses into a datetime that Python
# then formats again: that pair cost a third of the walk.  A time outside those years
# comes as the stored timestamp instead (``at_text`` NULL) and takes ``canonical_time``.
_PG_IN_RANGE = "at >= '1000-01-01 00:00:00+00' AND at < '10000-01-01 00:00:00+00'"
_PG_BATCH = (
    f"SELECT seq, CASE WHEN {_PG_IN_RANGE} THEN "
    """to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END, """
    f"CASE WHEN {_PG_IN_RANGE} THEN NULL ELSE at END, "
    f"{', '.join(_COLUMNS[2:])} FROM audit_events "
    "WHERE seq >= %s AND seq <= %s ORDER BY seq LIMIT %s"
)
_NO_END = 2**63 - 1
_NO_ZONE = object()


def audit_verify(
    session: Session,
    *,
    batch_size: int = VERIFY_BATCH,
    after: tuple[int, str] | None = None,
    until_seq: int | None = None,
) -> ChainVerification:
    """Walk the chain; name the first row whose seq, link or hash is wrong.

    Without ``after`` the walk starts at genesis; with ``after=(seq, hash)`` (a point
    already verified, e.g. the last seal) it starts at the row after it, so a check
    costs the length of the tail, not of the chain.  Without ``until_seq`` the walk
    runs to the chain head and checks the head too, so rows cut off the end are
    noticed; with it, it stops there (a bounded check of part of a tail).

    Rows are read as plain tuples in keyset batches (no ORM objects; on PostgreSQL
    straight from the driver's cursor, in the caller's transaction, with each time as
    its canonical text) and hashed in one tight loop, so the walk runs at the speed of
    the driver and sha256.  Every hash is still recomputed from every stored field.
    """
    expected_seq, prev_hash = (1, GENESIS_HASH) if after is None else (after[0] + 1, after[1])
    last_seq = _NO_END if until_seq is None else until_seq
    checked = 0
    # Names bound locally: this loop runs once per event of the chain.
    digest_of, escape, event_format = hashlib.sha256, encode_basestring, _EVENT_FORMAT
    utc_zone = _NO_ZONE
    # Closed on every way out: on PostgreSQL it ends the driver's pipeline (and the batch
    # asked for ahead) before the caller's session is used again.
    with closing(_row_batches(session, first=expected_seq, last=last_seq, size=batch_size)) as batches:
        for rows in batches:
            for seq, at_text, at, actor, action, object_type, object_ref, details, row_prev, row_hash in rows:
                if seq != expected_seq:
                    # The expected row is missing (or was moved elsewhere).
                    return ChainVerification(
                        False, checked, expected_seq,
                        f"expected seq {expected_seq}, found {seq} (a row is missing or moved)")
                if row_prev != prev_hash:
                    return ChainVerification(False, checked, seq,
                                             "prev_hash does not match the previous row's hash")
                try:
                    # _event_digest, inlined.  seq is the driver's int (BIGINT column).
                    if at_text is None:  # not written by PostgreSQL (see _PG_BATCH)
                        if utc_zone is _NO_ZONE:
                            utc_zone = _utc_zone_of(at)
                        if at.tzinfo is utc_zone and at.year >= 1000:  # canonical_time, the quick way
                            at_text = at.isoformat(timespec="microseconds")[:-6] + "Z"
                        else:
                            at_text = canonical_time(at)
                    text = event_format % (
                        escape(action), escape(actor), at_text, escape(details),
                        escape(object_ref), escape(object_type), escape(row_prev), seq)
                    recomputed = digest_of(text.encode("utf-8")).hexdigest()
                except (CanonicalError, ValueError, TypeError, AttributeError) as exc:
                    return ChainVerification(False, checked, seq, f"row cannot be re-encoded: {exc}")
                if recomputed != row_hash:
                    return ChainVerification(False, checked, seq,
                                             "hash does not match the row's contents")
                checked += 1
                expected_seq, prev_hash = seq + 1, row_hash
    if until_seq is not None:
        return ChainVerification(True, checked, last_hash=prev_hash)
    head = session.get(ChainHead, AUDIT_CHAIN, populate_existing=True)
    head_seq, head_hash = (head.seq, head.hash) if head else (0, GENESIS_HASH)
    if (head_seq, head_hash) != (expected_seq - 1, prev_hash):
        return ChainVerification(
            False, checked, expected_seq,
            f"chain head says seq {head_seq}, the table ends at seq {expected_seq - 1}: "
            "rows are missing at the end",
        )
    return ChainVerification(True, checked, last_hash=prev_hash)


def _utc_zone_of(moment: Any) -> Any:
    """The tzinfo object the driver gives UTC times, if ``moment`` carries one (PostgreSQL
    hands back its session zone, e.g. ZoneInfo('Etc/UTC')); a marker no time carries
    otherwise, so that every other time takes ``canonical_time`` (which refuses naive ones)."""
    zone = getattr(moment, "tzinfo", None)
    if zone is not None and (zone is UTC or str(zone) in ("UTC", "Etc/UTC")):
        return zone
    return _NO_ZONE


def _next_batch(rows: Sequence[Sequence[Any]], batch: tuple[int, int, bool], *, last: int,
                size: int) -> tuple[int, int, bool] | None:
    """The seq range (first, last, bounded) to ask for after `rows`, the answer to `batch`;
    None when the walk has read everything up to `last`.  A bounded batch asks for a range of
    `size` seqs; one that comes back short (a gap, or the end of the table) is followed by an
    open one, the next `size` rows wherever they are, after which the walk is bounded again."""
    start, end, bounded = batch
    if bounded and len(rows) == end - start + 1:  # every seq of the range: nothing missing
        return (end + 1, min(last, end + size), True) if end < last else None
    if bounded:
        after = rows[-1][0] + 1 if rows else start
        return (after, last, False) if after <= last else None
    if len(rows) < size:  # an open batch that found fewer than it asked for: the end
        return None
    after = rows[-1][0] + 1
    return (after, min(last, after + size - 1), True) if after <= last else None


def _row_batches(session: Session, *, first: int, last: int,
                 size: int) -> Generator[Sequence[Sequence[Any]], None, None]:
    """Rows ``first..last`` in seq order, ``size`` at a time, as tuples of the stored
    values with the time twice: (seq, at_text, at, actor, ...), where ``at_text`` is the
    canonical text of the time written by the database (PostgreSQL, years 1000-9999;
    ``at`` is then None) or None (``at`` an aware datetime)."""
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        # The driver's own cursors on the session's connection (same transaction):
        # SQLAlchemy's per-row result processing would cost a third of the walk.  In
        # pipeline mode the next batch is asked for before this one is handed out, so the
        # database reads and sends it while the caller hashes (about a fifth of the walk).
        driver = connection.connection.driver_connection
        if driver is None:  # pragma: no cover - a checked-out connection has its driver's
            raise RuntimeError("no driver connection behind the session")
        if first > last:
            return
        # Each batch asks for the seq range it should hold, not for "the next `size` rows
        # from here": a chain's seqs are consecutive, so the range holds exactly `size` rows,
        # and the database reads those whatever it believes about the table.  Asked for an
        # open range, a table bulk-loaded and not yet analysed was read by a bitmap scan of
        # every row to the end and a sort, batch after batch (measured on 300,000 events:
        # 45,000 events/s, against 290,000 once analysed).  A batch that comes back short
        # has a gap (a row missing or moved): the rows after the gap are then asked for as
        # before, so the walk names the first row out of place.
        with driver.pipeline(), driver.cursor() as current, driver.cursor() as ahead:
            batch = (first, min(last, first + size - 1), True)
            current.execute(_PG_BATCH, (batch[0], batch[1], size))
            while True:
                rows = current.fetchall()
                following = _next_batch(rows, batch, last=last, size=size)
                if following is not None:
                    ahead.execute(_PG_BATCH, (following[0], following[1], size))
                if rows:
                    yield rows
                if following is None:
                    return
                batch = following
                current, ahead = ahead, current
        return
    columns = [AuditEvent.seq, null(), *(getattr(AuditEvent, name) for name in _COLUMNS[1:])]
    while first <= last:
        found = session.execute(
            select(*columns).where(AuditEvent.seq >= first, AuditEvent.seq <= last)
            .order_by(AuditEvent.seq).limit(size)
        ).all()
        if not found:
            return
        yield found
        if len(found) < size:
            return
        first = found[-1][0] + 1
