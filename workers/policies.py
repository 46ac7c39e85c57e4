"""Which threshold policy judges a deployment's verifications.

The engine ships `default` v8 (docs/verification.md).  A deployment may name another, versioned policy
in a JSON file (VERIFICATION_POLICY_FILE); it is registered in the worker
process under its own name and version, and every stored result and every
certificate names the policy that judged it, so a reader always knows which
thresholds applied.

    {"name": "acme-strict", "version": "2",
     "checks": [{"name": "surface leakage (greedy)", "metric": "leakage.forget",
                 "comparator": "<=", "margin": 0.02, "baseline": "leakage.control",
                 "noise_z": 1.645}],
     "escalation": {"asu": {"scale": {"steps": 2.0}}}}

A check may name the metric that holds its standard error ("stderr"; default
"<metric>.stderr").
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

POLICY_FILE_VARIABLE = "VERIFICATION_POLICY_FILE"


def policy_from_json(document: dict[str, Any]) -> Any:
    """The engine's reader (`unlearning.verification.policy_from_json`): one parser, one set
    of rules (typed booleans, unmeasured handling, cures), registered on success."""
    from unlearning.verification import policy_from_json as engine_policy_from_json

    return engine_policy_from_json(document)


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
