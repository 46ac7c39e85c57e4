"""The model's next-token logits at chosen positions only.

A causal LM's output head maps every position's final state to the whole vocabulary: on
the project's demo model that is a third of the arithmetic, and on a released model with
a vocabulary of 128k tokens it is most of the memory a scoring batch holds.  Scoring,
calibration and target building read a few positions of each sequence (an answer's, the
learnt tokens'), so they ask for those alone.
"""

from __future__ import annotations

import torch
from torch import nn

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
