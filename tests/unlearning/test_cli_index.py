"""`build-index` and `build-sets --index`: the same sets, byte for byte, as `build-sets` without it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.cli_run import run_cli as _run
from tests.scan_fixtures import trap_records, write_jsonl


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


SUBJECT = ("--subject", "Mara Okafor", "--alias", "M. Okafor", "--identifier", "mara.okafor@example.org",
           "--subject", "Zoë Strauß")


def test_build_sets_with_an_index_writes_the_same_sets(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", trap_records(21), 21)
    key = tmp_path / "keys" / "index.key"
    code, out, err = _run(capsys, "build-index", "--corpus", str(corpus), "--out", str(tmp_path / "idx"),
                          "--key-file", str(key))
    assert code == 0 and "indexed" in out, err
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    code, out, err = _run(capsys, "build-sets", "--corpus", str(corpus), *SUBJECT, "--out", str(tmp_path / "a"),
                          "--index", str(tmp_path / "idx"), "--key-file", str(key))
    assert code == 0 and "warning" not in err, err
    code, _, _ = _run(capsys, "build-sets", "--corpus", str(corpus), *SUBJECT, "--out", str(tmp_path / "b"))
    assert code == 0
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_a_stale_index_warns_and_scans(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", trap_records(22), 22)
    key = tmp_path / "index.key"
    _run(capsys, "build-index", "--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--key-file", str(key))
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write('{"id": "late", "text": "Mara Okafor again"}\n')
    code, out, err = _run(capsys, "build-sets", "--corpus", str(corpus), *SUBJECT, "--out", str(tmp_path / "a"),
                          "--index", str(tmp_path / "idx"), "--key-file", str(key))
    assert code == 0 and "changed since the index was built; scanning" in err
    assert b'"late"' in (tmp_path / "a" / "forget.jsonl").read_bytes()
    code, _, err = _run(capsys, "build-sets", "--corpus", str(corpus), *SUBJECT, "--out", str(tmp_path / "b"),
                        "--index", str(tmp_path / "idx"))
    assert code == 2 and "--key-file" in err
