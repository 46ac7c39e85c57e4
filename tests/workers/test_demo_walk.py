"""The walk table of `python -m workers.embedded demo --requests N` (rendering only; the walk
itself runs the real pipeline in the benchmark)."""

from __future__ import annotations

import pytest

from workers.demo import render_walk
from workers.embedded import main


def _row(reference: str, certified: bool, ratio: float | None, version: int | None) -> dict:
    return {"reference": reference, "job": 1, "certified": certified, "ok": certified, "seconds": 41.25,
            "checkpoint_version": version, "retained_accuracy": 0.9 if certified else None,
            "retained_ratio_vs_parent": ratio, "failed": [] if certified else ["mia.auc_gap"], "reason": ""}


def test_the_walk_multiplies_the_ratios_along_the_lineage_and_counts_certificates() -> None:
    rows = [_row("ER-2026-00001", True, 0.99, 2), _row("ER-2026-00002", False, None, None),
            _row("ER-2026-00003", True, 0.98, 3)]
    text = render_walk(rows)
    lines = text.splitlines()
    assert "certified 2 of 3" in text
    assert lines[3].split()[:8] == ["1", "ER-2026-00001", "yes", "41.2", "v2", "0.900", "0.990", "0.990"]
    assert lines[4].split()[:3] == ["2", "ER-2026-00002", "NO"] and lines[4].endswith("mia.auc_gap")
    assert lines[5].split()[7] == f"{0.99 * 0.98:.3f}"  # a rejected request changes nothing
    assert rows[1]["retained_ratio_since_v1"] is None


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_a_walk_of_no_requests_is_refused_with_a_message(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["demo", "--requests", value])
    assert stopped.value.code == 2
    assert "--requests" in capsys.readouterr().err
