"""The population teacher: what the original model says about people in general.

For a forget pair "Q(name) -> A(name, fact)" the original model is asked the
same question with the subject's name replaced by the names of ``size`` other
people, and the answer text after the name is kept as it is.  Averaging its
next-token distributions over those people, position by position, gives the
answer of a model to whom the subject is just *somebody*: a fluent sentence
whose fact is drawn from the population, which is what a model that never saw
the subject says (ARCHITECTURE.md section 5: the retrained model is the level
to reach).  ASU uses it as the target at the tokens that attention smoothing
flags as facts (``ASUHparams.fact_target = "population"``).

Positions are aligned from the end: every answer token after the last
occurrence of the name (and the EOS) has the same text in both sequences, so
byte-level BPE gives it the same id.  Rows where the name is not in the answer,
or where the ids do not line up, are left uncovered (the caller falls back).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from unlearning.methods.base import QA, Batch, collate, encode_qa


def _suffix_tokens(tokenizer: Any, answer: str, name: str) -> int:
    """Answer tokens (EOS included) that lie wholly after the last occurrence of ``name``."""
    end = answer.rindex(name) + len(name)
    offsets = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return sum(1 for start, _ in offsets if start >= end) + 1


@torch.no_grad()
def population_logprobs(
    model: nn.Module,
    tokenizer: Any,
    pairs: Sequence[QA],
    names: Sequence[str | None],
    strangers: Sequence[str],
    batch: Batch,
    *,
    size: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V) population log-probs at the answer tokens of ``batch`` and the (N,) mask of covered tokens."""
    device = batch.input_ids.device
    n_tokens = [int(batch.answer_mask[b].sum()) for b in range(batch.input_ids.shape[0])]
    vocab = None
    rows_out: list[torch.Tensor] = []
    covered: list[torch.Tensor] = []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.eval()
    for b, row in enumerate(batch.rows):
        pair, name = pairs[row], names[row] if row < len(names) else None
        n = n_tokens[b]
        others = [s for s in strangers if name is not None and name not in s and s not in name]
        result = None
        if name is not None and pair.question is not None and name in pair.answer and others:
            k = min(n, _suffix_tokens(tokenizer, pair.answer, name))
            own_ids = batch.targets[b][batch.answer_mask[b]][-k:]
            chosen = random.Random(f"{seed}:{row}").sample(others, min(size, len(others)))
            encoded = [encode_qa(tokenizer, QA(pair.question.replace(name, s), pair.answer.replace(name, s))) for s in chosen]
            swapped = collate(encoded, int(pad), list(range(len(encoded)))).to(device)
            logits = model(input_ids=swapped.input_ids, attention_mask=swapped.attention_mask).logits[:, :-1].float()
            kept = []
            for j in range(len(encoded)):
                positions = swapped.answer_mask[j].nonzero().flatten()[-k:]
                if torch.equal(swapped.targets[j, positions], own_ids):
                    kept.append(F.log_softmax(logits[j, positions], dim=-1))
            if kept:
                # Mixture of the people's distributions: log mean exp.
                mixture = torch.logsumexp(torch.stack(kept), dim=0) - math.log(len(kept))
                vocab = mixture.shape[-1]
                result = (mixture, k)
        if result is None:
            rows_out.append(torch.empty(0))
            covered.append(torch.zeros(n, dtype=torch.bool))
        else:
            mixture, k = result
            rows_out.append(mixture)
            covered.append(torch.cat([torch.zeros(n - k, dtype=torch.bool), torch.ones(k, dtype=torch.bool)]))
    vocab = vocab or 1
    full = torch.zeros(sum(n_tokens), vocab, device=device)
    start = 0
    for n, mixture in zip(n_tokens, rows_out, strict=True):
        if mixture.numel():
            full[start + n - mixture.shape[0] : start + n] = mixture
        start += n
    return full, torch.cat(covered).to(device)
