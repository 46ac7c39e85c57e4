"""Quantisation attacks: does rounding the weights undo the erasure?

Zhang et al. (2025), "Catastrophic Failure of LLM Unlearning via
Quantization" (ICLR 2025, arXiv:2410.16454): unlearning with small weight
updates can be reverted by quantisation, which rounds the updated weights back
onto the original grid; the effect is strongest at 4 bits.

* 8-bit: on CPU (fp32) torch dynamic int8 quantisation of every nn.Linear
  (`torch.ao.quantization.quantize_dynamic`, the path a CPU deployment would
  take); elsewhere, and where the architecture's own code does not run on the
  quantised modules (Mamba reads a Linear's weight tensor directly), a
  per-output-channel symmetric int8 round trip of every Linear weight
  (weight-only 8-bit serving).
* 4-bit: group-wise round-to-nearest, simulated in torch on any device: every
  Linear weight is split into groups of `group_size` input columns, each group
  scaled to the symmetric int4 range [-7, 7] by its own absolute maximum,
  rounded and scaled back (the weight format of GPTQ/AWQ-style 4-bit serving
  without their calibration, i.e. the plain RTN baseline of the paper).

A mixture of experts whose experts are stacked in one 3-D parameter (transformers 5 keeps
Mixtral's, Qwen3-MoE's, DeepSeek-V3's and gpt-oss's experts as `(experts, a, b)` tensors, not
`nn.Linear`s) has each expert matrix rounded the same way, along its last axis (the input
axis of Mixtral-style `(experts, out, in)`, the output axis of gpt-oss's `(experts, in,
out)`: a 4- or 8-bit grid either way): they hold most of such a model's weights, and an
attack that left them at full precision would leave most of the model unrounded.

    attack.quant_leakage / attack.quant4_leakage = greedy leak rate on forget probes
    attack.quant_control / attack.quant4_control = the same on control probes
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import torch

from unlearning.modeling import forward_error

logger = logging.getLogger(__name__)


def quantised_copy(model: Any) -> tuple[Any, str]:
    """An 8-bit copy of the model and the name of the scheme used."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    if device.type == "cpu" and dtype == torch.float32:
        from torch.ao.quantization import quantize_dynamic

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notice of the torch.ao quantised tensors
            dynamic = quantize_dynamic(  # type: ignore[no-untyped-call]
                model, {torch.nn.Linear}, dtype=torch.qint8  # a copy (inplace=False)
            )
        failure = forward_error(dynamic)
        if failure is None:
            with torch.no_grad():
                for weight in stacked_expert_weights(dynamic):
                    weight.copy_(_int8_rows(weight))
            return dynamic, "torch-dynamic-int8"
        # Some architectures' own code reads a Linear's weight tensor (Mamba's `dt_proj.weight @ x`),
        # which the quantised module replaces by a method: their weights are rounded instead.
        logger.info("torch dynamic int8 does not run %s (%s: %s): int8 weight round trip instead",
                    type(model).__name__, type(failure).__name__, str(failure)[:120])
        del dynamic
        scheme = "int8-weight-roundtrip (torch dynamic int8 does not run this architecture)"
    else:
        scheme = "int8-weight-roundtrip"
    quantised = copy.deepcopy(model)
    with torch.no_grad():
        for module in quantised.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(_int8_rows(module.weight))
        for weight in stacked_expert_weights(quantised):
            weight.copy_(_int8_rows(weight))
    return quantised, scheme


def _int8_rows(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 round trip of each row (the last axis) of a weight."""
    w = weight.float()
    scale = w.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127.0
    return (w / scale).round().clamp(-127, 127).mul(scale).to(weight.dtype)


def stacked_expert_weights(model: Any) -> list[torch.nn.Parameter]:
    """The 3-D parameters a module holds itself, outside torch's own layers: a mixture of
    experts' stacked expert matrices (a convolution's 3-D kernel is not one)."""
    found: list[torch.nn.Parameter] = []
    for module in model.modules():
        if isinstance(module, torch.nn.modules.conv._ConvNd):
            continue
        found.extend(p for p in module.parameters(recurse=False) if p.dim() == 3 and p.is_floating_point())
    return found


def int4_roundtrip(weight: torch.Tensor, group_size: int = 32) -> torch.Tensor:
    """Group-wise symmetric 4-bit round trip of a (out, in) weight matrix, or of each matrix of
    a stack of them (experts, out, in): groups of `group_size` along the last axis."""
    *lead, in_features = weight.shape
    w = weight.float().reshape(-1, in_features)
    pad = (-in_features) % group_size
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    groups = w.reshape(w.shape[0], -1, group_size)
    scale = groups.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 7.0
    rounded = (groups / scale).round().clamp(-7, 7) * scale
    return rounded.reshape(w.shape[0], -1)[:, :in_features].reshape(*lead, in_features).to(weight.dtype)


def quantised4_copy(model: Any, *, group_size: int = 32) -> tuple[Any, str]:
    """A copy with every Linear weight rounded to group-wise int4 (simulated) and the scheme name."""
    quantised = copy.deepcopy(model)
    with torch.no_grad():
        for module in quantised.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(int4_roundtrip(module.weight, group_size))
        for weight in stacked_expert_weights(quantised):
            weight.copy_(int4_roundtrip(weight, group_size))
    return quantised, f"int4-rtn-g{group_size}"
