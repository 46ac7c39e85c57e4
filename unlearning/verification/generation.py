"""Batched forward passes the checks share: generation, hidden states, token scores.

Every question reaches the model through the tokenizer's chat template
(`unlearning.modeling.chat_prompt_ids`), exactly as in training.  A cloze
probe is the start of an answer: it is placed after the assistant header of a
neutral instruction, so the model continues its own answer.  Batches are
sorted by length (less padding), left-padded for generation and hidden
states (the last prompt token is then at index -1), right-padded for scoring.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from unlearning.modeling import chat_prompt_ids

from .probes import FactProbe

logger = logging.getLogger(__name__)

CLOZE_INSTRUCTION = "Continue the sentence."


def question_ids(tokenizer: Any, question: str) -> list[int]:
    return list(chat_prompt_ids(tokenizer, question))


def text_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def probe_ids(tokenizer: Any, probe: FactProbe) -> list[int]:
    if probe.kind == "cloze":
        return question_ids(tokenizer, CLOZE_INSTRUCTION) + text_ids(tokenizer, probe.prompt)
    return question_ids(tokenizer, probe.prompt)


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id
    return int(pad if pad is not None else 0)


def _batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _left_padded(
    prompts: Sequence[Sequence[int]], idx: Sequence[int], pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(prompts[i]) for i in idx)
    ids = torch.full((len(idx), width), pad, dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    for row, i in enumerate(idx):
        seq = torch.tensor(prompts[i], dtype=torch.long)
        ids[row, width - len(seq) :] = seq
        mask[row, width - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def model_device(model: Any) -> torch.device:
    device: torch.device = next(model.parameters()).device
    return device


@torch.inference_mode()
def generate_texts(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    *,
    samples: int = 0,
    max_new_tokens: int = 24,
    batch_size: int = 64,
    seed: int = 0,
) -> list[list[str]]:
    """Greedy answers (`samples` = 0: one per prompt) or `samples` sampled answers per prompt.

    Sampling is plain ancestral sampling at temperature 1 (no top-k/top-p), so
    the sampled leak rate estimates the probability the model itself gives
    the value; the torch seed is fixed per batch so reports are reproducible,
    and the caller's random state is restored afterwards.
    """
    if not prompts:
        return []
    device = model_device(model)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return _generate(model, tokenizer, prompts, samples=samples, max_new_tokens=max_new_tokens,
                         batch_size=batch_size, seed=seed)


def _generate(
    model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], *, samples: int,
    max_new_tokens: int, batch_size: int, seed: int,
) -> list[list[str]]:
    device = model_device(model)
    pad = _pad_id(tokenizer)
    out: list[list[str]] = [[] for _ in prompts]
    per_prompt = max(samples, 1)
    for number, idx in enumerate(_batches([len(p) for p in prompts], batch_size)):
        ids, mask = _left_padded(prompts, idx, pad, device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "pad_token_id": pad,
            "eos_token_id": tokenizer.eos_token_id,
        }
        if samples:
            torch.manual_seed(seed * 1_000_003 + number)
            kwargs.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          num_return_sequences=samples)
        else:
            kwargs.update(do_sample=False)
        generated = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        texts = tokenizer.batch_decode(generated[:, ids.shape[1] :], skip_special_tokens=True)
        for row, i in enumerate(idx):
            out[i] = [t.strip() for t in texts[row * per_prompt : (row + 1) * per_prompt]]
    return out


@torch.inference_mode()
def last_prompt_states(
    model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], *, batch_size: int = 64
) -> np.ndarray:
    """Residual stream at the last prompt token: array (layers + 1, prompts, hidden), float32."""
    device = model_device(model)
    pad = _pad_id(tokenizer)
    chunks: dict[int, np.ndarray] = {}
    for idx in _batches([len(p) for p in prompts], batch_size):
        ids, mask = _left_padded(prompts, idx, pad, device)
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        stacked = torch.stack([h[:, -1, :].float() for h in hidden]).cpu().numpy()
        for row, i in enumerate(idx):
            chunks[i] = stacked[:, row, :]
    return np.stack([chunks[i] for i in range(len(prompts))], axis=1)


@dataclass(frozen=True)
class TokenScores:
    """Per answer token: log p of the actual token, and mean/std of log p under the model."""

    logp: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray


@torch.inference_mode()
def score_continuations(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    batch_size: int = 32,
) -> list[TokenScores]:
    """Token scores of each continuation given its prefix (prefix tokens are not scored).

    mu and sigma are the expectation and standard deviation of log p(z) for z
    drawn from the model's own next-token distribution: the calibration terms
    of Min-K%++ (Zhang et al. 2024).
    """
    device = model_device(model)
    pad = _pad_id(tokenizer)
    full = [list(p) + list(c) for p, c in pairs]
    out: dict[int, TokenScores] = {}
    if not full:
        return []
    # Full-vocabulary log-probabilities are (rows, tokens, vocab) floats: cap a batch at
    # about 50 M of them so a 150k-vocabulary model does not exhaust memory.
    vocab = int(model.get_output_embeddings().weight.shape[0])
    longest = max(len(f) for f in full)
    batch_size = max(1, min(batch_size, 50_000_000 // max(1, vocab * longest)))
    for idx in _batches([len(f) for f in full], batch_size):
        width = max(len(full[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, : len(full[i])] = torch.tensor(full[i])
            mask[row, : len(full[i])] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
        probs = logprobs.exp()
        mu = (probs * logprobs).sum(-1)
        sigma = ((probs * logprobs.square()).sum(-1) - mu.square()).clamp_min(0).sqrt()
        targets = ids[:, 1:].to(device)
        token_logp = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        for row, i in enumerate(idx):
            start = max(len(pairs[i][0]), 1) - 1
            end = len(full[i]) - 1
            out[i] = TokenScores(
                logp=token_logp[row, start:end].cpu().numpy(),
                mu=mu[row, start:end].cpu().numpy(),
                sigma=sigma[row, start:end].cpu().numpy(),
            )
    return [out[i] for i in range(len(pairs))]
