"""Erasure requests: submission, four-eyes review, extension, and their selectors.

Every change goes through the request transition table and appends an audit event in
the caller's transaction.  Personal data is encrypted before it reaches a row and is
never written to audit details or logs: those carry the reference and the subject's
blind-index HMAC only.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, class_mapper, make_transient_to_detached

from deletion.domain import crypto, deadlines
from deletion.domain.audit import (
    AUDIT_APPEND_PG_CTES,
    AUDIT_HEAD_LOCK_PG,
    audit_append,
    audit_append_pg,
    audit_logged,
    canonical_json_flat,
)
from deletion.domain.canonical import GENESIS_HASH, canonical_time
from deletion.domain.chains import AUDIT_CHAIN
from deletion.domain.db import session_scope
from deletion.domain.errors import NotFound, PermissionDenied, ValidationError
from deletion.domain.gdpr import DENIAL_REASONS, GROUNDS, PRIORITIES
from deletion.domain.models import ErasureRequest, Model, ReferenceCounter, SubjectIndex, utcnow
from deletion.domain.states import (
    CANCEL_NEEDS_REVIEW,
    OPEN_REQUEST_STATUSES,
    RequestStatus,
    check_request_transition,
)

logger = logging.getLogger(__name__)
P = ParamSpec("P")
_Row = TypeVar("_Row")

OBJECT_TYPE = "erasure_request"
SUBJECT_CONTEXT = "erasure_requests.subject"
# A clock a little ahead on the officer's side must not reject a request received now.
CLOCK_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class SubjectIdentifiers:
    """The decrypted identifiers of one request; for the worker's set building only."""

    name: str
    aliases: tuple[str, ...] = ()
    emails: tuple[str, ...] = ()
    phones: tuple[str, ...] = ()
    notes: str = field(default="", repr=False)

    def __repr__(self) -> str:  # never let identifiers reach a log line by accident
        return "SubjectIdentifiers(<redacted>)"


@dataclass(frozen=True)
class Submission:
    """A request just filed, and the earlier requests the blind index matched to it."""

    request: ErasureRequest
    earlier: tuple[ErasureRequest, ...]


# --------------------------------------------------------------------------- writes


def request_submission(
    session: Session,
    *,
    actor: str,
    actor_id: int | None = None,
    name: str,
    aliases: Sequence[str] = (),
    emails: Sequence[str] = (),
    phones: Sequence[str] = (),
    ground: str,
    received_at: datetime,
    model_name: str,
    priority: str = "batch",
    notes: str = "",
    now: datetime | None = None,
    commit: bool = False,
) -> Submission:
    """File a request; the earlier matches come back too, so a caller that shows them
    need not run the blind-index look-up a second time.

    ``commit=True`` commits the caller's transaction as the filing's last step, for a
    caller that writes nothing else in it (the API): on PostgreSQL the COMMIT then goes
    in the same round trip as the writes, so the two row locks every filing takes (the
    reference counter and the audit head) are released by the server, not after the
    client has woken up, read the writes' answer and sent a COMMIT of its own.  The
    caller's ``session_scope`` commit that follows has nothing left to do.
    """
    now = now or utcnow()
    identifiers = _checked(name=name, aliases=aliases, emails=emails, phones=phones, notes=notes, ground=ground,
                           priority=priority, received_at=received_at, now=now)
    name = identifiers.name
    if session.get_bind().dialect.name == "postgresql":
        return _submission_pg(session, actor=actor, actor_id=actor_id, identifiers=identifiers,
                              ground=ground, received_at=received_at, model_name=model_name,
                              priority=priority, now=now, commit=commit)
    model = session.execute(select(Model).where(Model.name == model_name)).scalar_one_or_none()
    if model is None:
        raise ValidationError("model_name", "no such registered model")

    keys = crypto.keyring()
    reference = _next_reference(session, year=now.year)
    # Bound to this row's reference: a ciphertext moved to another request does not open.
    ciphertext, key_id = keys.encrypt_json(_as_json(identifiers), context=SUBJECT_CONTEXT,
                                           row=reference)
    subject_hmac = keys.blind_index("name", name)
    earlier = request_find_earlier(
        session, name=name, aliases=identifiers.aliases, emails=identifiers.emails,
        phones=identifiers.phones,
    )
    request = ErasureRequest(
        reference=reference,
        subject_ciphertext=ciphertext,
        subject_key_id=key_id,
        subject_ad_version=crypto.AD_ROW,
        subject_hmac=subject_hmac,
        blind_key_id=keys.blind_key_id,
        ground=ground,
        received_at=received_at,
        due_at=deadlines.due_at(received_at),
        model_id=model.id,
        priority=priority,
        status=RequestStatus.SUBMITTED,
        submitted_by=actor,
        submitted_by_id=actor_id,
    )
    session.add(request)
    session.flush()
    session.add_all(
        SubjectIndex(request_id=request.id, kind=kind, hmac=digest, key_id=keys.blind_key_id)
        for kind, digest in _index_entries(keys, identifiers)
    )
    audit_append(
        session, actor=actor, action="request.submitted", object_type=OBJECT_TYPE,
        object_ref=request.reference,
        details={
            "ground": ground, "priority": priority, "model": model.name,
            "received_at": canonical_time(received_at), "due_at": canonical_time(request.due_at),
            "subject_hmac": subject_hmac, "blind_key_id": keys.blind_key_id,
            "earlier_requests": [r.reference for r in earlier],
        },
    )
    if commit:
        session.commit()
    return Submission(request=request, earlier=tuple(earlier))


@dataclass(frozen=True)
class Filing:
    """A request filed in a transaction of its own (``request_file``): the new row, detached
    (every column loaded), and the references of the earlier requests the blind index matched."""

    request: ErasureRequest
    earlier: tuple[str, ...]


