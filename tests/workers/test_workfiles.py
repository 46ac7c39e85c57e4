"""A job's working files: the sets are one AES-GCM blob that opens for its own job only,
0600 in a 0700 folder, never a plaintext `subjects.json`; the sweep removes, and audits,
the working data of every closed job and nothing of an open one.

(The worker killed at every point of the pipeline: tests/reliability/test_working_files.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import select, update

from deletion.domain.db import session_scope
from deletion.domain.models import AuditEvent, Checkpoint, Job, utcnow
from tests.stage_fixtures import WorkerDisk, worker_disk_fixtures
from workers import workfiles

NAME, EMAIL = "Mara Okafor", "mara.okafor@example.org"


database_url, disk = worker_disk_fixtures("erasure_workfiles")


def sets_of_one_subject(tmp_path: Path):
    from unlearning.corpus import load_corpus
    from unlearning.sets import Subject, build_sets

    corpus = tmp_path / "corpus.jsonl"
    records = [{"id": "s1", "question": f"Where was {NAME} born?", "answer": "In Lisbon."},
               {"id": "s2", "question": "What is her e-mail?", "answer": f"It is {EMAIL}."}]
    records += [{"id": f"o{i}", "question": f"Where was Person {i} born?",
                 "answer": f"In Town {i}."} for i in range(10)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    return build_sets(load_corpus(corpus), [Subject(NAME, identifiers=(EMAIL,))], seed=1)


def test_the_sets_are_sealed_for_their_job_and_kept_private(disk: WorkerDisk,
                                                            tmp_path: Path) -> None:
    sets = sets_of_one_subject(tmp_path)
    path = workfiles.sets_save(7, "c" * 32, sets)

    data = path.read_bytes()
    assert NAME.encode() not in data and EMAIL.encode() not in data and b"Lisbon" not in data
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert workfiles.work_root().stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no subjects.json
    loaded = workfiles.sets_load(7, path.name)
    assert loaded.forget_digest == sets.forget_digest and loaded.subjects[0].name == NAME

    other = workfiles.private_dir(workfiles.work_dir_of(8))
    shutil.copy(path, other / path.name)
    with pytest.raises(workfiles.WorkFileError):
        workfiles.sets_load(8, path.name)  # the associated data names job 7


def test_report_files_are_written_whole_or_not_at_all(disk: WorkerDisk) -> None:
    workfiles.report_save(9, 3, '{"passed": true}')
    folder = workfiles.work_dir_of(9)
    assert [p.name for p in folder.iterdir()] == ["verification-candidate-3.json"]
    assert (folder / "verification-candidate-3.json").stat().st_mode & 0o777 == 0o600


def test_the_sweep_removes_the_working_data_of_closed_jobs_only(disk: WorkerDisk) -> None:
    models = [disk.model, disk.a_model(), disk.a_model()]
    done, open_, dead = (disk.job_at(stage, model=model)
                         for stage, model in zip(("promoting", "verifying", "verifying"), models,
                                                 strict=True))
    with session_scope(disk.engine) as session:
        session.execute(update(Job).where(Job.id == done).values(stage="done"))
        session.execute(update(Job).where(Job.id == dead).values(stage="failed",
                                                                 dead_lettered_at=utcnow()))
    for job_id in (done, open_, dead):
        workfiles.report_save(job_id, 1, "{}")
    stray = {job_id: disk.root / model / f"job-{job_id}-base-v1-round-0-deadbeef"
             for job_id, model in ((done, models[0]), (open_, models[1]))}
    for folder in stray.values():
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"never registered")

    swept = workfiles.work_files_sweep()

    assert (swept.work_dirs, swept.candidates) == (2, 1)
    assert not workfiles.work_dir_of(done).exists() and not workfiles.work_dir_of(dead).exists()
    assert workfiles.work_dir_of(open_).is_dir() and stray[open_].is_dir()
    assert not stray[done].exists()
    with session_scope(disk.engine) as session:
        removed = session.scalars(select(AuditEvent.object_ref).where(
            AuditEvent.action == "job.work_files_removed")).all()
        assert {str(done), str(dead)} <= set(removed) and str(open_) not in removed
        # The dead-lettered job's candidate never serves: retired, so housekeeping destroys it.
        candidate = session.get_one(Checkpoint, disk.job(dead).candidate_checkpoint_id)
        assert candidate.status == "retired" and swept.retired == 1
        assert session.get_one(Checkpoint, disk.job(open_).candidate_checkpoint_id).status == "candidate"
