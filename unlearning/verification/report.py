"""The verification report: metrics, checks, policy, guarantee, verdict, timings."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .policy import CheckResult

REQUIRED_METRICS = (
    "leakage.forget",
    "leakage.control",
    "leakage.base_forget",
    "latent.residual_ratio",
    "utility.retain_ratio",
    "utility.ppl_ratio",
    "fluency.gibberish_rate",
    "mia.auc",
    "attack.relearn_recovery",
    "attack.quant_leakage",
)

GUARANTEES = ("weights", "suppression")


def _finite(value: float) -> float | None:
    """JSON has no NaN or infinity; such a value is written as null."""
    return None if math.isnan(value) or math.isinf(value) else round(float(value), 6)


@dataclass(frozen=True)
class Report:
    metrics: dict[str, float]
    checks: tuple[CheckResult, ...]
    policy: dict[str, str]
    guarantee: str
    passed: bool
    timings: dict[str, float]
    control_source: str
    notes: tuple[str, ...] = ()
    cached: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def failed_checks(self) -> list[CheckResult]:
        return [c for c in self.checks if c.decides_pass and not c.passed]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: `metrics`, `checks`, `policy`, `guarantee`, `passed`, `timings`, ..."""
        return {
            "metrics": {k: _finite(v) for k, v in sorted(self.metrics.items())},
            "checks": [c.to_json() for c in self.checks],
            "policy": dict(self.policy),
            "guarantee": self.guarantee,
            "passed": self.passed,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "control_source": self.control_source,
            "notes": list(self.notes),
            "cached": list(self.cached),
            "settings": self.settings,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True, allow_nan=False)

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.dumps() + "\n", encoding="utf-8")
        return out