def request_file(
    engine: Engine,
    *,
    actor: str,
    actor_id: int | None = None,
    name: str,
    aliases: Sequence[str] = (),
    emails: Sequence[str] = (),
    phones: Sequence[str] = (),
    ground: str,
    received_at: datetime,
    model_name: str,
    priority: str = "batch",
    notes: str = "",
    now: datetime | None = None,
) -> Filing:
    """``request_submission`` in a transaction of its own, committed with its writes, for a
    caller that files and does nothing else in it (the API).  Same checks, rows, audit event
    and log line.  On PostgreSQL the filing runs on a pooled connection of ``engine`` as it
    is, without a Session: the session's transaction, its connection object and its two
    commits cost the API's filing about 0.2 ms of CPU, as much as its pipelined statements
    took to bind and send, for a row the API only reads back in its answer.

    Filings for the same model that this process's threads send while one is in the database
    are filed together, in one transaction (``_file_together``): each keeps its own number,
    rows, chained event, answer and errors, and is answered only once that transaction has
    committed."""
    now = now or utcnow()
    identifiers = _checked(name=name, aliases=aliases, emails=emails, phones=phones, notes=notes, ground=ground,
                           priority=priority, received_at=received_at, now=now)
    if engine.dialect.name != "postgresql":
        with session_scope(engine) as session:
            filed = request_submission(session, actor=actor, actor_id=actor_id, name=name, aliases=aliases,
                                       emails=emails, phones=phones, ground=ground, received_at=received_at,
                                       model_name=model_name, priority=priority, notes=notes, now=now, commit=True)
        return Filing(request=filed.request, earlier=tuple(r.reference for r in filed.earlier))
    pending = _pending(actor=actor, actor_id=actor_id, identifiers=identifiers, ground=ground,
                       received_at=received_at, model_name=model_name, priority=priority, now=now)
    _file_together(engine, pending)
    if pending.alone:  # its group was refused by the database as a whole: filed again, alone
        pending = replace(pending, written=None, error=None, alone=False)
        _file_on_pooled(engine, [pending])
    if pending.error is not None:
        raise pending.error
    if pending.written is None:  # pragma: no cover - a filed pending has one or the other
        raise RuntimeError("the filing ended without an outcome")
    request = _as_loaded(ErasureRequest, pending.written.row)
    make_transient_to_detached(request)
    return Filing(request=request, earlier=tuple(pending.written.earlier_references))


def _checked(*, name: str, aliases: Sequence[str], emails: Sequence[str], phones: Sequence[str], notes: str,
             ground: str, priority: str, received_at: datetime, now: datetime) -> SubjectIdentifiers:
    """A filing's input checked, and its identifiers cleaned (both ways of filing)."""
    name = " ".join(name.split())
    if not name:
        raise ValidationError("name", "the data subject's name is required")
    if ground not in GROUNDS:
        raise ValidationError("ground", f"unknown Art. 17(1) ground; one of {sorted(GROUNDS)}")
    if priority not in PRIORITIES:
        raise ValidationError("priority", f"one of {list(PRIORITIES)}")
    if received_at.tzinfo is None:
        raise ValidationError("received_at", "needs a time zone")
    if received_at > now + CLOCK_SKEW:
        raise ValidationError("received_at", "lies in the future")
    return SubjectIdentifiers(name=name, aliases=_clean(aliases), emails=_clean(emails), phones=_clean(phones),
                              notes=notes.strip())


# The PostgreSQL path of request_submission: the same rows and the same audit event, sent
# through the session's own psycopg connection (its transaction) in one pipeline, two round
# trips instead of eight awaited statements.  The first asks everything that needs no
# input from the database's answers, and takes both row locks (reference counter, then
# audit head: the order the ORM path takes them in) if, and only if, the model exists;
# the second writes (and, with ``commit=True``, commits).  So the locks are held for one
# round trip and the commit, not for the whole filing: concurrent filings queue on them
# for less time.  The new row's ORM object is made after the second round trip.  The
# request's id comes from its own sequence, as an INSERT would take it.
#
# A filing that commits a transaction it began itself (the API's: nothing else sent on the
# connection yet) sends BEGIN and COMMIT as statements of the pipeline, with the
# connection in autocommit mode meanwhile (as SQLAlchemy's own liveness ping does):
# psycopg, left to begin the transaction, awaits its BEGIN in a round trip of its own.
_PG_MODEL_EXISTS = "EXISTS (SELECT 1 FROM models WHERE name = %s)"
# The model, the next reference number (counted only if the model exists) and the
# requests the blind index matches (ids and references, so the audit event needs no
# further read), in one statement.  The model row is taken FOR KEY SHARE, the lock the
# request's foreign key takes on INSERT, here before the audit head: the scheduler and
# the certifier lock the model FOR UPDATE and then append to the chain, so a filing
# holding the head while its INSERT waited for the model would deadlock.
_PG_START = (
    "WITH model AS (SELECT id, name FROM models WHERE name = %s FOR KEY SHARE), "
    "counter AS (INSERT INTO reference_counters (prefix, last) SELECT %s, 1 FROM model "
    "ON CONFLICT (prefix) DO UPDATE SET last = reference_counters.last + 1 RETURNING last), "
    "earlier AS (SELECT id, reference FROM erasure_requests WHERE id IN "
    "(SELECT request_id FROM subject_index WHERE hmac IN ({digests}))) "
    "SELECT model.id, model.name, (SELECT last FROM counter), "
    "ARRAY(SELECT id FROM earlier ORDER BY id), ARRAY(SELECT reference FROM earlier ORDER BY id) "
    "FROM model"
)
# Filings that run a transaction of their own (the API's) go to the database one at a time
# per process.  Every filing holds the reference counter's and the audit head's row locks
# from its first round trip to its commit, so the database runs them one after another
# whatever the number sent; but each one sent while another held the locks waited in
# PostgreSQL (asleep on the holder's transaction, woken, then re-reading the row the holder
# had updated), and the more there were, the dearer each filing became: with 8 filing
# processes against 1, PostgreSQL spent 1.02 ms of CPU a filing against 0.49 and the
# clients 1.35 against 0.73, and 8 filed 310 a second where 1 filed 670 and 2 filed 660
# (2 cores).  A gunicorn worker serves 4 requests at once: its filings now queue on this
# lock (a sleep without the GIL) and the database sees one per worker: 2 processes of 4
# threads filed 595-790 a second against 420-700 (4 runs each, under varying load from
# other work), PostgreSQL spent 0.60-0.64 ms of CPU a filing against 0.75-0.89, and the
# 99th percentile of a filing's time fell from 51-99 ms to 21-32 ms (the median went from
# 6-12 to 10-13 ms: the wait moved from the database to the gate).  Only a filing's own
# transaction is gated: it begins and ends inside, so the gate is never held with a lock
# left in the database, nor awaited by a thread that holds one.  The wait is bounded: a
# filing for one model can wait in PostgreSQL while the certifier holds that model's row
# (FOR UPDATE, while it checks the candidate's files), which filings for other models need
# not; past FILING_GATE_WAIT_S they go on to the database as they did before the gate.
# The API's filings now wait before the gate, in groups (comment above _GROUPS), and each
# group passes it as one filing did.
_FILING_GATE = threading.Lock()
FILING_GATE_WAIT_S = 0.5


