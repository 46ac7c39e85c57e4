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
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

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
    modules = attention_modules(model)
    if not modules:
        raise ValueError(
            f"{type(model).__name__} has no attention module with a float `scaling`; "
            "attention temperature is not supported for this architecture"
        )
    if tau == 1.0:
        yield
        return
    saved = [(cast(Any, module), float(cast(Any, module).scaling)) for module in modules]
    try:
        for module, scaling in saved:
            module.scaling = scaling / tau
        yield
    finally:
        for module, scaling in saved:
            module.scaling = scaling
