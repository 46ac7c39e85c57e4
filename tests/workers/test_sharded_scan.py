"""A corpus of shards scanned by many processes gives the sets of one process, byte for byte."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.scan_fixtures import SUBJECTS, saved_bytes, trap_records, write_jsonl
from unlearning import sets as sets_module
from unlearning.corpus import load_corpus
from unlearning.sets import build_sets, build_sets_reference
from workers import scan


def _shard_dir(root: Path, seed: int, shards: int = 5) -> Path:
    records = trap_records(seed, 600)
    root.mkdir(parents=True)
    step = len(records) // shards
    for k in range(shards):
        write_jsonl(root / f"part-{k:02d}.jsonl", records[k * step:(k + 1) * step], seed + k)
    return root


def _scan_all(phase_dir: str, shards: Sequence[int]) -> None:
    for shard in shards:
        scan.scan_one_shard(Path(phase_dir), shard)


def _processes(count: int) -> scan.Dispatch:
    """Stand-ins for worker processes: each walks every shard, taking what is free."""
    context = multiprocessing.get_context("fork")

    def dispatch(phase_dir: Path, phase: str, shards: Sequence[int]) -> None:
        for n in range(count):
            order = list(shards) if n % 2 == 0 else list(reversed(shards))
            context.Process(target=_scan_all, args=(str(phase_dir), order), daemon=True).start()

    return dispatch


@pytest.mark.parametrize("processes", [0, 2])
def test_a_sharded_scan_equals_one_process_scanning_the_shards_in_order(
    tmp_path: Path, processes: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    corpus = _shard_dir(tmp_path / "corpus", seed=processes)
    tombstoned = frozenset({"r00007", "r00300"})
    single = build_sets(corpus, SUBJECTS, seed=11, exclude_ids=tombstoned, corpus_digest="d")
    reference = build_sets_reference(load_corpus(corpus), SUBJECTS, seed=11, exclude_ids=tombstoned,
                                     corpus_digest="d")
    sharded = scan.build_sets_sharded(corpus, SUBJECTS, scan_dir=tmp_path / "scan", seed=11,
                                      exclude_ids=tombstoned, corpus_digest="d",
                                      dispatch=_processes(processes) if processes else None)
    assert saved_bytes(sharded, tmp_path / "sharded") == saved_bytes(single, tmp_path / "single") \
        == saved_bytes(reference, tmp_path / "reference")
    assert sharded.counts()["forget_group"] > 0
    assert not (tmp_path / "scan").exists()  # identifiers and records do not stay behind


def test_the_sample_is_read_again_when_the_forget_set_outgrows_the_first_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sets_module, "RETAIN_POOL_MIN", 0)
    monkeypatch.setattr(sets_module, "RETAIN_MINIMUM", 0)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for k in range(3):
        lines = [{"id": f"s{k}-{i}", "text": f"Weather note {i} of shard {k}."} for i in range(1500)]
        lines += [{"id": f"m{k}-{i}", "text": f"Mara Okafor wrote entry {i}."} for i in range(60)]
        write_jsonl(corpus / f"p{k}.jsonl", lines, k)
    single = build_sets(corpus, SUBJECTS[:1], seed=3, retain_per_forget=2)
    sharded = scan.build_sets_sharded(corpus, SUBJECTS[:1], scan_dir=tmp_path / "scan", seed=3,
                                      retain_per_forget=2)
    assert saved_bytes(sharded, tmp_path / "a") == saved_bytes(single, tmp_path / "b")
    assert len(sharded.forget) == 180 and len(sharded.retain) == 360


def test_a_shard_task_is_idempotent_and_leaves_a_live_claim_alone(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = _shard_dir(tmp_path / "corpus", seed=4, shards=2)
    phase = tmp_path / "phase"
    phase.mkdir()
    spec = scan.ScanSpec(str(corpus), "match", [list(s.patterns()) for s in SUBJECTS], 1, 1 << 62, [], [])
    scan._write_atomic(phase / "spec.json", spec.to_json())
    (phase / "shard-00001.claim").touch()
    assert scan.scan_one_shard(phase, 0) is True
    assert scan.scan_one_shard(phase, 0) is False  # done: nothing to do twice
    assert scan.scan_one_shard(phase, 1) is False  # someone live holds it
    old = time.time() - scan.CLAIM_STALE_S - 5
    os.utime(phase / "shard-00001.claim", (old, old))
    assert scan.scan_one_shard(phase, 1) is True  # its holder is gone: taken over
    assert sorted(p.name for p in phase.iterdir()) == ["shard-00000.json", "shard-00001.json", "spec.json"]


def test_scan_files_are_private_and_encrypted_and_bound_to_their_path(tmp_path: Path) -> None:
    corpus = _shard_dir(tmp_path / "corpus", seed=5, shards=2)
    seen: list[tuple[Path, bytes, int]] = []

    def spy(phase_dir: Path, phase: str, shards: Sequence[int]) -> None:
        for shard in shards:  # scan as a worker would, then look at what lies on disk
            scan.scan_one_shard(phase_dir, shard)
        for path in sorted(phase_dir.iterdir()):
            seen.append((path, path.read_bytes(), path.stat().st_mode & 0o777))
        assert phase_dir.stat().st_mode & 0o777 == 0o700

    scan.build_sets_sharded(corpus, SUBJECTS, scan_dir=tmp_path / "scan", seed=1, dispatch=spy)
    assert seen
    names = [n for s in SUBJECTS for n in s.patterns()]
    for path, data, mode in seen:
        assert mode == 0o600, path.name
        assert data.startswith(scan.SCAN_MAGIC)
        assert not any(n.encode("utf-8") in data or n.lower().encode("utf-8") in data for n in names), path.name
    # A file copied under another name (or into another phase) does not open.
    phase = tmp_path / "elsewhere"
    phase.mkdir()
    (phase / "spec.json").write_bytes(seen[-1][1])
    with pytest.raises(scan.ScanFileError, match="does not open"):
        scan._read(phase / "spec.json")
    (phase / "plain.json").write_text("{}")
    with pytest.raises(scan.ScanFileError, match="not an encrypted scan file"):
        scan._read(phase / "plain.json")


def test_the_shard_task_is_registered_and_refuses_folders_outside_the_checkpoints(tmp_path: Path) -> None:
    from workers.celery_app import app

    task = app.tasks[scan.SCAN_SHARD]
    assert task.run("../../etc", 0) is False
