"""What every unlearning method shares: the protocol, batching and the loss algebra.

A method only states its loss (its own file); this module turns question /
answer pairs into padded batches with an answer mask, runs the optimiser loop
(AdamW, one retain batch per forget batch, linear warm-up then cosine decay)
and reports progress.  Losses are averaged over answer tokens per sequence and
then over the batch, as in the ASU and open-unlearning reference code.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from unlearning.progress import ProgressCallback, ProgressTracker

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QA:
    """One question / answer pair to train on (the answer is what the loss sees).

    A free-text record has no question: its whole text is the "answer".
    """

    question: str | None
    answer: str


@dataclass
class Batch:
    """Right-padded token ids with the mask of answer tokens that carry a loss.

    ``answer_mask[b, t]`` is true when token t+1 is an answer token, i.e. it
    is aligned with the logits at position t that predict it.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    answer_mask: torch.Tensor
    rows: list[int] = field(default_factory=list)

    def to(self, device: torch.device) -> Batch:
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.answer_mask.to(device),
            self.rows,
        )

    @property
    def targets(self) -> torch.Tensor:
        return self.input_ids[:, 1:]


def encode_qa(tokenizer: Any, pair: QA) -> tuple[list[int], int]:
    """Token ids exactly as `train_base` trains them, and where the loss starts.

    Returns the ids and the number of leading context tokens (the chat-formatted
    question, or the BOS of a free-text record), so the losses start from the
    base model's own answers.
    """
    from unlearning.prompting import encode_example

    if pair.question is None:
        ids, labels = encode_example(tokenizer, text=pair.answer)
    else:
        ids, labels = encode_example(tokenizer, question=pair.question, answer=pair.answer)
    context = next(i for i, label in enumerate(labels) if label != -100)
    return ids, context


def collate(encoded: Sequence[tuple[list[int], int]], pad_id: int, rows: list[int]) -> Batch:
    width = max(len(ids) for ids, _ in encoded)
    input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(encoded), width), dtype=torch.long)
    answer = torch.zeros((len(encoded), width - 1), dtype=torch.bool)
    for b, (ids, n_prompt) in enumerate(encoded):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention[b, : len(ids)] = 1
        answer[b, n_prompt - 1 : len(ids) - 1] = True
    return Batch(input_ids, attention, answer, rows)


