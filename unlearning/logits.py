"""The model's next-token logits at chosen positions only.

A causal LM's output head maps every position's final state to the whole vocabulary: on
the project's demo model that is a third of the arithmetic, and on a released model with
a vocabulary of 128k tokens it is most of the memory a scoring batch holds.  Scoring,
calibration and target building read a few positions of each sequence (an answer's, the
learnt tokens'), so they ask for those alone.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

_LOGITS_AT = "_erasure_logits_at"  # on a model: does it take a boolean `logits_to_keep` (None: not yet known)


def logits_at(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              keep: torch.Tensor) -> torch.Tensor:
    """The model's logits at the `keep` positions (boolean, batch x length) as (kept, vocab),
    row-major, as `model(...).logits[keep]` gives them.

    Computed at those positions only where the model takes a boolean `logits_to_keep`
    (transformers' causal LMs slice the final states before the output head and its
    soft-capping or scaling).  Run it in evaluation mode (dropout off): the check compares two
    forward passes.  Whether a model does is checked on its first call against the
    whole computation and remembered on the model, so a forward that reads the argument
    otherwise (or not at all) is never trusted blindly: that is read whole."""
    known = getattr(model, _LOGITS_AT, None)
    if known is not False:
        kept = int(keep.sum())
        try:
            rows: torch.Tensor | None = model(input_ids=input_ids, attention_mask=attention_mask,
                                              logits_to_keep=keep).logits
        except (TypeError, ValueError, IndexError, RuntimeError):
            rows = None
        if rows is not None and rows.dim() == 2 and rows.shape[0] == kept:
            if known:
                return rows
            whole: torch.Tensor = model(input_ids=input_ids, attention_mask=attention_mask).logits[keep]
            loose = rows.dtype not in (torch.float32, torch.float64)
            same = whole.shape == rows.shape and torch.allclose(
                whole.float(), rows.float(), rtol=1e-3, atol=5e-2 if loose else 1e-3)
            setattr(model, _LOGITS_AT, bool(same))
            return whole
        setattr(model, _LOGITS_AT, False)
    read: torch.Tensor = model(input_ids=input_ids, attention_mask=attention_mask).logits[keep]
    return read


# The model's readout: what it does to its output head's output before it calls that its logits.
#
# Most causal LMs return the head's output as it is, but some do more: gemma2 and its
# successors soft-cap it (`cap * tanh(x / cap)`), cohere multiplies it by `logit_scale`,
# granite divides it by `logits_scaling`, falcon_h1 multiplies it by `lm_head_multiplier`.
# A lens that reads a layer through the bare head reads a distribution the model never
# gives (a different temperature; no cap), so the latent checks read through the readout.

_READOUT = "_erasure_readout"  # on a model: its `Readout`, once found
_CAP_FIELDS = ("final_logit_softcapping",)


def _configs(config: object) -> list[object]:
    """The configuration and the ones nested in it (a multimodal model's `text_config`)."""
    out = [config]
    for name in ("text_config", "language_config", "llm_config"):
        inner = getattr(config, name, None)
        if inner is not None and inner is not config:
            out.append(inner)
    return out


def _caps(model: nn.Module) -> list[float]:
    found: list[float] = []
    for config in _configs(getattr(model, "config", None)):
        for field in _CAP_FIELDS:
            value = getattr(config, field, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                found.append(float(value))
    return sorted(set(found))


class Readout:
    """`cap * tanh(scale * x / cap)` (no cap: `scale * x`) of the head's output `x`.

    Found by `find_readout` from one forward pass of the model: a scale fitted by least
    squares, and a soft-cap named by the model's configuration; kept only where it
    reproduces the model's own logits.  `verified` is False where nothing did (the bare
    head is then used, and the verification report says so)."""

    def __init__(self, scale: float = 1.0, cap: float | None = None, *, verified: bool = True) -> None:
        self.scale, self.cap, self.verified = float(scale), cap, verified

    def __call__(self, head_output: torch.Tensor) -> torch.Tensor:
        out = head_output * self.scale if self.scale != 1.0 else head_output
        if self.cap is not None:
            out = torch.tanh(out / self.cap) * self.cap
        return out

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.cap is None

    def describe(self) -> str:
        """For the report: 'head', 'head x 0.0625', 'head, soft-capped at 30', 'head (unverified)'."""
        if not self.verified:
            return "head (the model's own readout not reproduced)"
        text = "head" if self.scale == 1.0 else f"head x {self.scale:.6g}"
        return text + (f", soft-capped at {self.cap:g}" if self.cap is not None else "")


def _fits(candidate: torch.Tensor, logits: torch.Tensor, *, loose: bool) -> bool:
    """Within float32 rounding of the logits' range, or bfloat16's (2^-8) where the model
    computed in half precision (its own readout rounds at every operation)."""
    scale = float(logits.abs().max().clamp_min(1.0))
    tolerance = 1e-2 if loose else 1e-3
    return bool(torch.allclose(candidate, logits, rtol=tolerance, atol=tolerance * scale))


def _fitted_scale(x: torch.Tensor, y: torch.Tensor) -> float:
    denominator = float((x * x).sum())
    return float((x * y).sum()) / denominator if denominator > 0 else 1.0


@torch.no_grad()
def find_readout(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Readout:
    """The model's readout, from one forward pass over `input_ids` (run it in evaluation mode);
    remembered on the model, so later calls cost nothing."""
    known = getattr(model, _READOUT, None)
    if isinstance(known, Readout):
        return known
    head = model.get_output_embeddings()  # type: ignore[operator]
    outputs: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, output: outputs.append(output))
    try:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    finally:
        handle.remove()
    found = Readout(verified=False)
    if outputs and outputs[-1].shape == logits.shape:
        loose = logits.dtype not in (torch.float32, torch.float64)
        keep = attention_mask.bool().to(logits.device)
        x, y = outputs[-1][keep].double(), logits[keep].double()
        if x.numel() and torch.isfinite(x).all() and torch.isfinite(y).all():
            candidates = []
            for cap in _caps(model):  # named by the configuration: tried first
                # Undo the tanh where it is not saturated and fit the scale inside the cap.
                unsaturated = (y / cap).abs() < 0.999
                if unsaturated.any():
                    inside = torch.atanh(y[unsaturated] / cap) * cap
                    candidates.append(Readout(_fitted_scale(x[unsaturated], inside), cap))
            candidates.append(Readout(_fitted_scale(x, y)))
            for candidate in candidates:
                if abs(candidate.scale - 1.0) < 1e-6:
                    candidate.scale = 1.0
                if _fits(candidate(x), y, loose=loose):
                    found = candidate
                    break
    if not found.verified:
        logger.warning("the model's logits are not its output head's output, scaled or soft-capped: "
                       "its latent readings go through the bare head")
    setattr(model, _READOUT, found)
    return found


def readout_of(model: nn.Module) -> Readout | None:
    """The readout `find_readout` found for `model`, if it ran."""
    known = getattr(model, _READOUT, None)
    return known if isinstance(known, Readout) else None


class ReadoutHead(nn.Module):
    """The output head followed by the model's readout: a layer's lens reads the
    distribution the model itself would give from that state."""

    def __init__(self, head: nn.Module, readout: Readout) -> None:
        super().__init__()
        self.head, self.readout = head, readout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.readout(self.head(x))
        return out
