"""Forget targets: what a model that never saw the subject would predict, token by token.

The unlearning objective of ASU (and of KIF's gates and distillation) is a
forward KL to a *target distribution* at every position of the subject's
records where such a model would predict differently.  Two teachers provide
it, both computed from the model being unlearned (no second copy of the
weights):

**The counterfactual teacher.**  Each forget record is copied (`counterfactuals` times) with
every span that says who it is about (`identifiers.identity_spans`; values such as dates
and addresses stay, their prediction then comes from the stranger's context) replaced by
a fresh one of the same shape
(`unlearning.identifiers`: the name by a name, the e-mail address by one
built the same way from the new name, the phone number by one with the same
digit pattern ...).  The model is run on every copy; its prediction at the
aligned position of the copy is what it predicts for a person it never saw.
Positions are aligned through the character offsets of the tokens: text
outside the spans is identical, shifted by the length differences; inside a
span word by word (a name's first and last names are words), the i-th of a word's n
original tokens takes the copy's word's token at i*m/n of its m tokens, so that the
first token of the subject's surname is predicted where the stranger's surname begins,
whatever either tokenises to (spread over the whole span when the word counts differ).  At a span token the copy's distribution has its own fresh token where
the subject's token should be, so the two tokens' probabilities are swapped:
the subject's name then gets exactly the probability the model gives a name it
never saw (a small model that cannot copy an unseen name spells it badly; a
large one that copies names keeps copying it), and Min-K%++'s calibrated
score of the subject's token becomes that of the fresh token.  One copy per
record is the default: several copies are averaged (a mixture, position by
position), and a mixture is broader than the prediction of any single
stranger, so the records would look unlike any stranger's to a calibrated
attack; with one fresh copy per record the subject's records become a
sample of strangers' records.  (`combine="span-median"`, an option: several
copies, the first's rows outside the identifying spans and each span whole from the copy
whose cost there is the median; see `_combine` and docs/methods.md.)  The teacher
covers every position whose context holds a span (in a question/answer pair:
the whole answer, since the question names the subject; in free text:
everything after the first identifier), learnt or not (a name in a question
is part of what an attacker scores).

**The tempered teacher** (ASU's own, Salehzz/ASU-unlearning): the model with
every attention logit divided by `tau` (`unlearning.attention`), which
flattens recalled facts far more than grammar.  It covers the learnt
positions the counterfactual teacher cannot: those whose context holds no
identifying span (a pronoun-only record of the subject's document, the
opening words of a text before the name).

Targets are cached top-k (k values and indices plus one bucket for the rest of
the mass, so a 128k-vocabulary model's cache stays small) or in full; the KL
is computed over the same k+1 buckets of the student.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import re
import weakref
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from unlearning.attention import attention_temperature
from unlearning.corpus import Record
from unlearning.identifiers import (
    FreshNames,
    avoid_set,
    counterfactual,
    identity_spans,
    names_in,
    replace_spans,
)
from unlearning.logits import logits_at
from unlearning.methods.base import Batch, collate, max_positions, sequence_mean
from unlearning.prompting import Example, encode_record, pad_id_of
from unlearning.subjects import Subject
from unlearning.text import word_regex

logger = logging.getLogger(__name__)



@dataclass
class Dist:
    """Target log-probabilities at some positions: (N, k) values and indices, (N,) tail; or full (N, V)."""

    values: torch.Tensor
    indices: torch.Tensor | None = None
    tail: torch.Tensor | None = None
    actual: torch.Tensor | None = None  # (N,) log-probability of the actual next token, where known
    _weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False,
                                                                              compare=False)

    def to(self, device: torch.device) -> Dist:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return Dist(self.values.to(device), move(self.indices), move(self.tail), move(self.actual))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in (self.values, self.indices, self.tail, self.actual) if t is not None)

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(probabilities (N, k [+1 for the tail]), their sums (N,), sum p log p (N,)): the parts
        of the forward KL that do not depend on the student, computed once per Dist (a cached
        target is asked at many steps)."""
        if self._weights is None:
            logp = self.values if self.tail is None else torch.cat([self.values, self.tail[:, None]], dim=-1)
            p = logp.exp()
            self._weights = (p, p.sum(-1), torch.where(p > 0, p * logp, 0.0).sum(-1))
        return self._weights


@dataclass
class RecordTarget:
    """The target of one example: the positions it covers and their distributions.

    `states` (optional, (n, layers, hidden)) are the residual states of the
    counterfactual copy at the aligned positions listed in `state_positions`
    (those of `positions` from the first identifying span on; inside the spans too
    unless `TeacherSettings.span_states` is off): the internal state of a model
    reading about a stranger, for a latent loss.
    """

    positions: list[int]  # prediction positions t (of token t+1), ascending
    dist: Dist
    source: list[str]  # per position: "counterfactual" or "tempered"
    states: torch.Tensor | None = None
    state_positions: list[int] = field(default_factory=list)


FULL_VOCABULARY_UP_TO = 4096  # a smaller vocabulary is cached whole: the KL is then exact


def compress(logprobs: torch.Tensor, topk: int | None, keep: torch.Tensor | None = None) -> Dist:
    """Keep the top-k log-probabilities (and the `keep` tokens: the actual next ones), plus one
    log-mass for the rest.  None, or a vocabulary of at most `FULL_VOCABULARY_UP_TO`, keeps
    everything.

    Keeping the actual token matters: an attacker scores exactly that token's
    probability against the distribution's mean and spread (Min-K%++), so the
    target must pin it, not leave it somewhere in an unconstrained tail.
    """
    vocab = logprobs.shape[-1]
    actual = (logprobs.gather(-1, keep.reshape(len(logprobs), -1)[:, :1].to(logprobs.device)).squeeze(-1)
              if keep is not None and keep.numel() else None)
    if topk is None or topk >= vocab or vocab <= FULL_VOCABULARY_UP_TO:
        return Dist(logprobs, actual=actual)
    values, indices = logprobs.topk(topk, dim=-1)
    if keep is not None and keep.numel():
        extra = keep.reshape(len(logprobs), -1).to(indices.device)
        present = (indices[:, :, None] == extra[:, None, :]).any(1)
        # Replace the lowest kept entries by the actual tokens that the top-k missed.
        for column in range(extra.shape[1]):
            missing = ~present[:, column]
            if bool(missing.any()):
                slot = topk - 1 - column
                indices[missing, slot] = extra[missing, column]
                values[missing, slot] = logprobs[missing].gather(-1, extra[missing, column: column + 1]).squeeze(-1)
    kept = torch.logsumexp(values, dim=-1)
    tail = torch.log1p(-kept.exp().clamp(max=1 - 1e-6))
    return Dist(values, indices, tail, actual)


def concat(dists: Sequence[Dist]) -> Dist:
    if not dists:
        return Dist(torch.zeros(0, 1))
    values = torch.cat([d.values for d in dists])
    actual = (torch.cat([d.actual for d in dists if d.actual is not None])
              if all(d.actual is not None for d in dists) else None)
    if dists[0].indices is None:
        return Dist(values, actual=actual)
    return Dist(values, torch.cat([d.indices for d in dists if d.indices is not None]),
                torch.cat([d.tail for d in dists if d.tail is not None]), actual)


