"""ASU - Attention Smoothing Unlearning (official code: Salehzz/ASU-unlearning).

Loss: ``forget_weight * L_asu + retain_weight * L_retain`` with

* ``L_asu`` = forward KL(teacher || student) over the vocabulary at every
  answer token of the forget set (question tokens masked), averaged per
  sequence then per batch.  The teacher is the frozen original model with every
  attention logit divided by ``tau`` (unlearning.attention): smoothing
  attention blurs which earlier tokens are recalled, which flattens factual
  tokens far more than grammar.
* ``L_retain`` = KL(original || student) on retain answer tokens (``"kl"``) or
  plain cross-entropy on them (``"gd"``).

Published defaults: tau 2.3 (Llama-2-7B) / 2.7 (Llama-3-8B), lr 1e-5, 5
epochs, one retain sample per forget sample, AdamW weight decay 0.01, weights
0.1 / 1.0.  Our demo models are tiny and trained from scratch, so lr and tau
differ (see ``ASUHparams`` and docs/methods.md for the measurements).

Improvements, each off in ``ASUHparams.published()``:

* ``teacher_refresh_every`` - every n epochs the teacher becomes the *current*
  student at temperature tau, so smoothing compounds instead of converging
  to the fixed teacher's own leakage.
* ``keep_copied_tokens`` - answer tokens copied from the question (the
  person's name) take the original, untempered distribution as target: high
  tau breaks copying, which is where fluency breaks.
* ``fact_target`` - what the teacher says at *fact* tokens, i.e. answer
  tokens whose probability the temperature cuts below ``fact_ratio`` times
  the original's (facts, not template: attention smoothing is the detector).
  ``"tempered"`` (published) keeps the tempered teacher there; ``"suppress"``
  removes the memorised token's mass and renormalises; ``"population"`` uses
  the original model's mixture over ``population_size`` other people
  (unlearning.methods.population): the answer of a model to whom the subject
  is a stranger.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from unlearning.attention import attention_temperature
from unlearning.methods.base import (
    QA,
    Batch,
    MethodInput,
    MethodOutcome,
    answer_logits,
    answer_nll,
    forget_retain_batches,
    run_training,
)
from unlearning.methods.population import population_logprobs
from unlearning.progress import ProgressCallback

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ASUHparams:
    """Defaults are the best measured settings on the demo model (docs/methods.md)."""

    tau: float = 4.0
    lr: float = 1e-3
    epochs: int = 5
    batch_size: int = 8
    retain_batch_size: int | None = 64  # None: same as batch_size (published)
    forget_weight: float = 1.0
    retain_weight: float = 1.0
    retain_loss: Literal["kl", "gd"] = "kl"
    weight_decay: float = 0.01
    cache_teacher: Literal["full", "topk", "none"] = "full"
    teacher_topk: int = 64
    teacher_refresh_every: int = 0
    keep_copied_tokens: bool = True
    fact_target: Literal["tempered", "suppress", "population"] = "population"
    fact_ratio: float = 1.5
    population_size: int = 8
    seed: int = 0

    @classmethod
    def published(cls, **overrides: Any) -> ASUHparams:
        """The paper's recipe: fixed teacher, no extra target shaping."""
        base = cls(
            retain_batch_size=None, forget_weight=0.1, teacher_refresh_every=0,
            keep_copied_tokens=False, fact_target="tempered", fact_ratio=0.5,
        )
        return replace(base, **overrides)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TeacherTarget:
    """Teacher log-probabilities at the answer tokens of one batch, (N, V) or top-k."""

    logprobs: torch.Tensor
    indices: torch.Tensor | None = None


@torch.no_grad()
def answer_logprobs(model: nn.Module, batch: Batch, tau: float) -> torch.Tensor:
    """log p(. | prefix) at every answer position of ``batch``, flattened to (N, V)."""
    was_training = model.training
    model.eval()
    with attention_temperature(model, tau):
        logits = answer_logits(model, batch)
    model.train(was_training)
    return F.log_softmax(logits[batch.answer_mask], dim=-1)


_WORD = re.compile(r"[^\W_]+(?:'s)?")


