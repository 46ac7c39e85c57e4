"""The shared runner of the methods that are only a loss (the baselines).

`run_loss` encodes the forget and retain records, batches them and trains
``loss(model, forget_batch, retain_batch)`` for the step budget; each baseline
file states its loss and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from unlearning.corpus import Record
from unlearning.methods.base import Batch, MethodInput, MethodOutcome, encode_all, make_batches
from unlearning.methods.training import TrainingHparams, run_training
from unlearning.progress import ProgressCallback

Loss = Callable[[nn.Module, Batch, Batch], torch.Tensor]


def run_loss(
    model: nn.Module, tokenizer: Any, data: MethodInput, hp: TrainingHparams, loss: Loss, *,
    stage: str, progress: ProgressCallback | None, forget: Sequence[Record] | None = None,
    prepare: Callable[[Sequence[Batch]], None] | None = None,
) -> MethodOutcome:
    """Train `loss` over forget batches (`forget` replaces the forget records, e.g. refusals)."""
    device = next(model.parameters()).device
    forget_examples = encode_all(tokenizer, forget if forget is not None else data.forget, model=model)
    forget_batches = make_batches(tokenizer, forget_examples, batch_size=hp.batch_size, shuffle=True,
                                  seed=hp.seed, device=device)
    retain_batches = make_batches(tokenizer, encode_all(tokenizer, data.retain, model=model),
                                  batch_size=hp.retain_batch_size, shuffle=True, seed=hp.seed + 1, device=device)
    if prepare is not None:
        prepare(forget_batches)
    steps, final = run_training(model, forget_batches, retain_batches or forget_batches,
                                lambda step, f, r: loss(model, f, r), hp,
                                steps=hp.budget(len(data.subjects) or 1), stage=stage, progress=progress)
    return MethodOutcome(model, steps, final)
