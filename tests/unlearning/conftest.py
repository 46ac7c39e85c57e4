"""Shared fixtures for the engine's tests.

- `tiny_corpus_dir`: a demo corpus of 24 people (+ control people) in a temp dir.
- `tiny_base_model_dir`: the `tiny` preset trained on it once per session
  (about 20 s on one core; memorises the training facts).
- `tiny_arch_model_dir(arch)`: a factory for tiny RANDOM models of another
  architecture (`llama`, `mistral`, `qwen2`, `gpt2`, `gpt_neox`, `opt`) with the same tokenizer
  and chat template, built from a config, saved once per session per arch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from unlearning.checkpoints import save_checkpoint
from unlearning.corpus import load_corpus
from unlearning.demo.corpus import write_demo_corpus
from unlearning.demo.tokenizer import train_tokenizer
from unlearning.demo.train_base import TrainResult, train_base

TINY_PEOPLE = 24
TINY_SEED = 0


@pytest.fixture(scope="session")
def tiny_corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny_corpus")
    write_demo_corpus(out, people=TINY_PEOPLE, seed=TINY_SEED)
    return out


@pytest.fixture(scope="session")
def tiny_base_training(tiny_corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    threads = torch.get_num_threads()
    try:
        return train_base(tiny_corpus_dir / "corpus.jsonl", tmp_path_factory.mktemp("tiny_base"),
                          preset="tiny", seed=TINY_SEED, threads=1)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_base_model_dir(tiny_base_training: TrainResult) -> Path:
    return tiny_base_training.out_dir


def _arch_config(arch: str, tokenizer: object) -> object:
    from transformers import (
        GPT2Config,
        GPTNeoXConfig,
        LlamaConfig,
        MistralConfig,
        OPTConfig,
        Qwen2Config,
    )

    ids = {
        "bos_token_id": tokenizer.bos_token_id,  # type: ignore[attr-defined]
        "eos_token_id": tokenizer.eos_token_id,  # type: ignore[attr-defined]
        "pad_token_id": tokenizer.pad_token_id,  # type: ignore[attr-defined]
        "vocab_size": len(tokenizer),  # type: ignore[arg-type]
    }
    common = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 128, **ids}
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "mistral":
        return MistralConfig(sliding_window=64, **common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "gpt2":
        return GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, **ids)
    if arch == "gpt_neox":  # rotary on part of each head, parallel attention and MLP
        return GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             max_position_embeddings=128, rotary_pct=0.5, **ids)
    if arch == "opt":  # learnt positions, post-projection embeddings
        return OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                         word_embed_proj_dim=64, max_position_embeddings=128, **ids)
    raise ValueError(f"unknown test architecture {arch!r}")


@pytest.fixture(scope="session")
def tiny_arch_model_dir(
    tiny_corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], Path]:
    from transformers import AutoModelForCausalLM

    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    tokenizer = train_tokenizer(
        [t for r in corpus.records for t in (r.question, r.answer, r.text) if t], vocab_size=512)
    built: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch not in built:
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(_arch_config(arch, tokenizer))
            out = tmp_path_factory.mktemp(f"tiny_{arch}")
            save_checkpoint(model.eval(), tokenizer, out,
                            {"method": "random_init", "seeds": {"seed": 0}, "arch": arch})
            built[arch] = out
        return built[arch]

    return make
