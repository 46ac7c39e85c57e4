"""Latent traces: does the model still tell the subject's true values from false ones inside?

A value can be unique to one person (an e-mail address, a phone number), so a
probe that classifies values into classes shared by many people cannot test
it.  Instead every layer is read through a *tuned lens* (Belrose et al. 2023,
"Eliciting Latent Predictions from Transformers with the Tuned Lens",
arXiv:2303.08112): per layer, an affine translator fitted by ridge regression
maps the layer's residual state onto the state the model feeds its output
head, on retained people's text (which the model should still know), and the
output head then reads a next-token distribution from that layer.  A fact is a
context and two continuations, the true value and a perturbed one (a given
perturbed answer, else another person's value of the same kind: a value
swap).  From the first token where they differ, each value is fed to the model
(teacher-forced) and the layer is *correct* when its lens gives the true value
the higher mean log-probability per token (`lens_token_logprobs`; policies up
to v4 compared the first differing token alone).  Tested on the subject's facts
and on a null that never saw them (chance, 0.5): the same facts asked about
strangers (policy v6), or control people's facts (v5 and before).
Reading intermediate layers is how Patil, Hase & Bansal (2023,
arXiv:2309.17410) recover "deleted" facts that no longer reach the output;
the lens is fitted afresh on the model under test and is independent of the
unlearning method (never a KIF signature direction).

    residual_knowledge_ratio = max over usable layers l of
        (acc_forget[l] - acc_control[l]) / (acc_base_forget[l] - acc_control[l])

A layer is usable when the base's forget accuracy exceeds control by at
least `min_gap` (elsewhere the base itself shows no decodable knowledge and
the ratio is noise); the embedding layer never is.  0 means no more decodable
than for strangers, 1 as decodable as before, below 0 less than for
strangers.  The bootstrap resamples forget and control facts (paired between
candidate and base) and recomputes the max; its standard deviation is the
`stderr` the policy uses, its 2.5/97.5 percentiles the CI.  With no usable
layer the ratio is *not measurable* (reported as such; the policy's rule
decides).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

logger = logging.getLogger(__name__)


def fit_translators(states: np.ndarray, head_inputs: np.ndarray, *, alpha: float = 1.0) -> list[np.ndarray]:
    """Per layer, the ridge solution W (d+1, d) of ``[h, 1] @ W ~ head input`` (a tuned lens)."""
    layers, n, d = states.shape
    y = torch.from_numpy(head_inputs).double()
    out = []
    for layer in range(layers):
        x = torch.cat([torch.from_numpy(states[layer]).double(), torch.ones(n, 1, dtype=torch.float64)], dim=1)
        gram = x.T @ x + alpha * torch.eye(d + 1, dtype=torch.float64)
        out.append(torch.linalg.solve(gram, x.T @ y).float().numpy())
    return out


@torch.no_grad()
def lens_token_logprobs(
    head: torch.nn.Module, translators: list[np.ndarray], states: list[np.ndarray], tokens: list[list[int]],
    *, chunk: int = 2048,
) -> list[np.ndarray]:
    """Per sequence, (layers, tokens): log p of each token as layer l's lens reads it from the state
    before it (`states[i]` is (layers, len(tokens[i]), hidden), as `continuation_states` gives)."""
    lengths = [len(t) for t in tokens]
    out = [np.zeros((len(translators), n), dtype=np.float32) for n in lengths]
    if not tokens or not sum(lengths):
        return out
    weight = next(head.parameters())
    target = torch.tensor([t for seq in tokens for t in seq])
    for layer, translator in enumerate(translators):
        h = torch.from_numpy(np.concatenate([s[layer] for s in states], axis=0))
        w = torch.from_numpy(translator)
        read = torch.empty(len(target))
        for begin in range(0, len(target), chunk):
            piece = h[begin : begin + chunk]
            translated = torch.cat([piece, torch.ones(len(piece), 1)], dim=1) @ w
            logits = head(translated.to(device=weight.device, dtype=weight.dtype)).float().cpu()
            rows = torch.arange(len(piece))
            read[begin : begin + len(piece)] = logits.log_softmax(-1)[rows, target[begin : begin + chunk]]
        at = 0
        for i, n in enumerate(lengths):
            out[i][layer] = read[at : at + n].numpy()
            at += n
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

    @property
    def measurable(self) -> bool:
        return self.usable_layers > 0


def _max_ratio(
    forget: np.ndarray, control: np.ndarray, base_forget: np.ndarray, min_gap: float
) -> tuple[float, int, int]:
    if forget.size == 0 or control.size == 0 or base_forget.size == 0:
        return 0.0, -1, 0
    acc_f, acc_c, acc_b = forget.mean(1), control.mean(1), base_forget.mean(1)
    gap = acc_b - acc_c
    usable = gap >= min_gap
    usable[0] = False  # the embedding layer: a function of one token, it holds no person
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
    n_f = forget.shape[1] if forget.ndim == 2 else 0
    n_c = control.shape[1] if control.ndim == 2 else 0
    if usable and n_f and n_c:
        for _ in range(bootstrap):
            fi = rng.integers(0, n_f, n_f)
            ci = rng.integers(0, n_c, n_c)
            sample, _, ok = _max_ratio(forget[:, fi], control[:, ci], base_forget[:, fi], min_gap)
            if ok:
                samples.append(sample)
    arr = np.array(samples) if samples else np.array([value])
    pick = layer if layer >= 0 else 0
    has_layers = forget.ndim == 2 and forget.shape[0] > 0
    return ResidualRatio(
        value=value,
        stderr=float(arr.std()),
        ci_low=float(np.percentile(arr, 2.5)),
        ci_high=float(np.percentile(arr, 97.5)),
        layer=layer,
        usable_layers=usable,
        acc_forget=float(forget[pick].mean()) if n_f and has_layers else 0.0,
        acc_control=float(control[pick].mean()) if n_c and has_layers else 0.0,
        acc_base_forget=float(base_forget[pick].mean()) if n_f and has_layers else 0.0,
    )
