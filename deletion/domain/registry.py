"""The model registry: models, checkpoints and their serving pointer, corpora and tombstones.

Promotion moves a model's ``serving`` pointer inside the caller's transaction, which
is the one that also wrote the deletion certificate: a checkpoint never serves without
its certificate, and a certificate never exists for a checkpoint that failed to serve.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from deletion.domain import config
from deletion.domain.audit import audit_append
from deletion.domain.canonical import canonical_time, sha256_hex
from deletion.domain.errors import DomainError, NotFound, PermanentJobError, ValidationError
from deletion.domain.models import (
    Certificate,
    Checkpoint,
    CheckpointCertificate,
    Corpus,
    CorpusTombstone,
    CorpusVersion,
    Job,
    Model,
    utcnow,
)
from deletion.domain.states import CheckpointStatus, check_checkpoint_transition

logger = logging.getLogger(__name__)

CHUNK = 1 << 20


class StaleBase(DomainError):
    """The job's base checkpoint no longer serves: re-base the job, do not promote."""

    status = 409


# ----------------------------------------------------------------------- digests


def checkpoint_digest(directory: str | os.PathLike[str]) -> str:
    """sha256 hex of the lines ``<relative posix path>:<sha256 hex>\\n`` of every regular
    file under ``directory``, sorted by path (docs/internals.md; the engine's
    ``unlearning.checkpoints.checkpoint_digest`` implements the same recipe).

    A symlink (or any file that is not regular) anywhere under the directory is refused
    with ``ValidationError``, not skipped: a skipped link would let bytes outside the
    digest (code named by ``auto_map``, say) load with the checkpoint.
    """
    root = Path(directory)
    if root.is_symlink() or not root.is_dir():
        raise ValidationError("directory", f"not a directory: {root}")
    lines = []
    for current, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(current, name)
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
                raise ValidationError(
                    "directory", f"{path.relative_to(root).as_posix()} in {root} is {kind}: refused")
            lines.append(f"{path.relative_to(root).as_posix()}:{_file_sha256(path)}\n")
        # os.walk lists a symlinked folder among `dirs` without following it: refused above.
    return sha256_hex("".join(sorted(lines)))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class CheckpointCorrupted(PermanentJobError):
    """A checkpoint's files no longer hash to the digest it was registered with."""


def checkpoint_check_files(checkpoint: Checkpoint) -> None:
    """Raise ``CheckpointCorrupted`` unless the files still match the registered digest.

    Called before a checkpoint is unlearned from (the base) and before one is
    certified and promoted (the candidate): a certificate must name the bytes that
    serve, and a job must not start from bytes nobody registered.  A missing
    directory counts as corrupted.
    """
    actual = checkpoint_files_digest(checkpoint.directory)
    if actual != checkpoint.digest:
        raise CheckpointCorrupted(
            f"checkpoint {checkpoint.id} (v{checkpoint.version}) no longer matches its "
            f"registered digest {checkpoint.digest[:12]} (files now: {actual[:12]})"
        )


MISSING = "missing"
REFUSED = "refused"


def checkpoint_files_digest(directory: str) -> str:
    """The digest of the files now, or ``missing`` / ``refused`` (a symlink or special
    file inside): never equal to a registered digest."""
    root = Path(directory)
    if not root.is_dir():
        return MISSING
    try:
        return checkpoint_digest(root)
    except ValidationError:
        return REFUSED
    except FileNotFoundError:  # removed while it was being hashed
        return MISSING


# ------------------------------------------------------------------------ models


