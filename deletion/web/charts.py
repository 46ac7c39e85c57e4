"""Geometry for the inline SVG charts.  Python computes coordinates; the templates draw
them, so every label goes through Django's auto-escaping."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deletion.domain.models import Checkpoint, VerificationResult

# (label, metric before erasure, metric after, the control level: people never trained on).
# Several readings: the first one a result holds (the newest policy's first), with its own control level.
CHART_GROUPS = (
    ("Surface leakage", "leakage.base_forget", "leakage.forget", "leakage.control"),
    ("Leakage after 8-bit quantisation", "leakage.base_forget", "attack.quant_leakage", "leakage.control"),
    ("Facts recovered by relearning", None, ("attack.relearn_paired_recovery", "attack.relearn_recovery"),
     ("attack.relearn_paired_stranger", "attack.relearn_control")),
    # The reading the newest policy decides on first; earlier rounds have older readings only.
    ("Residual latent knowledge", None, ("latent.matched_ratio", "latent.paired_ratio", "latent.value_ratio",
                                            "latent.residual_ratio"),
     None),
)
BAR_LEFT, BAR_WIDTH, ROW_HEIGHT = 220, 380, 46


def metric_values(results: Sequence[VerificationResult]) -> dict[str, float]:
    """Every metric value known for a round: the check rows, plus the full metric map
    a worker may keep in a row's details."""
    values: dict[str, float] = {}
    for row in results:
        extra = (row.details or {}).get("metrics") if isinstance(row.details, dict) else None
        if isinstance(extra, dict):
            for key, value in extra.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    values.setdefault(str(key), float(value))
    for row in results:
        if row.value is not None:
            values[row.metric] = float(row.value)
    return values


def verification_chart(results: Sequence[VerificationResult]) -> dict[str, Any] | None:
    values = metric_values(results)
    rows: list[dict[str, Any]] = []
    for label, before_key, after_key, control_key in CHART_GROUPS:
        after_keys = after_key if isinstance(after_key, tuple) else (after_key,)
        found = next((i for i, k in enumerate(after_keys) if k in values), None)
        if found is None:
            continue
        after = values[after_keys[found]]
        # A tuple of control levels pairs with the readings: the found reading's own level.
        control_key = control_key[found] if isinstance(control_key, tuple) else control_key
        before = values.get(before_key) if before_key else None
        control = values.get(control_key) if control_key else None
        y = 10 + len(rows) * ROW_HEIGHT
        row: dict[str, Any] = {"label": label, "y": y, "label_y": y + 17,
                               "after": after, "after_w": _width(after), "after_y": y + 18}
        if before is not None:
            row.update(before=before, before_w=_width(before))
        if control is not None:
            row.update(control=control, control_x=BAR_LEFT + _width(control))
        rows.append(row)
    if not rows:
        return None
    height = 10 + len(rows) * ROW_HEIGHT + 24
    ticks = [{"x": BAR_LEFT + BAR_WIDTH * t / 4, "label": f"{t * 25}%"} for t in range(5)]
    return {"rows": rows, "height": height, "axis_y": height - 22, "ticks": ticks,
            "left": BAR_LEFT, "width": BAR_LEFT + BAR_WIDTH + 70}


def _width(value: float) -> float:
    return round(BAR_WIDTH * min(max(value, 0.0), 1.0), 1)


@dataclass(frozen=True)
class LineageNode:
    checkpoint: Checkpoint
    x: int
    y: int
    serving: bool


NODE_GAP_Y, NODE_GAP_X, NODE_W, NODE_H = 78, 250, 200, 50


def lineage_graph(checkpoints: Sequence[Checkpoint], serving_id: int | None) -> dict[str, Any]:
    """Versions top to bottom; the serving line in the first column, checkpoints that
    branched off it (rejected candidates, re-based jobs) in the next ones."""
    by_id = {c.id: c for c in checkpoints}
    main_line: set[int] = set()
    cursor = by_id.get(serving_id) if serving_id is not None else None
    while cursor is not None:
        main_line.add(cursor.id)
        cursor = by_id.get(cursor.parent_id) if cursor.parent_id is not None else None
    if not main_line and checkpoints:
        main_line.add(checkpoints[0].id)
    columns: dict[int, int] = {}
    next_column = 1
    nodes: list[LineageNode] = []
    for row, checkpoint in enumerate(sorted(checkpoints, key=lambda c: c.version)):
        if checkpoint.id in main_line:
            column = 0
        else:
            column = columns.setdefault(checkpoint.parent_id or 0, next_column)
            if column == next_column:
                next_column = min(next_column + 1, 3)
        nodes.append(LineageNode(checkpoint, 20 + column * NODE_GAP_X, 20 + row * NODE_GAP_Y,
                                 checkpoint.id == serving_id))
    position = {n.checkpoint.id: n for n in nodes}
    edges = [
        {"x1": position[n.checkpoint.parent_id].x + NODE_W / 2, "y1": position[n.checkpoint.parent_id].y + NODE_H,
         "x2": n.x + NODE_W / 2, "y2": n.y}
        for n in nodes if n.checkpoint.parent_id in position
    ]
    width = 40 + NODE_W + NODE_GAP_X * max((n.x - 20) // NODE_GAP_X for n in nodes) if nodes else 300
    height = 40 + NODE_GAP_Y * max(len(nodes) - 1, 0) + NODE_H
    return {"nodes": nodes, "edges": edges, "width": width, "height": height, "node_w": NODE_W, "node_h": NODE_H}


CHART_LEFT, CHART_TOP, CHART_W, CHART_H = 46, 12, 560, 180


def continual_chart(points: Sequence[Any]) -> dict[str, Any] | None:
    """Lines over the serving line's versions: retained accuracy, the erased subjects'
    leakage after each erasure, and the control level (people never trained on)."""
    usable = [p for p in points if p.retained is not None or p.leakage is not None]
    if len(usable) < 2:
        return None
    step = CHART_W / max(len(points) - 1, 1)

    def xy(index: int, value: float) -> tuple[float, float]:
        return (round(CHART_LEFT + index * step, 1),
                round(CHART_TOP + CHART_H * (1 - min(max(value, 0.0), 1.0)), 1))

    series = {}
    for key in ("retained", "leakage", "control"):
        coords = [(i, getattr(p, key)) for i, p in enumerate(points) if getattr(p, key) is not None]
        series[key] = {"points": " ".join(f"{x},{y}" for x, y in (xy(i, v) for i, v in coords)),
                       "dots": [{"x": xy(i, v)[0], "y": xy(i, v)[1], "value": v,
                                 "version": points[i].version} for i, v in coords]}
    return {
        "series": series, "left": CHART_LEFT, "top": CHART_TOP, "width": CHART_LEFT + CHART_W + 30,
        "height": CHART_TOP + CHART_H + 34, "bottom": CHART_TOP + CHART_H, "right": CHART_LEFT + CHART_W,
        "xticks": [{"x": round(CHART_LEFT + i * step, 1), "label": f"v{p.version}"} for i, p in enumerate(points)],
        "yticks": [{"y": round(CHART_TOP + CHART_H * (1 - t / 4), 1), "label": f"{t * 25}%"} for t in range(5)],
        "label_y": CHART_TOP + CHART_H + 20,
    }
