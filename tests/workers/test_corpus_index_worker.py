"""The build-sets stage's look-up: a fresh corpus index gives the scan's sets; anything else scans."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.scan_fixtures import SUBJECTS, saved_bytes, trap_records, write_jsonl
from unlearning.sets import build_sets
from workers import scan

DIGEST = "c" * 64


@pytest.fixture
def index_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "indexes"
    monkeypatch.setattr(scan, "index_dir", lambda digest: home / digest[:32])
    return home


def _compute(corpus: Path, tmp_path: Path, **kwargs: Any) -> Any:
    return scan.compute_sets(corpus, SUBJECTS, job_work_dir=tmp_path / "job", seed=3,
                             exclude_ids=frozenset({"r00004"}), corpus_digest="v2", **kwargs)


def test_a_built_index_is_used_and_gives_the_scans_sets(tmp_path: Path, index_home: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", trap_records(11), 11)
    assert scan.build_corpus_index(corpus, DIGEST) is True
    assert scan.build_corpus_index(corpus, DIGEST) is False  # fresh: nothing to do
    assert (index_home / DIGEST[:32] / "manifest.json").is_file()
    assert (index_home.stat().st_mode & 0o777) == 0o700
    with caplog.at_level(logging.INFO, logger="workers.scan"):
        looked_up = _compute(corpus, tmp_path, content_digest=DIGEST)
    assert "corpus index look-up" in caplog.text
    scanned = build_sets(corpus, SUBJECTS, seed=3, exclude_ids={"r00004"}, corpus_digest="v2")
    assert saved_bytes(looked_up, tmp_path / "a") == saved_bytes(scanned, tmp_path / "b")


def test_a_stale_or_missing_index_falls_back_to_the_scan_and_says_so(
    tmp_path: Path, index_home: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", trap_records(12), 12)
    requested: list[tuple[Path, str]] = []
    monkeypatch.setattr(scan, "_request_index", lambda path, digest: requested.append((path, digest)))
    with caplog.at_level(logging.INFO, logger="workers.scan"):
        first = _compute(corpus, tmp_path, content_digest=DIGEST)
    assert "no usable corpus index (no index" in caplog.text
    assert requested == []  # a small corpus is scanned in seconds: no index asked for
    monkeypatch.setattr(scan, "INDEX_MIN_BYTES", 0)
    _compute(corpus, tmp_path, content_digest=DIGEST)
    assert requested == [(corpus, DIGEST)]
    scan.build_corpus_index(corpus, "e" * 64)  # an index of another digest (say the key's corpus changed)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="workers.scan"):
        again = _compute(corpus, tmp_path, content_digest=DIGEST)
    assert "no usable corpus index" in caplog.text
    assert saved_bytes(again, tmp_path / "a") == saved_bytes(first, tmp_path / "b")


def test_an_index_built_under_another_key_is_not_used(tmp_path: Path, index_home: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", trap_records(13), 13)
    scan.build_corpus_index(corpus, DIGEST)
    monkeypatch.setattr(scan, "index_key", lambda digest: b"rotated-blind-index-key-0123456789")
    index, why = scan.open_index(corpus, DIGEST)
    assert index is None and "another key" in why


def test_a_busy_lock_leaves_the_build_to_its_holder(tmp_path: Path, index_home: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", trap_records(14), 14)
    index_home.mkdir(mode=0o700)
    (index_home / f".{DIGEST[:32]}.lock").touch()
    assert scan.build_corpus_index(corpus, DIGEST) is False
    assert not (index_home / DIGEST[:32]).exists()


def test_the_index_task_is_registered() -> None:
    from workers.celery_app import app
    from workers.routing import DEFAULT_QUEUE, queue_for

    assert scan.BUILD_INDEX in app.tasks
    assert queue_for(scan.BUILD_INDEX) == DEFAULT_QUEUE
