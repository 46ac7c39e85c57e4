"""The walk table of `python -m workers.embedded demo --requests N` and its fixed retained
sample (rendering and sampling only; the walk itself runs the real pipeline in the benchmark)."""

from __future__ import annotations

import pytest

from unlearning.corpus import Record
from unlearning.demo.corpus import generate_demo_corpus
from unlearning.probes import Probe
from workers.demo import render_walk
from workers.embedded import main
from workers.walk import Reading, RetainedSample, row_fields, sample_questions


def _row(reference: str, certified: bool, ratio: float | None, version: int | None, *,
         serving: Reading | None = None, before: Reading | None = None,
         sample: RetainedSample | None = None) -> dict:
    return {"reference": reference, "job": 1, "certified": certified, "ok": certified, "seconds": 41.25,
            "checkpoint_version": version, "retained_accuracy": 0.9 if certified else None,
            "retained_ratio_vs_parent": ratio, "failed": [] if certified else ["mia.auc_gap"], "reason": "",
            **row_fields(serving, before, sample)}


def test_since_v1_is_each_models_fixed_sample_accuracy_over_v1s_not_the_product_of_ratios() -> None:
    before = Reading(version=1, accuracy=0.900)
    questions = tuple(Probe("original", f"question {n}?", "value", f"p{n:04d}-x-1", -1) for n in range(200))
    sample = RetainedSample(probes=questions, people=frozenset({"p0900"}))
    rows = [_row("ER-2026-00001", True, 0.99, 2, serving=Reading(2, 0.882), before=before, sample=sample),
            _row("ER-2026-00002", False, None, None, serving=Reading(2, 0.882, cached=True), before=before,
                 sample=sample),
            _row("ER-2026-00003", True, 0.98, 3, serving=Reading(3, 0.855), before=before, sample=sample)]
    text = render_walk(rows)
    lines = text.splitlines()
    assert "certified 2 of 3" in text
    assert "one fixed sample of 200 retained questions" in lines[2]
    assert lines[3].split()[5:9] == ["vs", "parent", "retained", "since"]
    assert lines[4].split() == ["0", "(before)", "-", "-", "v1", "-", "0.900", "1.000", "-"]
    assert lines[5].split()[:8] == ["1", "ER-2026-00001", "yes", "41.2", "v2", "0.990", "0.882", "0.980"]
    # A rejected request leaves v2 serving: the same reading, the same ratio (not "-").
    assert lines[6].split()[:8] == ["2", "ER-2026-00002", "NO", "41.2", "v2", "-", "0.882", "0.980"]
    assert lines[6].endswith("mia.auc_gap")
    # 0.855 / 0.900, not 0.99 * 0.98 = 0.970 (the verifier's per-job ratios multiplied).
    assert lines[7].split()[7] == "0.950"
    assert rows[2]["retained_ratio_since_v1"] == pytest.approx(0.855 / 0.900)
    assert [r["retained_accuracy_fixed_v1"] for r in rows] == [0.9, 0.9, 0.9]
    assert rows[0]["retained_questions"] == 200 and rows[2]["serving_version"] == 3


def test_a_walk_whose_sample_was_not_scored_says_why_and_gives_no_ratio() -> None:
    before = Reading(version=0, accuracy=None, error="no sample: RuntimeError: no corpus")
    rows = [_row("ER-2026-00001", True, 0.99, 2, before=before), _row("ER-2026-00002", True, 0.98, 3, before=before)]
    text = render_walk(rows)
    assert "the fixed sample was not scored (no sample: RuntimeError: no corpus)" in text
    assert [r["retained_ratio_since_v1"] for r in rows] == [None, None]
    assert text.splitlines()[4].split()[:8] == ["1", "ER-2026-00001", "yes", "41.2", "v2", "0.990", "-", "-"]


def test_the_fixed_sample_leaves_out_the_people_the_walk_files_and_records_naming_them() -> None:
    demo = generate_demo_corpus(people=30, seed=0)
    filed = list(demo.people[:3])
    ids = {p["person_id"] for p in filed}
    naming = Record(id="p9999-friend-1", question="Who is the friend of Ada Quist?",
                    answer=f"Ada Quist's friend is {filed[1]['name']}.")
    records = [*demo.records, naming]

    sample = sample_questions(records, filed, size=60)
    assert len(sample) == 60 and sample == sample_questions(records, filed, size=60)  # seeded
    assert not [p for p in sample if p.record_id.split("-")[0] in ids]
    assert not [p for p in sample if any(person["name"] in p.prompt for person in filed)]
    # The same draw with nobody left out holds their questions: leaving them out is what removes them.
    assert [p for p in sample_questions(records, [], size=60) if p.record_id.split("-")[0] in ids]
    # Another person's record that names one of them is left out too (by the name, not the id).
    assert sample_questions([naming], [], size=10)
    assert sample_questions([naming], filed, size=10) == ()


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_a_walk_of_no_requests_is_refused_with_a_message(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["demo", "--requests", value])
    assert stopped.value.code == 2
    assert "--requests" in capsys.readouterr().err