@contextlib.contextmanager
def _gated(own: bool) -> Iterator[None]:
    """Hold the process's filing gate, for a filing that runs its own transaction."""
    held = own and _FILING_GATE.acquire(timeout=FILING_GATE_WAIT_S)
    try:
        yield
    finally:
        if held:
            _FILING_GATE.release()


@functools.lru_cache(maxsize=64)
def _pg_start(digests: int) -> str:
    """The filing's first statement for this many blind-index digests.

    The digests are bound one by one (``hmac IN (%s, ...)``), not as one array
    (``hmac = ANY(%s)``): PostgreSQL reckons with ten elements in an array it cannot see,
    so the prepared statement's generic plan always looked dearer than the plans made for
    the values (388 matching rows estimated against 40) and the server planned the
    statement afresh on every filing.  With one parameter per digest both estimates agree,
    and from its sixth execution on a connection the statement runs on its generic plan
    (the same plan: index scans on the model's name, the counter's key and the digests):
    backend CPU a filing 0.63 -> 0.47 ms, and 0.85 -> 0.76 ms on the client, where the
    array no longer needs dumping (alternating runs of 600 filings).  One text per count of
    digests, each prepared once per connection.
    """
    return _PG_START.format(digests=", ".join(["%s"] * digests))


# Taken after the counter, in a statement of its own: every filing locks the two rows in
# this order.
_PG_HEAD_LOCK = AUDIT_HEAD_LOCK_PG.replace(" FOR UPDATE", f" AND {_PG_MODEL_EXISTS} FOR UPDATE")
# The very first audit event of a database: the genesis head, created as chain_head_lock
# creates it (two first appenders cannot both), then locked.
_PG_GENESIS_HEAD = "INSERT INTO chain_heads (name, seq, hash) VALUES (%s, 0, %s) ON CONFLICT (name) DO NOTHING"
_REQUEST_COLUMNS = tuple(c.key for c in ErasureRequest.__table__.columns if c.key != "id")


@functools.lru_cache(maxsize=64)
def _pg_insert_request(index_rows: int) -> str:
    """The request, its blind-index rows and its audit event (with the head's move) in one
    statement, which returns the new id: the writes' round trip binds and executes one
    statement instead of two while the row locks are held.  One text per count of index
    rows, made once."""
    insert = (f"INSERT INTO erasure_requests ({', '.join(_REQUEST_COLUMNS)}) "
              f"VALUES ({', '.join(['%s'] * len(_REQUEST_COLUMNS))}) RETURNING id")
    rows = ", ".join(["(%s, %s, %s)"] * index_rows)
    index = (f"rows AS (INSERT INTO subject_index (request_id, kind, hmac, key_id) "
             f"SELECT request.id, v.kind, v.hmac, v.key_id FROM request, "
             f"(VALUES {rows}) AS v(kind, hmac, key_id)), ") if index_rows else ""
    return f"WITH request AS ({insert}), {index}{AUDIT_APPEND_PG_CTES} SELECT id FROM request"


def _submission_pg(
    session: Session, *, actor: str, actor_id: int | None, identifiers: SubjectIdentifiers,
    ground: str, received_at: datetime, model_name: str, priority: str, now: datetime,
    commit: bool,
) -> Submission:
    from psycopg import pq

    session.flush()  # whatever the caller added first must be visible to the driver's reads
    driver = session.connection().connection.driver_connection
    if driver is None:  # a pooled connection always has its driver connection while checked out
        raise RuntimeError("no driver connection behind the session")
    # The transaction is the filing's own when nothing was sent in it yet and it commits.
    own = commit and driver.info.transaction_status == pq.TransactionStatus.IDLE
    written = _file_pg(driver, own=own, commit=commit, actor=actor, actor_id=actor_id, identifiers=identifiers,
                       ground=ground, received_at=received_at, model_name=model_name, priority=priority, now=now)
    # The row as the ORM would hold it after its own INSERT: persistent in this session,
    # every column loaded.
    if commit:
        session.commit()  # the session's own bookkeeping: the driver has committed already
    request = _as_loaded(ErasureRequest, written.row)
    make_transient_to_detached(request)
    session.add(request)
    # The earlier requests as ORM rows, for callers that show more than their references
    # (rare: a subject filed before); after a commit, in a transaction of their own.
    earlier = list(session.execute(
        select(ErasureRequest).where(ErasureRequest.id.in_(written.earlier_ids)).order_by(ErasureRequest.id)
    ).scalars()) if written.earlier_ids else []
    return Submission(request=request, earlier=tuple(earlier))


