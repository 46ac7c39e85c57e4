"""The architecture smoke's configs: each builds a causal LM that runs (the smoke itself, erase
and verify on every one, is a benchmark run by hand: `python -m bench.arch_smoke`)."""

from __future__ import annotations

import pytest
import torch

from bench import arch_smoke
from tests.unlearning.test_unseen_shapes import _tokenizer


@pytest.mark.parametrize("arch", arch_smoke.ARCHITECTURES)
def test_every_architecture_builds_from_its_config_and_runs(arch: str) -> None:
    from transformers import AutoModelForCausalLM

    tok = _tokenizer()
    model = AutoModelForCausalLM.from_config(arch_smoke.config(arch, tok)).eval()
    ids = torch.tensor([tok("Who is Mira Voss?")["input_ids"]])
    with torch.no_grad():
        assert model(input_ids=ids, use_cache=False).logits.shape == (1, ids.shape[1], len(tok))


def test_an_unknown_architecture_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown architecture 'rwkv'; one of phi, "):
        arch_smoke.config("rwkv", _tokenizer())
