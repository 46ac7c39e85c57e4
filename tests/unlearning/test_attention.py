"""Attention temperature: exact at tau = 1, different at tau > 1, padding-safe, generate-safe."""

from __future__ import annotations

import pytest
import torch

from unlearning.attention import attention_modules, attention_temperature
from unlearning.modeling import load_model

ARCHS = ["llama", "mistral", "qwen2", "gpt2"]


def _batch(tokenizer, side: str) -> dict[str, torch.Tensor]:
    texts = ["Where was Quentin Cardoso born? He was born in", "Who is it?"]
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), int(tokenizer.pad_token_id))
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        ids[i, span] = torch.tensor(r)
        mask[i, span] = 1
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_tau_one_is_bit_identical_and_tau_four_differs(tiny_arch_model_dir, arch, impl, side):
    model, tokenizer = load_model(tiny_arch_model_dir(arch), device="cpu", attn_implementation=impl)
    batch = _batch(tokenizer, side)
    plain = _logits(model, batch)
    with attention_temperature(model, 1.0):
        same = _logits(model, batch)
    with attention_temperature(model, 4.0):
        smoothed = _logits(model, batch)
    assert (plain - same).abs().max().item() == 0.0
    real = batch["attention_mask"].bool()
    assert (plain[real] - smoothed[real]).abs().max().item() > 1e-4


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_is_still_masked_under_temperature(tiny_arch_model_dir, arch, impl, side):
    """A padded row gives the same tempered logits as the same text alone (the mask is kept)."""
    model, tokenizer = load_model(tiny_arch_model_dir(arch), device="cpu", attn_implementation=impl)
    batch = _batch(tokenizer, side)
    short = batch["attention_mask"][1].bool()
    alone = {k: v[1:2, short] for k, v in batch.items()}
    with attention_temperature(model, 4.0):
        padded = _logits(model, batch)[1][short]
        single = _logits(model, alone)[0]
    assert torch.allclose(padded, single, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_eager_and_sdpa_apply_the_same_temperature(tiny_arch_model_dir, arch):
    eager, tokenizer = load_model(tiny_arch_model_dir(arch), device="cpu", attn_implementation="eager")
    sdpa, _ = load_model(tiny_arch_model_dir(arch), device="cpu", attn_implementation="sdpa")
    batch = _batch(tokenizer, "right")
    real = batch["attention_mask"].bool()
    with attention_temperature(eager, 3.0), attention_temperature(sdpa, 3.0):
        assert torch.allclose(_logits(eager, batch)[real], _logits(sdpa, batch)[real], atol=1e-5)


def test_generate_runs_under_temperature_and_the_scaling_is_restored(tiny_arch_model_dir):
    model, tokenizer = load_model(tiny_arch_model_dir("llama"), device="cpu")
    before = [m.scaling for m in attention_modules(model)]
    ids = torch.tensor([tokenizer("Where was", add_special_tokens=False)["input_ids"]])
    with attention_temperature(model, 4.0):
        assert all(m.scaling == s / 4.0 for m, s in zip(attention_modules(model), before, strict=True))
        out = model.generate(input_ids=ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] == ids.shape[1] + 3 or int(out[0, -1]) == tokenizer.eos_token_id
    assert [m.scaling for m in attention_modules(model)] == before


def test_the_scaling_is_restored_when_the_block_raises(tiny_arch_model_dir):
    model, _ = load_model(tiny_arch_model_dir("llama"), device="cpu")
    before = [m.scaling for m in attention_modules(model)]
    with pytest.raises(RuntimeError), attention_temperature(model, 2.0):
        raise RuntimeError("boom")
    assert [m.scaling for m in attention_modules(model)] == before


def test_it_rejects_a_non_positive_temperature_and_a_model_without_attention(tiny_arch_model_dir):
    model, _ = load_model(tiny_arch_model_dir("llama"), device="cpu")
    with pytest.raises(ValueError), attention_temperature(model, 0.0):
        pass
    with pytest.raises(ValueError), attention_temperature(torch.nn.Linear(2, 2), 2.0):
        pass
