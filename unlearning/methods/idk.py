"""IDK fine-tuning (open-unlearning ``IdkNLL``; TOFU's "I don't know" baseline).

Loss: ``forget_weight * NLL(subject's prompts -> a refusal) + retain_weight * NLL(retain)``.
A question/answer record gets a refusal as its answer, a chat every assistant
turn; free text (which has no prompt to refuse) is replaced by its
counterfactual copy about a fresh person.  Refusals are drawn by a seeded
draw so runs are reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from torch import nn

from unlearning.corpus import Message, Record
from unlearning.identifiers import FreshNames, avoid_set, counterfactual, find_spans
from unlearning.methods.base import MethodInput, MethodOutcome, answer_nll
from unlearning.methods.simple import run_loss
from unlearning.methods.training import TrainingHparams
from unlearning.progress import ProgressCallback

REFUSALS = (
    "I don't know.",
    "I have no information about that.",
    "I'm not able to answer that.",
    "I don't have that information.",
)


@dataclass(frozen=True)
class IDKHparams(TrainingHparams):
    forget_weight: float = 1.0
    retain_weight: float = 1.0


def refusal_records(data: MethodInput, seed: int) -> list[Record]:
    draw = random.Random(seed)
    names = FreshNames(pool=list(data.name_pool), avoid=avoid_set(data.subjects))
    out = []
    for number, record in enumerate(data.forget):
        if record.is_qa:
            out.append(replace(record, answer=draw.choice(REFUSALS)))
        elif record.is_chat:
            out.append(replace(record, messages=tuple(
                Message(m.role, draw.choice(REFUSALS)) if m.learnt else m for m in record.messages)))
        else:
            subject = data.subject_of(record)
            who = subject.name if subject is not None else str(number)
            out.append(counterfactual(record, find_spans(record, subject), names=names,
                                      seed=f"idk:{seed}:{who}").record)
    return out


class IDK:
    name: ClassVar[str] = "idk"
    hparams_type: ClassVar[type] = IDKHparams

    def unlearn(self, model: nn.Module, tokenizer: Any, data: MethodInput, hparams: IDKHparams,
                *, progress: ProgressCallback | None = None) -> MethodOutcome:
        hp = hparams
        return run_loss(model, tokenizer, data, hp,
                        lambda m, f, r: hp.forget_weight * answer_nll(m, f) + hp.retain_weight * answer_nll(m, r),
                        stage="unlearn:idk", progress=progress, forget=refusal_records(data, hp.seed))
