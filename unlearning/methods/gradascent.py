"""Gradient ascent (open-unlearning ``GradAscent``).

Loss: ``-NLL(forget answers)`` - push the likelihood of the forget answers
down with no anchor.  A baseline that shows why anchoring matters: it
forgets, then wrecks fluency and everyone else's facts.
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
    make_batches,
    run_training,
)
from unlearning.progress import ProgressCallback


@dataclass(frozen=True)
class GradAscentHparams:
    lr: float = 1e-3
    epochs: int = 5
    batch_size: int = 8
    weight_decay: float = 0.01
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class GradAscent:
    name: ClassVar[str] = "gradascent"
    hparams_type: ClassVar[type] = GradAscentHparams

    def unlearn(
        self, model: nn.Module, tokenizer: Any, data: MethodInput, hparams: GradAscentHparams,
        *, progress: ProgressCallback | None = None,
    ) -> MethodOutcome:
        hp = hparams
        device = next(model.parameters()).device
        forget = make_batches(tokenizer, data.forget, batch_size=hp.batch_size, shuffle=True, seed=hp.seed, device=device)

        def step_loss(epoch: int, forget_batch: Batch, retain_batch: Batch) -> torch.Tensor:
            return -answer_nll(model, forget_batch)

        steps, loss = run_training(
            model, forget, forget, step_loss, lr=hp.lr, epochs=hp.epochs,
            weight_decay=hp.weight_decay, stage="unlearn:gradascent", progress=progress,
        )
        return MethodOutcome(model, steps, loss)



