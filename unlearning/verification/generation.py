"""Batched forward passes the checks share: generation, hidden states, token scores.

Every prompt reaches the model in the model's own prompt format
(`unlearning.prompting`), exactly as in training: a probe's `form` says which
layout (question, question + beginning of the answer, beginning of a text,
conversation).  Batches are sorted by length (less padding), left-padded for
generation (the last prompt token is then at index -1), right-padded for
scoring and hidden states (every token at its own position).

No sequence reaches a model longer than its positions (`position_limit`):
GPT-2 and OPT would index past their position embeddings, a RoPE model would
run past its trained context.  Prompts keep their end (the question is there),
a record scored whole is scored in overlapping windows, and states are read
from the beginning of a record, as training cuts it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from unlearning.logits import Readout, ReadoutHead, find_readout, logits_at
from unlearning.modeling import (
    equal_length_batches,
    fit_prompts,
    left_padding_leaks,
    position_limit,
)
from unlearning.probes import CLOZE_INSTRUCTION, Probe
from unlearning.prompting import (
    Example,
    answer_prefix_encoding,
    chat_prefix_encoding,
    continuation_ids,
    pad_id_of,
    prompt_encoding,
    prompt_ids,
    text_ids,
    tokenize_after,
)

logger = logging.getLogger(__name__)

__all__ = [
    "CLOZE_INSTRUCTION", "TokenScores", "continuation_states", "generate_texts", "probe_encoding", "probe_ids",
    "question_ids", "score_continuations", "score_examples", "text_ids",
]


def question_ids(tokenizer: Any, question: str) -> list[int]:
    return prompt_ids(tokenizer, question)


def probe_ids(tokenizer: Any, probe: Probe) -> list[int]:
    """The token ids of a probe's prompt, laid out as its form says."""
    return probe_encoding(tokenizer, probe)[0]


def probe_encoding(tokenizer: Any, probe: Probe) -> tuple[list[int], str]:
    """`probe_ids` and the text they encode: what an answer or a value read after the prompt
    follows (`tokenize_after`), so it is encoded as the model met it in whole texts."""
    if probe.form == "text":
        return continuation_ids(tokenizer, probe.prompt), probe.prompt
    if probe.form == "answer":
        return answer_prefix_encoding(tokenizer, probe.prompt, probe.prefix)
    if probe.form == "chat":
        ids, text = chat_prefix_encoding(tokenizer, json.loads(probe.prompt))
        if probe.prefix:
            ids = ids + tokenize_after(tokenizer, text, probe.prefix)[0]
            text += probe.prefix
        return ids, text
    return prompt_encoding(tokenizer, probe.prompt)


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
    pad = pad_id_of(tokenizer)
    prompts, max_new_tokens = fit_prompts(model, prompts, max_new_tokens)
    out: list[list[str]] = [[] for _ in prompts]
    per_prompt = max(samples, 1)
    batches = _batches([len(p) for p in prompts], batch_size)
    if left_padding_leaks(model, pad):  # pads would run through the model: one length a batch
        batches = equal_length_batches(batches, [len(p) for p in prompts])
    for number, idx in enumerate(batches):
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
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        generated = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        texts = tokenizer.batch_decode(generated[:, ids.shape[1] :], skip_special_tokens=True)
        for row, i in enumerate(idx):
            out[i] = [t.strip() for t in texts[row * per_prompt : (row + 1) * per_prompt]]
    return out