def model_register(
    session: Session,
    *,
    actor: str,
    name: str,
    description: str = "",
    corpus_name: str | None = None,
    batch_window_hours: int | None = None,
) -> Model:
    if not name.strip():
        raise ValidationError("name", "a model needs a name")
    if session.execute(select(Model.id).where(Model.name == name)).first() is not None:
        raise ValidationError("name", f"model {name} is already registered")
    corpus_id = corpus_get(session, name=corpus_name).id if corpus_name else None
    model = Model(
        name=name, description=description, corpus_id=corpus_id,
        batch_window_hours=batch_window_hours or config.current().batch_window_hours,
        # Minutes only when no explicit hours were asked for (the configured default).
        batch_window_minutes=None if batch_window_hours else config.current().batch_window_minutes,
    )
    session.add(model)
    session.flush()
    audit_append(
        session, actor=actor, action="model.registered", object_type="model", object_ref=name,
        details={"corpus": corpus_name, "batch_window_hours": model.batch_window_hours},
    )
    return model


def model_get(session: Session, *, name: str, for_update: bool = False) -> Model:
    query = select(Model).where(Model.name == name)
    if for_update:
        query = query.with_for_update()
    model = session.execute(query).scalar_one_or_none()
    if model is None:
        raise NotFound(f"no model {name}")
    return model


MAX_BATCH_WINDOW_HOURS = 24 * 14


def model_schedule_update(
    session: Session, *, actor: str, name: str, batch_window_hours: int
) -> Model:
    """Change how long approved batch requests for a model wait to be merged into a job."""
    if not 1 <= batch_window_hours <= MAX_BATCH_WINDOW_HOURS:
        raise ValidationError(
            "batch_window_hours", f"between 1 and {MAX_BATCH_WINDOW_HOURS} hours"
        )
    model = model_get(session, name=name, for_update=True)
    previous = model.batch_window_hours
    model.batch_window_hours = batch_window_hours
    model.batch_window_minutes = None  # whole hours from now on
    audit_append(
        session, actor=actor, action="model.schedule_changed", object_type="model",
        object_ref=name, details={"batch_window_hours": batch_window_hours, "previous": previous},
    )
    return model


def model_list(session: Session) -> list[Model]:
    return list(session.execute(select(Model).order_by(Model.name)).scalars())


# ------------------------------------------------------------------- checkpoints


def checkpoint_register(
    session: Session,
    *,
    actor: str,
    model_name: str,
    directory: str,
    digest: str | None = None,
    parent_id: int | None = None,
    job_id: int | None = None,
    serving: bool = False,
) -> Checkpoint:
    """Register a checkpoint directory as the model's next version.

    ``serving=True`` is for the first checkpoint of a model only (bootstrap); later
    checkpoints serve through ``checkpoint_promote`` with a certificate.
    """
    model = model_get(session, name=model_name, for_update=True)
    if serving and model.serving_checkpoint_id is not None:
        raise DomainError(f"model {model_name} already serves; promote with a certificate")
    version = (session.execute(
        select(func.max(Checkpoint.version)).where(Checkpoint.model_id == model.id)
    ).scalar() or 0) + 1
    now = utcnow()
    checkpoint = Checkpoint(
        model_id=model.id, version=version, parent_id=parent_id, directory=str(directory),
        digest=digest or checkpoint_digest(directory),
        status=CheckpointStatus.SERVING if serving else CheckpointStatus.CANDIDATE,
        promoted_at=now if serving else None,
    )
    session.add(checkpoint)
    session.flush()
    if serving:
        model.serving_checkpoint_id = checkpoint.id
    if job_id is not None:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        job.candidate_checkpoint_id = checkpoint.id
    audit_append(
        session, actor=actor, action="checkpoint.registered", object_type="checkpoint",
        object_ref=f"{model_name}@{version}",
        details={"digest": checkpoint.digest, "parent_id": parent_id, "job": job_id,
                 "serving": serving},
    )
    return checkpoint


