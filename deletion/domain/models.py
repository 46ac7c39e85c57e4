"""The domain schema (ARCHITECTURE.md section 3) as SQLAlchemy 2.0 typed models.

The alembic migrations under ``migrations/`` create exactly these tables; a drift test
compares the two.  Nothing personal is stored in clear: subject identifiers live
encrypted in ``erasure_requests.subject_ciphertext`` and are found through HMAC blind
indexes in ``subject_index``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Stable constraint names, so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

HASH = 64  # sha256 hex


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite would hand back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: store aware UTC datetimes only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON(), list[Any]: JSON()}


# ------------------------------------------------------------------------ requests


class ErasureRequest(Base):
    __tablename__ = "erasure_requests"

    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String(20), unique=True)
    # AES-GCM over the canonical JSON of {name, aliases, emails, phones, notes};
    # NULL once purged after the retention period.
    subject_ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary)
    subject_key_id: Mapped[str] = mapped_column(String(32))
    # What the AES-GCM associated data names (deletion.domain.crypto): 2 = the column and
    # this row's reference, so a ciphertext copied to another row no longer opens; 1 = the
    # column only (rows written before revision 0002, resealed by beat).
    subject_ad_version: Mapped[int] = mapped_column(Integer, default=2, server_default=text("1"))
    # HMAC blind index of the normalised name (also one row per identifier in subject_index).
    subject_hmac: Mapped[str] = mapped_column(String(HASH), index=True)
    blind_key_id: Mapped[str] = mapped_column(String(32))
    ground: Mapped[str] = mapped_column(String(40))
    received_at: Mapped[datetime]
    due_at: Mapped[datetime]  # the deadline in force: moved by an extension
    extension_months: Mapped[int | None] = mapped_column(Integer)
    extension_reason: Mapped[str | None] = mapped_column(Text)
    extended_at: Mapped[datetime | None]
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    priority: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(24), index=True)
    submitted_by: Mapped[str] = mapped_column(String(150))
    # The staff account ids behind the actor strings: four-eyes compares these, because
    # a username can be changed (or differ only in case) while the person stays the same.
    submitted_by_id: Mapped[int | None] = mapped_column(Integer)
    reviewed_by: Mapped[str | None] = mapped_column(String(150))
    reviewed_by_id: Mapped[int | None] = mapped_column(Integer)
    decided_at: Mapped[datetime | None]
    reason_code: Mapped[str | None] = mapped_column(String(48))
    decision_note: Mapped[str | None] = mapped_column(Text)
    completed_at: Mapped[datetime | None]
    purged_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    model: Mapped[Model] = relationship(foreign_keys=[model_id])


class SubjectIndex(Base):
    """One HMAC per normalised identifier (name, alias, email, phone) of a request."""

    __tablename__ = "subject_index"

    id: Mapped[int] = mapped_column(primary_key=True)
    request_id: Mapped[int] = mapped_column(
        ForeignKey("erasure_requests.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16))
    hmac: Mapped[str] = mapped_column(String(HASH), index=True)
    key_id: Mapped[str] = mapped_column(String(32))


class ReferenceCounter(Base):
    """Last number handed out per reference prefix (``ER-2026``), bumped under a row lock."""

    __tablename__ = "reference_counters"

    prefix: Mapped[str] = mapped_column(String(16), primary_key=True)
    last: Mapped[int] = mapped_column(Integer)


class DeadlineAlert(Base):
    __tablename__ = "deadline_alerts"
    __table_args__ = (UniqueConstraint("request_id", "kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("erasure_requests.id"))
    kind: Mapped[str] = mapped_column(String(8))  # "7d", "2d", "0d" (on the day)
    sent_at: Mapped[datetime] = mapped_column(default=utcnow)


class RequestResolution(Base):
    """What to do about a request whose erasure failed, proposed by an officer and
    decided by a reviewer who is not the proposer: retry (another method or a stronger
    preset), retraining required, or a refusal under Art. 17(3)."""

    __tablename__ = "request_resolutions"

    id: Mapped[int] = mapped_column(primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("erasure_requests.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # retry, retraining, refusal
    method: Mapped[str | None] = mapped_column(String(32))
    preset: Mapped[str | None] = mapped_column(String(32))
    reason_code: Mapped[str | None] = mapped_column(String(48))
    note: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)  # proposed, approved, declined
    proposed_by: Mapped[str] = mapped_column(String(150))
    proposed_by_id: Mapped[int | None] = mapped_column(Integer)
    proposed_at: Mapped[datetime] = mapped_column(default=utcnow)
    decided_by: Mapped[str | None] = mapped_column(String(150))
    decided_by_id: Mapped[int | None] = mapped_column(Integer)
    decided_at: Mapped[datetime | None]
    decision_note: Mapped[str | None] = mapped_column(Text)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))


class LetterTemplate(Base):
    """The reply to the data subject (Art. 12(3)/(4)), per language and outcome; editable."""

    __tablename__ = "letter_templates"
    __table_args__ = (UniqueConstraint("language", "kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    language: Mapped[str] = mapped_column(String(8))
    kind: Mapped[str] = mapped_column(String(16))  # completed, refused
    subject: Mapped[str] = mapped_column(String(200))
    body: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer, default=1)
    updated_by: Mapped[str] = mapped_column(String(150))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


# ------------------------------------------------------------------- model registry


class Model(Base):
    __tablename__ = "models"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    corpus_id: Mapped[int | None] = mapped_column(ForeignKey("corpora.id"))
    # The serving pointer; checkpoints point back at models, hence use_alter.
    serving_checkpoint_id: Mapped[int | None] = mapped_column(
        ForeignKey("checkpoints.id", use_alter=True)
    )
    batch_window_hours: Mapped[int] = mapped_column(Integer, default=24)
    # Finer than the hours column when set (a demo's window of a few minutes); the
    # effective window is ``deletion.domain.services.batches.batch_window``.
    batch_window_minutes: Mapped[int | None] = mapped_column(Integer)
    # Who owns the model (the ML team): told when an erasure needs a retraining.
    owner_email: Mapped[str | None] = mapped_column(String(254))
    owner_webhook_url: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    serving_checkpoint: Mapped[Checkpoint | None] = relationship(
        foreign_keys=[serving_checkpoint_id], post_update=True
    )
    corpus: Mapped[Corpus | None] = relationship(foreign_keys=[corpus_id])


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("model_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.id"))
    directory: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(HASH))
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    promoted_at: Mapped[datetime | None]
    retired_at: Mapped[datetime | None]
    destroy_after: Mapped[datetime | None]
    destroyed_at: Mapped[datetime | None]

    model: Mapped[Model] = relationship(foreign_keys=[model_id])
    parent: Mapped[Checkpoint | None] = relationship(remote_side=[id])


class CheckpointCertificate(Base):
    """The certificates a checkpoint embodies (its own and every ancestor's)."""

    __tablename__ = "checkpoint_certificates"

    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id"), primary_key=True)
    certificate_id: Mapped[int] = mapped_column(ForeignKey("certificates.id"), primary_key=True)


class Corpus(Base):
    """A registered training corpus; its content changes only through new versions."""

    __tablename__ = "corpora"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Records about people the model never saw (any corpus format): the verifier's
    # chance level.  Registered with the corpus; kept across its tombstone versions.
    control_path: Mapped[str | None] = mapped_column(Text)
    control_manifest_digest: Mapped[str | None] = mapped_column(String(HASH))
    control_record_count: Mapped[int | None] = mapped_column(Integer)

    versions: Mapped[list[CorpusVersion]] = relationship(
        order_by="CorpusVersion.version", back_populates="corpus"
    )


class CorpusVersion(Base):
    __tablename__ = "corpus_versions"
    __table_args__ = (UniqueConstraint("corpus_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    corpus_id: Mapped[int] = mapped_column(ForeignKey("corpora.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    manifest_digest: Mapped[str] = mapped_column(String(HASH))
    record_count: Mapped[int | None] = mapped_column(Integer)
    # What registration read: the formats of its shards (e.g. "jsonl+zstd,parquet") and
    # the items that fit no record shape (named in the registration's audit event).
    formats: Mapped[str | None] = mapped_column(String(200))
    skipped_count: Mapped[int | None] = mapped_column(Integer)
    # Record ids excluded from this version on (cumulative over the tombstones).
    tombstoned_count: Mapped[int] = mapped_column(Integer, default=0)
    # The job whose tombstones made this version (jobs point back here: use_alter).
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", use_alter=True))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    corpus: Mapped[Corpus] = relationship(back_populates="versions")


class CorpusTombstone(Base):
    """A record no future training may use again, and the job that erased it."""

    __tablename__ = "corpus_tombstones"
    __table_args__ = (UniqueConstraint("corpus_id", "record_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    corpus_id: Mapped[int] = mapped_column(ForeignKey("corpora.id"), index=True)
    record_id: Mapped[str] = mapped_column(String(200))
    version_id: Mapped[int] = mapped_column(ForeignKey("corpus_versions.id"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# ----------------------------------------------------------------------------- jobs


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # One model is unlearned by one job at a time.
        Index(
            "uq_jobs_one_active_per_model",
            "model_id",
            unique=True,
            postgresql_where=text("stage NOT IN ('done', 'rejected') AND dead_lettered_at IS NULL"),
            sqlite_where=text("stage NOT IN ('done', 'rejected') AND dead_lettered_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    method: Mapped[str] = mapped_column(String(32))
    hparams: Mapped[dict[str, Any]] = mapped_column(default=dict)
    base_checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id"))
    candidate_checkpoint_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.id"))
    corpus_version_id: Mapped[int | None] = mapped_column(ForeignKey("corpus_versions.id"))
    stage: Mapped[str] = mapped_column(String(24), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    progress_stage: Mapped[str | None] = mapped_column(String(32))
    progress_step: Mapped[int | None] = mapped_column(Integer)
    progress_total: Mapped[int | None] = mapped_column(Integer)
    progress_eta_seconds: Mapped[float | None] = mapped_column(Float)
    # Sets digests and counts ({"forget_digest", "retain_digest", "forget", "retain", ...}).
    sets: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    work_dir: Mapped[str | None] = mapped_column(Text)
    timings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    verification_round: Mapped[int] = mapped_column(Integer, default=0)
    escalated: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None]
    # Random token of the current stage claim (services/jobs.py): every write a stage makes
    # is conditional on it, so a copy whose claim was taken over changes nothing.
    claim_token: Mapped[str | None] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(150))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    dead_lettered_at: Mapped[datetime | None]

    model: Mapped[Model] = relationship(foreign_keys=[model_id])
    requests: Mapped[list[ErasureRequest]] = relationship(
        secondary="job_requests", order_by="ErasureRequest.id"
    )


class JobRequest(Base):
    __tablename__ = "job_requests"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    request_id: Mapped[int] = mapped_column(
        ForeignKey("erasure_requests.id"), primary_key=True, index=True
    )


class VerificationResult(Base):
    __tablename__ = "verification_results"
    __table_args__ = (UniqueConstraint("job_id", "round", "metric"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    round: Mapped[int] = mapped_column(Integer, default=0)
    metric: Mapped[str] = mapped_column(String(64))
    value: Mapped[float | None] = mapped_column(Float)
    threshold: Mapped[float | None] = mapped_column(Float)
    comparator: Mapped[str | None] = mapped_column(String(4))
    passed: Mapped[bool | None] = mapped_column(Boolean)
    policy_name: Mapped[str] = mapped_column(String(64))
    policy_version: Mapped[str] = mapped_column(String(32))
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class VerificationReport(Base):
    """The engine's report for one candidate, stored when verification ends; append-only.

    Certification signs what this row holds (canonical JSON, ``digest`` = its sha256),
    never a file: a report file in the job's work folder that differs from it is an
    integrity failure.
    """

    __tablename__ = "verification_reports"
    __table_args__ = (UniqueConstraint("job_id", "candidate_checkpoint_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    round: Mapped[int] = mapped_column(Integer, default=0)
    candidate_checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id"))
    report: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(HASH))
    passed: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# ---------------------------------------------------------------- append-only chains


class Certificate(Base):
    """A signed deletion certificate; append-only (PostgreSQL triggers refuse changes)."""

    __tablename__ = "certificates"

    id: Mapped[int] = mapped_column(primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, unique=True)
    certificate_id: Mapped[str] = mapped_column(String(64), unique=True)
    payload: Mapped[str] = mapped_column(Text)  # canonical JSON text, hashed as stored
    payload_hash: Mapped[str] = mapped_column(String(HASH))
    prev_hash: Mapped[str] = mapped_column(String(HASH))
    signature: Mapped[str] = mapped_column(Text)  # base64 Ed25519 signature
    key_id: Mapped[str] = mapped_column(String(128))
    signed_at: Mapped[datetime]
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), index=True)


class AuditEvent(Base):
    """One entry of the hash-chained audit trail; append-only.

    ``details`` holds the canonical JSON text exactly as hashed, so that any change
    to any stored byte changes the recomputed hash.
    """

    __tablename__ = "audit_events"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(150))
    action: Mapped[str] = mapped_column(String(64), index=True)
    object_type: Mapped[str] = mapped_column(String(32))
    object_ref: Mapped[str] = mapped_column(String(64))
    details: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(HASH))
    hash: Mapped[str] = mapped_column(String(HASH), unique=True)

    __table_args__ = (Index("ix_audit_events_object", "object_type", "object_ref"),)

    @property
    def details_dict(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.details)
        return loaded


class AuditSeal(Base):
    """A keyed seal over the audit chain up to ``sealed_seq``; append-only.

    ``mac`` is HMAC-SHA256 under a key only the sealing worker holds
    (``deletion.domain.seals``), over the seal's canonical JSON.  Because each event's
    hash covers every earlier one, a seal vouches for the whole chain up to its seq:
    whoever rewrites those rows must also forge a seal, which needs the key.
    """

    __tablename__ = "audit_seals"

    id: Mapped[int] = mapped_column(primary_key=True)
    sealed_seq: Mapped[int] = mapped_column(BigInteger, index=True)
    chain_hash: Mapped[str] = mapped_column(String(HASH))
    key_id: Mapped[str] = mapped_column(String(32))
    mac: Mapped[str] = mapped_column(String(HASH))
    sealed_at: Mapped[datetime]


class CertificateVerifiedHead(Base):
    """A point of the certificate chain that a full or incremental walk verified; append-only.

    ``signature`` is Ed25519, by the signing key, over the record's canonical JSON
    (``deletion.domain.certificate_heads``), so a reader that holds only the public
    key ring can check it and start its walk there; an unsigned or altered row is
    never trusted.
    """

    __tablename__ = "certificate_verified_heads"

    id: Mapped[int] = mapped_column(primary_key=True)
    verified_seq: Mapped[int] = mapped_column(BigInteger, index=True)
    chain_hash: Mapped[str] = mapped_column(String(HASH))
    from_seq: Mapped[int] = mapped_column(BigInteger)  # where the walk began (0: genesis)
    key_id: Mapped[str] = mapped_column(String(128))
    signature: Mapped[str] = mapped_column(String(128))  # hex Ed25519 signature
    verified_at: Mapped[datetime]


class ChainHead(Base):
    """The tip of a hash chain; appenders lock this row so the chain cannot fork."""

    __tablename__ = "chain_heads"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)
    hash: Mapped[str] = mapped_column(String(HASH))


# ------------------------------------------------------------- Art. 19 and the outbox


class Recipient(Base):
    """Someone to whom a model's personal data (or its outputs) were disclosed."""

    __tablename__ = "recipients"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id"))  # None: all models
    kind: Mapped[str] = mapped_column(String(16))  # "webhook" or "manual"
    endpoint_url: Mapped[str | None] = mapped_column(Text)
    # Webhook signing secret, encrypted like subject identifiers.
    secret_ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary)
    secret_key_id: Mapped[str | None] = mapped_column(String(32))
    # As erasure_requests.subject_ad_version; 2 binds the ciphertext to this row's id.
    secret_ad_version: Mapped[int] = mapped_column(Integer, default=2, server_default=text("1"))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Notification(Base):
    """Art. 19: that a recipient was told of an erasure, or why they were not."""

    __tablename__ = "notifications"
    __table_args__ = (UniqueConstraint("request_id", "recipient_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("erasure_requests.id"), index=True)
    recipient_id: Mapped[int] = mapped_column(ForeignKey("recipients.id"))
    status: Mapped[str] = mapped_column(String(24))  # pending, sent, failed, not_sent
    reason: Mapped[str | None] = mapped_column(Text)  # why not (impossible, disproportionate)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_attempt_at: Mapped[datetime | None]
    next_attempt_at: Mapped[datetime | None]
    sent_at: Mapped[datetime | None]
    response_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class OutboxMessage(Base):
    """A task to enqueue once the transaction that wrote it has committed."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(primary_key=True)
    task_name: Mapped[str] = mapped_column(String(200))
    args: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
