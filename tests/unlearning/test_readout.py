"""The model's readout (`unlearning.logits.find_readout`): what a model does to its output
head's output before it returns logits, found from one forward pass, so that the latent
lens reads the distribution the model itself gives.  Each architecture is built here from
a small config with random weights (nothing downloaded)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from unlearning.logits import Readout, ReadoutHead, find_readout, readout_of

VOCAB = 64
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1,
          "eos_token_id": 2}


def _model(arch: str) -> Any:
    import transformers as T

    torch.manual_seed(0)
    builders = {
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=2, **COMMON)),
        # A cap of 2 with a head scaled up so that most logits saturate: far from the identity.
        "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(
            num_key_value_heads=2, head_dim=8, sliding_window=16, query_pre_attn_scalar=8,
            final_logit_softcapping=2.0, **COMMON)),
        "cohere": lambda: T.CohereForCausalLM(T.CohereConfig(num_key_value_heads=2, logit_scale=0.25, **COMMON)),
        "granite": lambda: T.GraniteForCausalLM(T.GraniteConfig(num_key_value_heads=2, logits_scaling=4.0,
                                                                **COMMON)),
        "falcon_h1": lambda: T.FalconH1ForCausalLM(T.FalconH1Config(
            num_key_value_heads=2, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_state=8, mamba_chunk_size=8,
            lm_head_multiplier=0.5, **COMMON)),
    }
    model = builders[arch]().eval()
    if arch == "gemma2":
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(50.0)
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded row: its pads are not compared
    ids[1, 9:] = 0
    return ids, mask


def _head_and_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the output head reads, and the model's logits, at the real positions."""
    seen: list[torch.Tensor] = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, a, o: seen.append(a[0]))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
    finally:
        handle.remove()
    keep = mask.bool()
    return seen[-1][keep], logits[keep]


@pytest.mark.parametrize(("arch", "scale", "cap"), [
    ("llama", 1.0, None), ("gemma2", 1.0, 2.0), ("cohere", 0.25, None), ("granite", 0.25, None),
    ("falcon_h1", 0.5, None),
])
def test_the_readout_reproduces_the_models_logits_from_what_its_head_reads(
        arch: str, scale: float, cap: float | None) -> None:
    model = _model(arch)
    ids, mask = _batch()
    found = find_readout(model, ids, mask)
    assert found.verified
    assert found.scale == pytest.approx(scale, rel=1e-4)
    assert found.cap == cap
    head = model.get_output_embeddings()
    inputs, logits = _head_and_logits(model, ids, mask)
    with torch.no_grad():
        read = ReadoutHead(head, found)(inputs)
        bare = head(inputs)
    assert torch.allclose(read, logits, rtol=1e-4, atol=1e-4)
    if scale != 1.0 or cap is not None:  # the bare head reads another distribution
        assert not torch.allclose(bare.log_softmax(-1), logits.log_softmax(-1), atol=1e-2)
    assert readout_of(model) is found  # remembered: a second call runs nothing
    assert find_readout(model, ids[:1, :0], mask[:1, :0]) is found


def test_the_descriptions_name_what_was_found() -> None:
    assert Readout().describe() == "head"
    assert Readout(0.25).describe() == "head x 0.25"
    assert Readout(1.0, 30.0).describe() == "head, soft-capped at 30"
    assert "not reproduced" in Readout(verified=False).describe()


def test_a_readout_it_cannot_reproduce_is_reported_and_read_through_the_bare_head(
        caplog: pytest.LogCaptureFixture) -> None:
    import transformers as T

    class Shifted(T.LlamaForCausalLM):  # type: ignore[misc]
        """Adds a fixed, token-dependent offset to every logit: neither a scale nor a cap."""

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            out = super().forward(*args, **kwargs)
            out.logits = out.logits + torch.linspace(-3.0, 3.0, VOCAB)
            return out

    torch.manual_seed(0)
    model = Shifted(T.LlamaConfig(num_key_value_heads=2, **COMMON)).eval()
    ids, mask = _batch()
    with caplog.at_level(logging.WARNING, logger="unlearning.logits"):
        found = find_readout(model, ids, mask)
    assert not found.verified and found.identity
    assert "bare head" in caplog.text
    x = torch.randn(4, VOCAB)
    assert torch.equal(found(x), x)


def test_a_half_precision_model_finds_its_soft_cap_through_its_rounding() -> None:
    model = _model("gemma2").to(torch.bfloat16)
    ids, mask = _batch()
    found = find_readout(model, ids, mask)
    assert found.verified and found.cap == 2.0
    assert found.scale == pytest.approx(1.0, abs=1e-2)
