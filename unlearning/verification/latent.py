"""Latent traces: is the fact still linearly decodable from the residual stream?

Linear probes (Alain & Bengio 2016, arXiv:1610.01644) are trained afresh on
the model under test, per layer, to read a fact's value from the hidden
state at the position where the model must recall it: the question, then the
reference answer up to the value (the last prompt token when the value is
not in the answer).  The embedding layer is left out: at that position it
is a function of one template token and cannot hold anything about a person.
The probe is a multi-class linear classifier (sklearn RidgeClassifier,
one-vs-rest least squares on standardised states); LogisticRegression gave
the same accuracies on our test models at 50-100x the time.  They are trained on facts
of retained people (which the model should still know) and tested on the
subject's facts and on control people's facts (never seen: chance).  White-box
probing of intermediate layers is how Patil, Hase & Bansal (2023,
arXiv:2309.17410) recover "deleted" facts; we never reuse a method's own
direction (e.g. a KIF signature), the probe is independent of the method.

    residual_knowledge_ratio = max over layers l of
        (acc_forget[l] - acc_control[l]) / (acc_base_forget[l] - acc_control[l])

over layers where the base model's forget accuracy exceeds control by at
least `min_gap` (elsewhere the base itself shows no decodable knowledge and
the ratio is noise).  0 means no more decodable than for strangers, 1 means
as decodable as before.  The bootstrap resamples forget and control facts
(paired between candidate and base) and recomputes the max; its standard
deviation is the `stderr` the policy uses, its 2.5/97.5 percentiles the CI.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import RidgeClassifier
from sklearn.preprocessing import StandardScaler

from .leakage import normalise_text

logger = logging.getLogger(__name__)


def probe_correctness(
    train_states: np.ndarray,
    train_labels: Sequence[str],
    test_states: Sequence[np.ndarray],
    test_labels: Sequence[Sequence[str]],
    *,
    seed: int = 0,
) -> list[np.ndarray]:
    """Per layer, train a probe on `train_states` and return, per test set, a boolean (layers, n) matrix.

    States are (layers, n, hidden).  Labels are normalised values.
    """
    layers = train_states.shape[0]
    y = np.array([normalise_text(v) for v in train_labels])
    out = [np.zeros((layers, len(labels)), dtype=bool) for labels in test_labels]
    if len(set(y.tolist())) < 2:
        return out
    for layer in range(layers):
        scaler = StandardScaler().fit(train_states[layer])
        probe = RidgeClassifier(alpha=1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            probe.fit(scaler.transform(train_states[layer]), y)
        for k, (states, labels) in enumerate(zip(test_states, test_labels, strict=True)):
            if len(labels):
                predicted = probe.predict(scaler.transform(states[layer]))
                out[k][layer] = predicted == np.array([normalise_text(v) for v in labels])
    return out


@dataclass(frozen=True)
class ResidualRatio:
    value: float
    stderr: float
    ci_low: float
    ci_high: float
    layer: int  # the layer achieving the max, -1 when no layer is usable
    usable_layers: int
    acc_forget: float  # at that layer
    acc_control: float
    acc_base_forget: float


def _max_ratio(
    forget: np.ndarray, control: np.ndarray, base_forget: np.ndarray, min_gap: float
) -> tuple[float, int, int]:
    acc_f, acc_c, acc_b = forget.mean(1), control.mean(1), base_forget.mean(1)
    gap = acc_b - acc_c
    usable = gap >= min_gap
    usable[0] = False  # the embedding layer (see the module docstring)
    if not usable.any():
        return 0.0, -1, 0
    ratios = np.where(usable, (acc_f - acc_c) / np.where(usable, gap, 1.0), -np.inf)
    layer = int(np.argmax(ratios))
    return float(ratios[layer]), layer, int(usable.sum())


def residual_knowledge_ratio(
    forget: np.ndarray,
    control: np.ndarray,
    base_forget: np.ndarray,
    *,
    min_gap: float = 0.2,
    bootstrap: int = 200,
    seed: int = 0,
) -> ResidualRatio:
    """The ratio from (layers, n) correctness matrices; forget and base_forget share columns."""
    value, layer, usable = _max_ratio(forget, control, base_forget, min_gap)
    rng = np.random.default_rng(seed)
    samples = []
    n_f, n_c = forget.shape[1], control.shape[1]
    if n_f and n_c:
        for _ in range(bootstrap):
            fi = rng.integers(0, n_f, n_f)
            ci = rng.integers(0, n_c, n_c)
            samples.append(_max_ratio(forget[:, fi], control[:, ci], base_forget[:, fi], min_gap)[0])
    arr = np.array(samples) if samples else np.array([value])
    pick = layer if layer >= 0 else 0
    return ResidualRatio(
        value=value,
        stderr=float(arr.std()),
        ci_low=float(np.percentile(arr, 2.5)),
        ci_high=float(np.percentile(arr, 97.5)),
        layer=layer,
        usable_layers=usable,
        acc_forget=float(forget[pick].mean()) if n_f else 0.0,
        acc_control=float(control[pick].mean()) if n_c else 0.0,
        acc_base_forget=float(base_forget[pick].mean()) if n_f else 0.0,
    )
