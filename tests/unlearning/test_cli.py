from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_run import run_cli as _run
from unlearning.corpus import load_corpus
from unlearning.demo.corpus import load_people


def _one_line_error(err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_demo_corpus_writes_the_corpus(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "demo-corpus", "--out", str(tmp_path), "--people", "7", "--seed", "2")
    assert code == 0 and "84 records" in out  # 7 x 11 facts + 7 general sentences
    assert len(load_people(tmp_path / "people.jsonl")) == 7


def test_build_sets_writes_pinned_sets(capsys, tiny_corpus_dir: Path, tmp_path: Path) -> None:
    person = load_people(tiny_corpus_dir / "people.jsonl")[2]
    code, out, _ = _run(capsys, "build-sets", "--corpus", str(tiny_corpus_dir / "corpus.jsonl"),
                        "--subject", person["name"], "--alias", person["aliases"][0],
                        "--identifier", person["email"], "--out", str(tmp_path / "sets"))
    assert code == 0 and "forget 11" in out
    manifest = json.loads((tmp_path / "sets" / "manifest.json").read_text())
    assert manifest["forget_digest"] in out
    subjects = json.loads((tmp_path / "sets" / "subjects.json").read_text())["subjects"]
    assert subjects == [{"name": person["name"], "aliases": person["aliases"], "identifiers": [person["email"]]}]


def test_a_subject_found_nowhere_is_refused_by_position_not_name(capsys, tiny_corpus_dir: Path, tmp_path: Path) -> None:
    person = load_people(tiny_corpus_dir / "people.jsonl")[0]
    code, _, err = _run(capsys, "build-sets", "--corpus", str(tiny_corpus_dir / "corpus.jsonl"),
                        "--subject", person["name"], "--subject", "Nobody Atall", "--out", str(tmp_path / "s"))
    assert code == 2
    _one_line_error(err, "--subject", "#2", "matched no record")
    assert "Nobody" not in err


def test_a_missing_corpus_file_is_named(capsys, tmp_path: Path) -> None:
    code, _, err = _run(capsys, "build-sets", "--corpus", str(tmp_path / "none.jsonl"),
                        "--subject", "Ann Lee", "--out", str(tmp_path / "s"))
    assert code == 2
    _one_line_error(err, "--corpus", "file not found")


def test_a_record_that_fits_no_shape_is_named_in_a_warning_and_skipped(capsys, tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "Ann Lee"}\n{"question": "Q?"}\n')
    code, _, err = _run(capsys, "build-sets", "--corpus", str(corpus), "--subject", "Ann Lee",
                        "--out", str(tmp_path / "s"))
    assert code == 0
    assert "1 item(s) fit no record shape" in err and "c.jsonl:2: field 'answer'" in err
    assert "Q?" not in err


def test_a_corpus_directory_of_parquet_and_zstd_shards_is_accepted(capsys, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.Table.from_struct_array(pa.array([{"id": "p1", "text": "Ann Lee lives here."}])),
                   shards / "a.parquet")
    (shards / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b'{"id": "z1", "text": "Rain."}\n'))
    code, out, _ = _run(capsys, "build-sets", "--corpus", str(shards), "--subject", "Ann Lee",
                        "--retain-per-forget", "1", "--out", str(tmp_path / "s"))
    assert code == 0 and "forget 1, retain 1" in out


