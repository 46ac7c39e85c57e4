"""NPO - Negative Preference Optimization (Zhang et al. 2024, arXiv 2404.05868; open-unlearning ``NPO``).

Loss: ``forget_weight * (2 / beta) * mean(-log sigmoid(-beta * log(pi(y|x) / pi_ref(y|x))))
+ retain_weight * NLL(retain)`` over forget sequences, where log pi is the
summed log-likelihood of the learnt tokens and pi_ref the model before the
first step (computed once).  Unlike gradient ascent the forget term saturates
once the record is unlikely, so it does not run away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from unlearning.methods.base import (
    Batch,
    MethodInput,
    MethodOutcome,
    answer_logits,
    answer_nll,
    token_nll,
)
from unlearning.methods.simple import run_loss
from unlearning.methods.training import TrainingHparams
from unlearning.progress import ProgressCallback


@dataclass(frozen=True)
class NPOHparams(TrainingHparams):
    beta: float = 0.1
    forget_weight: float = 1.0
    retain_weight: float = 1.0


def sequence_nll(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Summed negative log-likelihood of the learnt tokens per sequence, shape (batch,)."""
    return (token_nll(answer_logits(model, batch), batch) * batch.loss_mask).sum(-1)


class NPO:
    name: ClassVar[str] = "npo"
    hparams_type: ClassVar[type] = NPOHparams

    def unlearn(self, model: nn.Module, tokenizer: Any, data: MethodInput, hparams: NPOHparams,
                *, progress: ProgressCallback | None = None) -> MethodOutcome:
        hp = hparams
        reference: dict[int, torch.Tensor] = {}

        def prepare(batches: Sequence[Batch]) -> None:
            model.eval()
            with torch.no_grad():
                reference.update({id(b): sequence_nll(model, b) for b in batches})

        def loss(m: nn.Module, forget: Batch, retain: Batch) -> torch.Tensor:
            # log(pi / pi_ref) = ref_nll - nll; NPO penalises it being large.
            log_ratio = reference[id(forget)] - sequence_nll(m, forget)
            loss_forget = -F.logsigmoid(-hp.beta * log_ratio).mean() * 2.0 / hp.beta
            return hp.forget_weight * loss_forget + hp.retain_weight * answer_nll(m, retain)

        return run_loss(model, tokenizer, data, hp, loss, stage="unlearn:npo", progress=progress, prepare=prepare)
