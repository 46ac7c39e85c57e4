"""The optimiser loop every method runs, and the settings it runs with.

Every setting that shapes a training run is a field of `TrainingHparams`
(every method's hyper-parameters extend it), so the hyper-parameter record a
certificate signs says exactly how the candidate was made: learning rate,
step budget, batch sizes, warm-up, schedule, AdamW betas, weight decay and
gradient clipping.

**Budgets, not epochs.**  The number of optimiser steps is
``clamp(steps_per_subject * subjects, min_steps, max_steps)`` unless `steps`
is set: a forget set of a handful of records still gets enough steps to
move the model, and a job for many subjects costs a bounded multiple of a job
for one (20 subjects: 160 steps against 60 with the defaults).  The resolved
number is written back into the record.

The loop, top to bottom: AdamW over the trainable parameters (or the
method's parameter groups); a linear warm-up then the schedule; at each step
one forget batch (cycled) and one retain batch (cycled: a retain set larger
than the forget set is used in full over the steps), the method's loss,
backward, clipping, step.  A non-finite loss raises rather than writing a
broken checkpoint.

Inside a distributed erasure (`unlearning.distributed`) the same loop runs on
every rank: the model's forward takes this rank's share of each batch's rows
and returns the whole batch's outputs, so the loss is the one-process loss;
the gradients are summed over the ranks before clipping.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch
from torch import nn

from unlearning import distributed
from unlearning.methods.base import Batch
from unlearning.progress import ProgressCallback, ProgressTracker

logger = logging.getLogger(__name__)

SCHEDULES = ("cosine", "linear", "constant")


@dataclass(frozen=True)
class TrainingHparams:
    """The optimisation settings shared by every method (each method's hparams extend these)."""

    lr: float = 1e-3
    steps: int = 0  # 0: the budget rule decides (module doc); the number used is recorded
    min_steps: int = 60
    steps_per_subject: int = 8
    max_steps: int = 1000
    batch_size: int = 8
    retain_batch_size: int = 32
    warmup_fraction: float = 0.1
    schedule: str = "cosine"
    min_lr_fraction: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    seed: int = 0
    escalation: tuple[str, ...] = ()  # what an escalated retry changed, and why
    preset: str = "standard"  # standard | thorough (twice the step budget), see resolve_preset

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["escalation"] = list(self.escalation)
        return data

    def budget(self, subjects: int) -> int:
        if self.steps > 0:
            return self.steps
        return max(self.min_steps, min(self.max_steps, self.steps_per_subject * max(1, subjects)))

    def resolved(self, subjects: int) -> Any:
        """The same settings with the step budget filled in (what the certificate records)."""
        return replace(self, steps=self.budget(subjects))


GENERIC_PRESETS = ("standard", "thorough")
THOROUGH_FACTOR = 2  # "thorough" doubles the step budget (min_steps, steps_per_subject, max_steps)


def resolve_preset(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Apply the generic named preset to JSON values (the caller's own values win).

    "standard" is the method's defaults; "thorough" trains twice as long.  ASU
    has richer presets of its own and resolves them itself (`ASU.resolve`).
    """
    preset = str(values.get("preset", "standard"))
    if preset not in GENERIC_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose {' or '.join(GENERIC_PRESETS)}")
    out = dict(values)
    if preset == "thorough":
        for key in ("min_steps", "steps_per_subject", "max_steps"):
            out.setdefault(key, int(getattr(cls, key)) * THOROUGH_FACTOR)
    return out


def hparams_from_mapping(cls: type, values: dict[str, Any]) -> Any:
    """A frozen hparams dataclass from JSON values, rejecting unknown keys; lists become tuples."""
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"unknown hyper-parameters: {', '.join(unknown)}")
    clean = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        hp = cls(**clean)
    except TypeError as exc:
        raise ValueError(f"bad hyper-parameters: {exc}") from exc
    check(hp)
    validate = getattr(hp, "validate", None)  # a method's own rules (ASU: tau, cache, targets)
    if callable(validate):
        validate()
    return hp


def check(hp: TrainingHparams) -> None:
    """Refuse settings that cannot train (named in the message)."""
    problems = []
    if not hp.lr > 0:
        problems.append("lr must be positive")
    for name in ("steps", "min_steps", "steps_per_subject", "max_steps"):
        if getattr(hp, name) < 0:
            problems.append(f"{name} must be >= 0")
    if hp.batch_size < 1 or hp.retain_batch_size < 1:
        problems.append("batch sizes must be >= 1")
    if hp.schedule not in SCHEDULES:
        problems.append(f"schedule must be one of {', '.join(SCHEDULES)}")
    if not 0 <= hp.warmup_fraction < 1:
        problems.append("warmup_fraction must be in [0, 1)")
    if problems:
        raise ValueError("bad hyper-parameters: " + "; ".join(problems))


StepLoss = Callable[[int, Batch, Batch], torch.Tensor]


def lr_factor(step: int, *, total: int, warmup: int, schedule: str, floor: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return floor + (1 - floor) * max(0.0, 1.0 - progress)
    return floor + (1 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def run_training(
    model: nn.Module,
    forget: Sequence[Batch],
    retain: Sequence[Batch],
    step_loss: StepLoss,
    hp: TrainingHparams,
    *,
    steps: int,
    stage: str,
    progress: ProgressCallback | None,
    param_groups: Sequence[dict[str, Any]] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> tuple[int, float]:
    """Optimise ``step_loss(step, forget_batch, retain_batch)`` for ``steps`` optimiser steps.

    Returns (steps, mean loss over the last tenth of the steps).
    """
    if not forget:
        raise ValueError("the forget set is empty: there is nothing to erase")
    if not retain:
        raise ValueError("the retain set is empty: every method here needs retain data")
    groups = [dict(g) for g in param_groups] if param_groups is not None else [
        {"params": [p for p in model.parameters() if p.requires_grad]}
    ]
    params = [p for group in groups for p in group["params"]]
    world = distributed.current()
    split: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    sharded = False
    if world is not None:
        distributed.broadcast_parameters(params)
        if world.shard == "fsdp" and param_groups is None:
            distributed.fsdp_shard(model, world)
            groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
            params = list(groups[0]["params"])
            sharded = True
        elif world.shard == "fsdp":
            logger.warning("%s: parameter groups of their own: not sharded (FSDP), data-parallel only", stage)
        split = distributed.sharded_forward(model, world)
    optimiser = torch.optim.AdamW(groups, lr=hp.lr, betas=(hp.beta1, hp.beta2), weight_decay=hp.weight_decay)
    warmup = max(1, int(steps * hp.warmup_fraction))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: lr_factor(s, total=steps, warmup=warmup, schedule=hp.schedule,
                                       floor=hp.min_lr_fraction))
    tracker = ProgressTracker(progress, stage=stage, total=steps)
    tracker.report(0)
    losses: list[float] = []
    started = time.monotonic()
    model.train()
    with split:
        for step in range(steps):
            if on_step is not None:
                on_step(step)
            loss = step_loss(step, forget[step % len(forget)], retain[step % len(retain)])
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{stage}: non-finite loss at step {step}")
            optimiser.zero_grad(set_to_none=True)
            if sharded:
                # FSDP averages the ranks' gradients; each holds its rows' share of the sum.
                (loss * world.size).backward()  # type: ignore[union-attr]
            else:
                loss.backward()  # type: ignore[no-untyped-call]
            if world is not None and not sharded:
                distributed.sync_gradients(params)
            if hp.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, hp.clip_norm)
            optimiser.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            tracker.report(step + 1)
    if sharded:
        distributed.fsdp_unshard(model)
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    logger.info("%s: %s steps in %.1fs, final loss %.4f", stage, steps, time.monotonic() - started,
                sum(tail) / len(tail))
    return steps, sum(tail) / len(tail)
