"""Erase one or many data subjects from a checkpoint: the engine's one entry point for unlearning.

``erase`` loads ``model_dir`` (the serving checkpoint: continual unlearning
always starts from the previous result), turns the erasure sets into what the
methods train on, runs the method and writes the candidate with
``save_checkpoint`` (method, hyper-parameters, seeds, parent digest, set
digests).  Several subjects in one ``ErasureSets`` are erased in one run.

``processes=N`` (N > 1) runs the erasure on N ranks (`unlearning.distributed`:
each rank trains on its share of every batch; the losses are the one-process
losses); rank 0 is the caller and alone writes the checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from unlearning import methods
from unlearning.checkpoints import checkpoint_digest, save_checkpoint, stored_dtype
from unlearning.methods.base import MethodInput
from unlearning.methods.training import resolve_preset
from unlearning.progress import ProgressCallback
from unlearning.prompting import format_of
from unlearning.sets import DEFAULT_RETAIN_PER_FORGET

logger = logging.getLogger(__name__)

DEFAULT_METHOD = "asu"

# The default ASU settings were measured with this many retain records per forget
# record; build_sets uses it by default.
RETAIN_PER_FORGET = DEFAULT_RETAIN_PER_FORGET


@dataclass(frozen=True)
class EraseResult:
    out_dir: Path
    digest: str
    method: str
    hparams: dict[str, Any]
    seconds: float
    steps: int
    details: dict[str, Any] = field(default_factory=dict)


def method_input(sets: Any) -> MethodInput:
    """What the methods see of the erasure sets: records, subjects, probes and a name pool."""
    from unlearning.identifiers import name_parts_of

    return MethodInput(
        forget=tuple(sets.forget), retain=tuple(sets.retain), subjects=tuple(getattr(sets, "subjects", ())),
        record_subjects=dict(getattr(sets, "record_subjects", {})), probes=tuple(getattr(sets, "probes", ())),
        name_pool=tuple(name_parts_of(sets.retain)),
    )


def resolve_hparams(method: str, hparams: Any, model: Any, *, subjects: int) -> Any:
    """The method's hyper-parameters for this model: preset, overrides, step budget filled in.

    ``hparams`` is the method's dataclass, a JSON mapping of overrides, or None.
    """
    chosen = methods.get(method)
    if isinstance(hparams, chosen.hparams_type):
        resolved: Any = hparams
        return resolved.resolved(subjects)
    if hparams is not None and not isinstance(hparams, Mapping):
        raise ValueError(f"hparams for {method} must be {chosen.hparams_type.__name__}, got {type(hparams).__name__}")
    values = dict(hparams or {})
    resolve = getattr(chosen, "resolve", None)
    if callable(resolve):
        values = resolve(values, model)
    else:
        values = resolve_preset(chosen.hparams_type, values)
    return methods.hparams_from_json(method, values).resolved(subjects)


def erase(
    model_dir: str | Path,
    sets: Any,
    *,
    method: str = DEFAULT_METHOD,
    out_dir: str | Path,
    hparams: Any = None,
    progress: ProgressCallback | None = None,
    device: str | None = None,
    processes: int = 1,
    sharding: str = "none",
) -> EraseResult:
    """Unlearn every subject of ``sets`` from ``model_dir``; write the candidate to ``out_dir``.

    ``hparams`` is the method's frozen dataclass, a JSON mapping of overrides,
    or None for the method's defaults (the measured best settings, see
    docs/methods.md).  Raises ``ValueError`` for an unknown method or
    hyper-parameter and when the forget set is empty (nothing to certify).
    ``processes`` > 1 spawns that many ranks (``sharding="fsdp"`` also shards the
    parameters); a process that `accelerate launch` or `torchrun` started as one of
    several ranks joins their group by itself.
    """
    from unlearning import distributed
    from unlearning.modeling import load_model

    if distributed.current() is None:
        sharding = distributed.resolve_sharding(sharding)
        launched = distributed.world_from_env()
        if launched is not None:
            with distributed.world(*launched, shard=sharding):
                return erase(model_dir, sets, method=method, out_dir=out_dir, hparams=hparams,
                             progress=progress if launched[0] == 0 else None, device=device)
        if processes > 1:
            result: EraseResult = distributed.launch(
                erase, processes, model_dir, sets, shard=sharding, child_kwargs={"progress": None},
                method=method, out_dir=out_dir, hparams=hparams, progress=progress, device=device)
            return result
    world = distributed.current()
    if world is not None:
        device = world.device

    started = time.monotonic()
    chosen = methods.get(method)
    if isinstance(hparams, Mapping):
        # Before anything is loaded or written: a misspelt setting is refused at once.
        known = {f.name for f in dataclasses.fields(chosen.hparams_type)}
        unknown = sorted(set(hparams) - known)
        if unknown:
            raise ValueError(f"unknown hyper-parameters for {method}: {', '.join(unknown)}")
    data = method_input(sets)
    if not data.forget:
        raise ValueError("the forget set is empty: there is nothing to erase")

    parent_digest = checkpoint_digest(model_dir)
    model, tokenizer = load_model(model_dir, device=device)
    hp = resolve_hparams(method, hparams, model, subjects=len(data.subjects) or 1)
    torch.manual_seed(hp.seed)
    # Padding for training batches is on the right; generation pads on the left itself.
    tokenizer.padding_side = "right"
    logger.info(
        "erase: method %s, %s forget / %s retain records, parent %s",
        method, len(data.forget), len(data.retain), parent_digest[:12],
    )
    outcome = chosen.unlearn(model, tokenizer, data, hp, progress=progress)
    tokenizer.padding_side = "left"
    # Stored as the parent was (a bf16 model stays bf16: trained in fp32 on a CPU, it would
    # otherwise come back twice its size).  Verification loads what is stored, so whatever
    # the rounding does to the erasure is what the checks see.
    dtype = stored_dtype(model_dir)
    if dtype is not None:
        outcome.model.to(getattr(torch, dtype))
    metadata = {
        "method": method,
        "hparams": hp.to_json(),
        "seeds": {"seed": hp.seed},
        "parent_digest": parent_digest,
        "forget_digest": getattr(sets, "forget_digest", None),
        "retain_digest": getattr(sets, "retain_digest", None),
        "prompt_format": format_of(tokenizer).to_json(),
        "forget_records": len(data.forget),
        "retain_records": len(data.retain),
        "steps": outcome.steps,
        "stored_dtype": dtype,
        "final_loss": outcome.final_loss,
        "details": outcome.details,
    }
    if world is None:
        digest = save_checkpoint(outcome.model, tokenizer, out_dir, metadata)
    else:
        digest = _save_on_main(world, outcome.model, tokenizer, out_dir, metadata)
    seconds = time.monotonic() - started
    logger.info("erase: %s done in %.1fs, %s steps, digest %s", method, seconds, outcome.steps, digest[:12])
    return EraseResult(Path(out_dir), digest, method, hp.to_json(), seconds, outcome.steps, dict(outcome.details))


def _save_on_main(world: Any, model: Any, tokenizer: Any, out_dir: str | Path, metadata: dict[str, Any]) -> str:
    """Rank 0 writes the checkpoint (every rank holds the same full weights); all learn its digest."""
    import torch.distributed as dist

    box: list[Any] = [None]
    if world.main:
        try:
            box[0] = save_checkpoint(model, tokenizer, out_dir, metadata)
        except BaseException as exc:  # noqa: BLE001 - the other ranks must hear of it, then it is raised
            box[0] = exc
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        if world.main:
            raise box[0]
        raise RuntimeError("rank 0 failed to write the checkpoint")
    return str(box[0])


def erase_continual(
    model_dir: str | Path,
    requests: Sequence[Any],
    *,
    method: str = DEFAULT_METHOD,
    out_root: str | Path,
    hparams: Any = None,
    progress: ProgressCallback | None = None,
) -> list[EraseResult]:
    """Erase one set after another, each run starting from the previous candidate."""
    results: list[EraseResult] = []
    current = Path(model_dir)
    for index, sets in enumerate(requests):
        result = erase(current, sets, method=method, out_dir=Path(out_root) / f"step-{index:03d}",
                       hparams=hparams, progress=progress)
        results.append(result)
        current = result.out_dir
    return results
