"""The quantisation attacks' copies: what each scheme does to the weights, that the model
under attack is left as it was, and that an architecture whose own code cannot run on
torch's quantised modules (Mamba reads a Linear's weight tensor) gets the int8 round trip."""

from __future__ import annotations

import torch
import transformers as T

from unlearning.verification.attacks.quantization import (
    int4_roundtrip,
    quantised4_copy,
    quantised_copy,
)


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=2)).eval()


def _mamba() -> torch.nn.Module:
    torch.manual_seed(0)
    return T.MambaForCausalLM(T.MambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8)).eval()


def _linear_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: m.weight.detach().clone() for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def test_int4_rounds_each_group_of_columns_onto_15_levels_of_its_own_scale() -> None:
    torch.manual_seed(0)
    weight = torch.randn(6, 70)  # 70 columns: two groups of 32 and a padded one of 6
    rounded = int4_roundtrip(weight, group_size=32)
    assert rounded.shape == weight.shape
    for start in (0, 32, 64):
        group, original = rounded[:, start:start + 32], weight[:, start:start + 32]
        scale = original.abs().amax(dim=1, keepdim=True) / 7
        levels = group / scale
        assert torch.allclose(levels, levels.round(), atol=1e-4) and float(levels.abs().max()) <= 7 + 1e-4
        assert float(((group - original).abs() - scale / 2).max()) <= 1e-6


def test_the_8_bit_copy_on_cpu_is_torch_dynamic_int8_and_leaves_the_model_as_it_was() -> None:
    model = _llama()
    before = _linear_weights(model)
    ids = torch.tensor([[1, 5, 9, 3]])
    quantised, scheme = quantised_copy(model)
    assert scheme == "torch-dynamic-int8"
    assert not any(type(m) is torch.nn.Linear for m in quantised.modules())  # every one swapped for int8
    with torch.no_grad():
        plain, rounded = model(input_ids=ids).logits, quantised(input_ids=ids).logits
    assert not torch.equal(plain, rounded) and torch.allclose(plain, rounded, atol=0.05)
    assert all(torch.equal(before[k], w) for k, w in _linear_weights(model).items())


def test_an_architecture_that_reads_a_linear_weight_itself_gets_the_int8_round_trip_and_says_why() -> None:
    model = _mamba()
    before = _linear_weights(model)
    quantised, scheme = quantised_copy(model)
    assert scheme.startswith("int8-weight-roundtrip (") and "does not run this architecture" in scheme
    with torch.no_grad():
        logits = quantised(input_ids=torch.tensor([[1, 5, 9, 3]])).logits  # it runs
    assert torch.isfinite(logits).all()
    for name, weight in _linear_weights(quantised).items():
        scale = before[name].abs().amax(dim=1, keepdim=True) / 127
        steps = weight / scale
        assert torch.allclose(steps, steps.round(), atol=1e-3), name  # on each row's int8 grid
    assert all(torch.equal(before[k], w) for k, w in _linear_weights(model).items())
    rounded4, scheme4 = quantised4_copy(model, group_size=16)
    assert scheme4 == "int4-rtn-g16"
    assert all(torch.equal(before[k], w) for k, w in _linear_weights(model).items())


def _mixtral() -> torch.nn.Module:
    torch.manual_seed(0)
    return T.MixtralForCausalLM(T.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)).eval()


def test_stacked_expert_matrices_are_rounded_as_the_linear_weights_are() -> None:
    # transformers keeps a mixture's experts as (experts, out, in) parameters, not Linears: both
    # attacks round them onto the grid they put every Linear on, the model left as it was; a
    # Mamba convolution's 3-D kernel is no expert stack and is left alone.
    from unlearning.verification.attacks.quantization import stacked_expert_weights

    model = _mixtral()
    stacks = {name: p.detach().clone() for name, p in model.named_parameters() if p.dim() == 3}
    assert len(stacks) == 4 and len(stacked_expert_weights(model)) == 4  # gate_up and down, 2 layers
    assert stacked_expert_weights(_mamba()) == []
    rounded4, _ = quantised4_copy(model, group_size=16)
    rounded8, scheme = quantised_copy(model)
    assert scheme == "torch-dynamic-int8"
    for name, before in stacks.items():
        four, eight = rounded4.get_parameter(name).detach(), rounded8.get_parameter(name).detach()
        assert not torch.equal(four, before) and not torch.equal(eight, before)
        groups = before.reshape(-1, before.shape[-1] // 16, 16)
        levels = four.reshape(groups.shape) / (groups.abs().amax(dim=-1, keepdim=True) / 7)
        assert torch.allclose(levels, levels.round(), atol=1e-3) and float(levels.abs().max()) <= 7 + 1e-3
        steps = eight / (before.abs().amax(dim=-1, keepdim=True) / 127)
        assert torch.allclose(steps, steps.round(), atol=1e-3)
        assert torch.equal(model.get_parameter(name).detach(), before)
    with torch.no_grad():
        for quantised in (rounded4, rounded8):
            assert torch.isfinite(quantised(input_ids=torch.tensor([[1, 5, 9, 3]])).logits).all()
