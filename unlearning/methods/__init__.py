"""Unlearning methods, one file each; ``get(name)`` returns one.

Every method follows ``base.Method``: ``unlearn(model, tokenizer, data, hparams,
*, progress)`` trains ``model`` in place (or wraps it, for KIF) and returns a
``MethodOutcome``; hyper-parameters are a frozen dataclass per method.
"""

from __future__ import annotations

from typing import Any

from unlearning.methods.asu import ASU
from unlearning.methods.base import Method
from unlearning.methods.gradascent import GradAscent
from unlearning.methods.graddiff import GradDiff
from unlearning.methods.idk import IDK
from unlearning.methods.kif import KIF
from unlearning.methods.npo import NPO
from unlearning.methods.training import hparams_from_mapping

_REGISTRY: dict[str, type[Any]] = {cls.name: cls for cls in (ASU, KIF, GradAscent, GradDiff, NPO, IDK)}

METHOD_NAMES: tuple[str, ...] = tuple(sorted(_REGISTRY))


class UnknownMethod(ValueError):
    """Raised for a method name that is not registered."""


def get(name: str) -> Method:
    """The method registered under ``name`` (``asu``, ``kif``, ``gradascent``, ``graddiff``, ``npo``, ``idk``)."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise UnknownMethod(f"unknown unlearning method {name!r}; choose one of {', '.join(METHOD_NAMES)}") from None
    method: Method = cls()
    return method


def hparams_from_json(name: str, values: dict[str, Any] | None) -> Any:
    """Build a method's frozen hyper-parameters from JSON, rejecting unknown keys (ValueError)."""
    method = get(name)
    try:
        return hparams_from_mapping(method.hparams_type, dict(values or {}))
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