def kl_to_target(target: Dist, student_logits: torch.Tensor, mask: torch.Tensor, *,
                 next_ids: torch.Tensor | None = None, token_weight: float = 0.0,
                 token_gap: str = "logprob", floor_weight: float = 0.0,
                 own: torch.Tensor | None = None, odds_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Forward KL(target || student) at the masked positions, mean per sequence then per batch.

    ``student_logits`` is (B, T, V); the rows of ``target`` follow the masked
    positions in row-major order (sequence by sequence, position by position).

    With ``token_weight`` > 0 (and ``next_ids``, the (B, T) actual next tokens, and a target
    that knows their log-probabilities), each position adds ``token_weight`` times the
    squared gap between the student's and the target's log-probability of the actual
    token.  The forward KL alone barely moves that token when the target gives it
    little mass: a student that keeps 0.1 on it where the target has 1e-4 pays about
    log(1/0.9) = 0.1 nats, yet a membership attack scores exactly that token's
    log-probability (3 nats too familiar).  The squared gap is two-sided, so it stops
    at the target, never below it.

    ``token_gap="logodds"`` takes the gap of the token's log-odds, log p - log(1 - p),
    instead: the same as the log-probability's where the token is unlikely, and where it
    is likely, the gap of the mass left to every other token.  A calibrated attack
    (Min-K%++) reads a confident token by that mass (its z is about the square root of
    it), and the log-probability barely sees it: 0.99 against 0.9985 is 0.009 nats of
    log-probability, 1.9 of log-odds (`log_odds`).  ``token_gap="logodds-spans"`` takes the
    log-odds gap only at the rows ``odds_rows`` (N,) marks, in the target's row order (the tokens
    inside identifying spans, which the span attack reads), and the log-probability's elsewhere.

    With ``floor_weight`` > 0 (and ``next_ids``; the retain anchor as target), adds
    ``floor_weight`` times the fine-tuning loss of the actual tokens charged only below the
    target's level, max(0, log q(x) - log s(x)), at the masked positions that are also
    ``own`` (B, T; default all), mean per sequence then per batch over those positions.  It
    gives back what a token lost and never teaches past the original: a base that had
    learnt a fifth of its retained facts stays at a fifth, as the model retrained without the
    subject does.  It reads the student's log-probability of the token that the KL has
    already computed, so it costs no log-softmax of its own.
    """
    if floor_weight > 0 and (target.actual is None or next_ids is None):
        raise ValueError("the floor needs the actual tokens and a target that knows their log-probabilities")
    wanted = (token_weight > 0 or floor_weight > 0) and next_ids is not None and target.actual is not None
    rows = student_logits[mask]
    pick = next_ids[mask] if wanted and next_ids is not None else None
    per_token, mine = _kl_rows(target, rows, pick)
    floor: torch.Tensor | None = None
    if mine is not None and target.actual is not None:
        if floor_weight > 0:
            floor = torch.relu(target.actual - mine)
        if token_weight > 0:
            theirs, gap_mine = target.actual, mine
            if token_gap == "logodds":
                gap_mine, theirs = log_odds(mine), log_odds(theirs)
            elif token_gap == "logodds-spans":
                if odds_rows is None:
                    raise ValueError("token gap 'logodds-spans' needs odds_rows (the rows inside identifying spans)")
                gap_mine = torch.where(odds_rows, log_odds(mine), mine)
                theirs = torch.where(odds_rows, log_odds(theirs), theirs)
            elif token_gap != "logprob":
                raise ValueError(f"unknown token gap {token_gap!r}: logprob, logodds or logodds-spans")
            per_token = per_token + token_weight * (gap_mine - theirs).square()
    full = torch.zeros(mask.shape, dtype=per_token.dtype, device=per_token.device)
    full[mask] = per_token
    loss = sequence_mean(full, mask)
    if floor is None:
        return loss
    kept = mask if own is None else mask & own
    charged = torch.zeros(mask.shape, dtype=floor.dtype, device=floor.device)
    charged[mask] = floor
    return loss + floor_weight * sequence_mean(charged, kept)


# Log-probabilities above this are read as this: float32 cannot tell 1 - p below it.
_SURE = -1e-6


def log_odds(logp: torch.Tensor) -> torch.Tensor:
    """log p - log(1 - p) from log p, accurate for p near 1 (`expm1`)."""
    logp = logp.clamp(max=_SURE)
    return logp - torch.log(-torch.expm1(logp))


def _kl_rows(target: Dist, rows: torch.Tensor,
             pick: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row, KL(target || softmax(rows)) for student logits `rows` (N, V), and the rows'
    log-probability of the tokens `pick` (N,) where asked.

    A target of the whole vocabulary takes one fused log-softmax: on CPU it measured 1.5-1.8x
    faster, forward and backward, than a separate log-normaliser and weighted sum (320 x
    2,048: 3.0 against 5.5 ms; AMD EPYC, 2026-12-05), and in the training step a
    hand-written backward of both did not beat it either (Intel Xeon, 2026-12-06: 0.7 ms
    a step slower with the demo's 2,048 tokens).  A top-k target reads k + 1 columns of
    the student's distribution, which `_LogProbsAt` gives without writing the log-softmax
    out: 512 rows of 32,000 tokens against a top-64 target, 86 ms forward and backward
    where the log-softmax and a gather took 125 (Intel Xeon, 2026-12-06).
    """
    p, _, plogp = target.weights()
    if target.indices is not None and target.tail is not None:
        k = target.indices.shape[1]
        columns = target.indices if pick is None else torch.cat([target.indices, pick[:, None]], dim=1)
        chosen = _LogProbsAt.apply(rows, columns)  # type: ignore[no-untyped-call]
        picked = chosen[:, :k]
        rest = torch.log1p(-torch.logsumexp(picked, dim=-1).exp().clamp(max=1 - 1e-6))
        cross = (p[:, :-1] * picked).sum(-1) + p[:, -1] * rest
        return plogp - cross, (chosen[:, k] if pick is not None else None)
    logq = F.log_softmax(rows, dim=-1)
    mine = logq.gather(-1, pick[:, None]).squeeze(-1) if pick is not None else None
    return plogp - (p * logq).sum(-1), mine


class _LogProbsAt(torch.autograd.Function):
    """For logits `rows` (N, V): log softmax(row) at `columns` (N, K), with the gradient of a
    log-softmax followed by a gather (tests/unlearning/test_asu.py checks both against the
    textbook KL and torch's numerical gradient), without the (N, V) log-softmax: forward, a
    log-normaliser and a gather; backward, one softmax written in place and scaled, the
    columns' gradients scattered in.  Through autograd the same loss wrote the log-softmax,
    a zero tensor for the gather's gradient and the log-softmax's gradient."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        lse = torch.logsumexp(rows, dim=-1)
        ctx.save_for_backward(rows, lse, columns)
        return rows.gather(-1, columns) - lse[:, None]

    @staticmethod
    def backward(ctx: Any, g_chosen: torch.Tensor) -> tuple[torch.Tensor, None]:
        rows, lse, columns = ctx.saved_tensors
        # d log q_c / d rows = onehot(c) - q
        grad = (rows - lse[:, None]).exp_().mul_(-g_chosen.sum(-1)[:, None])
        return grad.scatter_add_(1, columns, g_chosen), None


# ------------------------------------------------------------------ forward passes


@torch.no_grad()
def position_logprobs(model: nn.Module, tokenizer: Any, examples: Sequence[Example], *, tau: float = 1.0,
                      batch_size: int = 16) -> list[torch.Tensor]:
    """Per example, (len - 1, V) log-probabilities of the next token at every position."""
    return position_outputs(model, tokenizer, examples, tau=tau, batch_size=batch_size)[0]


@torch.no_grad()
def position_outputs(
    model: nn.Module, tokenizer: Any, examples: Sequence[Example], *, tau: float = 1.0, batch_size: int = 16,
    states: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per example, next-token log-probabilities (len - 1, V) and, with `states`, the residual
    states of every layer after the embeddings (layers, len, hidden).

    An example longer than the model's positions (a counterfactual copy can outgrow its
    original: a longer fresh name) is cut to them, so its outputs are shorter."""
    limit = max_positions(model)
    if limit is not None:
        examples = [e.truncated(limit) if len(e) > limit else e for e in examples]
    was_training = model.training
    model.eval()
    pad = pad_id_of(tokenizer)
    device = next(model.parameters()).device
    logprob_out: list[torch.Tensor | None] = [None] * len(examples)
    state_out: list[torch.Tensor | None] = [None] * len(examples)
    context = attention_temperature(model, tau) if tau != 1.0 else contextlib.nullcontext()
    try:
        with context:
            for rows in by_length(examples, batch_size):
                chunk = [examples[i] for i in rows]
                batch = collate(chunk, pad, list(range(len(chunk)))).to(device)
                out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            output_hidden_states=states)
                logprobs = F.log_softmax(out.logits[:, :-1].float(), dim=-1)
                for b, (i, e) in enumerate(zip(rows, chunk, strict=True)):
                    logprob_out[i] = logprobs[b, : len(e) - 1].cpu()
                if states:
                    stacked = torch.stack([h.float() for h in out.hidden_states[1:]], dim=1)
                    for b, (i, e) in enumerate(zip(rows, chunk, strict=True)):
                        state_out[i] = stacked[b, :, : len(e)].cpu()
    finally:
        model.train(was_training)
    return [t for t in logprob_out if t is not None], [t for t in state_out if t is not None]


