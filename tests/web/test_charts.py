"""Geometry of the inline SVG charts (no database: plain objects stand in for rows)."""
from __future__ import annotations

from types import SimpleNamespace

from deletion.web.charts import BAR_LEFT, BAR_WIDTH, lineage_graph, verification_chart


def _result(metric, value, details=None):
    return SimpleNamespace(metric=metric, value=value, details=details)


def test_the_chart_puts_before_after_and_the_control_level_on_one_scale():
    chart = verification_chart([
        _result("leakage.forget", 0.1, {"metrics": {"leakage.base_forget": 0.9, "leakage.control": 0.05}}),
    ])
    row = chart["rows"][0]
    assert row["label"] == "Surface leakage"
    assert row["before_w"] == BAR_WIDTH * 0.9 and row["after_w"] == BAR_WIDTH * 0.1
    assert row["control_x"] == BAR_LEFT + BAR_WIDTH * 0.05


def test_no_chart_without_measurements_and_values_are_clamped():
    assert verification_chart([]) is None
    chart = verification_chart([_result("attack.relearn_recovery", 7.0)])
    assert chart["rows"][0]["after_w"] == BAR_WIDTH


def test_the_relearning_row_draws_the_newest_reading_against_its_own_strangers():
    paired = verification_chart([_result("attack.relearn_paired_recovery", 0.5, {"metrics": {
        "attack.relearn_paired_stranger": 0.25, "attack.relearn_recovery": 0.9, "attack.relearn_control": 0.0}})])
    (row,) = [r for r in paired["rows"] if r["label"] == "Facts recovered by relearning"]
    assert row["after"] == 0.5 and row["control"] == 0.25
    older = verification_chart([_result("attack.relearn_recovery", 0.9, {"metrics": {"attack.relearn_control": 0.1}})])
    (row,) = older["rows"]
    assert row["after"] == 0.9 and row["control"] == 0.1


def _checkpoint(id_, version, parent_id, status):
    return SimpleNamespace(id=id_, version=version, parent_id=parent_id, status=status, digest="d" * 64)


def test_the_serving_line_stays_in_the_first_column_and_a_rejected_branch_moves_aside():
    checkpoints = [_checkpoint(1, 1, None, "retired"), _checkpoint(2, 2, 1, "retired"),
                   _checkpoint(3, 3, 1, "candidate"), _checkpoint(4, 4, 2, "serving")]
    graph = lineage_graph(checkpoints, serving_id=4)
    x = {node.checkpoint.id: node.x for node in graph["nodes"]}
    assert x[1] == x[2] == x[4] < x[3]
    assert len(graph["edges"]) == 3
    assert [n.serving for n in graph["nodes"]] == [False, False, False, True]


def test_the_continual_chart_draws_the_serving_line_and_needs_two_points():
    from deletion.web.charts import continual_chart
    from deletion.web.selectors import ContinualPoint

    assert continual_chart([ContinualPoint(1, None, 0.99, 0.9, 0.05)]) is None
    chart = continual_chart([ContinualPoint(1, None, 0.99, 0.9, 0.05), ContinualPoint(2, 7, 0.95, 0.06, 0.05),
                             ContinualPoint(3, 8, 0.90, None, 0.04)])
    assert [t["label"] for t in chart["xticks"]] == ["v1", "v2", "v3"]
    assert len(chart["series"]["retained"]["dots"]) == 3 and len(chart["series"]["leakage"]["dots"]) == 2
    top, bottom = chart["top"], chart["bottom"]
    assert all(top <= d["y"] <= bottom for d in chart["series"]["retained"]["dots"])


def test_a_check_the_web_does_not_know_is_explained_by_its_own_name():
    from types import SimpleNamespace

    from deletion.web.explain import explain, failed_checks

    known = SimpleNamespace(metric="mia.auc", value=0.81, threshold=0.6, comparator="<=", passed=False,
                            details={"check": "membership inference (Min-K%++)"})
    new = SimpleNamespace(metric="attack.some_future_probe", value=3.0, threshold=2.0, comparator="<=",
                          passed=False, details={"check": "future probe"})
    info = SimpleNamespace(metric="gates_off.leakage.forget", value=0.5, threshold=0.1, comparator="<=",
                           passed=False, details={"check": "x", "decides_pass": False})
    assert "membership-inference attack" in explain(known).sentence and "81.0%" in explain(known).sentence
    assert "“future probe”" in explain(new).sentence and "at most 2" in explain(new).sentence
    assert [c.metric for c in failed_checks([known, new, info])] == ["mia.auc", "attack.some_future_probe"]