def checkpoint_promote(
    session: Session,
    *,
    actor: str,
    job_id: int,
    candidate_id: int,
    grace_hours: int | None = None,
    now: datetime | None = None,
) -> Checkpoint:
    """Make the job's candidate serve, retire the old serving checkpoint for destruction.

    Refuses with ``StaleBase`` when the job's base checkpoint no longer serves.  The
    candidate embodies the certificates issued for this job plus all of its parent's.
    """
    now = now or utcnow()
    job = session.get(Job, job_id, with_for_update=True)
    if job is None:
        raise NotFound(f"no job {job_id}")
    model = session.get(Model, job.model_id, with_for_update=True)
    candidate = session.get(Checkpoint, candidate_id, with_for_update=True)
    if model is None or candidate is None or candidate.model_id != model.id:
        raise NotFound(f"no candidate checkpoint {candidate_id} for job {job_id}")
    if model.serving_checkpoint_id != job.base_checkpoint_id:
        raise StaleBase(
            f"job {job_id} was built on checkpoint {job.base_checkpoint_id}, "
            f"but {model.serving_checkpoint_id} serves now"
        )
    certificates = list(session.execute(
        select(Certificate.id).where(Certificate.job_id == job_id)
    ).scalars())
    if not certificates:
        raise DomainError(f"job {job_id} has no certificate: nothing is promoted uncertified")
    candidate.status = check_checkpoint_transition(candidate.status, CheckpointStatus.SERVING)
    candidate.promoted_at = now
    old = session.get(Checkpoint, job.base_checkpoint_id, with_for_update=True)
    if old is not None:
        old.status = check_checkpoint_transition(old.status, CheckpointStatus.RETIRED)
        old.retired_at = now
        hours = config.current().checkpoint_grace_hours if grace_hours is None else grace_hours
        old.destroy_after = now + timedelta(hours=hours)
        inherited = session.execute(
            select(CheckpointCertificate.certificate_id)
            .where(CheckpointCertificate.checkpoint_id == old.id)
        ).scalars()
        certificates = sorted(set(certificates) | set(inherited))
    session.add_all(
        CheckpointCertificate(checkpoint_id=candidate.id, certificate_id=cid) for cid in certificates
    )
    model.serving_checkpoint_id = candidate.id
    session.flush()
    audit_append(
        session, actor=actor, action="checkpoint.promoted", object_type="checkpoint",
        object_ref=f"{model.name}@{candidate.version}",
        details={"job": job_id, "digest": candidate.digest,
                 "retired": old.id if old else None,
                 "destroy_after": canonical_time(old.destroy_after)
                 if old and old.destroy_after else None},
    )
    return candidate


class ServingCheckpointProtected(DomainError):
    """Only a promotion that replaces the serving checkpoint may retire it."""

    status = 409


def checkpoint_retire(
    session: Session, *, actor: str, checkpoint_id: int, reason: str, now: datetime | None = None
) -> Checkpoint:
    """Retire a candidate that will never serve (its job was rejected, re-based or
    dead-lettered); destroy it soon.

    Only a ``candidate`` may be retired here: a checkpoint that serves (or served) is
    retired by ``checkpoint_promote`` alone, in the transaction that makes its successor
    serve, so the serving pointer can never name a checkpoint that is due for destruction.
    """
    now = now or utcnow()
    checkpoint = _checkpoint(session, checkpoint_id)
    if checkpoint.status != CheckpointStatus.CANDIDATE or _serves(session, checkpoint.id):
        raise ServingCheckpointProtected(
            f"checkpoint {checkpoint_id} is {checkpoint.status}, not a candidate: "
            "only a promotion that replaces it retires it"
        )
    checkpoint.status = check_checkpoint_transition(checkpoint.status, CheckpointStatus.RETIRED)
    checkpoint.retired_at = now
    checkpoint.destroy_after = now
    audit_append(
        session, actor=actor, action="checkpoint.retired", object_type="checkpoint",
        object_ref=str(checkpoint_id), details={"reason": reason},
    )
    return checkpoint


def checkpoint_destroy(
    session: Session, *, actor: str, checkpoint_id: int, now: datetime | None = None
) -> Checkpoint:
    """Record that a retired checkpoint's files were deleted (the worker deletes them)."""
    checkpoint = _checkpoint(session, checkpoint_id)
    status = check_checkpoint_transition(checkpoint.status, CheckpointStatus.DESTROYED)
    checkpoint_check_destroyable(session, checkpoint)
    checkpoint.status = status
    checkpoint.destroyed_at = now or utcnow()
    audit_append(
        session, actor=actor, action="checkpoint.destroyed", object_type="checkpoint",
        object_ref=str(checkpoint_id), details={"digest": checkpoint.digest},
    )
    return checkpoint