@dataclass(frozen=True)
class _Written:
    """What ``_file_pg`` wrote: the request's row (every column, its id too) and the earlier
    requests the blind index matched (ids and references, in id order)."""

    row: dict[str, Any]
    earlier_ids: Sequence[int]
    earlier_references: Sequence[str]


@dataclass(eq=False)  # one filing is one object: compared, and found in a queue, by identity
class _Pending:
    """One filing on its way to PostgreSQL: its input, what is made of it before the row
    locks are taken, and its outcome (``written`` or ``error``; ``alone``: its group was
    rolled back as a whole and it is to be filed again by itself)."""

    actor: str
    actor_id: int | None
    identifiers: SubjectIdentifiers
    ground: str
    received_at: datetime
    model_name: str
    priority: str
    entries: list[tuple[str, str]]
    subject_hmac: str
    plaintext: bytes
    due_at: datetime
    prefix: str
    written: _Written | None = None
    error: BaseException | None = None
    alone: bool = False
    done: bool = False  # its outcome is set (by whichever thread filed it)
    seq: int = 0


def _pending(*, actor: str, actor_id: int | None, identifiers: SubjectIdentifiers, ground: str,
             received_at: datetime, model_name: str, priority: str, now: datetime) -> _Pending:
    """Everything that needs no answer from the database, done before the first round trip
    takes the row locks: concurrent filings queue on those locks until commit."""
    keys = crypto.keyring()
    return _Pending(actor=actor, actor_id=actor_id, identifiers=identifiers, ground=ground,
                    received_at=received_at, model_name=model_name, priority=priority,
                    entries=_index_entries(keys, identifiers),
                    subject_hmac=keys.blind_index("name", identifiers.name),
                    plaintext=_identifiers_json(identifiers), due_at=deadlines.due_at(received_at),
                    prefix=f"ER-{now.year}")


def _file_pg(
    driver: Any, *, own: bool, commit: bool, actor: str, actor_id: int | None, identifiers: SubjectIdentifiers,
    ground: str, received_at: datetime, model_name: str, priority: str, now: datetime,
) -> _Written:
    """One filing's statements on a psycopg connection (``_file_pg_group`` of one)."""
    pending = _pending(actor=actor, actor_id=actor_id, identifiers=identifiers, ground=ground,
                       received_at=received_at, model_name=model_name, priority=priority, now=now)
    try:
        _file_pg_group(driver, [pending], own=own, commit=commit)
    except _GroupFailed as failed:
        raise failed.error from failed.error.__cause__
    if pending.error is not None:
        raise pending.error
    if pending.written is None:  # pragma: no cover - a filed pending has one or the other
        raise RuntimeError("the filing ended without an outcome")
    return pending.written


class _Refused(Exception):
    """Every filing of a group named no registered model: nothing to write."""


