"""Relearning attack: fine-tuning on part of the subject's records, at several budgets.

Hu, Fu, Wu & Smith (2024), "Jogging the Memory of Unlearned LLMs Through
Targeted Relearning Attacks" (arXiv:2406.13356), and Deeb & Roger (2024),
"Do Unlearning Methods Remove Information from Language Model Weights?"
(arXiv:2410.08827), show that knowledge merely hidden by unlearning returns
after brief fine-tuning on related data, and that the recovery grows with
the attacker's budget.  We fine-tune a copy of the candidate on half of the
subject's records (split by record, seeded) and ask about the other half,
after each budget of optimiser steps (a recovery curve): the records hold
independent facts, so a model that truly lacks them can only guess, while
one that suppressed them recovers them.

    attack.relearn.<steps>   = leak rate (greedy, every probe kind) on the held-out half
    attack.relearn_recovery  = the highest point of the curve
    attack.relearn_control   = leak rate of the attacked model on control probes, at that point
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from unlearning.modeling import position_limit
from unlearning.prompting import encode_record, pad_examples, pad_id_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelearnSettings:
    budgets: tuple[int, ...] = (4, 12, 36)  # cumulative optimiser steps at which the curve is read
    lr: float = 1e-3
    batch_size: int = 16


def split_records(record_ids: Sequence[str], *, seed: int) -> tuple[set[str], set[str]]:
    """(ids to train on, ids held out); empty when there are fewer than two records."""
    keys = sorted(set(record_ids))
    if len(keys) < 2:
        return set(), set()
    random.Random(seed).shuffle(keys)
    held = set(keys[: max(1, len(keys) // 2)])
    return set(keys) - held, held


def relearn_curve(
    model: Any, tokenizer: Any, records: Sequence[Any], settings: RelearnSettings, *, seed: int,
) -> Iterator[tuple[int, Any]]:
    """Yield (steps, attacked copy) after each budget; the candidate itself is left untouched."""
    attacked = copy.deepcopy(model)
    device = next(attacked.parameters()).device
    limit = position_limit(model)  # a longer record is cut to the positions, as training does
    examples = [e.truncated(limit) if limit is not None and len(e) > limit else e
                for e in (encode_record(tokenizer, r) for r in records)]
    pairs = [(list(e.ids), e.labels) for e in examples]
    optimiser = torch.optim.AdamW(
        [p for p in attacked.parameters() if p.requires_grad], lr=settings.lr, weight_decay=0.0)
    rng = random.Random(seed)
    pad_id = pad_id_of(tokenizer)
    done = 0
    for budget in sorted(settings.budgets):
        attacked.train()
        with torch.enable_grad():
            while done < budget:
                batch = rng.sample(pairs, min(settings.batch_size, len(pairs)))
                tensors = {k: v.to(device) for k, v in pad_examples(batch, pad_id=pad_id).items()}
                loss = attacked(**tensors).loss
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                done += 1
        attacked.eval()
        yield budget, attacked