@torch.inference_mode()
def continuation_states(
    model: Any, tokenizer: Any, sequences: Sequence[Sequence[int]], starts: Sequence[int], *,
    batch_size: int = 32,
) -> list[np.ndarray]:
    """Residual stream of every layer at the positions that predict each sequence's tokens from
    `starts[i]` on: per sequence, an array (layers + 1, len - start, hidden), float32.

    Right-padded, so every token sits at its own position.  A sequence longer than
    the model's positions keeps its end (the continuation and the context just
    before it); a start of 0 becomes 1 (the first token has nothing before it)."""
    device = model_device(model)
    pad = pad_id_of(tokenizer)
    limit = position_limit(model)
    fitted: list[tuple[list[int], int]] = []
    for seq, start in zip(sequences, starts, strict=True):
        seq = list(seq)
        cut = max(0, len(seq) - limit) if limit is not None else 0
        fitted.append((seq[cut:], max(1, start - cut)))
    out: list[np.ndarray] = [np.zeros((0, 0, 0), dtype=np.float32)] * len(fitted)
    for idx in _batches([len(s) for s, _ in fitted], batch_size):
        width = max(len(fitted[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            seq = fitted[i][0]
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        hidden = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True).hidden_states
        stacked = torch.stack([h.float() for h in hidden]).cpu().numpy()  # (layers + 1, batch, width, hidden)
        for row, i in enumerate(idx):
            seq, start = fitted[i]
            out[i] = stacked[:, row, start - 1 : len(seq) - 1, :]
    return out


READOUT_RECORDS = 4  # records of one forward pass that find the model's readout


@torch.inference_mode()
def readout_head(model: Any, tokenizer: Any, examples: Sequence[Example], head: Any = None) -> ReadoutHead:
    """`head` (the model's output head by default) followed by the model's readout
    (`unlearning.logits.find_readout`), found on the first few of `examples`."""
    head = model.get_output_embeddings() if head is None else head
    limit = position_limit(model)
    chosen = [e.truncated(limit) if limit is not None else e for e in list(examples)[:READOUT_RECORDS]]
    chosen = [e for e in chosen if len(e)]
    if not chosen:
        return ReadoutHead(head, Readout(verified=False))
    width = max(len(e) for e in chosen)
    ids = torch.full((len(chosen), width), pad_id_of(tokenizer), dtype=torch.long)
    mask = torch.zeros((len(chosen), width), dtype=torch.long)
    for row, example in enumerate(chosen):
        ids[row, : len(example)] = torch.tensor(example.ids)
        mask[row, : len(example)] = 1
    device = model_device(model)
    return ReadoutHead(head, find_readout(model, ids.to(device), mask.to(device)))


@torch.inference_mode()
def states_and_head_inputs(
    model: Any, tokenizer: Any, examples: Sequence[Example], *, max_positions: int = 3000,
    batch_size: int = 32,
) -> tuple[np.ndarray, np.ndarray]:
    """Residual states of every layer (layers + 1, N, hidden) and what the output head reads (N, hidden)
    at the learnt positions of `examples` (at most `max_positions`, evenly spread)."""
    head = model.get_output_embeddings()
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, output: captured.append(args[0].float()))
    device = model_device(model)
    pad = pad_id_of(tokenizer)
    limit = position_limit(model)
    if limit is not None:  # as training cuts a record: its beginning
        examples = [e.truncated(limit) for e in examples]
    states: list[np.ndarray] = []
    inputs: list[np.ndarray] = []
    total = sum(sum(e.learnt) for e in examples)
    stride = max(1, total // max(1, max_positions))
    counter = 0
    try:
        for start in range(0, len(examples), batch_size):
            chunk = list(examples[start : start + batch_size])
            width = max(len(e) for e in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            keep: list[tuple[int, int]] = []
            for row, example in enumerate(chunk):
                ids[row, : len(example)] = torch.tensor(example.ids)
                mask[row, : len(example)] = 1
                for t in range(len(example) - 1):
                    if example.learnt[t + 1]:
                        if counter % stride == 0:
                            keep.append((row, t))
                        counter += 1
            captured.clear()
            hidden = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                           output_hidden_states=True).hidden_states
            if not keep:
                continue
            rows = torch.tensor([r for r, _ in keep])
            cols = torch.tensor([c for _, c in keep])
            states.append(torch.stack([h[rows, cols].float() for h in hidden]).cpu().numpy())
            inputs.append(captured[-1][rows, cols].cpu().numpy())
    finally:
        handle.remove()
    if not states:
        return np.zeros((0, 0, 0), dtype=np.float32), np.zeros((0, 0), dtype=np.float32)
    return np.concatenate(states, axis=1), np.concatenate(inputs, axis=0)


@dataclass(frozen=True)
class TokenScores:
    """Per scored token: log p of the actual token, and mean/std of log p under the model."""

    logp: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray


def _windows(length: int, start: int, limit: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored) windows of at most `limit` tokens that score tokens start.. once.

    A sequence that fits is one window.  A longer one is scored in windows that
    move by half the limit, each token given at least the half-limit of tokens
    before it (the strided evaluation of long texts): every token still gets a
    score, so the scores line up with the sequence as the callers expect."""
    start = max(start, 1)
    if length <= limit:
        return [(0, length, start)]
    stride = max(1, limit // 2)
    out: list[tuple[int, int, int]] = []
    position = start
    while position < length:
        end = min(length, max(position + stride, limit))
        begin = max(0, end - limit)
        out.append((begin, end, position))
        position = end
    return out or [(length - limit, length, length)]  # nothing to score: one empty window


def _score_batches(
    model: Any, full: Sequence[Sequence[int]], starts: Sequence[int], pad: int, batch_size: int,
) -> list[TokenScores]:
    """Scores of tokens `starts[i]`.. of every sequence, windowed to the model's positions (`_windows`)."""
    limit = position_limit(model)
    if limit is None or all(len(f) <= limit for f in full):
        return _score_pieces(model, full, starts, pad, batch_size)
    pieces: list[list[int]] = []
    piece_starts: list[int] = []
    owners: list[int] = []
    for i, (sequence, start) in enumerate(zip(full, starts, strict=True)):
        for begin, end, first in _windows(len(sequence), start, limit):
            pieces.append(list(sequence[begin:end]))
            piece_starts.append(first - begin)
            owners.append(i)
    scored = _score_pieces(model, pieces, piece_starts, pad, batch_size)
    parts: list[list[TokenScores]] = [[] for _ in full]
    for owner, score in zip(owners, scored, strict=True):
        parts[owner].append(score)
    return [TokenScores(logp=np.concatenate([p.logp for p in own]), mu=np.concatenate([p.mu for p in own]),
                        sigma=np.concatenate([p.sigma for p in own])) for own in parts]


def _score_pieces(
    model: Any, full: Sequence[Sequence[int]], starts: Sequence[int], pad: int, batch_size: int,
) -> list[TokenScores]:
    """Scores of tokens `starts[i]`.. of every sequence (each token given everything before it)."""
    device = model_device(model)
    out: dict[int, TokenScores] = {}
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
        # Position t predicts token t + 1: the scored tokens' positions, the only ones whose
        # next-token distribution is computed (`logits_at`).
        keep = torch.zeros((len(idx), width), dtype=torch.bool)
        for row, i in enumerate(idx):
            keep[row, max(starts[i], 1) - 1: len(full[i]) - 1] = True
        logprobs = torch.log_softmax(logits_at(model, ids.to(device), mask.to(device), keep.to(device)).float(),
                                     dim=-1)
        probs = logprobs.exp()
        mu = (probs * logprobs).sum(-1)
        sigma = ((probs * logprobs.square()).sum(-1) - mu.square()).clamp_min(0).sqrt()
        nexts = torch.roll(ids, -1, dims=1)[keep].to(device)
        token_logp = logprobs.gather(-1, nexts.unsqueeze(-1)).squeeze(-1).cpu().numpy()
        mu_np, sigma_np = mu.cpu().numpy(), sigma.cpu().numpy()
        offset = 0
        for i in idx:  # `keep` is row-major: each row's scored positions in order
            count = max(0, len(full[i]) - max(starts[i], 1))
            part = slice(offset, offset + count)
            out[i] = TokenScores(logp=token_logp[part], mu=mu_np[part], sigma=sigma_np[part])
            offset += count
    return [out[i] for i in range(len(full))]


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
    if not pairs:
        return []
    full = [list(p) + list(c) for p, c in pairs]
    return _score_batches(model, full, [len(p) for p, _ in pairs], pad_id_of(tokenizer), batch_size)


@torch.inference_mode()
def score_examples(
    model: Any, tokenizer: Any, examples: Sequence[Example], *, batch_size: int = 32,
) -> list[TokenScores]:
    """Token scores of every token of each encoded record after its first (the whole record)."""
    if not examples:
        return []
    return _score_batches(model, [list(e.ids) for e in examples], [1] * len(examples),
                          pad_id_of(tokenizer), batch_size)
