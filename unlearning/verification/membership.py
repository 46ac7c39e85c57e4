"""Membership inference: can an attacker tell the subject's records were trained on?

Two different attacks, each scored over whole records (every token training
taught: the answer of a question/answer pair, the assistant turns of a chat,
all of a free text; the prompt around them was never a training target, and
its tokens' scores are noise that would drown the signal) and over the
record's identifying spans only (names, e-mail addresses, phone numbers ...):

* **Min-K%++** (Zhang et al. 2024, "Min-K%++: Improved Baseline for Detecting
  Pre-training Data from Large Language Models", arXiv:2404.02936), which
  improves Min-K% Prob (Shi et al. 2023, arXiv:2310.16789).  For each token
  x_t after the prefix x_<t:

      z_t = (log p(x_t | x_<t) - mu_t) / sigma_t,
      mu_t = E_{z ~ p(.|x_<t)} log p(z | x_<t),  sigma_t^2 = Var_{z ~ p(.|x_<t)} log p(z | x_<t)

  and a record's score is the mean of its lowest k % of z_t.
* **zlib ratio** (Carlini et al. 2021, "Extracting Training Data from Large
  Language Models", USENIX Security): the record's total log-likelihood
  divided by the length of its zlib compression, so that text that is merely
  easy (repetitive, common) does not pass for memorised text.

Members score higher.  Each AUC is the ROC AUC of forget records (positive)
against control records (negative): 0.5 means the attacker cannot tell them
apart.  The check is **two-sided**: an erasure that makes the subject *less*
familiar than a stranger (AUC well below 0.5, what gradient ascent does)
reveals the erasure just as much, so the policy bounds `|AUC - 0.5|`
(`<name>_gap`).  The standard error is Hanley & McNeil's (1982).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata

from .generation import TokenScores


def min_k_plus_plus(scores: TokenScores, *, k: float = 0.2, tokens: Sequence[int] | None = None) -> float:
    """Mean of the lowest `k` share of calibrated token scores (all tokens, or `tokens` only)."""
    z = (scores.logp - scores.mu) / np.maximum(scores.sigma, 1e-6)
    if tokens is not None:
        z = z[[t for t in tokens if 0 <= t < z.size]]
    if not z.size:
        return 0.0
    count = max(1, int(math.ceil(k * z.size)))
    return float(np.sort(z)[:count].mean())


def zlib_ratio(scores: TokenScores, text: str) -> float:
    """log-likelihood / zlib-compressed bytes of the text (higher: more familiar)."""
    compressed = max(1, len(zlib.compress(text.encode("utf-8"))))
    return float(scores.logp.sum()) / compressed


def auc_with_stderr(positive: Sequence[float], negative: Sequence[float]) -> tuple[float, float]:
    n1, n0 = len(positive), len(negative)
    if not n1 or not n0:
        return 0.5, 0.0
    # The ROC AUC as the Mann-Whitney U statistic over n1 * n0 (ties count a half), from the
    # positives' mid-ranks: what `sklearn.metrics.roc_auc_score` returns, without its input
    # validation, which cost 4 ms a call where a 20-subject verification makes 1,320 calls
    # (tests/unlearning/test_verification_units.py compares the two).
    ranks = rankdata(np.concatenate([np.asarray(positive, dtype=float), np.asarray(negative, dtype=float)]))
    auc = float((ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
    q1 = auc / (2 - auc)
    q2 = 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n1 - 1) * (q1 - auc * auc) + (n0 - 1) * (q2 - auc * auc)) / (n1 * n0)
    return auc, math.sqrt(max(var, 0.0))
