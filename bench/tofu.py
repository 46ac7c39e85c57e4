"""TOFU-style forget quality and model utility (Maini et al. 2024, "TOFU", arXiv 2401.06121).

Truth ratio of a question: the length-normalised probability of perturbed
(wrong) answers over that of the true answer,
``R = mean_k p(a_k | q)^(1/|a_k|) / p(a | q)^(1/|a|)``.  A model that knows
the fact has R far below 1; one that never saw it has R near 1.

Forget quality: the p-value of a two-sample Kolmogorov-Smirnov test between
the truth ratios of the forget facts under the unlearned model and under the
retrain oracle.  A high p-value means the two cannot be told apart.

Model utility: the harmonic mean, on retained people's facts, of the true
answer's normalised probability, ``max(0, 1 - R)`` and the ROUGE-L recall of
the greedy answer (TOFU also averages real-author and world-fact sets, which
the demo corpus does not have).

Perturbed answers are the true answer with the value swapped for other
values of the same attribute drawn from other people (the demo corpus draws
values from finite pools, so these are exactly the plausible wrong answers).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Fact:
    question: str
    answer: str
    perturbed: tuple[str, ...]


def facts_of(records: Sequence[Any], people: Sequence[dict[str, Any]], *, perturbed: int,
             seed: int = 0) -> list[Fact]:
    """Question/answer records with a known value, each with ``perturbed`` wrong answers."""
    pools: dict[str, set[str]] = defaultdict(set)
    for person in people:
        for fact in person["facts"]:
            pools[fact["attribute"]].add(fact["value"])
    out: list[Fact] = []
    for record in records:
        meta = record.meta or {}
        value, attribute = meta.get("value"), meta.get("attribute")
        if not (record.question and record.answer and value and value in record.answer):
            continue
        others = sorted(pools.get(attribute, set()) - {value})
        if not others:
            continue
        rng = random.Random(f"{seed}:{record.id}")
        chosen = rng.sample(others, min(perturbed, len(others)))
        out.append(Fact(record.question, record.answer,
                        tuple(record.answer.replace(value, other) for other in chosen)))
    return out


def mean_logprobs(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], *,
                  batch_size: int = 64) -> np.ndarray:
    """Mean log-probability per answer token (eos included) of each (question, answer)."""
    import torch

    from unlearning.prompting import encode_example, pad_examples

    device = next(model.parameters()).device
    out: list[float] = []
    examples = [encode_example(tokenizer, question=q, answer=a) for q, a in pairs]
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = pad_examples(examples[start:start + batch_size], pad_id=int(tokenizer.pad_token_id))
            logits = model(input_ids=batch["input_ids"].to(device),
                           attention_mask=batch["attention_mask"].to(device)).logits[:, :-1].float()
            targets = batch["labels"][:, 1:].to(device)
            mask = targets != -100
            logp = torch.log_softmax(logits, -1).gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)
            out.extend(((logp * mask).sum(1) / mask.sum(1).clamp_min(1)).tolist())
    return np.asarray(out, dtype=float)


def truth_ratios(model: Any, tokenizer: Any, facts: Sequence[Fact]) -> tuple[np.ndarray, np.ndarray]:
    """(truth ratio, normalised true-answer probability) per fact."""
    pairs = [(f.question, f.answer) for f in facts]
    pairs += [(f.question, wrong) for f in facts for wrong in f.perturbed]
    scores = mean_logprobs(model, tokenizer, pairs)
    true = scores[: len(facts)]
    ratios, at = [], len(facts)
    for i, fact in enumerate(facts):
        wrong = scores[at:at + len(fact.perturbed)]
        at += len(fact.perturbed)
        ratios.append(float(np.mean(np.exp(wrong)) / np.exp(true[i])))
    return np.asarray(ratios), np.exp(true)


def forget_quality(candidate_ratios: np.ndarray, oracle_ratios: np.ndarray) -> float:
    """KS-test p-value between the two truth-ratio distributions (1.0 = indistinguishable)."""
    from scipy.stats import ks_2samp

    return float(ks_2samp(candidate_ratios, oracle_ratios).pvalue)


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l_recall(prediction: str, reference: str) -> float:
    ref = reference.lower().split()
    return _lcs(prediction.lower().split(), ref) / len(ref) if ref else 0.0


def model_utility(model: Any, tokenizer: Any, facts: Sequence[Fact]) -> dict[str, float]:
    """TOFU's harmonic mean of probability, truth-ratio score and ROUGE-L on retained facts."""
    from unlearning.modeling import generate_answers

    ratios, probability = truth_ratios(model, tokenizer, facts)
    answers = generate_answers(model, tokenizer, [f.question for f in facts])
    rouge = float(np.mean([rouge_l_recall(a, f.answer) for a, f in zip(answers, facts, strict=True)]))
    parts = {"probability": float(np.mean(probability)),
             "truth_ratio_score": float(np.mean(np.maximum(0.0, 1.0 - ratios))),
             "rouge_l": rouge}
    values = list(parts.values())
    harmonic = 0.0 if min(values) <= 0 else len(values) / sum(1.0 / v for v in values)
    return {"model_utility": harmonic, **parts}


def evaluate(model_dir: Path, forget: Sequence[Fact], retain: Sequence[Fact]) -> dict[str, Any]:
    """Truth ratios on the forget facts and model utility on the retained ones, for one model."""
    from unlearning.modeling import load_model

    model, tokenizer = load_model(model_dir)
    ratios, probability = truth_ratios(model, tokenizer, forget)
    utility = model_utility(model, tokenizer, retain)
    return {"forget_truth_ratios": ratios.tolist(),
            "forget_probability": float(np.mean(probability)), **utility}