def by_length(examples: Sequence[Example], batch_size: int) -> list[list[int]]:
    """The examples' indices in batches of similar lengths (shortest first): a batch is padded
    to its longest example, so mixing a 60-token record with 20-token ones runs the model on
    40 padding positions for each short one.  Callers put the results back in order."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i]), i))
    return [order[start: start + batch_size] for start in range(0, len(order), batch_size)]


def tempering_supported(model: nn.Module) -> bool:
    from unlearning.attention import tempering_supported as supported

    return supported(model)


# ------------------------------------------------------------------ alignment


def _occurrences(text: str, keys: Sequence[str]) -> list[tuple[int, int, str]]:
    if not keys:
        return []
    return [(m.start(), m.end(), m.group()) for m in word_regex(keys, text).finditer(text)]


@dataclass(frozen=True)
class Alignment:
    """For each original token index: the copy's token index, and whether it is a span token."""

    tokens: dict[int, tuple[int, bool]]
    first_span_token: int  # the first original token inside a span (len(ids) when none)
    # For a span token: the copy's tokens whose log-probabilities it carries, and the share
    # of their sum it carries (less than 1 where several of its word's tokens share one).
    pieces: dict[int, tuple[tuple[int, ...], float]] = field(default_factory=dict)
    # The span tokens that begin a word after a span's first (a surname after a first name,
    # an address's part after its first dot): there the copy's context holds the stranger's
    # earlier word, and what the model knows of people with that word (`later_parts`).
    later: frozenset[int] = frozenset()


