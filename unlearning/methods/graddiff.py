"""Gradient difference (open-unlearning ``GradDiff``).

Loss: ``-forget_weight * NLL(forget) + retain_weight * NLL(retain)``: gradient
ascent on the subject's records anchored by plain fine-tuning on retained ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from unlearning.methods.base import MethodInput, MethodOutcome, answer_nll
from unlearning.methods.simple import run_loss
from unlearning.methods.training import TrainingHparams
from unlearning.progress import ProgressCallback


@dataclass(frozen=True)
class GradDiffHparams(TrainingHparams):
    forget_weight: float = 1.0
    retain_weight: float = 1.0


class GradDiff:
    name: ClassVar[str] = "graddiff"
    hparams_type: ClassVar[type] = GradDiffHparams

    def unlearn(self, model: nn.Module, tokenizer: Any, data: MethodInput, hparams: GradDiffHparams,
                *, progress: ProgressCallback | None = None) -> MethodOutcome:
        hp = hparams
        return run_loss(model, tokenizer, data, hp,
                        lambda m, f, r: -hp.forget_weight * answer_nll(m, f) + hp.retain_weight * answer_nll(m, r),
                        stage="unlearn:graddiff", progress=progress)