def copied_answer_tokens(tokenizer: Any, pair: QA) -> list[bool]:
    """Per answer token (EOS included): does it spell a word that the question also has?

    Matching words, not token ids: byte-level BPE splits "Quentin" at the start
    of an answer differently from " Quentin" inside the question.  Possessives
    count as their word ("Cardoso's" copies "Cardoso").
    """
    if pair.question is None:
        return [False] * (len(tokenizer(pair.answer, add_special_tokens=False)["input_ids"]) + 1)
    question_words = {w.removesuffix("'s") for w in _WORD.findall(pair.question)}
    words = [(m.start(), m.end(), m.group().removesuffix("'s")) for m in _WORD.finditer(pair.answer)]
    encoded = tokenizer(pair.answer, add_special_tokens=False, return_offsets_mapping=True)
    flags = []
    for start, end in encoded["offset_mapping"]:
        covering = [w for ws, we, w in words if ws < end and start < we]
        flags.append(bool(covering) and all(w in question_words for w in covering))
    return [*flags, False]  # EOS


def copied_token_mask(tokenizer: Any, pairs: Sequence[QA], batch: Batch) -> torch.Tensor:
    """(N,) over the answer tokens of ``batch``: true where the token is copied from the question."""
    flags: list[bool] = []
    for b, row in enumerate(batch.rows):
        row_flags = copied_answer_tokens(tokenizer, pairs[row])
        n = int(batch.answer_mask[b].sum())
        flags.extend((row_flags + [False] * n)[:n])
    return torch.tensor(flags, dtype=torch.bool, device=batch.input_ids.device)


