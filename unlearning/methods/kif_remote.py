"""KIF suppression gates as a self-contained modeling file.

This file is copied verbatim into every KIF checkpoint directory and named in
its ``config.json`` ``auto_map`` (the Hugging Face remote-code convention), so
``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` builds
the base architecture *with* the gates: any tool that loads Hugging Face
checkpoints gets the suppression, not the bare base model.  It must therefore
import nothing but torch and transformers.

A gate sits on the residual stream after one decoder layer.  For each signature
direction v (orthonormal rows) and hidden state h at every token::

    z = (v . h - mean) / std           standardised projection
    g = sigmoid(slope * (z - threshold))
    h <- h - g * strength * (v . h) * v

With ``rank > 0`` the gate also carries the optional small LoRA of the
design: a low-rank update of the same hidden state, switched per token by a
learned linear gate over the standardised projections::

    a = sigmoid(mix . z + bias)
    h <- h + a * up(down(h))

so the update acts where the signature says the subject is, and nowhere else.
``set_gates_enabled(False)`` turns every gate (and its LoRA) off; the base
weights are never touched, so the gates-off model is exactly the base model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM


class SuppressionGate(nn.Module):
    """Gated removal of ``k`` signature directions from one layer's output (plus an optional gated LoRA)."""

    directions: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, hidden_size: int, k: int, rank: int = 0) -> None:
        super().__init__()
        self.rank = int(rank)
        self.register_buffer("directions", torch.zeros(k, hidden_size))
        self.register_buffer("mean", torch.zeros(k))
        self.register_buffer("std", torch.ones(k))
        self.slope = nn.Parameter(torch.full((k,), 4.0))
        self.threshold = nn.Parameter(torch.zeros(k))
        self.strength = nn.Parameter(torch.zeros(k))
        if self.rank > 0:
            # LoRA initialisation: ``up`` starts at zero, so a fresh gate changes nothing.
            self.lora_down = nn.Parameter(torch.randn(self.rank, hidden_size) / hidden_size**0.5)
            self.lora_up = nn.Parameter(torch.zeros(hidden_size, self.rank))
            self.lora_mix = nn.Parameter(torch.zeros(k))
            self.lora_bias = nn.Parameter(torch.zeros(()))

    def standardised(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        projection = hidden @ self.directions.to(hidden.dtype).T
        return (projection - self.mean.to(hidden.dtype)) / self.std.to(hidden.dtype), projection

    def gate(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z, projection = self.standardised(hidden)
        return torch.sigmoid(self.slope.to(hidden.dtype) * (z - self.threshold.to(hidden.dtype))), projection

    def lora_gate(self, hidden: torch.Tensor) -> torch.Tensor:
        """Per-token switch of the LoRA, (..., 1); zeros when the gate has none."""
        if self.rank == 0:
            return hidden.new_zeros((*hidden.shape[:-1], 1))
        z, _ = self.standardised(hidden)
        return torch.sigmoid(z @ self.lora_mix.to(hidden.dtype) + self.lora_bias.to(hidden.dtype))[..., None]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        z, projection = self.standardised(hidden)
        g = torch.sigmoid(self.slope.to(hidden.dtype) * (z - self.threshold.to(hidden.dtype)))
        out = hidden - (g * self.strength.to(hidden.dtype) * projection) @ self.directions.to(hidden.dtype)
        if self.rank > 0:
            a = torch.sigmoid(z @ self.lora_mix.to(hidden.dtype) + self.lora_bias.to(hidden.dtype))[..., None]
            out = out + a * ((hidden @ self.lora_down.to(hidden.dtype).T) @ self.lora_up.to(hidden.dtype).T)
        return out


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The list of decoder blocks of a Llama/Mistral/Qwen2 (``model.layers``) or GPT-2 (``transformer.h``)."""
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "layers"):
        return inner.layers  # type: ignore[no-any-return]
    transformer = getattr(model, "transformer", None)
    if transformer is not None and hasattr(transformer, "h"):
        return transformer.h  # type: ignore[no-any-return]
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


def attach_gates(model: nn.Module, gates: dict[int, SuppressionGate], enabled: list[bool]) -> list[Any]:
    """Hook each gate onto the output of its decoder layer; ``enabled[0]`` switches all of them."""

    def make_hook(gate: SuppressionGate) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            if not enabled[0]:
                return None
            if isinstance(output, tuple):
                return (gate(output[0]), *output[1:])
            return gate(output)

        return hook

    layers = decoder_layers(model)
    return [layers[index].register_forward_hook(make_hook(gate)) for index, gate in gates.items()]


class KIFGatesMixin:
    """Adds ``kif_gates`` (from ``config.kif``: layers, k) to a causal-LM class."""

    def install_kif_gates(self, config: Any) -> None:
        spec = getattr(config, "kif", None) or {}
        layers = [int(layer) for layer in spec.get("layers", [])]
        k = int(spec.get("k", 1))
        rank = int(spec.get("rank", 0))
        hidden = int(getattr(config, "hidden_size", 0) or config.n_embd)
        self.kif_gates = nn.ModuleDict({str(layer): SuppressionGate(hidden, k, rank) for layer in layers})
        self._kif_enabled = [True]
        gates: dict[int, SuppressionGate] = {int(n): g for n, g in self.kif_gates.items()}  # type: ignore[misc]
        attach_gates(self, gates, self._kif_enabled)  # type: ignore[arg-type]

    def set_gates_enabled(self, enabled: bool) -> None:
        """Switch every suppression gate on or off (off = exactly the base model)."""
        self._kif_enabled[0] = bool(enabled)

    @property
    def gates_enabled(self) -> bool:
        return self._kif_enabled[0]

    def _init_weights(self, module: nn.Module) -> None:
        # Gate parameters come from the checkpoint; the base class must not re-initialise them.
        if isinstance(module, SuppressionGate):
            return
        super()._init_weights(module)  # type: ignore[misc]


class KIFLlamaForCausalLM(KIFGatesMixin, LlamaForCausalLM):  # type: ignore[no-untyped-call]
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.install_kif_gates(config)


class KIFMistralForCausalLM(KIFGatesMixin, MistralForCausalLM):  # type: ignore[no-untyped-call]
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.install_kif_gates(config)


class KIFQwen2ForCausalLM(KIFGatesMixin, Qwen2ForCausalLM):  # type: ignore[no-untyped-call]
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.install_kif_gates(config)


class KIFGPT2LMHeadModel(KIFGatesMixin, GPT2LMHeadModel):  # type: ignore[no-untyped-call]
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.install_kif_gates(config)


KIF_CLASSES = {
    "LlamaForCausalLM": KIFLlamaForCausalLM,
    "MistralForCausalLM": KIFMistralForCausalLM,
    "Qwen2ForCausalLM": KIFQwen2ForCausalLM,
    "GPT2LMHeadModel": KIFGPT2LMHeadModel,
}
