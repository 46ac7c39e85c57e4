"""A job's working files: encrypted at rest, private, and swept once the job is closed.

The sets of a job (forget and retain records, probes, the subjects' names, aliases,
e-mails and phone numbers) are personal data.  In the service they are written only
as one AES-256-GCM blob (`ErasureSets.dumps()`), encrypted with the service's
encryption key and associated data naming the job, so the bytes open for this job
only; the file is created 0600 inside a 0700 folder, written to a temporary name,
fsync'd and renamed, so a crash never leaves half a file.  Nothing else of a job is
written in clear: the verification report copy (`verification-candidate-N.json`) holds
metrics and verdicts, no names.  (`ErasureSets.save(dir)` with its plaintext
`subjects.json` remains for the engine's CLI, never the service.)

Each claim writes its own sets file (named after its claim token; `jobs.sets.sets_file`
says which one the job uses) and its own candidate folder, so two copies of a stage
never write, or delete, each other's files.

Removal is recorded in the audit trail (`job.work_files_removed`): at once when a job
is done or rejected, and by beat's sweep (`work_files_sweep`) for every job that closed
without it (dead-lettered, a crash between the job's last commit and the removal, a
cancelled request) and for candidate folders that were never registered (a worker
killed between writing a candidate and registering it, a copy that lost its claim).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from deletion.domain import crypto
from deletion.domain.audit import audit_append
from deletion.domain.canonical import sha256_hex
from deletion.domain.db import session_scope
from deletion.domain.errors import PermanentJobError
from deletion.domain.models import Checkpoint, Job
from deletion.domain.services.certification import ReportMismatch
from deletion.domain.states import JOB_TERMINAL
from workers.runtime import config, engine

log = logging.getLogger(__name__)

ACTOR = "system:housekeeping"
WORK_FOLDER = "_work"
SETS_CONTEXT = "erasure-work.sets"
SETS_MAGIC = b"erasure-sets/1\n"
_JOB_DIR = re.compile(r"^job-(\d+)$")
_CANDIDATE_DIR = re.compile(r"^job-(\d+)-")


class WorkFileError(PermanentJobError):
    """A working file that does not open (wrong job, tampered, unknown key): an integrity
    failure, not something a retry fixes."""


# ------------------------------------------------------------------------ paths


def work_root() -> Path:
    return config().checkpoint_dir / WORK_FOLDER


def work_dir_of(job_id: int) -> Path:
    """Scratch space of one job: mode 0700, removed when the job is closed."""
    return work_root() / f"job-{job_id}"


def sets_file_name(claim: str) -> str:
    return f"sets-{claim[:12]}.aesgcm"


def report_path_of(job_id: int, candidate_id: int) -> Path:
    """One report per candidate: a re-based or escalated job never reuses a stale verdict."""
    return work_dir_of(job_id) / f"verification-candidate-{candidate_id}.json"


def candidate_dir_of(model_name: str, job_id: int, round_: int, base_version: int,
                     claim: str) -> Path:
    """Per claim: a copy that lost its claim never writes into, or removes, the winner's."""
    return (config().checkpoint_dir / model_name
            / f"job-{job_id}-base-v{base_version}-round-{round_}-{claim[:8]}")


def private_dir(path: Path) -> Path:
    """Create `path` (and the work root) with mode 0700, whatever the umask."""
    for folder in (work_root(), path):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write `path` atomically with mode 0600: a temporary name, fsync, rename, fsync the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


# ------------------------------------------------------------------------- sets


def sets_save(job_id: int, claim: str, sets: Any) -> Path:
    """Encrypt `sets.dumps()` for this job and write it; returns the file."""
    keys = crypto.keyring()
    sealed, key_id = keys.encrypt(sets.dumps(), context=SETS_CONTEXT, row=f"job-{job_id}")
    folder = private_dir(work_dir_of(job_id))
    path = folder / sets_file_name(claim)
    write_private(path, SETS_MAGIC + key_id.encode("ascii") + b"\n" + sealed)
    return path


def sets_present(job_id: int, name: str | None) -> bool:
    return bool(name) and (work_dir_of(job_id) / str(name)).is_file()


def sets_load(job_id: int, name: str) -> Any:
    """Decrypt and load a job's sets (`ErasureSets.loads` re-checks every digest)."""
    from unlearning.sets import ErasureSets

    data = (work_dir_of(job_id) / name).read_bytes()
    if not data.startswith(SETS_MAGIC):
        raise WorkFileError(f"job {job_id}: {name} is not an encrypted sets file")
    key_id, _, sealed = data[len(SETS_MAGIC):].partition(b"\n")
    try:
        blob = crypto.keyring().decrypt(sealed, key_id_=key_id.decode("ascii"),
                                        context=SETS_CONTEXT, row=f"job-{job_id}")
    except (crypto.DecryptionError, UnicodeDecodeError) as exc:
        raise WorkFileError(f"job {job_id}: {name} does not open ({exc})") from exc
    return ErasureSets.loads(blob)