def checkpoints_due_for_destruction(session: Session, *, now: datetime | None = None) -> list[Checkpoint]:
    return list(session.execute(
        select(Checkpoint).where(
            Checkpoint.status == CheckpointStatus.RETIRED,
            Checkpoint.destroy_after <= (now or utcnow()),
        ).order_by(Checkpoint.id)
    ).scalars())


def checkpoint_check_destroyable(session: Session, checkpoint: Checkpoint) -> None:
    """Raise unless the checkpoint is retired and no model's serving pointer names it.

    The worker calls this (row locked) before it deletes any file, and
    ``checkpoint_destroy`` again before it records the deletion.
    """
    if _serves(session, checkpoint.id):
        raise ServingCheckpointProtected(
            f"checkpoint {checkpoint.id} is a model's serving checkpoint: never destroyed")
    if checkpoint.status != CheckpointStatus.RETIRED:
        raise ServingCheckpointProtected(
            f"checkpoint {checkpoint.id} is {checkpoint.status}, not retired: not destroyed")


def _serves(session: Session, checkpoint_id: int) -> bool:
    return session.execute(
        select(Model.id).where(Model.serving_checkpoint_id == checkpoint_id).limit(1)
    ).first() is not None


def _checkpoint(session: Session, checkpoint_id: int) -> Checkpoint:
    checkpoint = session.get(Checkpoint, checkpoint_id, with_for_update=True)
    if checkpoint is None:
        raise NotFound(f"no checkpoint {checkpoint_id}")
    return checkpoint


# ----------------------------------------------------------------------- corpora


def corpus_register(
    session: Session,
    *,
    actor: str,
    name: str,
    path: str,
    manifest_digest: str,
    record_count: int | None = None,
) -> CorpusVersion:
    """Register a corpus (version 1), or return its current version if the digest matches."""
    corpus = session.execute(select(Corpus).where(Corpus.name == name)).scalar_one_or_none()
    if corpus is not None:
        current = corpus_current(session, name=name)
        if current.manifest_digest == manifest_digest:
            return current
        raise ValidationError("name", f"corpus {name} exists with other contents")
    corpus = Corpus(name=name)
    session.add(corpus)
    session.flush()
    version = CorpusVersion(
        corpus_id=corpus.id, version=1, path=path, manifest_digest=manifest_digest,
        record_count=record_count, tombstoned_count=0,
    )
    session.add(version)
    session.flush()
    audit_append(
        session, actor=actor, action="corpus.registered", object_type="corpus", object_ref=name,
        details={"manifest_digest": manifest_digest, "records": record_count},
    )
    return version


def corpus_get(session: Session, *, name: str) -> Corpus:
    corpus = session.execute(select(Corpus).where(Corpus.name == name)).scalar_one_or_none()
    if corpus is None:
        raise NotFound(f"no corpus {name}")
    return corpus


def corpus_current(session: Session, *, name: str) -> CorpusVersion:
    corpus = corpus_get(session, name=name)
    return session.execute(
        select(CorpusVersion).where(CorpusVersion.corpus_id == corpus.id)
        .order_by(CorpusVersion.version.desc()).limit(1)
    ).scalar_one()


def corpus_content_digest(session: Session, *, corpus_id: int) -> str:
    """The digest of a corpus's contents: its first version's manifest digest.  Tombstones
    make new versions of the same file (their digests name the excluded ids), so this is
    what a corpus index is built for and checked against (`workers.scan.open_index`)."""
    return session.execute(
        select(CorpusVersion.manifest_digest).where(CorpusVersion.corpus_id == corpus_id)
        .order_by(CorpusVersion.version.asc()).limit(1)
    ).scalar_one()


