"""Erase one or many data subjects from a checkpoint: the engine's one entry point for unlearning.

``erase`` loads ``model_dir`` (the serving checkpoint: continual unlearning
always starts from the previous result), turns the erasure sets into what the
methods train on, runs the method and writes the candidate with
``save_checkpoint`` (method, hyper-parameters, seeds, parent digest, set
digests).  Several subjects in one ``ErasureSets`` are erased in one run.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from unlearning import methods
from unlearning.checkpoints import checkpoint_digest, save_checkpoint
from unlearning.methods.base import QA, MethodInput
from unlearning.progress import ProgressCallback
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


def _as_qa(record: Any) -> QA | None:
    if getattr(record, "question", None) is not None and getattr(record, "answer", None) is not None:
        return QA(record.question, record.answer)
    if getattr(record, "text", None):
        return QA(None, record.text)
    return None


def _subject_names(sets: Any) -> list[str]:
    """Every name and alias of the subjects, longest first (so "Mara Okafor" wins over "M. Okafor")."""
    names: list[str] = []
    for subject in getattr(sets, "subjects", ()):
        names.append(subject.name)
        names.extend(getattr(subject, "aliases", ()))
    return sorted({n for n in names if n}, key=len, reverse=True)


def method_input(sets: Any, *, seed: int = 0) -> MethodInput:
    """Forget and retain pairs, plus the question templates the subjects share with other people.

    A retain question that reads like a forget question with another name in
    the subject's place ("Where was <X> born?") gives KIF a matched control
    prompt and gives the forget question a plausible no-knowledge answer: the
    other person's answer with the subject's name put back.
    """
    forget = [qa for qa in (_as_qa(r) for r in sets.forget) if qa is not None]
    retain = [qa for qa in (_as_qa(r) for r in sets.retain) if qa is not None]
    names = _subject_names(sets)
    forget_names = [next((n for n in names if qa.question and n in qa.question), None) for qa in forget]

    templates: dict[tuple[str, str], list[int]] = {}
    for i, (qa, name) in enumerate(zip(forget, forget_names, strict=True)):
        if qa.question is not None and name is not None:
            at = qa.question.index(name)
            templates.setdefault((qa.question[:at], qa.question[at + len(name) :]), []).append(i)
    control: list[QA] = []
    control_names: list[str | None] = []
    candidates: dict[int, list[str]] = {}
    for qa in retain:
        if qa.question is None:
            continue
        for (prefix, suffix), rows in templates.items():
            q = qa.question
            if len(q) > len(prefix) + len(suffix) and q.startswith(prefix) and q.endswith(suffix):
                other = q[len(prefix) : len(q) - len(suffix)]
                if other in names:
                    continue
                control.append(qa)
                control_names.append(other)
                if other in qa.answer:
                    for i in rows:
                        candidates.setdefault(i, []).append(qa.answer.replace(other, forget_names[i] or other))
                break
    draw = random.Random(seed)
    alternatives: list[str | None] = []
    for i, qa in enumerate(forget):
        options = [a for a in candidates.get(i, []) if a != qa.answer]
        alternatives.append(draw.choice(options) if options else None)
    return MethodInput(
        forget=forget, retain=retain, forget_names=forget_names,
        control=control, control_names=control_names, alternatives=alternatives,
    )


def erase(
    model_dir: str | Path,
    sets: Any,
    *,
    method: str = DEFAULT_METHOD,
    out_dir: str | Path,
    hparams: Any = None,
    progress: ProgressCallback | None = None,
    device: str | None = None,
) -> EraseResult:
    """Unlearn every subject of ``sets`` from ``model_dir``; write the candidate to ``out_dir``.

    ``hparams`` is the method's frozen dataclass, a JSON mapping of overrides,
    or None for the method's defaults (the measured best settings, see
    docs/methods.md).  Raises ``ValueError`` for an unknown method or
    hyper-parameter and when the forget set is empty (nothing to certify).
    """
    from unlearning.modeling import load_model

    started = time.monotonic()
    chosen = methods.get(method)
    if hparams is None or isinstance(hparams, Mapping):
        hp = methods.hparams_from_json(method, dict(hparams or {}))
    elif isinstance(hparams, chosen.hparams_type):
        hp = hparams
    else:
        raise ValueError(f"hparams for {method} must be {chosen.hparams_type.__name__}, got {type(hparams).__name__}")
    data = method_input(sets, seed=hp.seed)
    if not data.forget:
        raise ValueError("the forget set is empty: there is nothing to erase")

    parent_digest = checkpoint_digest(model_dir)
    torch.manual_seed(hp.seed)
    model, tokenizer = load_model(model_dir, device=device)
    # Padding for training batches is on the right; generation pads on the left itself.
    tokenizer.padding_side = "right"
    logger.info(
        "erase: method %s, %s forget / %s retain records, parent %s",
        method, len(data.forget), len(data.retain), parent_digest[:12],
    )
    outcome = chosen.unlearn(model, tokenizer, data, hp, progress=progress)
    tokenizer.padding_side = "left"
    metadata = {
        "method": method,
        "hparams": hp.to_json(),
        "seeds": {"seed": hp.seed},
        "parent_digest": parent_digest,
        "forget_digest": getattr(sets, "forget_digest", None),
        "retain_digest": getattr(sets, "retain_digest", None),
        "forget_records": len(data.forget),
        "retain_records": len(data.retain),
        "steps": outcome.steps,
        "final_loss": outcome.final_loss,
        "details": outcome.details,
    }
    digest = save_checkpoint(outcome.model, tokenizer, out_dir, metadata)
    seconds = time.monotonic() - started
    logger.info("erase: %s done in %.1fs, %s steps, digest %s", method, seconds, outcome.steps, digest[:12])
    return EraseResult(Path(out_dir), digest, method, hp.to_json(), seconds, outcome.steps, dict(outcome.details))


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
