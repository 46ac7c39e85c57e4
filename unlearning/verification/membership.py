"""Membership inference: can an attacker tell the subject's records were trained on?

Min-K%++ (Zhang et al. 2024, "Min-K%++: Improved Baseline for Detecting
Pre-training Data from Large Language Models", arXiv:2404.02936), which
improves Min-K% Prob (Shi et al. 2023, arXiv:2310.16789).  For each answer
token x_t after the prefix x_<t:

    z_t = (log p(x_t | x_<t) - mu_t) / sigma_t,
    mu_t = E_{z ~ p(.|x_<t)} log p(z | x_<t),  sigma_t^2 = Var_{z ~ p(.|x_<t)} log p(z | x_<t)

and a record's score is the mean of its lowest k % of z_t.  Members score
higher.  `mia.auc` is the ROC AUC of forget records (positive) against
control records (negative): 0.5 means the attacker cannot tell them apart.
The standard error is Hanley & McNeil's (1982).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from sklearn.metrics import roc_auc_score

from .generation import TokenScores


def min_k_plus_plus(scores: TokenScores, *, k: float = 0.2) -> float:
    if not scores.logp.size:
        return 0.0
    z = (scores.logp - scores.mu) / np.maximum(scores.sigma, 1e-6)
    count = max(1, int(math.ceil(k * z.size)))
    return float(np.sort(z)[:count].mean())


def auc_with_stderr(positive: Sequence[float], negative: Sequence[float]) -> tuple[float, float]:
    n1, n0 = len(positive), len(negative)
    if not n1 or not n0:
        return 0.5, 0.0
    labels = [1] * n1 + [0] * n0
    auc = float(roc_auc_score(labels, list(positive) + list(negative)))
    q1 = auc / (2 - auc)
    q2 = 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n1 - 1) * (q1 - auc * auc) + (n0 - 1) * (q2 - auc * auc)) / (n1 * n0)
    return auc, math.sqrt(max(var, 0.0))