def corpus_tombstoned_ids(session: Session, *, name: str) -> set[str]:
    """Record ids no training or set building may use again."""
    corpus = corpus_get(session, name=name)
    return set(session.execute(
        select(CorpusTombstone.record_id).where(CorpusTombstone.corpus_id == corpus.id)
    ).scalars())


def corpus_tombstone(
    session: Session,
    *,
    actor: str,
    corpus: str,
    record_ids: Iterable[str],
    job_id: int | None = None,
) -> CorpusVersion:
    """Tombstone records; the result is a new corpus version (same file, fewer records).

    Its manifest digest is sha256 over the previous digest and the sorted new ids, so a
    version names exactly which records it excludes.  Already tombstoned ids are skipped.
    """
    current = corpus_current(session, name=corpus)
    already = corpus_tombstoned_ids(session, name=corpus)
    new_ids = sorted(set(record_ids) - already)
    if not new_ids:
        return current
    version = CorpusVersion(
        corpus_id=current.corpus_id, version=current.version + 1, path=current.path,
        manifest_digest=sha256_hex(current.manifest_digest + "\n" + "\n".join(new_ids)),
        record_count=current.record_count, tombstoned_count=len(already) + len(new_ids),
        job_id=job_id,
    )
    session.add(version)
    session.flush()
    session.add_all(
        CorpusTombstone(corpus_id=current.corpus_id, record_id=rid, version_id=version.id,
                        job_id=job_id)
        for rid in new_ids
    )
    audit_append(
        session, actor=actor, action="corpus.tombstoned", object_type="corpus", object_ref=corpus,
        details={"version": version.version, "records": len(new_ids), "job": job_id,
                 "manifest_digest": version.manifest_digest},
    )
    return version


# -------------------------------------------------------- corpus sources (control)


def corpus_register_sources(
    session: Session,
    *,
    actor: str,
    name: str,
    path: str,
    manifest_digest: str,
    record_count: int | None = None,
    formats: str | None = None,
    skipped_count: int | None = None,
    control_path: str | None = None,
    control_manifest_digest: str | None = None,
    control_record_count: int | None = None,
) -> CorpusVersion:
    """Register a training corpus together with its optional control corpus (records about
    people the model never saw), both already read by the caller (which computed their
    digests and counts; the domain reads no corpus files).

    Idempotent like ``corpus_register``: the same contents and the same control return the
    current version; another control for a corpus that has one is refused.
    """
    if control_path is not None and not control_manifest_digest:
        raise ValidationError("control_path", "a control corpus needs its manifest digest")
    existed = session.execute(select(Corpus.id).where(Corpus.name == name)).first() is not None
    version = corpus_register(session, actor=actor, name=name, path=path, manifest_digest=manifest_digest,
                              record_count=record_count)
    corpus = session.get_one(Corpus, version.corpus_id)
    if not existed:
        version.formats = formats
        version.skipped_count = skipped_count
        if skipped_count:
            audit_append(
                session, actor=actor, action="corpus.items_skipped", object_type="corpus", object_ref=name,
                details={"version": version.version, "skipped": skipped_count,
                         "reason": "items that fit no record shape (text, question+answer, messages)"},
            )
    if control_path is None:
        return version
    if corpus.control_manifest_digest is not None:
        if corpus.control_manifest_digest != control_manifest_digest:
            raise ValidationError("control_path", f"corpus {name} already has another control corpus")
        return version
    corpus.control_path = control_path
    corpus.control_manifest_digest = control_manifest_digest
    corpus.control_record_count = control_record_count
    audit_append(
        session, actor=actor, action="corpus.control_registered", object_type="corpus", object_ref=name,
        details={"manifest_digest": control_manifest_digest, "records": control_record_count},
    )
    return version


def corpus_control_path(session: Session, *, corpus_id: int) -> str | None:
    """The registered control corpus of a corpus, or None (the verifier then builds its own)."""
    corpus = session.get(Corpus, corpus_id)
    if corpus is None:
        raise NotFound(f"no corpus {corpus_id}")
    return corpus.control_path
