"""The latent check's whole-value reading (policy v5): the states before every token of a value,
batched and right-padded, and each layer's lens log-probability of those tokens."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from unlearning.verification.generation import continuation_states
from unlearning.verification.latent import fit_translators, lens_token_logprobs


def _model(positions: int = 64) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_positions=positions, n_embd=16, n_layer=2, n_head=2)
    return GPT2LMHeadModel(config).eval()


def test_batched_states_are_each_sequences_own_from_its_start() -> None:
    model = _model()
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    rng = np.random.default_rng(0)
    sequences = [list(rng.integers(2, 50, n)) for n in (9, 4, 13, 7)]
    starts = [5, 1, 10, 0]  # 0: the first token has nothing before it, so reading starts at 1
    read = continuation_states(model, tokenizer, sequences, starts, batch_size=3)
    for seq, start, states in zip(sequences, starts, read, strict=True):
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
        first = max(start, 1)
        assert states.shape == (3, len(seq) - first, 16)
        for layer in range(3):
            expected = alone[layer][0, first - 1 : len(seq) - 1].numpy()
            assert np.allclose(states[layer], expected, atol=1e-5)


def test_a_sequence_past_the_positions_keeps_its_end() -> None:
    model = _model(positions=16)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    seq = list(np.random.default_rng(1).integers(2, 50, 40))
    (states,) = continuation_states(model, tokenizer, [seq], [36])
    with torch.no_grad():
        end = model(input_ids=torch.tensor([seq[-16:]]), output_hidden_states=True).hidden_states
    assert states.shape[1] == 4
    assert np.allclose(states[2], end[2][0, 11:15].numpy(), atol=1e-5)


def test_the_lens_log_probabilities_are_the_heads_reading_of_each_translated_state() -> None:
    model = _model()
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    rng = np.random.default_rng(2)
    sequences = [list(rng.integers(2, 50, n)) for n in (8, 11)]
    starts = [3, 6]
    states = continuation_states(model, tokenizer, sequences, starts)
    fit = np.concatenate(states, axis=1)
    translators = fit_translators(fit, rng.normal(size=(fit.shape[1], 16)).astype(np.float32))
    targets = [seq[s:] for seq, s in zip(sequences, starts, strict=True)]
    read = lens_token_logprobs(model.get_output_embeddings(), translators, states, targets, chunk=3)
    head = model.get_output_embeddings()
    for s, t, r in zip(states, targets, read, strict=True):
        assert r.shape == (3, len(t))
        for layer, w in enumerate(translators):
            h = torch.from_numpy(s[layer])
            with torch.no_grad():
                lp = head(torch.cat([h, torch.ones(len(h), 1)], 1) @ torch.from_numpy(w)).log_softmax(-1)
            assert r[layer] == pytest.approx(lp[torch.arange(len(t)), torch.tensor(t)].numpy(), abs=1e-5)
        assert (r <= 0).all()
