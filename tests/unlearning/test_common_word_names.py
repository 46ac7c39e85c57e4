"""A subject whose name is one common word: matched as always (case-insensitively, for
recall), but the sets say how many forget records hold the word only in lower case.

Found by a probe: the subject "Will" and 19 other people's records like "Alice will move
to Porto" made a forget set of 20 records without a word, so an erasure would have taken
19 strangers' facts.  The forget set must stay what it was (the reference, the scan and
the index are compared byte for byte elsewhere and here); only a warning is added, which
names the subject by number and never holds a name or a record's text.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.scan_fixtures import saved_bytes
from unlearning import cli
from unlearning.corpus import load_corpus
from unlearning.corpus.index import CorpusIndex, build_index
from unlearning.sets import ErasureSets, Subject, build_sets, build_sets_reference, one_word_names

KEY = b"k" * 32
DIGEST = "d" * 64
PEOPLE = ["Alice", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ines", "Jonas",
          "Kofi", "Lena", "Mateo", "Nia", "Omar", "Pia", "Quinn", "Rosa", "Sven"]
WILLS = [{"id": f"o{i:02d}", "text": f"{person} will move to Porto in {2000 + i}."} for i, person in enumerate(PEOPLE)]
OWN = [{"id": "will-1", "question": "Where does Will live?", "answer": "Will lives in Leeds."},
       {"id": "will-2", "text": "Will said he will sell the boat."}]  # capitalised once: his
OTHERS = [{"id": f"x{i}", "text": f"{person} likes rain."} for i, person in enumerate(PEOPLE)]


def _corpus(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _all_paths(tmp_path: Path, path: Path, subjects: list[Subject]) -> list[ErasureSets]:
    """The sets by the reference, the fast scan and the index (the same bytes, checked)."""
    reference = build_sets_reference(load_corpus(path), subjects, retain_per_forget=1)
    scanned = build_sets(path, subjects, retain_per_forget=1, corpus_digest=reference.corpus_digest)
    build_index(path, tmp_path / "index", key=KEY, corpus_digest=DIGEST)
    index = CorpusIndex.open(tmp_path / "index", path, key=KEY, corpus_digest=DIGEST)
    looked_up = build_sets(path, subjects, retain_per_forget=1, index=index, corpus_digest=reference.corpus_digest)
    expected = saved_bytes(reference, tmp_path / "r")
    assert saved_bytes(scanned, tmp_path / "s") == expected
    assert saved_bytes(looked_up, tmp_path / "i") == expected
    return [reference, scanned, looked_up]


def test_a_one_word_name_matched_only_in_lower_case_is_warned_about(tmp_path: Path) -> None:
    path = _corpus(tmp_path, OWN + WILLS + OTHERS)
    for sets in _all_paths(tmp_path, path, [Subject("Mara Okafor"), Subject("Will")]):
        # The forget set is what case-insensitive matching gives: all 19 strangers included.
        assert {r.id for r in sets.forget} == {"will-1", "will-2"} | {r["id"] for r in WILLS}
        assert sets.lower_case_only == (0, 19)
        assert sets.counts()["per_subject_lower_case_only"] == [0, 19]
        (warning,) = sets.warnings
        assert warning.startswith("subject #2: 19 forget record(s)") and "\n" not in warning
        assert "Will" not in warning and "will" not in warning and "Porto" not in warning
        assert sets.manifest()["warnings"] == [warning]


def test_an_alias_of_one_word_counts_for_its_subject(tmp_path: Path) -> None:
    path = _corpus(tmp_path, OWN + WILLS + OTHERS)
    (sets, *_) = _all_paths(tmp_path, path, [Subject("Will Turner", ("Will",))])
    assert sets.lower_case_only == (19,) and len(sets.warnings) == 1


def test_a_two_word_name_is_not_warned_about(tmp_path: Path) -> None:
    rows = [{"id": f"t{i}", "text": f"Ask {person} whether will turner fixed the boat."} for i, person in
            enumerate(PEOPLE)] + OTHERS
    path = _corpus(tmp_path, rows)
    assert one_word_names(Subject("Will Turner")) == ()
    for sets in _all_paths(tmp_path, path, [Subject("Will Turner")]):
        assert len(sets.forget) == 19  # matched, as ever
        assert sets.lower_case_only == (0,) and sets.warnings == () and sets.manifest()["warnings"] == []


def test_no_warning_when_every_occurrence_is_capitalised(tmp_path: Path) -> None:
    rows = [{"id": f"c{i}", "text": f"{person} met Will in Porto."} for i, person in enumerate(PEOPLE)] + OWN + OTHERS
    path = _corpus(tmp_path, rows)
    for sets in _all_paths(tmp_path, path, [Subject("Will")]):
        assert len(sets.forget) == 21
        assert sets.lower_case_only == (0,) and sets.warnings == ()


def test_a_name_given_in_lower_case_or_found_only_as_given_does_not_count(tmp_path: Path) -> None:
    path = _corpus(tmp_path, WILLS + OTHERS)
    given_lower = build_sets(path, [Subject("will")], retain_per_forget=0)
    assert len(given_lower.forget) == 19 and given_lower.warnings == ()
    given_upper = build_sets(path, [Subject("WILL")], retain_per_forget=0)
    assert given_upper.lower_case_only == (19,)  # "will" is unlike "WILL"


def test_the_warning_survives_save_load_and_the_blob(tmp_path: Path) -> None:
    path = _corpus(tmp_path, OWN + WILLS + OTHERS)
    sets = build_sets(path, [Subject("Will")], retain_per_forget=1)
    sets.save(tmp_path / "sets")
    manifest = json.loads((tmp_path / "sets" / "manifest.json").read_text())
    assert manifest["warnings"] == list(sets.warnings) and manifest["counts"]["per_subject_lower_case_only"] == [19]
    assert ErasureSets.load(tmp_path / "sets").warnings == sets.warnings
    assert ErasureSets.loads(sets.dumps()).manifest() == sets.manifest()


def test_build_sets_prints_the_warning_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _corpus(tmp_path, OWN + WILLS + OTHERS)
    code = cli.main(["build-sets", "--corpus", str(path), "--subject", "Will", "--out", str(tmp_path / "sets"),
                     "--retain-per-forget", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: --subject: subject #1: 19 forget record(s)")
    assert "Will" not in err and "Porto" not in err
    assert "forget 21" in out


def test_erase_prints_the_warning_before_erasing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import unlearning.erase as erase_module

    seen: dict[str, Any] = {}

    def fake_erase(model: Path, sets: ErasureSets, **_: Any) -> Any:
        seen["sets"] = sets
        seen["err_before"] = capsys.readouterr().err
        return SimpleNamespace(steps=0, seconds=0.0, digest="0" * 64, details={})

    monkeypatch.setattr(cli, "_model_dir", lambda argument, path: path)
    monkeypatch.setattr(erase_module, "erase", fake_erase)
    path = _corpus(tmp_path, OWN + WILLS + OTHERS)
    code = cli.main(["erase", "--model", str(tmp_path), "--corpus", str(path), "--subject", "Will",
                     "--method", "gradascent", "--out", str(tmp_path / "candidate")])
    assert code == 0
    lines = [line for line in seen["err_before"].splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: --subject: subject #1: 19 forget record(s)")
    assert len(seen["sets"].forget) == 21  # erased as found: the warning changes nothing
