"""IDK fine-tuning (open-unlearning ``IdkNLL``; TOFU's "I don't know" baseline).

Loss: ``forget_weight * NLL(forget questions -> a refusal) + retain_weight * NLL(retain answers)``.
Each forget question is paired with one of a few fixed refusals, picked by a
seeded draw so runs are reproducible.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from unlearning.methods.base import (
    QA,
    Batch,
    MethodInput,
    MethodOutcome,
    answer_nll,
    forget_retain_batches,
    run_training,
)
from unlearning.progress import ProgressCallback

REFUSALS = (
    "I don't know.",
    "I have no information about that.",
    "I'm not able to answer that.",
    "I don't have that information.",
)


@dataclass(frozen=True)
class IDKHparams:
    lr: float = 1e-3
    epochs: int = 5
    batch_size: int = 8
    forget_weight: float = 1.0
    retain_weight: float = 1.0
    weight_decay: float = 0.01
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class IDK:
    name: ClassVar[str] = "idk"
    hparams_type: ClassVar[type] = IDKHparams

    def unlearn(
        self, model: nn.Module, tokenizer: Any, data: MethodInput, hparams: IDKHparams,
        *, progress: ProgressCallback | None = None,
    ) -> MethodOutcome:
        hp = hparams
        device = next(model.parameters()).device
        draw = random.Random(hp.seed)
        refusals = [QA(pair.question, draw.choice(REFUSALS)) for pair in data.forget]
        forget, retain = forget_retain_batches(
            tokenizer, refusals, data.retain, batch_size=hp.batch_size, seed=hp.seed, device=device,
        )

        def step_loss(epoch: int, forget_batch: Batch, retain_batch: Batch) -> torch.Tensor:
            return hp.forget_weight * answer_nll(model, forget_batch) + hp.retain_weight * answer_nll(model, retain_batch)

        steps, loss = run_training(
            model, forget, retain, step_loss, lr=hp.lr, epochs=hp.epochs,
            weight_decay=hp.weight_decay, stage="unlearn:idk", progress=progress,
        )
        return MethodOutcome(model, steps, loss)