def shape_teacher(
    tempered: torch.Tensor,
    original: torch.Tensor,
    batch: Batch,
    hp: ASUHparams,
    fact_mask: torch.Tensor,
    copied: torch.Tensor,
    population: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Apply the optional target shaping to the tempered teacher, (N, V) log-probs."""
    target = tempered.clone()
    if hp.keep_copied_tokens:
        target[copied] = original[copied]
    if hp.fact_target == "population" and population is not None:
        people, covered = population
        rows = (fact_mask & covered).nonzero().flatten()
        target[rows] = people[rows]
    if hp.fact_target == "suppress" and bool(fact_mask.any()):
        tokens = batch.targets[batch.answer_mask]
        rows = fact_mask.nonzero().flatten()
        target[rows, tokens[rows]] = float("-inf")
        target[rows] = F.log_softmax(target[rows], dim=-1)
    return target


def fact_token_mask(
    tempered: torch.Tensor, original: torch.Tensor, batch: Batch, hp: ASUHparams, copied: torch.Tensor
) -> torch.Tensor:
    """(N,) true where tempering cuts the memorised token's probability below ``fact_ratio``."""
    tokens = batch.targets[batch.answer_mask]
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    ratio = (tempered[rows, tokens] - original[rows, tokens]).exp()
    mask = ratio < hp.fact_ratio
    if hp.keep_copied_tokens:
        mask &= ~copied
    return mask


def compress(target: torch.Tensor, hp: ASUHparams) -> TeacherTarget:
    if hp.cache_teacher != "topk":
        return TeacherTarget(target)
    values, indices = target.topk(min(hp.teacher_topk, target.shape[-1]), dim=-1)
    return TeacherTarget(F.log_softmax(values, dim=-1), indices)


def kl_at_answers(target: TeacherTarget, student_logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Forward KL(target || student) per answer token, mean per sequence then per batch."""
    student = F.log_softmax(student_logits[batch.answer_mask], dim=-1)
    if target.indices is not None:
        # Top-k cache: KL over the teacher's support, student renormalised on it.
        student = F.log_softmax(student.gather(-1, target.indices), dim=-1)
    teacher = target.logprobs
    per_token = (teacher.exp() * (teacher - student)).nan_to_num(0.0).sum(-1)
    sequence = batch.answer_mask.nonzero()[:, 0]
    n = batch.answer_mask.shape[0]
    sums = torch.zeros(n, device=per_token.device).index_add(0, sequence, per_token)
    counts = batch.answer_mask.sum(-1).clamp_min(1).to(per_token.dtype)
    return (sums / counts).mean()


class ASU:
    name: ClassVar[str] = "asu"
    hparams_type: ClassVar[type] = ASUHparams

    def unlearn(
        self,
        model: nn.Module,
        tokenizer: Any,
        data: MethodInput,
        hparams: ASUHparams,
        *,
        progress: ProgressCallback | None = None,
    ) -> MethodOutcome:
        hp = hparams
        if hp.cache_teacher == "none" and hp.teacher_refresh_every > 0:
            raise ValueError("teacher_refresh_every needs a cached teacher (cache_teacher full or topk)")
        device = next(model.parameters()).device
        forget, retain = forget_retain_batches(
            tokenizer, data.forget, data.retain, batch_size=hp.batch_size, seed=hp.seed, device=device, retain_batch_size=hp.retain_batch_size,
        )
        forget_index = {id(b): i for i, b in enumerate(forget)}
        retain_index = {id(b): i for i, b in enumerate(retain)}

        # What the original model says never changes, so it is computed once,
        # before the first step, from the model itself (no copy needed).
        original_forget = [answer_logprobs(model, b, 1.0) for b in forget]
        copied = [copied_token_mask(tokenizer, data.forget, b) for b in forget]
        facts = [
            fact_token_mask(answer_logprobs(model, b, hp.tau), o, b, hp, c)
            for b, o, c in zip(forget, original_forget, copied, strict=True)
        ]
        # cache_teacher="none" is the reference path: a frozen copy of the
        # original computes the teacher at every step (the cached run must match it).
        frozen = _frozen_copy(model) if hp.cache_teacher == "none" else None
        original_retain = (
            [TeacherTarget(answer_logprobs(model, b, 1.0)) for b in retain]
            if hp.retain_loss == "kl" and frozen is None
            else []
        )
        population = (
            [
                population_logprobs(
                    model, tokenizer, data.forget, data.forget_names, _strangers(data), b,
                    size=hp.population_size, seed=hp.seed,
                )
                for b in forget
            ]
            if hp.fact_target == "population"
            else [None] * len(forget)
        )
        teachers: list[TeacherTarget] = []

        def teacher_for(i: int, source: nn.Module) -> TeacherTarget:
            tempered = answer_logprobs(source, forget[i], hp.tau)
            shaped = shape_teacher(tempered, original_forget[i], forget[i], hp, facts[i], copied[i], population[i])
            return compress(shaped, hp)

        def on_epoch_start(epoch: int) -> None:
            refresh = hp.teacher_refresh_every > 0 and epoch % hp.teacher_refresh_every == 0
            if frozen is None and (epoch == 0 or refresh):
                # Epoch 0: the student still is the original, so this is the
                # published fixed teacher; later refreshes temper the student.
                teachers[:] = [teacher_for(i, model) for i in range(len(forget))]

        def step_loss(epoch: int, forget_batch: Batch, retain_batch: Batch) -> torch.Tensor:
            i = forget_index[id(forget_batch)]
            teacher = teachers[i] if frozen is None else teacher_for(i, frozen)
            loss_forget = kl_at_answers(teacher, answer_logits(model, forget_batch), forget_batch)
            if hp.retain_loss == "gd":
                loss_retain = answer_nll(model, retain_batch)
            else:
                original = (
                    original_retain[retain_index[id(retain_batch)]]
                    if frozen is None
                    else TeacherTarget(answer_logprobs(frozen, retain_batch, 1.0))
                )
                loss_retain = kl_at_answers(original, answer_logits(model, retain_batch), retain_batch)
            return hp.forget_weight * loss_forget + hp.retain_weight * loss_retain

        steps, loss = run_training(
            model, forget, retain, step_loss, lr=hp.lr, epochs=hp.epochs, weight_decay=hp.weight_decay,
            stage="unlearn:asu", progress=progress, on_epoch_start=on_epoch_start,
        )
        fact_tokens = int(sum(int(f.sum()) for f in facts))
        return MethodOutcome(model, steps, loss, {"fact_tokens": fact_tokens})


def _strangers(data: MethodInput) -> list[str]:
    """Names of other people from the matched control questions (never a subject's)."""
    subjects = {n for n in data.forget_names if n}
    return sorted({n for n in data.control_names if n and n not in subjects})


def _frozen_copy(model: nn.Module) -> nn.Module:
    import copy

    frozen = copy.deepcopy(model)
    frozen.eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen
