"""Utility: what the erasure cost everyone else.

- `utility.retain_ratio` = acc_candidate(retain) / acc_base(retain), where acc
  is the share of retained people's questions whose greedy answer contains
  the fact's value (the TOFU "model utility" idea, Maini et al. 2024,
  arXiv:2401.06121, reduced to exact-value accuracy).
- `utility.ppl_ratio` = ppl_candidate / ppl_base on held-out general text
  never trained on, with ppl = exp(total negative log-likelihood / total
  UTF-8 bytes): per byte rather than per token, so that models with
  different tokenizers (a model retrained on a smaller corpus trains its own)
  are comparable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .generation import TokenScores
from .leakage import contains_value


def accuracy(answers: Sequence[str], values: Sequence[str]) -> float:
    if not answers:
        return 0.0
    return sum(contains_value(a, v) for a, v in zip(answers, values, strict=True)) / len(answers)


def perplexity(scores: Sequence[TokenScores], scored_bytes: Sequence[int]) -> float:
    """Per-byte perplexity of the scored texts."""
    total_bytes = sum(scored_bytes)
    if not scores or not total_bytes:
        return float("nan")
    nll = -float(sum(float(s.logp.sum()) for s in scores))
    return float(math.exp(nll / total_bytes))


def ratio(candidate: float, base: float) -> float:
    """candidate / base; 1.0 when both are 0 (nothing to lose), inf-safe for a zero base."""
    if base == 0:
        return 1.0 if candidate == 0 else float(candidate > 0) * 10.0
    return candidate / base