def align(original: Example, copy: Example, mapping: Mapping[str, str]) -> Alignment | None:
    """Token alignment of a record and its counterfactual copy (None when they do not line up)."""
    from unlearning.identifiers import replace_spans

    occurrences = _occurrences(original.text, list(mapping))
    if replace_spans(original.text, mapping) != copy.text:
        return None
    # Where each occurrence lands in the copy, and the shift of the text after it.
    placed: list[tuple[int, int, int, int]] = []  # (orig start, orig end, copy start, copy end)
    shift = 0
    for start, end, found in occurrences:
        fresh = replace_spans(found, mapping)
        placed.append((start, end, start + shift, start + shift + len(fresh)))
        shift += len(fresh) - (end - start)
    by_span = {(s, e, t): j for j, ((s, e), t) in enumerate(zip(copy.offsets, copy.ids, strict=True)) if e > s}
    tokens: dict[int, tuple[int, bool]] = {}
    pieces: dict[int, tuple[tuple[int, ...], float]] = {}
    span_groups: dict[int, list[int]] = {}
    later: set[int] = set()
    first_span = len(original.ids)
    for i, ((s, e), token) in enumerate(zip(original.offsets, original.ids, strict=True)):
        if e <= s:
            continue
        inside = next((q for q, (os_, oe, _, _) in enumerate(placed) if s < oe and os_ < e), None)
        if inside is not None:
            span_groups.setdefault(inside, []).append(i)
            first_span = min(first_span, i)
            continue
        delta = sum(ce - cs - (oe - os_) for os_, oe, cs, ce in placed if oe <= s)
        j = by_span.get((s + delta, e + delta, token))
        if j is not None:
            tokens[i] = (j, False)
    for q, group in span_groups.items():
        os_, oe, cs, ce = placed[q]
        targets = [j for j, (s, e) in enumerate(copy.offsets) if e > s and s < ce and cs < e]
        if not targets:
            continue
        mine_words, their_words = [group], [targets]  # no cut fits both: spread over the whole span
        for pattern in _WORDS:
            mine_split, their_split = (_by_word(group, original, os_, oe, pattern),
                                       _by_word(targets, copy, cs, ce, pattern))
            if len(mine_split.words) == len(their_split.words):
                mine_words, their_words = _joined_words(mine_split, their_split)
                break
        for word, (mine, theirs) in enumerate(zip(mine_words, their_words, strict=True)):
            if not theirs:
                continue
            if word and mine:
                later.add(mine[0])
            n, m = len(mine), len(theirs)
            first = [theirs[k * m // n] for k in range(n)]
            for k, i in enumerate(mine):
                tokens[i] = (first[k], True)
                if m >= n:  # the word's pieces partitioned, in order, over its tokens
                    pieces[i] = (tuple(theirs[k * m // n: (k + 1) * m // n]), 1.0)
                else:  # several tokens share a piece and its log-probability
                    pieces[i] = ((first[k],), 1.0 / first.count(first[k]))
    # Special tokens (empty offsets) follow their aligned neighbour.
    previous: tuple[int, int] | None = None
    for i, ((s, e), token) in enumerate(zip(original.offsets, original.ids, strict=True)):
        if e > s:
            if i in tokens:
                previous = (i, tokens[i][0])
            continue
        j = (previous[1] + i - previous[0]) if previous else i
        if 0 <= j < len(copy.ids) and copy.ids[j] == token and copy.offsets[j][1] <= copy.offsets[j][0]:
            tokens[i] = (j, False)
            previous = (i, j)
    return Alignment(tokens, first_span, pieces, frozenset(later))


# How a span is cut into words for the alignment, finest first: letters-and-digits runs with
# each other character a word of its own (an e-mail address's "@" and dots, a phone number's
# dashes: the structure two values of one shape share, so the domain after "@" aligns with
# the same domain), then runs of non-space characters (a hyphenated first name against a
# plain one).  The first cut that gives both sides the same number of words is used.
_WORDS = (re.compile(r"[^\W_]+|[^\w\s]|_"), re.compile(r"\S+"))


@dataclass(frozen=True)
class _WordTokens:
    """The tokens of a span by word: per word (a match of a `_WORDS` pattern), the tokens whose
    first character of the span falls in it; and every boundary between word k and k+1 that
    a token runs across (k)."""

    words: list[list[int]]
    crossed: frozenset[int]


def _by_word(indices: Sequence[int], example: Example, lo: int, hi: int,
             pattern: re.Pattern[str]) -> _WordTokens:
    """The tokens `indices` of the span text[lo:hi] by word (`_WordTokens`)."""
    words = [(lo + m.start(), lo + m.end()) for m in pattern.finditer(example.text[lo:hi])]
    grouped: list[list[int]] = [[] for _ in words]
    crossed: set[int] = set()
    for i in indices:
        s, e = example.offsets[i]
        s, e = max(s, lo), min(e, hi)
        touched = [n for n, (ws, we) in enumerate(words) if s < we and ws < e]
        if touched:
            grouped[touched[0]].append(i)
            crossed.update(range(touched[0], touched[-1]))
    return _WordTokens(grouped, frozenset(crossed))


def _joined_words(mine: _WordTokens, theirs: _WordTokens) -> tuple[list[list[int]], list[list[int]]]:
    """Both sides' tokens by word, with the words that a token of either side runs across
    joined into one: a copy whose ".1" is one token where the subject writes "." and "3"
    gives the two words one group on both sides, so the subject's "3" shares the copy's
    ".1" instead of finding no token of its own (it then fell back to the tempered teacher,
    which keeps a memorised digit where it was: measured 2026-12-07, docs/methods.md)."""
    crossed = mine.crossed | theirs.crossed
    mine_words: list[list[int]] = []
    their_words: list[list[int]] = []
    for k, (a, b) in enumerate(zip(mine.words, theirs.words, strict=True)):
        if k and k - 1 in crossed:
            mine_words[-1] += a
            their_words[-1] += b
        else:
            mine_words.append(list(a))
            their_words.append(list(b))
    return mine_words, their_words


# ------------------------------------------------------------------ the teacher


@dataclass(frozen=True)
class TeacherSettings:
    counterfactuals: int = 1
    candidates: int = 9  # stranger identities drawn per subject; the most typical ones teach
    states: bool = False  # also keep the copy's residual states (for a latent loss)
    # ... at the identifying spans' own tokens too: the states inside an e-mail address, where
    # a layer still reads the memorised rest of it (measured 2026-12-07, docs/methods.md)
    span_states: bool = True
    tau: float = 2.0
    topk: int | None = 64
    use_counterfactual: bool = True
    seed: int = 0
    combine: str = "mixture"  # how several copies make one target (`_combine`)
    # Where a later word of a span begins (`Alignment.later`), what the subject's token does not
    # take: "original", the model's own prediction there for the subject's record without the
    # subject's word (`_carry_onto_original`); "copy", the copy's row (the stranger's context).
    later_parts: str = "original"


@dataclass(frozen=True)
class TargetPlan:
    """What the target of one forget example needs that does not depend on the weights: its
    counterfactual copies and their alignments, the positions a copy covers, and whether any
    learnt position is left to the tempered teacher.  Planned once; an online teacher then
    runs only the frozen model at each step (`targets_from_plans`)."""

    copies: tuple[Example, ...]
    alignments: tuple[Alignment, ...]
    first_span: int  # the first original token inside a span (len(ids) when none)
    covered: frozenset[int]  # prediction positions t some copy gives a distribution for
    tempered: bool  # a learnt position no copy covers: the tempered teacher is needed
    # The index layout `targets_from_plans` derives from the plan (`_layout`), kept after its
    # first use: an online teacher rebuilds the targets every step from the same plan.
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class _CopyLayout:
    number: int  # which of the plan's copies
    where: torch.Tensor  # the prediction positions t of the example this copy covers
    rows: torch.Tensor  # the copy's output row for each of them
    # (row k, token i, pieces, a later word's onset) to carry
    spans: tuple[tuple[int, int, tuple[tuple[int, ...], float], bool], ...]
    span_positions: frozenset[int]


@dataclass(frozen=True)
class _Layout:
    copies: tuple[_CopyLayout, ...]
    positions: list[int]
    sources: list[str]
    cf_slots: torch.Tensor
    cf_rows: torch.Tensor
    tempered_slots: torch.Tensor
    tempered_rows: torch.Tensor
    actual: torch.Tensor
    # (t, j, span): the first copy's state j stands for the example's at t, a span token or not
    states: tuple[tuple[int, int, bool], ...]


def plan_targets(
    tokenizer: Any,
    records: Sequence[Record],
    examples: Sequence[Example],
    subjects_of: Sequence[Any | None],
    settings: TeacherSettings,
    *,
    chosen: Mapping[str, Sequence[str]],
    names: FreshNames,
    limit: int | None = None,
) -> list[TargetPlan]:
    """The plan of every forget example (`TargetPlan`); `chosen` (subject -> identity seeds) names
    the strangers, `limit` is the model's number of positions (a longer copy is cut to it)."""
    names = names.with_tokenizer(tokenizer)
    plans = []
    for record, example, subject in zip(records, examples, subjects_of, strict=True):
        n_positions = len(example) - 1
        copies: list[Example] = []
        alignments: list[Alignment] = []
        if settings.use_counterfactual and settings.counterfactuals > 0:
            spans = identity_spans(record, subject, names)
            for identity in (chosen.get(_who(record, subject), ()) if spans else ()):
                cf = counterfactual(record, spans, names=names, seed=identity)
                copied = encode_record(tokenizer, cf.record).truncated(len(example) + 64)
                alignment = align(example, copied, cf.mapping)
                if alignment is not None:
                    copies.append(copied)
                    alignments.append(alignment)
        first_span = min([len(example.ids), *(a.first_span_token for a in alignments)])
        # The model predicts from a copy's positions below its limit only (`position_outputs`).
        covered = frozenset(
            i - 1 for copied, alignment in zip(copies, alignments, strict=True)
            for i, (j, _) in alignment.tokens.items()
            if 1 <= i <= n_positions and 1 <= j < min(len(copied), limit or len(copied))
        )
        tempered = any(example.learnt[t + 1] and not (t in covered and t + 1 >= first_span)
                       for t in range(n_positions))
        plans.append(TargetPlan(tuple(copies), tuple(alignments), first_span, covered, tempered))
    return plans


def forget_targets(
    model: nn.Module,
    tokenizer: Any,
    records: Sequence[Record],
    examples: Sequence[Example],
    subjects_of: Sequence[Any | None],
    settings: TeacherSettings,
    *,
    name_pool: Sequence[str] = (),
    avoid: Sequence[Any] = (),
    identities: dict[str, list[str]] | None = None,
) -> list[RecordTarget]:
    """The target of every forget example (module doc): counterfactual where it applies, else tempered.

    `identities` (subject -> identity seeds) are the strangers to use; by default the most
    typical ones are chosen here (`typical_identities`)."""
    names = FreshNames(pool=list(name_pool), avoid=avoid_set(avoid))
    if identities is not None:
        chosen = identities
    elif settings.use_counterfactual and settings.counterfactuals > 0:
        chosen = typical_identities(model, tokenizer, records, subjects_of, settings, names)
    else:
        chosen = {}
    plans = plan_targets(tokenizer, records, examples, subjects_of, settings, chosen=chosen, names=names,
                         limit=max_positions(model))
    return targets_from_plans(model, tokenizer, examples, plans, settings)


def targets_from_plans(model: nn.Module, tokenizer: Any, examples: Sequence[Example],
                       plans: Sequence[TargetPlan], settings: TeacherSettings) -> list[RecordTarget]:
    """The targets of planned examples: the model runs on every copy, and tempered only on the
    examples whose plan needs it."""
    needs = [k for k, plan in enumerate(plans) if plan.tempered]
    tempered: dict[int, torch.Tensor] = {}
    if needs:  # an online teacher calls this every step: nothing to temper, no tempered pass
        tau = settings.tau if tempering_supported(model) else 1.0
        if tau != settings.tau:
            logger.warning("%s has no attention the engine can temper: no tempered teacher, the "
                           "original prediction stands where no counterfactual applies", type(model).__name__)
        tempered = dict(zip(needs, position_logprobs(model, tokenizer, [examples[k] for k in needs], tau=tau),
                            strict=True))
    all_copies = [copied for plan in plans for copied in plan.copies]
    all_lps, all_states = position_outputs(model, tokenizer, all_copies, states=settings.states)
    own = _own_rows(model, tokenizer, examples, plans) if settings.later_parts == "original" else {}
    out: list[RecordTarget] = []
    offset = 0
    for index, (example, plan) in enumerate(zip(examples, plans, strict=True)):
        n_positions = len(example) - 1
        copy_lps = all_lps[offset: offset + len(plan.copies)]
        copy_states = all_states[offset: offset + len(plan.copies)]
        offset += len(plan.copies)
        layout = _layout(example, plan, tuple(int(lp.shape[0]) for lp in copy_lps))
        per_copy: list[tuple[torch.Tensor, torch.Tensor, frozenset[int]]] = []
        for part in layout.copies:
            copy_lp, copied = copy_lps[part.number], plan.copies[part.number]
            rows = copy_lp[part.rows]
            for k, i, pieces, later in part.spans:
                mine = int(example.ids[i])
                carried = _carried(rows[k], mine, copied, copy_lp, pieces)
                if later and carried is not None and (i - 1) in own.get(index, {}):
                    rows[k] = _carry_onto_original(own[index][i - 1], mine, carried, _spelling(tokenizer, example, i))
                else:
                    rows[k] = _carry_pieces(rows[k], mine, copied, copy_lp, pieces)
            per_copy.append((part.where, rows, part.span_positions))
        mixed, _ = _combine(per_copy, example, n_positions, settings.combine)
        width = (mixed.shape[1] if mixed is not None else
                 tempered[index].shape[1] if len(layout.tempered_rows) else _vocabulary(model))
        values = torch.zeros(len(layout.positions), width)
        if len(layout.cf_rows) and mixed is not None:
            values[layout.cf_slots] = mixed[layout.cf_rows]
        if len(layout.tempered_rows):
            values[layout.tempered_slots] = tempered[index][layout.tempered_rows]
        states, kept = None, []
        if settings.states and copy_states:
            # The state of token t (what predicts t + 1); of a span token too (`span_states`).
            state_rows = {t: copy_states[0][:, j] for t, j, is_span in layout.states
                          if (settings.span_states or not is_span) and j < copy_states[0].shape[1]}
            kept = [t for t in layout.positions if t in state_rows and t + 1 > plan.first_span]
            states = torch.stack([state_rows[t] for t in kept]) if kept else None
        out.append(RecordTarget(list(layout.positions), compress(values, settings.topk, layout.actual[:, None]),
                                list(layout.sources), states, kept))
    return out


def _layout(example: Example, plan: TargetPlan, output_lengths: tuple[int, ...]) -> _Layout:
    """Which rows of which copy's output make the example's target, and where they go: fixed by
    the plan and the copies' output lengths, so computed once per plan."""
    found: _Layout | None = plan.memo.get(output_lengths)
    if found is not None:
        return found
    n_positions = len(example) - 1
    copies: list[_CopyLayout] = []
    covered: set[int] = set()
    for number, (length, alignment) in enumerate(zip(output_lengths, plan.alignments, strict=True)):
        ts: list[int] = []
        js: list[int] = []
        spans: list[tuple[int, int, tuple[tuple[int, ...], float], bool]] = []
        for i, (j, is_span) in alignment.tokens.items():
            t = i - 1  # the position that predicts token i
            if t < 0 or j < 1 or t >= n_positions or j - 1 >= length:
                continue
            if is_span:
                spans.append((len(ts), i, alignment.pieces.get(i, ((j,), 1.0)), i in alignment.later))
            ts.append(t)
            js.append(j - 1)
        if not ts:
            continue
        covered.update(ts)
        copies.append(_CopyLayout(number, torch.tensor(ts), torch.tensor(js), tuple(spans),
                                  frozenset(i - 1 for _, i, _, _ in spans)))
    positions: list[int] = []
    sources: list[str] = []
    cf_slots: list[int] = []
    cf_rows: list[int] = []
    tempered_slots: list[int] = []
    tempered_rows: list[int] = []
    for t in range(n_positions):
        if t in covered and t + 1 >= plan.first_span:
            cf_slots.append(len(positions))
            cf_rows.append(t)
            sources.append("counterfactual")
        elif example.learnt[t + 1]:
            tempered_slots.append(len(positions))
            tempered_rows.append(t)
            sources.append("tempered")
        else:
            continue
        positions.append(t)
    first = plan.alignments[0].tokens.items() if plan.alignments else ()
    layout = _Layout(tuple(copies), positions, sources, _index(cf_slots), _index(cf_rows),
                     _index(tempered_slots), _index(tempered_rows),
                     _index([int(example.ids[t + 1]) for t in positions]),
                     tuple((t, j, is_span) for t, (j, is_span) in first if 0 <= t < n_positions))
    plan.memo[output_lengths] = layout
    return layout


def _index(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def _combine(per_copy: Sequence[tuple[torch.Tensor, torch.Tensor, frozenset[int]]], example: Example, n_positions: int,
             how: str) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One target row per position from the copies' rows: (rows (n_positions, V) with -inf where
    no copy covers a position, how many copies cover each).

    "mixture": where several copies cover a position, their mean probability.  "span-median":
    outside the identifying spans the first copy's row (the most typical stranger's); each
    run of span positions (an e-mail address, a name) takes, whole, the rows of the copy whose
    cost for the subject's tokens there is the median of the copies'.  One stranger that is
    typical over a whole record can be atypical at one address: the span then costs what it
    costs a typical stranger, with that stranger's own spread of token costs inside it (a
    per-position median or a mixture would be smoother than any real stranger's).
    """
    count = torch.zeros(max(n_positions, 0), dtype=torch.long)
    if not per_copy:
        return None, count
    width = per_copy[0][1].shape[1]
    mixed = torch.full((n_positions, width), -math.inf)
    if how == "mixture" or len(per_copy) == 1:
        for number, (where, rows, _) in enumerate(per_copy):
            if number == 0:
                mixed[where] = rows
            else:
                mixed[where] = torch.logaddexp(mixed[where], rows)
            count[where] += 1
        if int(count.max()) > 1:
            mixed = mixed - count.clamp_min(1).double().log().float()[:, None]
        return mixed, count
    if how != "span-median":
        raise ValueError(f"unknown way to combine counterfactual copies: {how!r}")
    lookup = [{int(t): k for k, t in enumerate(where.tolist())} for where, _, _ in per_copy]
    for number in reversed(range(len(per_copy))):  # the first copy's rows win where it covers
        where, rows, _ = per_copy[number]
        mixed[where] = rows
        count[where] = 1
    span_positions = sorted(set().union(*(spans for _, _, spans in per_copy)))
    runs: list[list[int]] = []
    for t in span_positions:
        if runs and t == runs[-1][-1] + 1:
            runs[-1].append(t)
        else:
            runs.append([t])
    for run in runs:
        actual = [int(example.ids[t + 1]) for t in run]
        costs = []
        for number, (_, rows, _) in enumerate(per_copy):
            at = lookup[number]
            if all(t in at for t in run):
                costs.append((float(sum(rows[at[t], a] for t, a in zip(run, actual, strict=True))), number))
        if len(costs) < 2:
            continue
        costs.sort()
        chosen = costs[(len(costs) - 1) // 2][1]
        rows, at = per_copy[chosen][1], lookup[chosen]
        for t in run:
            mixed[t] = rows[at[t]]
    return mixed, count


def _vocabulary(model: nn.Module) -> int:
    found: Any = model  # a transformers model: its output head, else its configuration
    head = found.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(found.config.vocab_size)


def _carry_pieces(row: torch.Tensor, mine: int, copy: Example, copy_lp: torch.Tensor,
                  pieces: tuple[tuple[int, ...], float]) -> torch.Tensor:
    """The copy's prediction at a span token, with the subject's token given the stranger's.

    The subject's token takes the log-probability with which the copy starts the stranger's
    word it stands for (its first piece, in its own context, times the token's share of that
    piece), and that piece takes the subject's; then the row is renormalised.  With one piece
    each this is a swap of the two tokens' probabilities.

    Only the onset: a model that never saw a one-token surname pays once to copy it from the
    question, never for the four more pieces an unseen stranger's surname happens to have.
    Measured on the demo base (10 people, 328 span tokens of their answers) against the
    model retrained without them: carrying the sum of the pieces put the target 4.8 nats
    below the retrained model on average (54 tokens more than 4 nats below), and the erased
    model stopped writing the subject's name ("Yara@inbox." where it wrote "Yara Ramírez's
    email address is ..."), which the fluency check rejected; with the onset the span
    membership AUC is the retrained model's (0.70 against 0.67).
    """
    carried = _carried(row, mine, copy, copy_lp, pieces)
    if carried is None:
        return row
    theirs = int(copy.ids[pieces[0][0]])
    row[theirs] = row[mine].clone()
    row[mine] = carried
    return row - torch.logsumexp(row, dim=0)


def _carried(row: torch.Tensor, mine: int, copy: Example, copy_lp: torch.Tensor,
             pieces: tuple[tuple[int, ...], float]) -> float | None:
    """The log-probability `_carry_pieces` gives the subject's token; None where the copy has
    the same token there (nothing to carry)."""
    indices, share = pieces
    j = indices[0]
    if int(copy.ids[j]) == mine:
        return None
    return share * float(copy_lp[j - 1][int(copy.ids[j])]) if 1 <= j <= copy_lp.shape[0] else float(row[mine])


def _own_rows(model: nn.Module, tokenizer: Any, examples: Sequence[Example],
              plans: Sequence[TargetPlan]) -> dict[int, dict[int, torch.Tensor]]:
    """Per example with a later word's onset in a span (`Alignment.later`): the model's own
    next-token log-probabilities at the positions that predict those onsets, {t: (V,)}.

    Kept in the plan per model (an online teacher asks every step; the frozen model's
    answer does not change)."""
    out: dict[int, dict[int, torch.Tensor]] = {}
    needs: list[int] = []
    for index, plan in enumerate(plans):
        if not any(a.later for a in plan.alignments):
            continue
        found = plan.memo.get("own")
        if found is not None and found[0]() is model:
            out[index] = found[1]
        else:
            needs.append(index)
    if needs:
        for index, lp in zip(needs, position_logprobs(model, tokenizer, [examples[k] for k in needs]), strict=True):
            wanted = {i - 1 for a in plans[index].alignments for i in a.later if 1 <= i <= lp.shape[0]}
            rows = {t: lp[t].clone() for t in sorted(wanted)}
            plans[index].memo["own"] = (weakref.ref(model), rows)
            out[index] = rows
    return out


_WORD_AT = re.compile(r"\s*([^\W_]+)")


def _spelling(tokenizer: Any, example: Example, i: int) -> Callable[[int], bool]:
    """Whether a token spells the start of the subject's word at token i (" Nak" for
    "Nakamura"): written there, it goes on to the subject's word."""
    found = _WORD_AT.match(example.text, example.offsets[i][0])
    word = found.group(1).casefold() if found else ""

    def spells(token: int) -> bool:
        piece = tokenizer.decode([token]).strip().casefold()
        return bool(word and piece) and word.startswith(piece)
    return spells


def _carry_onto_original(own: torch.Tensor, mine: int, carried: float, spells: Callable[[int], bool],
                         *, look: int = 32) -> torch.Tensor:
    """The target at a later word's onset: the subject's token takes the carried probability
    (what the copy gives the stranger's word there, `_carry_pieces`), and the rest of the
    mass follows the model's own prediction for the subject's record without the subject's
    word (nor a token that starts spelling it).

    The copy's own row there reads what the model knows of people who share the stranger's
    earlier word: measured on the demo's service walk (request 2, 2026-12-07), the stranger
    "Tobias Bright" stood for the subject, the model wrote "Tobias Dubois" (a Tobias it
    knows) instead of copying "Bright", and the target at the subject's surname put 0.37-0.72
    on " Dubois": the erased model learnt to write other people's surnames after a first
    name and answered about strangers with "Clara Okafor ...".  Without the subject's word,
    the model's own row there is what a model that never saw them reads after the subject's
    first name: the surnames of the others it knows by that name, and copying."""
    row = own.clone()
    row[mine] = -math.inf
    for token in torch.topk(row, min(look, row.shape[0])).indices.tolist():
        if spells(int(token)):
            row[token] = -math.inf
    value = min(carried, math.log1p(-1e-6))
    row = torch.log_softmax(row, dim=0) + math.log1p(-math.exp(value))
    row[mine] = value
    return row


def _who(record: Record, subject: Any | None) -> str:
    return str(subject.name) if subject is not None else record.id


def _learnt_scores(model: nn.Module, tokenizer: Any, examples: Sequence[Example], *,
                   batch_size: int = 16) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Per example: its learnt prediction positions t (of token t + 1), the calibrated score z
    of the actual token there (Min-K%++'s, Zhang et al. 2024) and its log-probability.
    Only the learnt positions' next-token distributions are computed (`logits_at`), one
    batch at a time."""
    out: list[tuple[list[int], torch.Tensor, torch.Tensor] | None] = [None] * len(examples)
    for positions, rows, members in learnt_logprobs(model, tokenizer, examples, batch_size=batch_size):
        for i, t_list, lp in zip(members, positions, rows, strict=True):
            example = examples[i]
            p = lp.exp()
            mu = (p * lp).sum(-1)
            sigma = ((p * lp * lp).sum(-1) - mu * mu).clamp_min(0).sqrt()
            ids = torch.tensor([[int(example.ids[t + 1])] for t in t_list], dtype=torch.long).reshape(-1, 1)
            actual = lp.gather(-1, ids).squeeze(-1)
            out[i] = (t_list, (actual - mu) / sigma.clamp_min(1e-6), actual)
    return [scored for scored in out if scored is not None]


def learnt_logprobs(model: nn.Module, tokenizer: Any, examples: Sequence[Example], *, batch_size: int = 16,
                    ) -> Iterator[tuple[list[list[int]], list[torch.Tensor], list[int]]]:
    """Per batch of similar lengths (`by_length`), as it is computed (one batch's
    distributions held at a time): each member's learnt prediction positions t (those whose
    next token t + 1 training taught, within the model's positions), the next-token
    log-probabilities there (positions, V), and the members' indices."""
    limit = max_positions(model)
    was_training = model.training
    model.eval()
    pad = pad_id_of(tokenizer)
    device = next(model.parameters()).device
    try:
        for members in by_length(examples, batch_size):
            chunk = [examples[i].truncated(limit) if limit is not None and len(examples[i]) > limit else examples[i]
                     for i in members]
            batch = collate(chunk, pad, list(range(len(chunk)))).to(device)
            positions = [[t for t in range(len(e) - 1) if e.learnt[t + 1]] for e in chunk]
            keep = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
            for b, t_list in enumerate(positions):
                keep[b, t_list] = True
            with torch.no_grad():
                logprobs = F.log_softmax(logits_at(model, batch.input_ids, batch.attention_mask,
                                                   keep.to(device)).float(), dim=-1).cpu()
            yield positions, list(torch.split(logprobs, [len(t) for t in positions])), members
    finally:
        model.train(was_training)


def _familiarity(model: nn.Module, tokenizer: Any, examples: Sequence[Example],
                 span_texts: Sequence[Sequence[str]] = (), *,
                 scores: Sequence[tuple[list[int], torch.Tensor, torch.Tensor]] | None = None,
                 ) -> tuple[float, float, float]:
    """How familiar the model finds records, by each statistic the membership attacks use
    (`unlearning.verification.membership`), averaged over the records: the Min-K%++ score
    (lowest 20 % of calibrated token scores, Zhang et al. 2024) of the learnt tokens, the
    same over the tokens of the identifying spans (`span_texts`, per record; the whole-record
    score where a record has none), and the zlib ratio (log-likelihood per compressed byte).
    `scores`: the examples' `_learnt_scores` when the caller has them."""
    whole, spans, ratios = [], [], []
    if scores is None:
        scores = _learnt_scores(model, tokenizer, examples)
    for number, (example, (positions, z_all, actual)) in enumerate(zip(examples, scores, strict=True)):
        if not positions:
            continue
        marked = set()
        folded = example.text.casefold()
        for text in (span_texts[number] if number < len(span_texts) else ()):
            key, start = text.casefold(), 0
            while key and (found := folded.find(key, start)) >= 0:
                marked.update(example.tokens_in(found, found + len(key)))
                start = found + len(key)
        z = z_all.tolist()
        z_span = [value for t, value in zip(positions, z, strict=True) if t + 1 in marked]
        whole.append(_min_k(z))
        spans.append(_min_k(z_span) if z_span else whole[-1])
        ratios.append(float(actual.double().sum()) / max(1, len(zlib.compress(example.text.encode("utf-8")))))

    def mean(values: list[float]) -> float:
        return sum(values) / max(1, len(values))

    return mean(whole), mean(spans), mean(ratios)


def _min_k(z: list[float], k: float = 0.2) -> float:
    low = sorted(z)[: max(1, math.ceil(k * len(z)))]
    return sum(low) / len(low)


def typical_identities(
    model: nn.Module, tokenizer: Any, records: Sequence[Record], subjects_of: Sequence[Any | None],
    settings: TeacherSettings, names: FreshNames, *, per_subject: int = 12,
) -> dict[str, list[str]]:
    """Per subject, the identity seeds of its `counterfactuals` most typical strangers.

    Strangers differ: a fresh name made of parts the model knows from other
    people is easier for it than one made of rare parts.  One random stranger
    would make the subject exactly as familiar as that stranger, wherever it
    falls in their distribution; so `candidates` strangers are drawn and the
    model's familiarity with each is measured on the subject's records about
    them, by every statistic a membership attack uses (`_familiarity`: Min-K%++
    over the whole records and over the identifying spans, the zlib ratio).  The
    strangers closest to the median teach, closeness being the sum over the
    statistics of the distance of the candidate's rank from the middle rank: a
    stranger typical by one statistic can sit at the edge by another (measured
    on a chat corpus, docs/methods.md), and the attacker may use either.  The
    subject becomes a typical stranger, no more and no less familiar.
    """
    names = names.with_tokenizer(tokenizer)
    groups: dict[str, list[tuple[Record, Any | None]]] = {}
    for record, subject in zip(records, subjects_of, strict=True):
        groups.setdefault(_who(record, subject), []).append((record, subject))
    out: dict[str, list[str]] = {}
    for who, members in groups.items():
        sample = members[:per_subject]
        seeds = [f"teacher:{settings.seed}:{who}:{k}" for k in range(max(settings.candidates, settings.counterfactuals))]
        if len(seeds) <= settings.counterfactuals:
            out[who] = seeds
            continue
        spans = [identity_spans(r, subj, names) for r, subj in sample]
        copies = [[counterfactual(r, found, names=names, seed=seed) for (r, _), found in zip(sample, spans, strict=True)]
                  for seed in seeds]
        examples = [[encode_record(tokenizer, c.record) for c in group] for group in copies]
        # Every candidate's copies in one run of the model: full batches, not one per candidate.
        flat = _learnt_scores(model, tokenizer, [e for group in examples for e in group])
        scores, offset = [], 0
        for group, encoded in zip(copies, examples, strict=True):
            scores.append(_familiarity(model, tokenizer, encoded, [list(c.mapping.values()) for c in group],
                                       scores=flat[offset: offset + len(encoded)]))
            offset += len(encoded)
        out[who] = [seeds[k] for k in most_typical(scores, settings.counterfactuals)]
    return out


def most_typical(scores: Sequence[Sequence[float]], count: int) -> list[int]:
    """Indices of the `count` candidates nearest the middle by every statistic at once:
    ranked by the sum, over the statistics (the columns of `scores`), of the distance of
    the candidate's rank from the middle rank (ties: the lower index)."""
    n = len(scores)
    if n == 0:
        return []
    middle = (n - 1) / 2
    distance = [0.0] * n
    for statistic in range(len(scores[0])):
        order = sorted(range(n), key=lambda k: (scores[k][statistic], k))
        for rank, k in enumerate(order):
            distance[k] += abs(rank - middle)
    return sorted(range(n), key=lambda k: (distance[k], k))[:count]


def original_targets(
    model: nn.Module, tokenizer: Any, examples: Sequence[Example], *, topk: int | None, states: bool = False,
) -> list[RecordTarget]:
    """What the model predicts now at every learnt position (the retain anchor); with `states`,
    also its residual states there (a latent anchor)."""
    logprobs, all_states = position_outputs(model, tokenizer, examples, states=states)
    out = []
    for number, (example, lp) in enumerate(zip(examples, logprobs, strict=True)):
        positions = [t for t in range(len(example) - 1) if example.learnt[t + 1]]
        actual = torch.tensor([int(example.ids[t + 1]) for t in positions], dtype=torch.long)
        kept = all_states[number][:, positions].transpose(0, 1) if states and positions else None
        out.append(RecordTarget(positions, compress(lp[positions], topk, actual[:, None]),
                                ["original"] * len(positions), kept, list(positions) if kept is not None else []))
    return out


def position_masks(examples: Sequence[Example], targets: Sequence[RecordTarget]) -> list[list[bool]]:
    masks = []
    for example, target in zip(examples, targets, strict=True):
        mask = [False] * max(0, len(example) - 1)
        for t in target.positions:
            mask[t] = True
        masks.append(mask)
    return masks


def batch_target(batch: Batch, targets: Sequence[RecordTarget]) -> Dist:
    """The targets of a batch's rows, in the row-major order of its loss mask."""
    device = batch.input_ids.device
    return concat([targets[row].dist for row in batch.rows]).to(device)


def batch_states(batch: Batch, targets: Sequence[RecordTarget]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(rows, positions, teacher states (n, layers, hidden)) of a batch, or None when it has none."""
    rows, cols, states = [], [], []
    for b, row in enumerate(batch.rows):
        target = targets[row]
        if target.states is None:
            continue
        rows += [b] * len(target.state_positions)
        cols += list(target.state_positions)
        states.append(target.states)
    if not states:
        return None
    device = batch.input_ids.device
    return torch.tensor(rows, device=device), torch.tensor(cols, device=device), torch.cat(states).to(device)


def latent_loss(hidden_states: Sequence[torch.Tensor], cached: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                lens: Lens | None = None,
                readings: dict[int, Dist | LensColumns] | None = None) -> torch.Tensor:
    """How far the student's residual states at the subject's positions are from the stranger's.

    Without a lens: the mean relative squared distance of the states, every layer.  With one:
    the forward KL, at every intermediate layer the lens reads, from the next-token
    distribution the lens reads off the stranger's state to the one it reads off the
    student's (`Lens`).  `readings` are `lens_readings(cached, lens)`, for a caller that
    asks about the same cached states at many steps (they never change).
    """
    rows, cols, teacher = cached
    if lens is None:
        student = torch.stack([h[rows, cols].float() for h in hidden_states[1:]], dim=1)
        error = (student - teacher).square().sum(-1) / teacher.square().sum(-1).clamp_min(1e-6)
        return error.mean()
    readings = readings if readings is not None else lens_readings(cached, lens)
    losses = []
    for layer, translator in lens.layers.items():
        reading, states = readings[layer], hidden_states[layer][rows, cols].float()
        if isinstance(reading, LensColumns):
            logits = lens.read_columns(states, translator, reading.columns)
            mine = logits - logits.logsumexp(-1, keepdim=True)
            losses.append((reading.plogp - (reading.p * mine).sum(-1)).mean())
        else:
            losses.append(_kl_rows(reading, lens.read(states, translator))[0].mean())
    return torch.stack(losses).mean() if losses else teacher.new_zeros(())


LENS_TOPK = 64  # a lens reading's columns kept where the vocabulary is larger (`lens_readings`)


@dataclass(frozen=True)
class LensColumns:
    """A lens reading restricted to some tokens per position: their ids (N, c), and the
    reading's probabilities renormalised over them, with sum p log p (the KL's fixed part)."""

    columns: torch.Tensor
    p: torch.Tensor
    plogp: torch.Tensor


@torch.no_grad()
def lens_readings(cached: tuple[torch.Tensor, torch.Tensor, torch.Tensor], lens: Lens, *,
                  topk: int = 0, next_ids: torch.Tensor | None = None) -> dict[int, Dist | LensColumns]:
    """Per layer the lens reads, the next-token distribution it reads off the cached
    (stranger's) states: the latent loss's fixed side (its KL weights computed here, once).

    With `topk` (and an output head the lens can read column by column, `Lens.read_columns`),
    each position keeps the reading's `topk` most likely tokens and the token that actually
    follows there (`next_ids`, the subject's: the one whose reading the loss must bring to
    the stranger's), and the loss compares the two readings over those tokens alone.  The
    student's reading then costs `topk + 1` columns of the head per position instead of
    the whole vocabulary: on a model of 32,000 tokens the whole-vocabulary lens took a sixth
    of an ASU step (docs/methods.md, "The lens over a few columns")."""
    teacher = cached[2]
    out: dict[int, Dist | LensColumns] = {}
    for layer, translator in lens.layers.items():
        logp = F.log_softmax(lens.read(teacher[:, layer - 1].float(), translator), dim=-1)
        if not topk or topk + 1 >= logp.shape[-1] or not lens.reads_columns:
            whole = Dist(logp)
            whole.weights()
            out[layer] = whole
            continue
        columns = logp.topk(topk + 1, dim=-1).indices
        if next_ids is not None:
            follows = next_ids.to(columns.device)
            present = (columns[:, :topk] == follows[:, None]).any(-1)
            columns[:, topk] = torch.where(present, columns[:, topk], follows)
        kept = logp.gather(-1, columns)
        kept = kept - kept.logsumexp(-1, keepdim=True)
        p = kept.exp()
        out[layer] = LensColumns(columns, p, (p * kept).sum(-1))
    return out


@dataclass
class Lens:
    """A tuned lens of the model before the erasure (Belrose et al. 2023): per intermediate layer,
    an affine map, fitted by ridge regression on everyone else's text, from the layer's residual
    state to what the output head reads; the head then gives a next-token distribution.

    The latent loss compares what the lens reads off the student's state with what it reads
    off the stranger's, not the states themselves: a state also carries which name was read
    (a stranger's differs from the subject's in a model that never saw either), and matching
    it whole pulls towards one particular stranger instead of removing what the state says
    about the subject's values.  At most `MAX_LENS_LAYERS` layers, evenly spread, are read.
    """

    layers: dict[int, torch.Tensor]  # hidden_states index -> (hidden + 1, hidden) translator
    head: nn.Module  # a frozen copy of the model's output head

    @staticmethod
    def _translated(states: torch.Tensor, translator: torch.Tensor) -> torch.Tensor:
        """The states mapped to what the head reads: ``[h, 1] @ translator``."""
        return torch.cat([states, states.new_ones(len(states), 1)], dim=1) @ translator.to(states.device)

    def read(self, states: torch.Tensor, translator: torch.Tensor) -> torch.Tensor:
        weight = next(self.head.parameters())
        logits: torch.Tensor = self.head(self._translated(states, translator).to(dtype=weight.dtype))
        return logits.float()

    @property
    def reads_columns(self) -> bool:
        """Whether the head is a linear map (with the model's elementwise readout after it), so
        that some of its columns can be read without the rest (`read_columns`)."""
        return isinstance(getattr(self.head, "head", self.head), nn.Linear)

    def read_columns(self, states: torch.Tensor, translator: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """`read(states, translator)` at `columns` (N, c) only: one product with the head's rows
        that any position asks for, then each position's own."""
        linear = getattr(self.head, "head", self.head)
        readout = getattr(self.head, "readout", None)
        assert isinstance(linear, nn.Linear)
        asked, where = torch.unique(columns, return_inverse=True)
        logits = self._translated(states, translator).to(dtype=linear.weight.dtype) @ linear.weight[asked].T
        if linear.bias is not None:
            logits = logits + linear.bias[asked]
        picked = logits.gather(-1, where)
        return (readout(picked) if readout is not None else picked).float()


MAX_LENS_LAYERS = 4
LENS_RECORDS = 256  # the lens is fitted on at most this many retained records (one forward each)


def fit_lens(model: nn.Module, tokenizer: Any, examples: Sequence[Example], *, max_positions: int = 3000) -> Lens | None:
    """The tuned lens of `model` on `examples` (everyone else's records); None without an
    intermediate layer or a learnt position."""
    from unlearning.verification.generation import readout_head, states_and_head_inputs
    from unlearning.verification.latent import fit_translators

    states, head_inputs = states_and_head_inputs(model, tokenizer, list(examples)[:LENS_RECORDS],
                                                 max_positions=max_positions)
    if states.size == 0 or states.shape[0] < 3:
        return None
    intermediate = list(range(1, states.shape[0] - 1))  # neither the embeddings nor the head's input
    step = max(1, math.ceil(len(intermediate) / MAX_LENS_LAYERS))
    chosen = intermediate[::step][:MAX_LENS_LAYERS]
    translators = fit_translators(states[chosen], head_inputs)
    # A frozen copy of the head: the lens is a fixed reading of the states, the same for the
    # stranger's and the student's, whatever the training does to the model's own head.
    # It reads through the model's own readout (a soft-cap, a logit scale), as the model does.
    frozen: nn.Module = copy.deepcopy(model.get_output_embeddings()).eval()  # type: ignore[operator]
    for p in frozen.parameters():
        p.requires_grad_(False)
    head = readout_head(model, tokenizer, examples, head=frozen)
    return Lens({layer: torch.from_numpy(t) for layer, t in zip(chosen, translators, strict=True)}, head)


def stranger_answers(
    model: nn.Module, tokenizer: Any, records: Sequence[Record], subjects_of: Sequence[Any | None],
    identities: dict[str, list[str]], names: FreshNames, *, max_new_tokens: int = 48,
) -> list[tuple[Record, Any]]:
    """What the model answers about a stranger, told about the subject: extra forget records.

    For each question/answer record: its question about the subject's stranger (the
    first teaching identity), the model's greedy answer to it, and that answer with the
    stranger's identifiers put back to the subject's.  Trained like any forget record
    (towards the stranger's distribution), they teach the student what to *say* about
    the subject, not only how to score the subject's own records: the paths its own
    generation takes are covered (teacher forcing alone leaves them to chance).
    """
    names = names.with_tokenizer(tokenizer)
    from unlearning.modeling import generate_answers
    from unlearning.verification.fluency import is_degenerate

    jobs: list[tuple[Record, Any, dict[str, str], str]] = []
    for record, subject in zip(records, subjects_of, strict=True):
        seeds = identities.get(_who(record, subject))
        if not record.is_qa or record.question is None or not seeds:
            continue
        cf = counterfactual(record, identity_spans(record, subject, names), names=names, seed=seeds[0])
        if cf.mapping and cf.record.question:
            jobs.append((record, subject, dict(cf.mapping), cf.record.question))
    if not jobs:
        return []
    was_padding = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        answers = generate_answers(model, tokenizer, [q for *_, q in jobs], max_new_tokens=max_new_tokens)
    finally:
        tokenizer.padding_side = was_padding
    out: list[tuple[Record, Any]] = []
    for (record, subject, mapping, _), answer in zip(jobs, answers, strict=True):
        back = {fresh: mine for mine, fresh in mapping.items()}
        told = replace_spans(answer, back).strip()
        # An answer that names somebody else is kept: a model that cannot copy the stranger's
        # surname goes on with one it knows ("<first> <known surname> was born in ..."), and
        # so would a model that never saw the subject.  Leaving those out left the student no
        # fluent path after the subject's first name (measured on the demo model, docs/methods.md).
        # Babble is left out: it would teach babble.
        if is_degenerate(told) or len(told.split()) < 2 or told == record.answer:
            continue
        out.append((Record(id=f"{record.id}~told", question=record.question, answer=told), subject))
    return out


def retain_strangers(records: Sequence[Record], names: FreshNames) -> list[Record]:
    """Retained records retold about strangers: each record that names somebody
    (`identifiers.names_in`) or shows an identifier pattern (an e-mail address, a phone
    number), copied with those spans replaced by a fresh identity (one per record).

    Anchored at the model's own prediction for them, they keep what the model predicts for
    *a stranger* where it was: the forget loss lowers the subject's facts after the
    subject's name, and a model generalises that to every name, so a teacher that follows
    the student (`teacher_refresh`) would follow it down below what a model that never saw
    the subject predicts for a stranger (measured on the demo, docs/methods.md)."""
    out: list[Record] = []
    for record in records:
        found = names_in(record)
        subject = Subject(found[0], tuple(found[1:])) if found else None
        spans = identity_spans(record, subject, names)
        if not spans:
            continue
        cf = counterfactual(record, spans, names=names, seed=f"retain:{record.id}")
        if cf.mapping:
            out.append(dataclasses.replace(cf.record, id=f"{record.id}~stranger"))
    return out


def span_targets(plan: TargetPlan) -> frozenset[int]:
    """The prediction positions of `plan`'s example whose next token is inside an identifying
    span (the first copy's alignment says which)."""
    if not plan.alignments:
        return frozenset()
    return frozenset(i - 1 for i, (_, is_span) in plan.alignments[0].tokens.items() if is_span and i >= 1)


def keep_rows(new: RecordTarget, old: RecordTarget, positions: frozenset[int]) -> RecordTarget:
    """`new` with the rows of `positions` taken from `old` (the same example's earlier target)."""
    rows = [k for k, t in enumerate(new.positions) if t in positions]
    if not rows or new.positions != old.positions:
        return new
    index = torch.tensor(rows)

    def merged(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
        if a is None or b is None:
            return a
        out = a.clone()
        out[index] = b[index]
        return out

    dist = Dist(merged(new.dist.values, old.dist.values), merged(new.dist.indices, old.dist.indices),  # type: ignore[arg-type]
                merged(new.dist.tail, old.dist.tail), merged(new.dist.actual, old.dist.actual))
    return dataclasses.replace(new, dist=dist)
