"""The verification report: metrics, checks, policy, guarantee, verdict, timings.

`Report.to_json()` is the one serialised form (stored by the service, signed
into certificates by digest, written by the CLI); `Report.from_json` reads it
back, and is what every reader of a report uses.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .policy import CheckResult

REQUIRED_METRICS = (
    "leakage.forget",
    "leakage.control",
    "leakage.base_forget",
    "utility.retain_ratio",
    "utility.ppl_ratio",
    "fluency.gibberish_rate",
    "mia.auc",
    "mia.auc_gap",
    "attack.quant_leakage",
)

GUARANTEES = ("weights", "suppression")


def _finite(value: float) -> float | None:
    """JSON has no NaN or infinity; such a value is written as null."""
    return None if math.isnan(value) or math.isinf(value) else round(float(value), 6)


class ReportError(ValueError):
    """A report document that cannot be read; the message says what is wrong."""


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
    unmeasured: dict[str, str] = field(default_factory=dict)  # metric -> reason code
    details: dict[str, Any] = field(default_factory=dict)  # method, preset, counts: no personal data

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
            "unmeasured": dict(sorted(self.unmeasured.items())),
            "details": self.details,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        """Read a report written by `to_json` (extra keys, e.g. `seconds`, are kept out)."""
        try:
            metrics = {str(k): float("nan") if v is None else float(v)
                       for k, v in (data.get("metrics") or {}).items()}
            return cls(
                metrics=metrics,
                checks=tuple(CheckResult.from_json(c) for c in data.get("checks") or ()),
                policy={str(k): str(v) for k, v in (data.get("policy") or {}).items()},
                guarantee=str(data["guarantee"]),
                passed=bool(data["passed"]),
                timings={str(k): float(v) for k, v in (data.get("timings") or {}).items()},
                control_source=str(data.get("control_source", "")),
                notes=tuple(str(n) for n in data.get("notes") or ()),
                cached=tuple(str(n) for n in data.get("cached") or ()),
                settings=dict(data.get("settings") or {}),
                unmeasured={str(k): str(v) for k, v in (data.get("unmeasured") or {}).items()},
                details=dict(data.get("details") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReportError(f"not a verification report: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> Report:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ReportError(f"{path}: not readable ({exc})") from exc
        return cls.from_json(data)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True, allow_nan=False)

    def save(self, path: str | Path) -> Path:
        """Write the report atomically (a temporary file renamed over the target)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                stream.write(self.dumps() + "\n")
            os.replace(temporary, out)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return out
