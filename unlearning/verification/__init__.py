"""Verification: the evidence behind a deletion certificate (ARCHITECTURE.md section 6).

`verify(candidate_dir, base_dir, sets, ...)` measures surface leakage, latent
traces, utility, fluency, membership inference and attacks against control
people the model never saw, and judges them by a named, versioned policy.
docs/verification.md gives each metric's formula and its paper.
"""

from __future__ import annotations

from .policy import (
    DEFAULT_POLICY,
    CheckResult,
    CheckSpec,
    Escalation,
    Policy,
    get_policy,
    policy_escalate,
    policy_from_json,
    register_policy,
    report_escalation,
)
from .report import REQUIRED_METRICS, Report, ReportError
from .settings import VerifySettings
from .suite import clear_cache, verify

__all__ = [
    "DEFAULT_POLICY", "REQUIRED_METRICS", "CheckResult", "CheckSpec", "Escalation", "Policy",
    "Report", "ReportError", "VerifySettings", "clear_cache", "get_policy", "policy_escalate", "report_escalation",
    "policy_from_json", "register_policy",
    "verify",
]