def _file_pg_group(driver: Any, group: list[_Pending], *, own: bool, commit: bool) -> None:
    """The statements of one or more filings for one model, in one transaction and one
    pipeline (comment above _PG_MODEL_EXISTS): each filing's first statement (its model,
    its number, its blind-index matches), the audit head's lock once, then each filing's
    writes, its event chained to the one before, and the COMMIT.  ``own``: BEGIN and COMMIT
    are the pipeline's, the connection in autocommit meanwhile and put back in its
    transactional mode afterwards.

    A filing for a model that does not exist gets its ValidationError (its ``error``) and
    takes no number.  A filing matches the earlier requests of its group as it matches
    those already stored (its first statement ran before their writes).  Whatever else
    goes wrong raises, as SQLAlchemy would have raised it, with every filing of the group
    rolled back unless the COMMIT may have reached the server (``_GroupFailed``)."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    keys = crypto.keyring()
    model_name = group[0].model_name
    statement = ""
    commit_sent = False
    # The filing's own transaction runs behind this process's gate (comment at _FILING_GATE).
    with _gated(own):
        try:
            if own:
                driver.autocommit = True
            with driver.pipeline() as pipeline:
                transaction, lock = driver.cursor(), driver.cursor()
                if own:
                    transaction.execute("BEGIN")
                starts = []
                for pending in group:
                    # A name is always filed, so there is always a digest (a NULL would stand for none).
                    digests: list[str | None] = [digest for _, digest in pending.entries] or [None]
                    start = driver.cursor()
                    statement = _pg_start(len(digests))
                    start.execute(statement, (model_name, pending.prefix, *digests))
                    starts.append(start)
                statement = _PG_HEAD_LOCK
                lock.execute(_PG_HEAD_LOCK, (AUDIT_CHAIN, model_name))
                pipeline.sync()
                found = [start.fetchone() for start in starts]
                head = lock.fetchone()
                live: list[tuple[_Pending, Any]] = []
                for pending, row in zip(group, found, strict=True):
                    if row is None:
                        pending.error = ValidationError("model_name", "no such registered model")
                    else:
                        live.append((pending, row))
                if not live:
                    raise _Refused
                if head is None:  # the very first audit event: create the genesis head (locked)
                    statement = _PG_GENESIS_HEAD
                    genesis, lock = driver.cursor(), driver.cursor()
                    genesis.execute(_PG_GENESIS_HEAD, (AUDIT_CHAIN, GENESIS_HASH))
                    lock.execute(AUDIT_HEAD_LOCK_PG, (AUDIT_CHAIN,))
                    pipeline.sync()
                    head = lock.fetchone()
                    if head is None:  # pragma: no cover - the row was inserted just above
                        raise RuntimeError(f"chain {AUDIT_CHAIN}: head row vanished")
                tip = (head[0], head[1])
                inserts: list[tuple[Any, str, dict[str, Any], Sequence[int], list[str]]] = []
                earlier_in_group: list[list[int]] = []
                for i, (pending, (model_id, registered_name, number, earlier_ids, earlier_references)) in enumerate(live):
                    reference = f"{pending.prefix}-{number:05d}"
                    # Earlier filings of this group that share a digest with this one, in filing
                    # (and so id) order, after the stored ones.
                    mine = {digest for _, digest in pending.entries}
                    before = [j for j in range(i) if mine & {digest for _, digest in live[j][0].entries}]
                    earlier_in_group.append(before)
                    earlier_references = [*earlier_references, *(inserts[j][1] for j in before)]
                    ciphertext, key_id = keys.encrypt(pending.plaintext, context=SUBJECT_CONTEXT, row=reference)
                    stamp = utcnow()
                    values: dict[str, Any] = dict.fromkeys(_REQUEST_COLUMNS)
                    values.update(
                        reference=reference, subject_ciphertext=ciphertext, subject_key_id=key_id,
                        subject_ad_version=crypto.AD_ROW, subject_hmac=pending.subject_hmac,
                        blind_key_id=keys.blind_key_id, ground=pending.ground, received_at=pending.received_at,
                        due_at=pending.due_at, model_id=model_id, priority=pending.priority,
                        status=RequestStatus.SUBMITTED, submitted_by=pending.actor, submitted_by_id=pending.actor_id,
                        created_at=stamp, updated_at=stamp,
                    )
                    seq, event = audit_append_pg(
                        head=tip, actor=pending.actor, action="request.submitted",
                        object_type=OBJECT_TYPE, object_ref=reference,
                        details={
                            "ground": pending.ground, "priority": pending.priority, "model": registered_name,
                            "received_at": canonical_time(pending.received_at),
                            "due_at": canonical_time(pending.due_at), "subject_hmac": pending.subject_hmac,
                            "blind_key_id": keys.blind_key_id, "earlier_requests": earlier_references,
                        },
                    )
                    tip = (seq, event[8])  # the event's hash: the next one's prev_hash
                    pending.seq = seq
                    insert = driver.cursor()
                    statement = _pg_insert_request(len(pending.entries))
                    insert.execute(statement, (
                        *(_pg_value(v) for v in values.values()),
                        *(x for kind, digest in pending.entries for x in (kind, digest, keys.blind_key_id)),
                        *event))
                    inserts.append((insert, reference, values, earlier_ids, earlier_references))
                if commit:  # in this round trip: the server releases the locks at once
                    statement = "COMMIT"
                    commit_sent = True
                    if own:
                        transaction.execute("COMMIT")
                    else:
                        driver.commit()
                # Leaving the pipeline sends the writes (and the COMMIT) and awaits them.
            created: list[int] = []
            for insert, _, _, _, _ in inserts:
                row = insert.fetchone()
                if row is None:  # pragma: no cover - the INSERT returns its row
                    raise RuntimeError("the new request's row came back empty")
                created.append(row[0])
        except _Refused:
            return
        except psycopg.Error as exc:  # as SQLAlchemy would have raised it (IntegrityError, ...)
            # The server refused a statement (or the COMMIT was never sent): the transaction
            # is rolled back whole.  Otherwise the COMMIT may have been taken.
            error = DBAPIError.instance(statement, None, exc, psycopg.Error)
            error.__cause__ = exc
            raise _GroupFailed(rolled_back=exc.sqlstate is not None or not commit_sent, error=error) from exc
        except Exception as exc:
            raise _GroupFailed(rolled_back=not commit_sent, error=exc) from exc
        finally:
            if own:
                _leave_autocommit(driver)
    for (pending, _), (_, reference, values, earlier_ids, earlier_references), created_id, before in zip(
            live, inserts, created, earlier_in_group, strict=True):
        pending.written = _Written(row={"id": created_id, **values},
                                   earlier_ids=[*earlier_ids, *(created[j] for j in before)],
                                   earlier_references=earlier_references)
        audit_logged(actor=pending.actor, action="request.submitted", object_type=OBJECT_TYPE, object_ref=reference,
                     seq=pending.seq)


class _GroupFailed(Exception):
    """``_file_pg_group`` raised ``error``; ``rolled_back``: nothing of the group was committed."""

    def __init__(self, *, rolled_back: bool, error: Exception) -> None:
        super().__init__(str(error))
        self.rolled_back, self.error = rolled_back, error


def _copied(error: Exception) -> Exception:
    """The same error as a new object, for another thread to raise (a thread that raises an
    exception object writes its own traceback into it)."""
    twin = copy.copy(error)
    twin.__cause__ = error.__cause__
    return twin


# Filings for one model that this process's threads send while one of them is in the
# database go together, in one transaction.  Every filing holds the reference counter's and
# the audit head's row locks from its first round trip until its COMMIT is durable, so the
# database files them one after another, each waiting for the one before it to be written
# to disk (the WAL flush: 1-4 ms on the bench's machine, more than everything else the
# filing holds the locks for); filed together, the flush is paid once for the group.  A
# thread that finds no group of its model in the database sends one itself, with every
# filing queued for that model by then (the leader); the others wait to be answered.  Each
# filing keeps its own number, rows, chained event (the events of a group consecutive, each
# chained to the one before) and log line, and is answered only after the group's COMMIT.
# One model a group: a filing waiting on a model's row lock (the certifier holds it FOR
# UPDATE while it checks a candidate's files) holds up only filings for that model, as it
# would in the database.  A group the database refuses as a whole (any statement failing
# aborts the transaction) is filed again one by one, so that each filing gets its own
# answer, never another's error; a group whose COMMIT may have been taken (the connection
# lost after it was sent) is not: each of its filings gets the error, as one alone would.
_GROUPS = threading.Condition()
_QUEUES: dict[tuple[int, str], list[_Pending]] = {}
_SENDING: set[tuple[int, str]] = set()
GROUP_MAX = 32


def _file_together(engine: Engine, pending: _Pending) -> None:
    """File ``pending`` with the filings for its model queued in this process meanwhile: its
    outcome is set when this returns (``written``, ``error``, or ``alone``)."""
    key = (id(engine), pending.model_name)
    with _GROUPS:
        queue = _QUEUES.setdefault(key, [])
        queue.append(pending)
        while not pending.done and key in _SENDING:
            _GROUPS.wait()
        if pending.done:  # another thread filed it
            return
        _SENDING.add(key)  # this thread sends the next group (a sender marks what it took done)
    group = [pending]
    try:
        _file_on_pooled(engine, group, queue=queue)
    except BaseException:
        # Nothing of the others' was sent (no connection to be had, say): they file alone.
        for other in group[1:]:
            if other.written is None and other.error is None:
                other.alone = True
        raise
    finally:
        with _GROUPS:
            for filed in group:
                filed.done = True
            queue[:] = [p for p in queue if p is not pending]
            _SENDING.discard(key)
            if not queue and _QUEUES.get(key) is queue:
                del _QUEUES[key]
            _GROUPS.notify_all()


def _file_on_pooled(engine: Engine, group: list[_Pending], queue: list[_Pending] | None = None) -> None:
    """File ``group`` in one transaction on a pooled connection of ``engine``, every filing
    in it given its outcome; with ``queue``, what is queued there once the connection is in
    hand joins ``group`` (up to GROUP_MAX filings)."""
    from psycopg import pq

    pooled = engine.raw_connection()  # checked out as a session would (liveness ping and all)
    try:
        driver = pooled.driver_connection
        if driver is None:  # pragma: no cover - a checked-out connection has its driver's
            raise RuntimeError("no driver connection behind the pool")
        own = driver.info.transaction_status == pq.TransactionStatus.IDLE
        if queue is not None:
            with _GROUPS:
                group[:] = [*group, *(p for p in queue if p not in group)][:GROUP_MAX]
                queue[:] = [p for p in queue if p not in group]
        try:
            _file_pg_group(driver, group, own=own, commit=True)
        except _GroupFailed as failed:
            for pending in group:
                if failed.rolled_back and len(group) > 1:
                    pending.alone = True
                else:  # each thread raises an exception object of its own
                    pending.error = failed.error if pending is group[0] else _copied(failed.error)
    finally:
        pooled.close()  # back to the pool, reset (rolled back) as a session's connection is


def _as_loaded(cls: type[_Row], values: dict[str, Any]) -> _Row:
    """A new instance of a mapped class holding ``values`` as the ORM's loading does: the
    values go straight into the instance's state, with no attribute event per column.  The
    constructor set each of the request's 27 columns through its instrumentation, which cost
    a filing more CPU than building the audit event (``make_transient_to_detached`` then
    makes it the persistent row's image, as before)."""
    # class_mapper configures the mappers first where they are not yet, as the constructor does.
    instance = class_mapper(cls).class_manager.new_instance()
    vars(instance).update(values)
    return instance


def _leave_autocommit(driver: Any) -> None:
    """Back to the pool's transactional mode after a filing that ran its own transaction:
    a transaction it left open (it raised before its COMMIT) is rolled back first.  A
    connection that cannot be put back is closed, so the pool replaces it."""
    import psycopg
    from psycopg import pq

    if driver.closed:
        return
    try:
        if driver.info.transaction_status != pq.TransactionStatus.IDLE:
            driver.execute("ROLLBACK")
        driver.autocommit = False
    except psycopg.Error:
        driver.close()


def _pg_value(value: Any) -> Any:
    """A column value as the ORM's types would bind it (UTC times, enums by value)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime: store aware UTC datetimes only")
        return value.astimezone(UTC)
    if isinstance(value, RequestStatus):
        return value.value
    return value


def _request_only(submission: Callable[P, Submission]) -> Callable[P, ErasureRequest]:
    def submit(*args: P.args, **kwargs: P.kwargs) -> ErasureRequest:
        return submission(*args, **kwargs).request

    submit.__doc__ = "``request_submission`` returning the new row only."
    return submit


request_submit = _request_only(request_submission)


def request_approve(
    session: Session, *, actor: str, reference: str, now: datetime | None = None,
    actor_id: int | None = None,
) -> ErasureRequest:
    request = _decide(session, actor=actor, actor_id=actor_id, reference=reference,
                      target=RequestStatus.APPROVED)
    request.decided_at = now or utcnow()
    audit_append(
        session, actor=actor, action="request.approved", object_type=OBJECT_TYPE,
        object_ref=reference, details={"priority": request.priority},
    )
    return request


def request_deny(
    session: Session,
    *,
    actor: str,
    reference: str,
    reason_code: str,
    note: str = "",
    now: datetime | None = None,
    actor_id: int | None = None,
) -> ErasureRequest:
    if reason_code not in DENIAL_REASONS:
        raise ValidationError("reason_code", f"one of {sorted(DENIAL_REASONS)}")
    request = _decide(session, actor=actor, actor_id=actor_id, reference=reference,
                      target=RequestStatus.DENIED)
    request.reason_code = reason_code
    request.decision_note = note.strip() or None
    request.decided_at = now or utcnow()
    audit_append(
        session, actor=actor, action="request.denied", object_type=OBJECT_TYPE,
        object_ref=reference, details={"reason_code": reason_code},
    )
    return request


def request_cancel(
    session: Session, *, actor: str, reference: str, reason: str = "",
    actor_id: int | None = None,
) -> ErasureRequest:
    """Cancel an open request.

    Before review the officer may withdraw it.  Once a reviewer approved it, cancelling
    undoes a four-eyes decision, so it takes a second person again: never the
    submitter, and always with a reason for the file.  (Which role that second person
    holds is the caller's rule; the web and the API allow reviewers only.)
    """
    request = request_get(session, reference=reference, for_update=True)
    reason = reason.strip()
    if request.status in CANCEL_NEEDS_REVIEW:
        if not reason:
            raise ValidationError("reason", "cancelling an approved request needs a reason")
        if same_person(actor=actor, actor_id=actor_id, other=request.submitted_by,
                       other_id=request.submitted_by_id):
            raise PermissionDenied(
                "four-eyes: the submitter cannot cancel a request after its approval"
            )
    request = request_transition(
        session, actor=actor, reference=reference, target=RequestStatus.CANCELED,
        action="request.canceled",
        details={"after_approval": request.status in CANCEL_NEEDS_REVIEW,
                 "reason_given": bool(reason)},
    )
    request.decision_note = reason or request.decision_note
    return request


def request_extend(
    session: Session,
    *,
    actor: str,
    reference: str,
    months: int,
    reason: str,
    now: datetime | None = None,
) -> ErasureRequest:
    """Art. 12(3): extend once, by one or two months, while inside the first month."""
    now = now or utcnow()
    if months not in range(1, deadlines.MAX_EXTENSION_MONTHS + 1):
        raise ValidationError("months", "an extension is one or two further months")
    if not reason.strip():
        raise ValidationError("reason", "Art. 12(3) requires the reasons for the delay")
    request = request_get(session, reference=reference, for_update=True)
    if request.status not in OPEN_REQUEST_STATUSES:
        raise ValidationError("reference", f"a {request.status} request cannot be extended")
    if request.extension_months is not None:
        raise ValidationError("months", "the deadline has already been extended once")
    if now >= request.due_at:
        raise ValidationError("months", "the first month has ended: too late to extend")
    request.extension_months = months
    request.extension_reason = reason.strip()
    request.extended_at = now
    request.due_at = deadlines.extended_due_at(request.received_at, months)
    audit_append(
        session, actor=actor, action="request.extended", object_type=OBJECT_TYPE,
        object_ref=reference,
        details={"months": months, "due_at": canonical_time(request.due_at)},
    )
    return request


def request_transition(
    session: Session,
    *,
    actor: str,
    reference: str,
    target: RequestStatus,
    action: str,
    details: dict[str, Any] | None = None,
) -> ErasureRequest:
    """Move a request along its state machine (raising, unchanged, if the table forbids)."""
    request = request_get(session, reference=reference, for_update=True)
    previous = request.status
    request.status = check_request_transition(previous, target)
    if target is RequestStatus.COMPLETED:
        request.completed_at = utcnow()
    session.flush()
    audit_append(
        session, actor=actor, action=action, object_type=OBJECT_TYPE, object_ref=reference,
        details={"from": previous, "to": str(target), **(details or {})},
    )
    return request


def request_purge_identifiers(
    session: Session, *, actor: str, retention_days: int, now: datetime | None = None
) -> list[str]:
    """Drop the encrypted identifiers of requests closed more than ``retention_days`` ago.

    The blind-index HMACs stay (they are not reversible) so a repeated request is still
    recognised; the audit trail and certificates never held plaintext in the first place.
    """
    cutoff = (now or utcnow()) - timedelta(days=retention_days)
    closed = (RequestStatus.COMPLETED, RequestStatus.DENIED, RequestStatus.CANCELED)
    rows = session.execute(
        select(ErasureRequest).where(
            ErasureRequest.status.in_([s.value for s in closed]),
            ErasureRequest.subject_ciphertext.is_not(None),
            ErasureRequest.updated_at < cutoff,
        )
    ).scalars().all()
    for request in rows:
        request.subject_ciphertext = None
        request.decision_note = None
        request.purged_at = now or utcnow()
        audit_append(
            session, actor=actor, action="request.identifiers_purged", object_type=OBJECT_TYPE,
            object_ref=request.reference, details={"retention_days": retention_days},
        )
    return [r.reference for r in rows]


# ------------------------------------------------------------------------ selectors


def request_get(session: Session, *, reference: str, for_update: bool = False) -> ErasureRequest:
    query = select(ErasureRequest).where(ErasureRequest.reference == reference)
    if for_update:
        query = query.with_for_update()
    request = session.execute(query).scalar_one_or_none()
    if request is None:
        raise NotFound(f"no erasure request {reference}")
    return request


def request_list(
    session: Session,
    *,
    status: str | Iterable[str] | None = None,
    model_id: int | None = None,
    priority: str | None = None,
    due_before: datetime | None = None,
    limit: int | None = None,
) -> list[ErasureRequest]:
    """Requests, earliest deadline first (the order the statutory clock demands)."""
    query = select(ErasureRequest).order_by(ErasureRequest.due_at, ErasureRequest.id)
    if status is not None:
        statuses = [status] if isinstance(status, str) else list(status)
        query = query.where(ErasureRequest.status.in_(statuses))
    if model_id is not None:
        query = query.where(ErasureRequest.model_id == model_id)
    if priority is not None:
        query = query.where(ErasureRequest.priority == priority)
    if due_before is not None:
        query = query.where(ErasureRequest.due_at < due_before)
    if limit is not None:
        query = query.limit(limit)
    return list(session.execute(query).scalars())


def request_find_earlier(
    session: Session,
    *,
    name: str | None = None,
    aliases: Sequence[str] = (),
    emails: Sequence[str] = (),
    phones: Sequence[str] = (),
    exclude_reference: str | None = None,
) -> list[ErasureRequest]:
    """Requests sharing any identifier with these, found by blind index only."""
    keys = crypto.keyring()
    wanted = SubjectIdentifiers(name=name or "", aliases=tuple(aliases), emails=tuple(emails),
                                phones=tuple(phones))
    digests = {digest for _, digest in _index_entries(keys, wanted)}
    if not digests:
        return []
    query = (
        select(ErasureRequest)
        .join(SubjectIndex, SubjectIndex.request_id == ErasureRequest.id)
        .where(SubjectIndex.hmac.in_(digests))
        .distinct()
        .order_by(ErasureRequest.id)
    )
    if exclude_reference is not None:
        query = query.where(ErasureRequest.reference != exclude_reference)
    return list(session.execute(query).scalars())


def request_duplicate_check(
    session: Session,
    *,
    actor: str,
    name: str,
    aliases: Sequence[str] = (),
    emails: Sequence[str] = (),
    phones: Sequence[str] = (),
) -> list[ErasureRequest]:
    """Earlier requests for the same subject, asked before filing a new one.

    Answering "has this person asked before, and under which references?" is a look-up
    of personal data by identifiers, so it is audited like any other access: the
    subject's blind index and the references answered, never the identifiers.
    """
    earlier = request_find_earlier(session, name=name, aliases=aliases, emails=emails,
                                   phones=phones)
    keys = crypto.keyring()
    audit_append(
        session, actor=actor, action="request.duplicate_check", object_type="subject",
        object_ref=keys.blind_index("name", name) if name.strip() else "-",
        details={"blind_key_id": keys.blind_key_id,
                 "answered": [r.reference for r in earlier]},
    )
    return earlier


def subject_identifiers(session: Session, reference: str) -> SubjectIdentifiers:
    """Decrypt a request's identifiers (worker only: set building needs the name)."""
    request = request_get(session, reference=reference)
    if request.subject_ciphertext is None:
        raise NotFound(f"{reference}: identifiers were purged after the retention period")
    data = crypto.keyring().decrypt_json(
        request.subject_ciphertext, key_id_=request.subject_key_id, context=SUBJECT_CONTEXT,
        row=crypto.ad_row(request.subject_ad_version, request.reference),
    )
    return SubjectIdentifiers(
        name=data["name"], aliases=tuple(data["aliases"]), emails=tuple(data["emails"]),
        phones=tuple(data["phones"]), notes=data.get("notes", ""),
    )


# -------------------------------------------------------------------------- helpers

def same_person(*, actor: str, actor_id: int | None, other: str | None,
                other_id: int | None) -> bool:
    """Whether two actors are one person: by account id when both have one (a renamed
    account is still the same person), else by the actor string."""
    if actor_id is not None and other_id is not None:
        return actor_id == other_id
    return other is not None and actor.casefold() == other.casefold()


def _decide(
    session: Session, *, actor: str, actor_id: int | None, reference: str, target: RequestStatus
) -> ErasureRequest:
    request = request_get(session, reference=reference, for_update=True)
    # Four-eyes: the officer who filed the request may never be the one who decides it.
    if same_person(actor=actor, actor_id=actor_id, other=request.submitted_by,
                   other_id=request.submitted_by_id):
        raise PermissionDenied("four-eyes: the submitter of a request cannot review it")
    request.status = check_request_transition(request.status, target)
    request.reviewed_by = actor
    request.reviewed_by_id = actor_id
    session.flush()
    return request


def _next_reference(session: Session, *, year: int) -> str:
    """ER-YYYY-NNNNN from a per-year counter bumped atomically (upsert ... returning)."""
    prefix = f"ER-{year}"
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = (
        insert(ReferenceCounter)
        .values(prefix=prefix, last=1)
        .on_conflict_do_update(
            index_elements=["prefix"], set_={"last": ReferenceCounter.last + 1}
        )
        .returning(ReferenceCounter.last)
    )
    number = session.execute(statement).scalar_one()
    return f"{prefix}-{number:05d}"


def _clean(values: Sequence[str]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for value in values:
        text = " ".join(str(value).split())
        if text:
            seen.setdefault(text, None)
    return tuple(seen)


def _identifiers_json(identifiers: SubjectIdentifiers) -> bytes:
    """What ``Keyring.encrypt_json`` seals: the canonical JSON bytes of ``_as_json``."""
    return canonical_json_flat(_as_json(identifiers)).encode("utf-8")


def _as_json(identifiers: SubjectIdentifiers) -> dict[str, Any]:
    return {
        "name": identifiers.name, "aliases": list(identifiers.aliases),
        "emails": list(identifiers.emails), "phones": list(identifiers.phones),
        "notes": identifiers.notes,
    }


def _index_entries(
    keys: crypto.Keyring, identifiers: SubjectIdentifiers
) -> list[tuple[str, str]]:
    # Names and aliases share one HMAC space so that an alias matches a name elsewhere.
    entries = [("name", keys.blind_index("name", identifiers.name))] if identifiers.name else []
    entries += [("alias", keys.blind_index("name", a)) for a in identifiers.aliases]
    entries += [("email", keys.blind_index("email", e)) for e in identifiers.emails]
    entries += [("phone", keys.blind_index("phone", p)) for p in identifiers.phones]
    return list(dict.fromkeys(entries))
