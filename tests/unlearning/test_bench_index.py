"""The index benchmark's pieces: its build figure and its 10 GB extrapolation (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

from bench.index import _linear, build, index_summary
from tests.scan_fixtures import trap_records, write_jsonl


def test_the_build_figure_names_what_was_built(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", trap_records(1), 1)
    row = build(corpus, tmp_path / "i")
    assert row["records"] > 300 and row["postings"] > row["keys"] > 0 and row["index_mb"] > 0
    assert (tmp_path / "i" / "manifest.json").is_file()


def test_the_ten_gb_figure_is_a_line_through_the_measured_sizes() -> None:
    assert _linear([(100.0, 2.0)], 10_000.0) == 200.0
    assert abs(_linear([(100.0, 1.0), (1000.0, 2.0)], 10_000.0) - 12.0) < 1e-9
    builds = [{"corpus_mb": 100.0, "seconds": 20.0, "index_mb": 70.0},
              {"corpus_mb": 1000.0, "seconds": 250.0, "index_mb": 700.0}]
    lookups = [{"corpus_mb": mb, "subjects": n, "forget_set_s": s, "build_sets_s": s + 1}
               for mb, n, s in ((100.0, 1, 0.1), (1000.0, 1, 0.4), (100.0, 9, 1.0), (1000.0, 9, 1.9))]
    summary = index_summary(builds, lookups, (1, 9))
    ten = summary["ten_gb"]
    assert ten["build_s"] == 2500.0 and ten["index_gb"] == 7.0 and "least-squares" in ten["method"]
    assert abs(ten["forget_set_s"]["1"] - 3.4) < 1e-9 and abs(ten["build_sets_s"]["9"] - 11.9) < 1e-9
