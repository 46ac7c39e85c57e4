"""Quantisation attack: does 8-bit rounding undo the erasure?

Zhang et al. (2025), "Catastrophic Failure of LLM Unlearning via
Quantization" (ICLR 2025, arXiv:2410.16454): unlearning with small weight
updates can be reverted by quantisation, which rounds the updated weights
back onto the original grid.  On CPU (fp32) we use torch dynamic int8
quantisation of every nn.Linear (`torch.ao.quantization.quantize_dynamic`,
the path a CPU deployment would take); elsewhere (bf16 on GPU, where that
path does not run) a per-output-channel symmetric int8 round trip of every
Linear weight, which is what weight-only 8-bit serving computes.

    attack.quant_leakage = greedy leak rate on forget probes of the quantised model
    attack.quant_control = the same on control probes
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import torch

logger = logging.getLogger(__name__)


def quantised_copy(model: Any) -> tuple[Any, str]:
    """An 8-bit copy of the model and the name of the scheme used."""
    quantised = copy.deepcopy(model)
    device = next(quantised.parameters()).device
    dtype = next(quantised.parameters()).dtype
    if device.type == "cpu" and dtype == torch.float32:
        from torch.ao.quantization import quantize_dynamic

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notice of the torch.ao quantised tensors
            quantised = quantize_dynamic(  # type: ignore[no-untyped-call]
                quantised, {torch.nn.Linear}, dtype=torch.qint8
            )
        return quantised, "torch-dynamic-int8"
    with torch.no_grad():
        for module in quantised.modules():
            if isinstance(module, torch.nn.Linear):
                weight = module.weight.float()
                scale = weight.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
                module.weight.copy_((weight / scale).round().clamp(-127, 127).mul(scale).to(dtype))
    return quantised, "int8-weight-roundtrip"
