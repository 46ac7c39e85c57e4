"""Gradient ascent (open-unlearning ``GradAscent``).

Loss: ``-NLL(forget)``: push the likelihood of the subject's records down
with no anchor.  A baseline that shows why anchoring matters: it forgets,
then wrecks fluency and everyone else's facts, and it makes the subject
*less* familiar than a stranger, which the two-sided membership check sees.
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
class GradAscentHparams(TrainingHparams):
    pass


class GradAscent:
    name: ClassVar[str] = "gradascent"
    hparams_type: ClassVar[type] = GradAscentHparams

    def unlearn(self, model: nn.Module, tokenizer: Any, data: MethodInput, hparams: GradAscentHparams,
                *, progress: ProgressCallback | None = None) -> MethodOutcome:
        return run_loss(model, tokenizer, data, hparams, lambda m, f, r: -answer_nll(m, f),
                        stage="unlearn:gradascent", progress=progress)
