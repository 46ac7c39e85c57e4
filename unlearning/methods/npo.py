"""NPO - Negative Preference Optimization (Zhang et al. 2024, arXiv 2404.05868; open-unlearning ``NPO``).

Loss: ``forget_weight * (2 / beta) * mean(-log sigmoid(-beta * log(pi(y|x) / pi_ref(y|x))))
+ retain_weight * NLL(retain answers)`` over forget sequences, where log pi is
the summed answer log-likelihood and pi_ref the frozen original (computed
once, before the first step).  Unlike gradient ascent the forget term
saturates once the answer is unlikely, so it does not run away.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
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
    forget_retain_batches,
    run_training,
    token_nll,
)
from unlearning.progress import ProgressCallback


@dataclass(frozen=True)
class NPOHparams:
    beta: float = 0.1
    lr: float = 1e-3
    epochs: int = 5
    batch_size: int = 8
    forget_weight: float = 1.0
    retain_weight: float = 1.0
    weight_decay: float = 0.01
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sequence_nll(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Summed answer negative log-likelihood per sequence, shape (batch,)."""
    nll = token_nll(answer_logits(model, batch), batch)
    return (nll * batch.answer_mask).sum(-1)


class NPO:
    name: ClassVar[str] = "npo"
    hparams_type: ClassVar[type] = NPOHparams

    def unlearn(
        self, model: nn.Module, tokenizer: Any, data: MethodInput, hparams: NPOHparams,
        *, progress: ProgressCallback | None = None,
    ) -> MethodOutcome:
        hp = hparams
        device = next(model.parameters()).device
        forget, retain = forget_retain_batches(
            tokenizer, data.forget, data.retain, batch_size=hp.batch_size, seed=hp.seed, device=device,
        )
        model.eval()
        with torch.no_grad():
            reference = {id(b): sequence_nll(model, b) for b in forget}

        def step_loss(epoch: int, forget_batch: Batch, retain_batch: Batch) -> torch.Tensor:
            # log(pi / pi_ref) = ref_nll - nll; NPO penalises it being large.
            log_ratio = reference[id(forget_batch)] - sequence_nll(model, forget_batch)
            loss_forget = -F.logsigmoid(-hp.beta * log_ratio).mean() * 2.0 / hp.beta
            return hp.forget_weight * loss_forget + hp.retain_weight * answer_nll(model, retain_batch)

        steps, loss = run_training(
            model, forget, retain, step_loss, lr=hp.lr, epochs=hp.epochs,
            weight_decay=hp.weight_decay, stage="unlearn:npo", progress=progress,
        )
        return MethodOutcome(model, steps, loss)
