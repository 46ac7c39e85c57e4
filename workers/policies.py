"""Which threshold policy judges a deployment's verifications.

The engine ships `default` v1.  A deployment may name another, versioned policy
in a JSON file (VERIFICATION_POLICY_FILE); it is registered in the worker
process under its own name and version, and every stored result and every
certificate names the policy that judged it, so a reader always knows which
thresholds applied.

    {"name": "acme-strict", "version": "2",
     "checks": [{"name": "surface leakage (greedy)", "metric": "leakage.forget",
                 "comparator": "<=", "margin": 0.02, "baseline": "leakage.control",
                 "noise_z": 1.645}],
     "escalation": {"asu": {"scale": {"epochs": 2.0}}}}
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

POLICY_FILE_VARIABLE = "VERIFICATION_POLICY_FILE"


def policy_from_json(document: dict[str, Any]) -> Any:
    from unlearning.verification import CheckSpec, Escalation, Policy, register_policy

    checks = tuple(
        CheckSpec(name=c["name"], metric=c["metric"], comparator=c["comparator"],
                  margin=float(c["margin"]), baseline=c.get("baseline"),
                  noise_z=float(c.get("noise_z", 0.0)),
                  decides_pass=bool(c.get("decides_pass", True)))
        for c in document["checks"]
    )
    if not checks or any(c.comparator not in ("<=", ">=") for c in checks):
        raise ValueError("a policy needs checks with comparator '<=' or '>='")
    escalation = {
        method: Escalation(scale=dict(rule.get("scale", {})), add=dict(rule.get("add", {})))
        for method, rule in (document.get("escalation") or {}).items()
    }
    return register_policy(Policy(name=str(document["name"]), version=str(document["version"]),
                                  checks=checks, escalation=escalation))


@cache
def deployment_policy() -> Any:
    """The policy named by VERIFICATION_POLICY_FILE, else the engine's default."""
    from unlearning.verification import DEFAULT_POLICY

    # Read here, not in deletion.domain.config: only the worker ever needs it, and
    # the domain must not know the engine's policy format.
    path = os.environ.get(POLICY_FILE_VARIABLE, "").strip()
    if not path:
        return DEFAULT_POLICY
    return policy_from_json(json.loads(Path(path).read_text(encoding="utf-8")))
