"""What every unlearning method shares: the protocol, batching and the loss algebra.

A method only states its loss (its own file).  This module turns encoded
records (`unlearning.prompting.Example`, one encoding for every record shape)
into padded batches with a loss mask, and holds the losses several methods
use.  Losses are averaged over the loss positions of each sequence and then
over the batch, as in the ASU and open-unlearning reference code.  The
optimiser loop lives in `unlearning.methods.training`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from unlearning.corpus import Record
from unlearning.progress import ProgressCallback
from unlearning.prompting import Example, encode_record, pad_id_of

logger = logging.getLogger(__name__)


@dataclass
class Batch:
    """Right-padded token ids with the mask of positions that carry a loss.

    ``loss_mask[b, t]`` is true when the prediction at position t (of token
    t+1) is trained: by default where token t+1 is learnt (an answer, an
    assistant turn, free text).  ``rows`` index the batch's sequences in the
    list they came from, so per-sequence caches can be looked up.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    rows: list[int] = field(default_factory=list)

    def to(self, device: torch.device) -> Batch:
        return Batch(self.input_ids.to(device), self.attention_mask.to(device),
                     self.loss_mask.to(device), self.rows)

    @property
    def targets(self) -> torch.Tensor:
        return self.input_ids[:, 1:]

    @property
    def answer_mask(self) -> torch.Tensor:  # the name older callers use
        return self.loss_mask


def collate(examples: Sequence[Example], pad_id: int, rows: list[int],
            masks: Sequence[Sequence[bool]] | None = None) -> Batch:
    """Pad examples into a batch; `masks[i][t]` overrides which positions of example i train."""
    width = max(len(e) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    loss = torch.zeros((len(examples), max(1, width - 1)), dtype=torch.bool)
    for b, example in enumerate(examples):
        n = len(example)
        input_ids[b, :n] = torch.tensor(example.ids)
        attention[b, :n] = 1
        positions = masks[b] if masks is not None else example.learnt[1:]
        loss[b, : n - 1] = torch.tensor(list(positions)[: n - 1], dtype=torch.bool)
    return Batch(input_ids, attention, loss, rows)


def make_batches(
    tokenizer: Any, examples: Sequence[Example], *, batch_size: int, shuffle: bool, seed: int,
    device: torch.device | None = None, masks: Sequence[Sequence[bool]] | None = None,
) -> list[Batch]:
    """Fixed batches (``rows`` index into ``examples``), moved to ``device`` when one is given."""
    pad_id = pad_id_of(tokenizer)
    order = list(range(len(examples)))
    if shuffle:
        random.Random(seed).shuffle(order)
    batches = []
    for s in range(0, len(order), batch_size):
        rows = order[s : s + batch_size]
        batches.append(collate([examples[i] for i in rows], pad_id, rows,
                               [masks[i] for i in rows] if masks is not None else None))
    return batches if device is None else [b.to(device) for b in batches]


def encode_all(tokenizer: Any, records: Sequence[Record], *, max_length: int = 512,
               model: nn.Module | None = None) -> list[Example]:
    """Every record encoded the way training encodes it (truncated to `max_length` tokens, and
    to `model`'s positions when it has fewer: GPT-2 and OPT have learnt position embeddings)."""
    limit = min(max_length, max_positions(model) or max_length) if model is not None else max_length
    return [encode_record(tokenizer, r).truncated(limit) for r in records]


def max_positions(model: nn.Module) -> int | None:
    """The longest sequence the model's position embeddings take, if its config says.

    MPT's config names it `max_seq_len` alone (no `max_position_embeddings` alias): its ALiBi
    bias is built for that many positions, and a longer sequence fails to add to it."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def answer_logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Logits at the positions that predict a token (last position dropped), fp32."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    logits: torch.Tensor = out.logits[:, :-1, :].float()
    return logits


def sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the loss positions of each sequence, then over the sequences that have any."""
    mask = mask.to(values.dtype)
    counts = mask.sum(-1)
    per_sequence = (values * mask).sum(-1) / counts.clamp_min(1.0)
    present = (counts > 0).to(values.dtype)
    return (per_sequence * present).sum() / present.sum().clamp_min(1.0)


def token_nll(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Per-token negative log-likelihood of the targets, shape (batch, length)."""
    nll: torch.Tensor = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")
    return nll


def masked_nll(logits: torch.Tensor, batch: Batch, mask: torch.Tensor) -> torch.Tensor:
    """`sequence_mean(token_nll(logits, batch), mask)`, the log-softmax taken at the masked
    positions only (the same value and gradient: elsewhere the term is multiplied by zero)."""
    per_token = F.cross_entropy(logits[mask], batch.targets[mask], reduction="none")
    full = torch.zeros(mask.shape, dtype=per_token.dtype, device=per_token.device)
    full[mask] = per_token
    return sequence_mean(full, mask)


def answer_nll(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Plain fine-tuning loss on the learnt tokens (sequence mean, then batch mean), the
    log-softmax taken at those tokens only (`masked_nll`)."""
    return masked_nll(answer_logits(model, batch), batch, batch.loss_mask.bool())


@dataclass(frozen=True)
class MethodOutcome:
    """What a method hands back to `erase`: the model to save and how it got there."""

    model: nn.Module
    steps: int
    final_loss: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MethodInput:
    """The data a method sees: records, not token ids (each method encodes with its tokenizer).

    ``record_subjects[record.id]`` are the indices (into ``subjects``) of the
    subjects a forget record is about; ``probes`` are the sets' verification
    probes (KIF mines its signature on their prompts); ``name_pool`` are name
    parts of other people (for fresh names in counterfactual copies).
    """

    forget: Sequence[Record]
    retain: Sequence[Record]
    subjects: Sequence[Any] = ()
    record_subjects: Mapping[str, Sequence[int]] = field(default_factory=dict)
    probes: Sequence[Any] = ()
    name_pool: Sequence[str] = ()

    def subject_of(self, record: Record) -> Any | None:
        found = self.record_subjects.get(record.id) or ()
        return self.subjects[found[0]] if found and self.subjects else None


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


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
