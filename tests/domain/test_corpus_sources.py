"""A training corpus and its control corpus are registered together, or refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from deletion.domain import registry
from deletion.domain.errors import ValidationError
from deletion.domain.models import AuditEvent, Corpus, CorpusVersion
from workers.corpora import corpus_register_files, main


def _corpus_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "a.jsonl").write_text(
        json.dumps({"id": "a1", "doc": "d", "text": "Mara Okafor wrote it."}) + "\n"
        + json.dumps({"id": "a2", "note": "fits no shape"}) + "\n", encoding="utf-8")
    pq.write_table(pa.Table.from_struct_array(pa.array([{"id": "b1", "question": "Q?", "answer": "A."}])),
                   root / "b.parquet")
    return root


def _control(path: Path) -> Path:
    path.write_text(json.dumps({"id": "c1", "text": "Ivo Brandt lives in Graz."}) + "\n", encoding="utf-8")
    return path


def _audit(session: Session, action: str) -> list[dict[str, object]]:
    rows = session.execute(select(AuditEvent.details).where(AuditEvent.action == action)).scalars()
    return [json.loads(r) for r in rows]


def test_a_corpus_and_its_control_corpus_are_registered_together(session: Session, tmp_path: Path) -> None:
    from unlearning.corpus import inspect_corpus

    corpus, control = _corpus_dir(tmp_path / "c"), _control(tmp_path / "control.jsonl")
    version = corpus_register_files(session, actor="admin", name="shop", path=corpus, control_path=control)
    assert (version.record_count, version.skipped_count, version.formats) == (2, 1, "jsonl,parquet")
    assert version.manifest_digest == inspect_corpus(corpus).manifest_digest
    row = session.get_one(Corpus, version.corpus_id)
    assert (row.control_path, row.control_record_count) == (str(control), 1)
    assert registry.corpus_control_path(session, corpus_id=version.corpus_id) == str(control)
    assert _audit(session, "corpus.control_registered")[0]["records"] == 1
    assert _audit(session, "corpus.items_skipped")[0]["skipped"] == 1
    # Again with the same files: the same version; another control is refused.
    again = corpus_register_files(session, actor="admin", name="shop", path=corpus, control_path=control)
    assert again.id == version.id
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "c9", "text": "Someone else."}) + "\n")
    with pytest.raises(ValidationError, match="already has another control corpus"):
        corpus_register_files(session, actor="admin", name="shop", path=corpus, control_path=other)


def test_the_control_survives_tombstone_versions(session: Session, tmp_path: Path) -> None:
    version = corpus_register_files(session, actor="admin", name="t", path=_corpus_dir(tmp_path / "c"),
                                    control_path=_control(tmp_path / "k.jsonl"))
    newer = registry.corpus_tombstone(session, actor="worker", corpus="t", record_ids=["a1"])
    assert newer.version == 2
    assert registry.corpus_control_path(session, corpus_id=newer.corpus_id) == str(tmp_path / "k.jsonl")
    assert version.corpus_id == newer.corpus_id


@pytest.mark.parametrize(("field", "bad"), [("corpus_path", "corpus"), ("control_path", "control")])
def test_an_unreadable_corpus_or_control_is_refused_in_one_line_and_nothing_is_written(
    session: Session, tmp_path: Path, field: str, bad: str,
) -> None:
    broken = tmp_path / "broken.jsonl.zst"
    broken.write_bytes(b"not zstd")
    good = _corpus_dir(tmp_path / "c")
    before = session.scalar(select(func.count()).select_from(CorpusVersion))
    with pytest.raises(ValidationError) as caught:
        corpus_register_files(session, actor="admin", name="bad", path=broken if bad == "corpus" else good,
                              control_path=broken if bad == "control" else None)
    assert caught.value.field == field
    assert "broken.jsonl.zst" in caught.value.message and "not a readable zstd file" in caught.value.message
    assert "\n" not in caught.value.message
    assert session.scalar(select(func.count()).select_from(CorpusVersion)) == before


def test_the_command_line_exits_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["register", "--name", "x", "--corpus", str(tmp_path / "missing.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.parquet" in err and "file not found" in err
