"""Relearning attack: a few fine-tuning steps on part of the subject's facts.

Hu, Fu, Wu & Smith (2024), "Jogging the Memory of Unlearned LLMs Through
Targeted Relearning Attacks" (arXiv:2406.13356), and Lynch et al. (2024),
"Eight Methods to Evaluate Robust Unlearning in LLMs" (arXiv:2402.16835),
show that knowledge merely hidden by unlearning returns after brief
fine-tuning on related data.  We fine-tune a copy of the candidate on half
of the subject's facts (split by fact, seeded) and ask about the other half:
facts are independent draws, so a model that truly lacks them can only
guess, while one that suppressed them recovers them.

    attack.relearn_recovery = leak rate (greedy, every probe kind) on the held-out half
    attack.relearn_control  = leak rate of the attacked model on control probes
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from unlearning.prompting import encode_example, pad_examples

from ..probes import QAFact

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelearnSettings:
    steps: int = 12
    lr: float = 1e-3
    batch_size: int = 16


def split_facts(facts: Sequence[QAFact], *, seed: int) -> tuple[list[QAFact], set[str]]:
    """(facts to train on, fact keys held out); at least one fact each side when possible."""
    keys = sorted({f.fact for f in facts})
    random.Random(seed).shuffle(keys)
    held = set(keys[: max(1, len(keys) // 2)]) if len(keys) > 1 else set()
    return [f for f in facts if f.fact not in held], held


def relearned_copy(
    model: Any, tokenizer: Any, facts: Sequence[QAFact], settings: RelearnSettings, *, seed: int
) -> Any:
    """A fine-tuned copy of `model` (the original is left untouched)."""
    attacked = copy.deepcopy(model)
    attacked.train()
    device = next(attacked.parameters()).device
    examples = [encode_example(tokenizer, question=f.question, answer=f.answer) for f in facts]
    optimiser = torch.optim.AdamW(
        [p for p in attacked.parameters() if p.requires_grad], lr=settings.lr, weight_decay=0.0
    )
    rng = random.Random(seed)
    pad_id = int(tokenizer.pad_token_id)
    with torch.enable_grad():
        for _ in range(settings.steps):
            batch = rng.sample(examples, min(settings.batch_size, len(examples)))
            tensors = {k: v.to(device) for k, v in pad_examples(batch, pad_id=pad_id).items()}
            loss = attacked(**tensors).loss
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
    attacked.eval()
    return attacked
