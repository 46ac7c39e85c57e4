"""Gradient difference (open-unlearning ``GradDiff``).

Loss: ``-forget_weight * NLL(forget answers) + retain_weight * NLL(retain answers)``
- gradient ascent on the forget set anchored by plain fine-tuning on the
retain set (one retain batch per forget batch).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from unlearning.methods.base import (
    Batch,
    MethodInput,
    MethodOutcome,
    answer_nll,
    forget_retain_batches,
    run_training,
)
from unlearning.progress import ProgressCallback


@dataclass(frozen=True)
class GradDiffHparams:
    lr: float = 1e-3
    epochs: int = 5
    batch_size: int = 8
    forget_weight: float = 1.0
    retain_weight: float = 1.0
    weight_decay: float = 0.01
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class GradDiff:
    name: ClassVar[str] = "graddiff"
    hparams_type: ClassVar[type] = GradDiffHparams

    def unlearn(
        self, model: nn.Module, tokenizer: Any, data: MethodInput, hparams: GradDiffHparams,
        *, progress: ProgressCallback | None = None,
    ) -> MethodOutcome:
        hp = hparams
        device = next(model.parameters()).device
        forget, retain = forget_retain_batches(
            tokenizer, data.forget, data.retain, batch_size=hp.batch_size, seed=hp.seed, device=device,
        )

        def step_loss(epoch: int, forget_batch: Batch, retain_batch: Batch) -> torch.Tensor:
            return -hp.forget_weight * answer_nll(model, forget_batch) + hp.retain_weight * answer_nll(model, retain_batch)

        steps, loss = run_training(
            model, forget, retain, step_loss, lr=hp.lr, epochs=hp.epochs,
            weight_decay=hp.weight_decay, stage="unlearn:graddiff", progress=progress,
        )
        return MethodOutcome(model, steps, loss)
