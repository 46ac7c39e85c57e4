"""Attention temperature: the forget-teacher of ASU without a copy of the weights.

ASU (Attention Smoothing Unlearning) divides every self-attention logit by a
temperature tau > 1, i.e. replaces the softmax scaling ``head_dim ** -0.5`` by
``head_dim ** -0.5 / tau``.  Every attention module of the architectures we
support (Llama, Mistral, Qwen2, GPT-2) stores that factor in ``self.scaling``
and hands it to whichever backend runs (eager, sdpa, flash), so patching the
attribute changes all backends at once, keeps the backend's own padding mask,
and also works under ``generate()`` (which rejects unknown keyword arguments).

At tau = 1 the attribute is left untouched, so the output is bit-identical to
the plain model whatever the backend.

Older architectures keep the factor elsewhere, and each is tempered where the
whole logit is divided, nothing else: BLOOM adds its ALiBi bias as
``beta * alibi + inv_norm_factor * q.k`` (both factors are divided), Falcon's
eager ALiBi path multiplies the biased scores by ``inv_norm_factor``, and an
attention that does not scale at all (GPT-Neo) reads its query from a
``q_proj`` projection, whose output is divided (no norm follows it there, so the
logit is divided and nothing else).  Whether the model's output moves at all is
checked once a model (`tempering_supported`): a factor the running code path
ignores (Falcon under SDPA calls it with its default scale) tempers nothing,
and such a model is reported as having no tempered teacher.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import nn

logger = logging.getLogger(__name__)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of ``model`` that carry a float ``scaling``.

    The class-name test keeps out other modules with a ``scaling`` attribute
    (a PEFT LoRA layer keeps a dict of adapter scalings there).
    """
    return [
        module
        for module in model.modules()
        if type(module).__name__.endswith("Attention")
        and isinstance(getattr(module, "scaling", None), float)
    ]


@contextmanager
def attention_temperature(model: nn.Module, tau: float) -> Iterator[None]:
    """Run ``model`` with every attention logit divided by ``tau`` inside the block.

    Raises ``ValueError`` for tau <= 0 or a model with no recognisable
    attention module (silently running the untempered model would make a
    teacher that teaches nothing).
    """
    if not tau > 0:
        raise ValueError(f"attention temperature must be positive, got {tau!r}")
    factors, queries = _factors(model), _query_projections(model)
    if not factors and not queries:
        raise ValueError(
            f"{type(model).__name__} has no attention module with a float `scaling`; "
            "attention temperature is not supported for this architecture"
        )
    if tau == 1.0:
        yield
        return
    saved = [(cast(Any, module), name, float(getattr(module, name))) for module, name in factors]
    handles: list[Any] = []
    try:
        for module, name, value in saved:
            setattr(module, name, value / tau)
        for projection in queries:
            handles.append(projection.register_forward_hook(lambda m, args, out: out / tau))
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        for handle in handles:
            handle.remove()


# Attribute sets that scale a whole attention logit, tried in order per module.
_LOGIT_FACTORS = (("scaling",), ("inv_norm_factor", "beta"), ("inv_norm_factor",))


def _is_attention(module: nn.Module) -> bool:
    return type(module).__name__.endswith("Attention")


def _factors(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(module, attribute) of every float factor that scales a whole attention logit."""
    out: list[tuple[nn.Module, str]] = []
    for module in model.modules():
        if not _is_attention(module):
            continue
        for names in _LOGIT_FACTORS:
            if all(isinstance(getattr(module, n, None), float) for n in names):
                out.extend((module, n) for n in names)
                break
    return out


def _query_projections(model: nn.Module) -> list[nn.Module]:
    """The `q_proj` projections of attention modules that keep no factor at all and no norm
    (a query norm would undo the division): dividing their output divides the logit."""
    out: list[nn.Module] = []
    for module in model.modules():
        if not _is_attention(module) or any(isinstance(getattr(module, n, None), float)
                                             for names in _LOGIT_FACTORS for n in names):
            continue
        projection = getattr(module, "q_proj", None)
        norms = [c for c in module.modules() if "norm" in type(c).__name__.lower()]
        if isinstance(projection, nn.Linear) and not norms and not any(
                _is_attention(inner) and inner is not module for inner in module.modules()):
            out.append(projection)
    return out


_SUPPORTED = "_erasure_tempering"  # on a model: does tempering move its output (None: not yet known)


@torch.no_grad()
def tempering_supported(model: nn.Module, tau: float = 2.0) -> bool:
    """Whether `attention_temperature` changes what `model` predicts: it has a factor or a
    query projection to temper, and the code path that runs reads it (one forward pass of a
    few tokens at `tau` and at 1, once a model; remembered on it)."""
    known = getattr(model, _SUPPORTED, None)
    if isinstance(known, bool):
        return known
    supported = False
    if _factors(model) or _query_projections(model):
        parameter = next(model.parameters())
        vocabulary = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 8)
        ids = (torch.arange(8, device=parameter.device) % max(1, vocabulary - 1) + 1)[None, :]
        was_training = model.training
        model.eval()
        try:
            mask = torch.ones_like(ids)
            plain = model(input_ids=ids, attention_mask=mask).logits.float()
            with attention_temperature(model, tau):
                tempered = model(input_ids=ids, attention_mask=mask).logits.float()
            supported = bool((plain - tempered).abs().max() > 1e-6)
        except (TypeError, ValueError, RuntimeError, AttributeError):
            supported = False
        finally:
            model.train(was_training)
    setattr(model, _SUPPORTED, supported)
    return supported
