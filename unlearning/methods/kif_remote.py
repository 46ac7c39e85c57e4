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
import transformers
from torch import nn
from transformers import PreTrainedModel


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


def _layer_count(config: Any) -> int | None:
    for name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The list of decoder blocks of any transformers causal LM, found generically.

    It is the shallowest ``nn.ModuleList`` with as many entries as the config
    has layers (``model.layers``, ``transformer.h``, ``gpt_neox.layers``,
    ``model.decoder.layers`` ...).  Raises ValueError naming the class when
    there is none.
    """
    count = _layer_count(getattr(model, "config", None))
    candidates = [
        (name, module) for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and count is not None and len(module) == count
        and not name.startswith("kif_gates")
    ]
    if not candidates:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__}: KIF cannot hook it")
    return min(candidates, key=lambda item: item[0].count("."))[1]


def hidden_size(config: Any) -> int:
    for name in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"cannot tell the hidden size of {type(config).__name__}")


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
        hidden = hidden_size(config)
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

    @classmethod
    def is_custom_code(cls) -> bool:
        # The modeling code is transformers' own base class (the gates initialise nothing).  As
        # "custom code" (this module is not transformers'), loading skips `_init_weights` of a
        # module with no tensor of its own, which is where some bases fill a non-persistent
        # buffer of their submodules: Falcon-H1's model writes each layer's `mup_vector` there,
        # left as uninitialised memory (NaN logits, gates on or off) in a loaded KIF checkpoint.
        return False


_GATED: dict[str, type] = {}


def gated_class(base: type) -> type:
    """The base causal-LM class with the gates mixed in (one class per base, built once)."""
    name = "KIF" + base.__name__
    if name not in _GATED:
        def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
            base.__init__(self, config, *args, **kwargs)  # type: ignore[misc]
            self.install_kif_gates(config)

        _GATED[name] = type(name, (KIFGatesMixin, base), {"__init__": __init__, "__module__": __name__})
    return _GATED[name]


def __getattr__(name: str) -> type:
    """``KIF<BaseClass>`` for any causal-LM class of transformers: what ``auto_map`` names.

    A checkpoint's config says ``"auto_map": {"AutoModelForCausalLM":
    "kif_remote.KIFLlamaForCausalLM"}`` (or ``KIFGPTNeoXForCausalLM`` ...);
    transformers imports this file and asks for that name, and gets the gated
    subclass of the base architecture, built on first use.
    """
    if name.startswith("KIF"):
        base = getattr(transformers, name[3:], None)
        if isinstance(base, type) and issubclass(base, PreTrainedModel):
            return gated_class(base)
    raise AttributeError(name)