def make_batches(
    tokenizer: Any, pairs: Sequence[QA], *, batch_size: int, shuffle: bool, seed: int,
    device: torch.device | None = None,
) -> list[Batch]:
    """Fixed-order batches (``rows`` index into ``pairs`` so caches can be looked up),
    moved to ``device`` when one is given."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [encode_qa(tokenizer, pair) for pair in pairs]
    order = list(range(len(pairs)))
    if shuffle:
        random.Random(seed).shuffle(order)
    batches = [
        collate([encoded[i] for i in order[s : s + batch_size]], int(pad_id), order[s : s + batch_size])
        for s in range(0, len(order), batch_size)
    ]
    return batches if device is None else [b.to(device) for b in batches]


def forget_retain_batches(
    tokenizer: Any, forget: Sequence[QA], retain: Sequence[QA], *, batch_size: int, seed: int,
    device: torch.device | None = None, retain_batch_size: int | None = None,
) -> tuple[list[Batch], list[Batch]]:
    """The shuffled forget batches (seed) and retain batches (seed + 1) every method trains on."""
    return (
        make_batches(tokenizer, forget, batch_size=batch_size, shuffle=True, seed=seed, device=device),
        make_batches(tokenizer, retain, batch_size=retain_batch_size or batch_size, shuffle=True,
                     seed=seed + 1, device=device),
    )


def answer_logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Logits at the positions that predict a token (last position dropped), fp32."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    logits: torch.Tensor = out.logits[:, :-1, :].float()
    return logits


def sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the answer tokens of each sequence, then over the batch."""
    mask = mask.to(values.dtype)
    per_sequence = (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
    return per_sequence.mean()


def token_nll(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Per-token negative log-likelihood of the targets, shape (batch, length)."""
    nll: torch.Tensor = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")
    return nll


def answer_nll(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Plain fine-tuning loss on answer tokens (sequence mean, then batch mean)."""
    return sequence_mean(token_nll(answer_logits(model, batch), batch), batch.answer_mask)


def kl_to_target(
    target_logprobs: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Forward KL(target || student) over the vocabulary at masked positions."""
    student = F.log_softmax(student_logits, dim=-1)
    kl = (target_logprobs.exp() * (target_logprobs - student)).sum(-1)
    return sequence_mean(kl, mask)


@dataclass(frozen=True)
class MethodOutcome:
    """What a method hands back to `erase`: the model to save and how it got there."""

    model: nn.Module
    steps: int
    final_loss: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MethodInput:
    """The data a method sees.

    ``forget_names[i]`` is the subject name (or alias) that occurs in forget
    question i, when known.  ``control`` holds questions of the same shape
    about other, retained people (with ``control_names`` likewise); KIF mines its
    signature against them.  ``alternatives[i]`` is a plausible answer to forget
    question i that does not hold the subject's fact (what a model that never
    saw them would say), or None when none could be built.
    """

    forget: Sequence[QA]
    retain: Sequence[QA]
    forget_names: Sequence[str | None] = ()
    control: Sequence[QA] = ()
    control_names: Sequence[str | None] = ()
    alternatives: Sequence[str | None] = ()


class Method(Protocol):
    name: ClassVar[str]
    hparams_type: ClassVar[type]

    def unlearn(
        self,
        model: nn.Module,
        tokenizer: Any,
        data: MethodInput,
        hparams: Any,
        *,
        progress: ProgressCallback | None = None,
    ) -> MethodOutcome: ...


StepLoss = Callable[[int, Batch, Batch], torch.Tensor]


def run_training(
    model: nn.Module,
    forget: Sequence[Batch],
    retain: Sequence[Batch],
    step_loss: StepLoss,
    *,
    lr: float,
    epochs: int,
    weight_decay: float,
    warmup_fraction: float = 0.1,
    stage: str,
    progress: ProgressCallback | None,
    on_epoch_start: Callable[[int], None] | None = None,
    param_groups: Sequence[dict[str, Any]] | None = None,
) -> tuple[int, float]:
    """Optimise ``step_loss(epoch, forget_batch, retain_batch)`` for ``epochs`` passes over ``forget``.

    One retain batch goes with each forget batch; the retain batches are
    cycled across steps, so a retain set larger than the forget set is used
    in full over the epochs instead of its first batches only.

    Returns (steps, mean loss of the last epoch).  Raises ``FloatingPointError``
    on a non-finite loss rather than writing a broken checkpoint.
    """
    # Default: every trainable parameter at ``lr``; a method may pass groups with their own
    # ``lr`` (KIF: gates fast, LoRA slow).
    groups = [dict(g) for g in param_groups] if param_groups is not None else [
        {"params": [p for p in model.parameters() if p.requires_grad]}
    ]
    params = [p for group in groups for p in group["params"]]
    optimiser = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    if not retain:
        raise ValueError("the retain set is empty: every method here needs retain data")
    total = max(1, epochs * len(forget))
    warmup = max(1, int(total * warmup_fraction))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, schedule)
    tracker = ProgressTracker(progress, stage=stage, total=total)
    tracker.report(0)
    step, last_epoch_loss = 0, float("nan")
    started = time.monotonic()
    for epoch in range(epochs):
        if on_epoch_start is not None:
            on_epoch_start(epoch)
        model.train()
        losses = []
        for forget_batch in forget:
            loss = step_loss(epoch, forget_batch, retain[step % len(retain)])
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{stage}: non-finite loss at step {step}")
            optimiser.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimiser.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            step += 1
            tracker.report(step)
        last_epoch_loss = sum(losses) / max(1, len(losses))
        logger.debug("%s epoch %s loss %.4f", stage, epoch, last_epoch_loss)
    model.eval()
    logger.info("%s: %s steps in %.1fs", stage, step, time.monotonic() - started)
    return step, last_epoch_loss


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