def sets_files_discard(job_id: int, *, keep: str) -> None:
    """Remove the sets files of earlier claims of this job (a rebuilt set replaces them)."""
    folder = work_dir_of(job_id)
    if not folder.is_dir():
        return
    for path in folder.glob("sets-*.aesgcm"):
        if path.name != keep:
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------------- reports


def report_save(job_id: int, candidate_id: int, text: str) -> None:
    """The working copy of a report the database now holds (written after the commit)."""
    private_dir(work_dir_of(job_id))
    write_private(report_path_of(job_id, candidate_id), text.encode("utf-8"))


def report_file_check(job_id: int, candidate_id: int, digest: str) -> None:
    """`ReportMismatch` when the report file of this candidate differs from the stored one."""
    path = report_path_of(job_id, candidate_id)
    if path.is_file() and sha256_hex(path.read_bytes()) != digest:
        raise ReportMismatch(f"job {job_id}: the report file of candidate {candidate_id} differs "
                             "from the report stored when verification ended")


# ---------------------------------------------------------------------- removal


def _count_files(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def _remove_tree(path: Path) -> int:
    """Delete a folder and everything in it; returns how many files it held."""
    files = _count_files(path)
    shutil.rmtree(path)
    return files


def work_files_remove(job_id: int, *, reason: str, actor: str = ACTOR) -> bool:
    """Delete the job's work folder, then record it; False when there was none."""
    folder = work_dir_of(job_id)
    if not folder.exists():
        return False
    files = _remove_tree(folder)
    with session_scope(engine()) as session:
        audit_append(session, actor=actor, action="job.work_files_removed", object_type="job",
                     object_ref=str(job_id), details={"reason": reason, "files": files})
    log.info("job %s: work files removed (%s, %s file(s))", job_id, reason, files)
    return True


@dataclass(frozen=True)
class Sweep:
    work_dirs: int  # job work folders removed
    candidates: int  # unregistered candidate folders removed
    retired: int  # registered candidates of closed jobs retired (destroyed by housekeeping)


def _closed(job: Job | None) -> bool:
    return job is None or job.stage in JOB_TERMINAL or job.dead_lettered_at is not None


def work_files_sweep() -> Sweep:
    """Remove the working data of every closed job, and every unregistered candidate
    folder of a closed job; each removal is audited."""
    root = config().checkpoint_dir
    work_dirs = candidates = 0
    for folder in sorted(work_root().iterdir()) if work_root().is_dir() else []:
        match = _JOB_DIR.match(folder.name)
        if not match or not folder.is_dir():
            continue
        job_id = int(match.group(1))
        with session_scope(engine()) as session:
            job = session.get(Job, job_id)
            closed, stage = _closed(job), job.stage if job else "missing"
        if closed:
            try:
                work_dirs += work_files_remove(job_id, reason=f"sweep: job {stage}")
            except OSError as exc:
                log.error("job %s: work files not removed: %s", job_id, type(exc).__name__)
    with session_scope(engine()) as session:
        registered = {Path(d).resolve() for d in session.scalars(select(Checkpoint.directory))}
    for model_dir in sorted(root.iterdir()) if root.is_dir() else []:
        if model_dir.name == WORK_FOLDER or not model_dir.is_dir() or model_dir.is_symlink():
            continue
        for folder in sorted(model_dir.iterdir()):
            match = _CANDIDATE_DIR.match(folder.name)
            if not match or not folder.is_dir() or folder.resolve() in registered:
                continue
            job_id = int(match.group(1))
            with session_scope(engine()) as session:
                job = session.get(Job, job_id)
                if not _closed(job):
                    continue  # a stage may be writing it right now
                files = _remove_tree(folder)
                audit_append(session, actor=ACTOR, action="checkpoint.unregistered_removed",
                             object_type="job", object_ref=str(job_id),
                             details={"folder": f"{model_dir.name}/{folder.name}",
                                      "files": files})
            candidates += 1
            log.info("job %s: unregistered candidate folder %s removed", job_id, folder.name)
    return Sweep(work_dirs, candidates, _retire_candidates_of_closed_jobs())


def _retire_candidates_of_closed_jobs() -> int:
    """A rejected or dead-lettered job's candidate never serves: retire it (the services
    do so when they close the job; this catches jobs closed before they did)."""
    from deletion.domain import registry
    from deletion.domain.states import CheckpointStatus, JobStage

    retired = 0
    with session_scope(engine()) as session:
        rows = session.execute(
            select(Job.id, Checkpoint.id).join(Checkpoint, Checkpoint.id == Job.candidate_checkpoint_id)
            .where(Checkpoint.status == CheckpointStatus.CANDIDATE,
                   (Job.stage == JobStage.REJECTED) | Job.dead_lettered_at.is_not(None))
        ).all()
        for job_id, checkpoint_id in rows:
            registry.checkpoint_retire(session, actor=ACTOR, checkpoint_id=checkpoint_id,
                                       reason=f"sweep: job {job_id} closed without serving it")
            retired += 1
    return retired