def test_an_unreadable_corpus_file_exits_2_naming_it(capsys, tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl.zst"
    corpus.write_bytes(b"not zstd")
    code, _, err = _run(capsys, "build-sets", "--corpus", str(corpus), "--subject", "Ann Lee",
                        "--out", str(tmp_path / "s"))
    assert code == 2
    _one_line_error(err, "--corpus", "c.jsonl.zst", "not a readable zstd file")


def test_an_unknown_method_is_named(capsys, tmp_path: Path) -> None:
    code, _, err = _run(capsys, "erase", "--model", str(tmp_path), "--corpus", "c.jsonl",
                        "--subject", "Ann Lee", "--method", "lobotomy", "--out", str(tmp_path / "o"))
    assert code == 2
    _one_line_error(err, "--method", "lobotomy")


def test_a_model_directory_that_does_not_load_is_named(capsys, tiny_corpus_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    for model in (tmp_path / "missing", broken):
        code, _, err = _run(capsys, "erase", "--model", str(model), "--corpus",
                            str(tiny_corpus_dir / "corpus.jsonl"), "--subject", "Ann Lee",
                            "--method", "asu", "--out", str(tmp_path / "o"))
        assert code == 2
        _one_line_error(err, "--model")


def test_verify_names_a_missing_base_model(capsys, tiny_arch_model_dir, tiny_corpus_dir: Path, tmp_path: Path) -> None:
    model = tiny_arch_model_dir("llama")
    capsys.readouterr()  # building the fixture may log
    code, _, err = _run(capsys, "verify", "--model", str(model),
                        "--base", str(tmp_path / "nope"), "--corpus", str(tiny_corpus_dir / "corpus.jsonl"),
                        "--subject", "Ann Lee", "--report", str(tmp_path / "r.json"))
    assert code == 2
    _one_line_error(err, "--base", "not a directory")


def test_an_alias_before_any_subject_is_rejected(capsys, tmp_path: Path) -> None:
    code, _, err = _run(capsys, "build-sets", "--corpus", "c.jsonl", "--alias", "A. Lee",
                        "--subject", "Ann Lee", "--out", str(tmp_path))
    assert code == 2
    _one_line_error(err, "--alias", "must follow a --subject")


def test_train_base_refuses_a_non_empty_output_directory(capsys, tiny_corpus_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    code, _, err = _run(capsys, "train-base", "--corpus", str(tiny_corpus_dir / "corpus.jsonl"),
                        "--out", str(tmp_path), "--preset", "tiny")
    assert code == 2
    _one_line_error(err, "--out", "not empty")


def test_the_module_runs_as_a_program(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "unlearning", "demo-corpus", "--out", str(tmp_path),
                           "--people", "3"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "manifest.json").is_file()


def test_erase_writes_a_candidate_checkpoint_with_its_parent_digest(
    capsys, tiny_base_model_dir: Path, tiny_corpus_dir: Path, tmp_path: Path,
) -> None:
    from unlearning.checkpoints import checkpoint_digest, read_metadata
    person = load_people(tiny_corpus_dir / "people.jsonl")[4]
    capsys.readouterr()
    code, out, err = _run(capsys, "-q", "erase", "--model", str(tiny_base_model_dir),
                          "--corpus", str(tiny_corpus_dir / "corpus.jsonl"), "--subject", person["name"],
                          "--method", "gradascent", "--hparams", '{"steps": 1}',
                          "--out", str(tmp_path / "candidate"))
    assert code == 0, err
    meta = read_metadata(tmp_path / "candidate")
    assert meta["method"] == "gradascent" and meta["hparams"]["steps"] == 1
    assert meta["parent_digest"] == checkpoint_digest(tiny_base_model_dir)
    assert checkpoint_digest(tmp_path / "candidate") in out


def test_erase_names_an_unknown_hyper_parameter(capsys, tiny_base_model_dir: Path, tiny_corpus_dir: Path, tmp_path: Path) -> None:
    person = load_people(tiny_corpus_dir / "people.jsonl")[4]
    capsys.readouterr()
    code, _, err = _run(capsys, "-q", "erase", "--model", str(tiny_base_model_dir),
                        "--corpus", str(tiny_corpus_dir / "corpus.jsonl"), "--subject", person["name"],
                        "--method", "gradascent", "--hparams", '{"tau": 3}', "--out", str(tmp_path / "c"))
    assert code == 2
    _one_line_error(err, "--hparams", "tau")


def test_verify_passes_the_built_sets_to_the_verifier_and_exits_1_when_it_fails(
    capsys, monkeypatch, tiny_arch_model_dir, tiny_corpus_dir: Path, tmp_path: Path,
) -> None:
    # The verifier itself is tested in test_verification*.py (minutes on the tiny model);
    # here only the command's wiring: sets built from the arguments, report written, exit code.
    import unlearning.verification as verification

    seen = {}

    class FakeReport:
        def to_json(self) -> dict:
            return {"passed": False, "metrics": {"leakage.forget": 1.0}}

    def fake_verify(candidate, base, sets, *, control=None, corpus=None, progress=None, **_):
        seen.update(candidate=candidate, base=base, sets=sets, control=control, corpus=corpus)
        return FakeReport()

    monkeypatch.setattr(verification, "verify", fake_verify)
    person = load_people(tiny_corpus_dir / "people.jsonl")[5]
    model = tiny_arch_model_dir("llama")
    capsys.readouterr()
    code, out, err = _run(capsys, "-q", "verify", "--model", str(model), "--base", str(model),
                          "--corpus", str(tiny_corpus_dir / "corpus.jsonl"),
                          "--subject", person["name"], "--alias", person["aliases"][0],
                          "--control", str(tiny_corpus_dir / "control_records.jsonl"),
                          "--report", str(tmp_path / "report.json"))
    assert code == 1 and "FAILED" in out, err
    assert json.loads((tmp_path / "report.json").read_text())["passed"] is False
    assert len(seen["sets"].forget) == 11 and seen["sets"].subjects[0].aliases == tuple(person["aliases"])
    control_ids = [r.id for r in load_corpus(tiny_corpus_dir / "control_records.jsonl").records]
    assert [r.id for r in seen["control"]] == control_ids  # read by the command, any corpus format
    assert seen["corpus"] == tiny_corpus_dir / "corpus.jsonl"  # the latent probes train on it


def _retry_fakes(monkeypatch, verdicts: list[bool]) -> list[dict]:
    """erase and verify stand-ins: each erase call recorded, each verify answering the next verdict
    (a failed surface-leakage check under the default policy, else a pass)."""
    import unlearning.erase as erase_module
    import unlearning.verification as verification
    from unlearning.erase import EraseResult

    calls: list[dict] = []

    def fake_erase(model_dir, sets, *, method, out_dir, hparams=None, **_):
        calls.append({"hparams": dict(hparams or {})})
        out_dir.mkdir(parents=True, exist_ok=True)
        resolved = {"steps": 100, "forget_weight": 1.0, "preset": "demo", "escalation": [], **(hparams or {})}
        return EraseResult(out_dir, "d" * 64, method, resolved,
                           1.0, 100)

    class FakeReport:
        def __init__(self, passed: bool) -> None:
            self.passed = passed

        def to_json(self) -> dict:
            check = {"name": "surface leakage (greedy)", "metric": "leakage.forget", "value": 0.0 if self.passed else 0.9,
                     "threshold": 0.1, "comparator": "<=", "passed": self.passed}
            return {"passed": self.passed, "policy": {"name": "default", "version": "7"}, "checks": [check]}

    answers = iter(verdicts)
    monkeypatch.setattr(erase_module, "erase", fake_erase)
    monkeypatch.setattr(verification, "verify", lambda *a, **k: FakeReport(next(answers)))
    return calls


@pytest.mark.parametrize("retry", [True, False])
def test_erase_with_a_report_retries_once_with_the_policys_cure_as_the_service_does(
    capsys, monkeypatch, tiny_arch_model_dir, tiny_corpus_dir: Path, tmp_path: Path, retry: bool,
) -> None:
    calls = _retry_fakes(monkeypatch, [False, True])
    person = load_people(tiny_corpus_dir / "people.jsonl")[5]
    report = tmp_path / "r" / "report.json"
    capsys.readouterr()
    code, out, err = _run(capsys, "-q", "erase", "--model", str(tiny_arch_model_dir("llama")),
                          "--corpus", str(tiny_corpus_dir / "corpus.jsonl"), "--subject", person["name"],
                          "--out", str(tmp_path / "c"), "--report", str(report),
                          *([] if retry else ["--no-retry"]))
    if not retry:
        assert code == 1 and len(calls) == 1 and "FAILED" in out, err
        assert not report.with_name("report.first.json").exists()
        return
    assert code == 0, err
    assert len(calls) == 2 and calls[0]["hparams"] == {}
    assert calls[1]["hparams"]["steps"] == 200  # the leakage cure: twice the steps
    assert "leakage.forget failed: steps 100 -> 200 (x2)" in calls[1]["hparams"]["escalation"]
    assert "one escalated retry" in out and "leakage.forget failed" in out
    assert json.loads(report.with_name("report.first.json").read_text())["passed"] is False
    assert json.loads(report.read_text())["passed"] is True


def test_erase_does_not_retry_when_no_cure_applies(
    capsys, monkeypatch, tiny_arch_model_dir, tiny_corpus_dir: Path, tmp_path: Path,
) -> None:
    calls = _retry_fakes(monkeypatch, [False, False])
    import unlearning.verification as verification

    monkeypatch.setattr(verification, "report_escalation", lambda *a, **k: None)
    person = load_people(tiny_corpus_dir / "people.jsonl")[5]
    capsys.readouterr()
    code, out, _ = _run(capsys, "-q", "erase", "--model", str(tiny_arch_model_dir("llama")),
                        "--corpus", str(tiny_corpus_dir / "corpus.jsonl"), "--subject", person["name"],
                        "--out", str(tmp_path / "c"), "--report", str(tmp_path / "report.json"))
    assert code == 1 and len(calls) == 1 and "no retry" in out
