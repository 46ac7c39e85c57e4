"""ASU and its teacher: tempering is exact, counterfactual targets move only the subject's
knowledge, the cache changes nothing, and on a trained model it forgets one person and keeps
the others."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from unlearning.corpus import load_corpus
from unlearning.erase import method_input, resolve_hparams
from unlearning.identifiers import FreshNames, avoid_set
from unlearning.methods.asu import ASU, ASUHparams, preset_values
from unlearning.methods.base import (
    Batch,
    MethodInput,
    collate,
    encode_all,
    masked_nll,
    sequence_mean,
    token_nll,
)
from unlearning.methods.targets import (
    TeacherSettings,
    _who,
    compress,
    forget_targets,
    kl_to_target,
    log_odds,
    most_typical,
    plan_targets,
    position_logprobs,
    position_outputs,
    targets_from_plans,
)
from unlearning.modeling import generate_answers, load_model
from unlearning.prompting import pad_id_of
from unlearning.sets import Subject, build_sets


def _people(corpus_dir) -> list[dict]:
    return [json.loads(line) for line in (corpus_dir / "people.jsonl").read_text().splitlines()]


def _subject(corpus_dir, index: int) -> Subject:
    person = _people(corpus_dir)[index]
    return Subject(person["name"], tuple(person["aliases"]))


def _forget_data(corpus_dir, index: int) -> MethodInput:
    """The method input of erasing the demo person at `index`."""
    return method_input(build_sets(load_corpus(corpus_dir / "corpus.jsonl"), [_subject(corpus_dir, index)]))


def _records(corpus_dir, person: str):
    return [r for r in load_corpus(corpus_dir / "corpus.jsonl").records if r.meta.get("person") == person]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_the_teacher_at_tau_one_is_exactly_the_plain_model_and_differs_at_tau_four(
    tiny_corpus_dir, tiny_arch_model_dir, impl,
):
    model, tokenizer = load_model(tiny_arch_model_dir("llama"), device="cpu", attn_implementation=impl)
    examples = encode_all(tokenizer, _records(tiny_corpus_dir, "p0000")[:4])
    batch = collate(examples, pad_id_of(tokenizer), list(range(len(examples))))
    with torch.no_grad():
        plain = F.log_softmax(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
                              .logits[:, :-1].float(), dim=-1)
    at_one = position_logprobs(model, tokenizer, examples, tau=1.0)
    at_four = position_logprobs(model, tokenizer, examples, tau=4.0)
    for b, example in enumerate(examples):
        n = len(example) - 1
        assert torch.allclose(at_one[b], plain[b, :n], atol=1e-5)
        assert (at_four[b] - plain[b, :n]).abs().max().item() > 1e-3


def test_the_compressed_target_keeps_the_actual_token_and_sums_to_one():
    torch.manual_seed(0)
    logprobs = F.log_softmax(torch.randn(5, 5000), dim=-1)
    actual = logprobs.argmin(-1)  # the least likely token: never in a top-k
    dist = compress(logprobs, 8, actual[:, None])
    assert dist.indices is not None and dist.tail is not None
    assert all(int(a) in dist.indices[i].tolist() for i, a in enumerate(actual))
    kept = torch.logsumexp(dist.values, -1).exp() + dist.tail.exp()
    assert torch.allclose(kept, torch.ones(5), atol=1e-5)
    # The KL to the target of the distribution itself is zero; to another one it is not.
    mask = torch.ones(1, 5, dtype=torch.bool)
    assert kl_to_target(dist, logprobs[None], mask).item() == pytest.approx(0.0, abs=1e-4)
    elsewhere = logprobs.clone().scatter_(-1, dist.indices, -30.0)  # no mass where the target has its top
    assert kl_to_target(dist, elsewhere[None], mask).item() > 0.1



def _textbook_kl(dist, logits, mask, next_ids=None, token_weight=0.0, gap="logprob"):
    """KL(target || student) straight from the definition: the student's full log-softmax,
    the target's top-k plus one tail bucket where it is compressed."""
    student = F.log_softmax(logits[mask], dim=-1)
    per = []
    for i in range(len(student)):
        if dist.indices is None:
            teacher, mine = dist.values[i], student[i]
        else:
            picked = student[i, dist.indices[i]]
            rest = torch.log1p(-torch.logsumexp(picked, -1).exp().clamp(max=1 - 1e-6))
            teacher = torch.cat([dist.values[i], dist.tail[i:i + 1]])
            mine = torch.cat([picked, rest[None]])
        p = teacher.exp()
        term = torch.where(p > 0, p * (teacher - mine), torch.zeros_like(p)).sum()
        if token_weight:
            mine, theirs = student[i, next_ids[mask][i]], dist.actual[i]
            if gap == "logodds":
                mine, theirs = log_odds(mine), log_odds(theirs)
            term = term + token_weight * (mine - theirs).square()
        per.append(term)
    full = torch.zeros(mask.shape)
    full[mask] = torch.stack(per)
    return (full.sum(-1) / mask.sum(-1).clamp_min(1)).sum() / (mask.sum(-1) > 0).sum()


@pytest.mark.parametrize("vocab,topk", [(5000, 16), (300, None)])
def test_the_kl_is_the_textbook_kl_in_value_and_gradient(vocab, topk):
    # The loss (`kl_to_target`) is computed its own way (one fused log-softmax at the masked
    # positions); it must still be the definition, with unnormalised logits, a target with
    # tokens of probability zero, padding rows without a position, and the actual-token term.
    torch.manual_seed(3)
    mask = torch.rand(3, 7) < 0.6
    mask[2] = False
    n = int(mask.sum())
    teacher = F.log_softmax(torch.randn(n, vocab) * 2, dim=-1)
    teacher[:, :5] = float("-inf")  # a target that rules tokens out
    next_ids = torch.randint(5, vocab, (3, 7))
    dist = compress(teacher, topk, next_ids[mask][:, None])
    logits = (torch.randn(3, 7, vocab) * 3 + 7).requires_grad_(True)
    reference = logits.detach().clone().requires_grad_(True)
    for weight, gap in ((0.0, "logprob"), (1.5, "logprob"), (1.5, "logodds")):
        fast = kl_to_target(dist, logits, mask, next_ids=next_ids, token_weight=weight, token_gap=gap)
        slow = _textbook_kl(dist, reference, mask, next_ids=next_ids, token_weight=weight, gap=gap)
        assert fast.item() == pytest.approx(slow.item(), rel=1e-5)
        grad, = torch.autograd.grad(fast, logits)
        expected, = torch.autograd.grad(slow, reference)
        assert torch.allclose(grad, expected, atol=1e-6, rtol=1e-4)
        assert float(grad.abs().sum()) > 0


def test_the_log_probabilities_at_chosen_tokens_have_the_gradient_of_a_log_softmax():
    # `_LogProbsAt` writes its own backward pass: torch's numerical check of it, a column
    # chosen twice in a row included.
    from unlearning.methods.targets import _LogProbsAt

    torch.manual_seed(5)
    rows = (torch.randn(4, 9, dtype=torch.float64) * 3).requires_grad_(True)
    columns = torch.randint(0, 9, (4, 3))
    columns[0, 1] = columns[0, 0]
    assert torch.autograd.gradcheck(lambda r: _LogProbsAt.apply(r, columns), (rows,))
    assert torch.allclose(_LogProbsAt.apply(rows, columns), F.log_softmax(rows, dim=-1).gather(-1, columns))


def test_batches_by_length_give_each_example_what_it_gets_alone(tiny_corpus_dir, tiny_base_model_dir):
    # `position_outputs` runs the examples in batches of similar lengths: every example must
    # still get its own rows, in the caller's order, as if it ran alone.
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    examples = encode_all(tokenizer, list(load_corpus(tiny_corpus_dir / "corpus.jsonl").records)[:9])
    lengths = [len(e) for e in examples]
    assert lengths != sorted(lengths)  # the order is not already by length
    batched, states = position_outputs(model, tokenizer, examples, batch_size=4, states=True)
    for example, rows, state in zip(examples, batched, states, strict=True):
        alone, alone_states = position_outputs(model, tokenizer, [example], batch_size=1, states=True)
        assert rows.shape == alone[0].shape == (len(example) - 1, rows.shape[1])
        assert torch.allclose(rows, alone[0], atol=1e-4)
        assert torch.allclose(state, alone_states[0], atol=1e-4)


class _Wrapped(torch.nn.Module):
    """A causal LM whose forward reads `logits_to_keep` in its own way (`how`): not at all
    (no such argument), ignoring it (whole logits), or keeping the wrong rows."""

    def __init__(self, inner: torch.nn.Module, how: str) -> None:
        super().__init__()
        self.inner, self.how = inner, how
        self.config = inner.config

    def get_output_embeddings(self):  # noqa: ANN201
        return self.inner.get_output_embeddings()

    def forward(self, input_ids, attention_mask, **kwargs):  # noqa: ANN001, ANN003, ANN201
        keep = kwargs.pop("logits_to_keep", None)
        if self.how == "refuses" and keep is not None:
            raise TypeError("forward() got an unexpected keyword argument 'logits_to_keep'")
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask)
        if self.how == "shifted" and keep is not None:  # the right shape, the wrong positions
            out.logits = out.logits[keep.roll(1, dims=1)]
        return out


@pytest.mark.parametrize("how", ["native", "refuses", "ignores", "shifted"])
def test_scores_at_learnt_positions_only_equal_those_read_off_every_position(tiny_corpus_dir, tiny_base_model_dir,
                                                                             how):
    # `_learnt_scores` asks the model for logits at the learnt positions only (`logits_at`);
    # a model that cannot give them, or gives others, is found out on its first call and read
    # whole: the scores are those read off the full log-softmax at every position.
    from unlearning.logits import _LOGITS_AT
    from unlearning.methods.targets import _learnt_scores, position_logprobs

    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    examples = encode_all(tokenizer, list(load_corpus(tiny_corpus_dir / "corpus.jsonl").records)[:9])
    reader = model if how == "native" else _Wrapped(model, how)
    for _ in range(2):  # the first call checks the model, the second trusts what it found
        scores = _learnt_scores(reader, tokenizer, examples, batch_size=4)
        for example, lp, (positions, z, actual) in zip(examples, position_logprobs(model, tokenizer, examples),
                                                      scores, strict=True):
            assert positions == [t for t in range(len(example) - 1) if example.learnt[t + 1]]
            rows = lp[positions]
            p = rows.exp()
            mu = (p * rows).sum(-1)
            sigma = ((p * rows * rows).sum(-1) - mu * mu).clamp_min(0).sqrt()
            expected = rows.gather(-1, torch.tensor([[example.ids[t + 1]] for t in positions])).squeeze(-1)
            assert torch.allclose(actual, expected, atol=1e-4)
            assert torch.allclose(z, (expected - mu) / sigma.clamp_min(1e-6), atol=1e-3)
    assert getattr(reader, _LOGITS_AT) is (how == "native")


@pytest.mark.parametrize("how", ["native", "ignores"])
def test_continuation_scores_equal_those_read_off_every_position(tiny_corpus_dir, tiny_base_model_dir, how):
    # Verification scores a continuation from the logits at its own positions only: the same
    # token scores (Min-K%++'s log p, mu and sigma) as the full log-softmax at every position.
    import numpy as np

    from unlearning.verification.generation import score_continuations

    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    reader = model if how == "native" else _Wrapped(model, how)
    examples = encode_all(tokenizer, list(load_corpus(tiny_corpus_dir / "corpus.jsonl").records)[:7])
    pairs = [(list(e.ids[: 3 + k]), list(e.ids[3 + k:])) for k, e in enumerate(examples)]
    pairs.append((list(examples[0].ids), []))  # nothing to score
    for scores in (score_continuations(reader, tokenizer, pairs, batch_size=3) for _ in range(2)):
        for (prefix, continuation), score in zip(pairs, scores, strict=True):
            ids = torch.tensor([prefix + continuation])
            with torch.no_grad():
                lp = F.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)[len(prefix) - 1:]
            p = lp.exp()
            mu = (p * lp).sum(-1)
            sigma = ((p * lp.square()).sum(-1) - mu.square()).clamp_min(0).sqrt()
            expected = lp.gather(-1, torch.tensor(continuation).reshape(-1, 1)).squeeze(-1)
            assert score.logp.shape == (len(continuation),)
            assert np.allclose(score.logp, expected.numpy(), atol=1e-4)
            assert np.allclose(score.mu, mu.numpy(), atol=1e-4)
            assert np.allclose(score.sigma, sigma.numpy(), atol=1e-4)


def test_the_retained_records_nll_at_their_positions_is_the_full_nll_masked():
    # ASU's fine-tuning term on retained records takes the log-softmax at their own positions
    # only (`masked_nll`); value and gradient must be those of the whole-sequence NLL masked.
    torch.manual_seed(5)
    ids = torch.randint(0, 50, (4, 9))
    mask = torch.rand(4, 8) < 0.4
    mask[1] = False  # a row with nothing to learn (a stranger copy) counts for nothing
    batch = Batch(ids, torch.ones_like(ids), mask)
    logits = torch.randn(4, 8, 50, requires_grad=True)
    reference = logits.detach().clone().requires_grad_(True)
    fast = masked_nll(logits, batch, mask)
    slow = sequence_mean(token_nll(reference, batch), mask)
    assert fast.item() == pytest.approx(slow.item(), rel=1e-6)
    grad, = torch.autograd.grad(fast, logits)
    expected, = torch.autograd.grad(slow, reference)
    assert torch.allclose(grad, expected, atol=1e-7)
    assert float(grad[~mask].abs().sum()) == 0.0 and float(grad[mask].abs().sum()) > 0


def _three_positions(vocab: int, *, seed: int) -> tuple[torch.Tensor, partial[torch.Tensor]]:
    """Three positions whose actual tokens are 0, 1 and 2, and a function of p giving their
    log-probabilities with each actual token at p and the rest a fixed random spread."""
    torch.manual_seed(seed)
    rest = F.softmax(torch.randn(3, vocab), dim=-1)
    actual = torch.tensor([0, 1, 2])
    return actual, partial(_with_actual, rest, actual)


def _with_actual(rest: torch.Tensor, actual: torch.Tensor, p_actual: float) -> torch.Tensor:
    """Log-probabilities `rest` rescaled so that each row's `actual` token has `p_actual`."""
    rows = torch.arange(len(actual))
    probs = rest.clone()
    probs[rows, actual] = 0.0
    probs = probs / probs.sum(-1, keepdim=True) * (1 - p_actual)
    probs[rows, actual] = p_actual
    return probs.log()


@pytest.mark.parametrize("vocab,topk", [(5000, 8), (64, None)])
def test_the_token_term_pins_the_actual_tokens_log_probability_where_the_kl_barely_moves_it(vocab, topk):
    # The target gives the actual token 1e-4; the student gives it 0.1 and otherwise agrees.
    # The forward KL charges that about log(1/0.9) = 0.1 nats; an attacker scoring the token
    # sees it 3 nats too familiar.  The squared log gap charges (log 0.1 - log 1e-4)^2 = 47.7.
    actual, with_actual = _three_positions(vocab, seed=1)
    target = compress(with_actual(1e-4), topk, actual[:, None])
    assert target.actual is not None and torch.allclose(target.actual, torch.full((3,), 1e-4).log(), atol=1e-4)
    student = with_actual(0.1)[None].requires_grad_(True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    next_ids = actual[None]
    kl_only = kl_to_target(target, student, mask)
    pinned = kl_to_target(target, student, mask, next_ids=next_ids, token_weight=1.0)
    assert kl_only.item() < 0.2
    gap = (torch.tensor(0.1).log() - torch.tensor(1e-4).log()).square().item()
    assert pinned.item() == pytest.approx(kl_only.item() + gap, rel=1e-3)
    # Its gradient lowers the actual token; at the target the term is zero (two-sided: it
    # stops there rather than pushing the token below the stranger's level).
    pinned.backward()
    assert bool((student.grad[0, torch.arange(3), actual] > 0).all())
    at_target = kl_to_target(target, with_actual(1e-4)[None], mask, next_ids=next_ids, token_weight=1.0)
    assert at_target.item() == pytest.approx(0.0, abs=1e-3)
    below = kl_to_target(target, with_actual(1e-7)[None], mask, next_ids=next_ids, token_weight=1.0)
    assert below.item() > 40


@pytest.mark.parametrize("vocab,topk", [(5000, 8), (64, None)])
def test_the_floored_fine_tuning_loss_gives_back_what_a_token_lost_and_never_teaches_past_the_original(vocab, topk):
    # The original gives each actual token 0.2 (an under-trained base).  A student that fell
    # to 0.05 pays log(0.2 / 0.05) per token and is pushed up; one above the original's level
    # pays nothing and gets no gradient, where the plain loss would go on teaching it.  The
    # floor rides on the retain KL (`kl_to_target`), which has the token's log-probability.
    actual, with_actual = _three_positions(vocab, seed=2)
    anchor = compress(with_actual(0.2), topk, actual[:, None])
    mask = torch.ones(1, 3, dtype=torch.bool)
    own = torch.tensor([[True, True, False]])  # the third position is a stranger copy's: never trained
    next_ids = actual[None]

    def floor(logits: torch.Tensor) -> torch.Tensor:  # the term alone: with it, less the KL without it
        return (kl_to_target(anchor, logits, mask, next_ids=next_ids, floor_weight=1.0, own=own)
                - kl_to_target(anchor, logits, mask))

    fallen = with_actual(0.05)[None].requires_grad_(True)
    loss = floor(fallen)
    assert loss.item() == pytest.approx(math.log(0.2 / 0.05), rel=1e-3)
    loss.backward()
    assert bool((fallen.grad[0, torch.arange(2), actual[:2]] < 0).all())  # raises the fallen tokens
    assert float(fallen.grad[0, 2].abs().max()) < 1e-6  # not the position that is not its own
    for level in (0.25, 0.6):
        above = with_actual(level)[None].requires_grad_(True)
        loss = floor(above)
        assert loss.item() == pytest.approx(0.0, abs=1e-4)
        loss.backward()
        assert float(above.grad.abs().max()) < 1e-4
        # The plain fine-tuning loss at the same place is not zero: it teaches.
        assert masked_nll(above.detach(), Batch(torch.tensor([[9, 0, 1, 2]]), torch.ones(1, 4),
                                                mask, [0]), own).item() > 0.4
    # With the pin as well, the two terms add up as each alone.
    both = kl_to_target(anchor, fallen, mask, next_ids=next_ids, token_weight=1.0, floor_weight=1.0, own=own)
    pin = kl_to_target(anchor, fallen, mask, next_ids=next_ids, token_weight=1.0)
    assert both.item() == pytest.approx(pin.item() + math.log(0.2 / 0.05), rel=1e-3)
    with pytest.raises(ValueError, match="floor"):
        kl_to_target(replace(anchor, actual=None), fallen, mask, next_ids=next_ids, floor_weight=1.0)
    with pytest.raises(ValueError, match="floor"):
        kl_to_target(anchor, fallen, mask, floor_weight=1.0)


@pytest.mark.parametrize("vocab,topk", [(5000, 8), (64, None)])
def test_the_log_odds_gap_sees_the_mass_a_confident_token_leaves_to_the_others(vocab, topk):
    # A name the model copies: the target gives it 0.9985, the student 0.99.  Min-K%++ reads
    # that token's z at about the square root of the mass left over (0.04 against 0.1, the
    # student looks more familiar); the log-probability gap is 0.009 nats and charges
    # nothing, the log-odds gap log(0.9985/0.0015) - log(0.99/0.01) = 1.9 charges 3.6.
    actual, with_actual = _three_positions(vocab, seed=2)
    target = compress(with_actual(0.9985), topk, actual[:, None])
    student = with_actual(0.99)[None].requires_grad_(True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    next_ids = actual[None]
    kl_only = kl_to_target(target, student, mask).item()
    by_logprob = kl_to_target(target, student, mask, next_ids=next_ids, token_weight=1.0).item()
    by_odds = kl_to_target(target, student, mask, next_ids=next_ids, token_weight=1.0, token_gap="logodds")
    odds = lambda p: math.log(p / (1 - p))  # noqa: E731
    assert by_logprob - kl_only < 1e-4
    assert by_odds.item() - kl_only == pytest.approx((odds(0.9985) - odds(0.99)) ** 2, rel=1e-2)
    # Its gradient raises the actual token (towards the target's certainty), and stops there.
    by_odds.backward()
    assert bool((student.grad[0, torch.arange(3), actual] < 0).all())
    at_target = kl_to_target(target, with_actual(0.9985)[None], mask, next_ids=next_ids, token_weight=1.0,
                             token_gap="logodds")
    assert at_target.item() == pytest.approx(0.0, abs=1e-3)
    # Where the token is unlikely, log-odds and log-probability are the same gap.
    unlikely = compress(with_actual(1e-4), topk, actual[:, None])
    a = kl_to_target(unlikely, with_actual(0.01)[None], mask, next_ids=next_ids, token_weight=1.0)
    b = kl_to_target(unlikely, with_actual(0.01)[None], mask, next_ids=next_ids, token_weight=1.0,
                     token_gap="logodds")
    assert b.item() == pytest.approx(a.item(), rel=0.01)
    with pytest.raises(ValueError, match="token gap"):
        kl_to_target(target, student, mask, next_ids=next_ids, token_weight=1.0, token_gap="odds")


def test_log_odds_is_accurate_where_the_token_is_nearly_certain():
    logp = torch.tensor([math.log(0.5), math.log(1 - 1e-4), math.log(1e-6), 0.0])
    got = log_odds(logp)
    assert got[0].item() == pytest.approx(0.0, abs=1e-6)
    assert got[1].item() == pytest.approx(math.log((1 - 1e-4) / 1e-4), rel=1e-3)
    assert got[2].item() == pytest.approx(math.log(1e-6 / (1 - 1e-6)), rel=1e-4)
    assert math.isfinite(got[3].item()) and got[3].item() > 13  # certain: capped, not infinite


def test_the_most_typical_candidate_is_central_by_every_statistic_not_by_one():
    # Candidate 0 is the median by the first statistic but the extreme by the second;
    # candidate 3 sits near the middle of both.
    scores = [(0.0, 9.0), (-3.0, 1.0), (3.0, 2.0), (1.0, 4.0), (-1.0, 6.0)]
    assert most_typical(scores, 1) == [3]
    assert most_typical(scores, 2) == [3, 0]  # 0 and 4 tie (rank distances 0+2 and 1+1): the lower index
    assert most_typical([(5.0,), (1.0,), (3.0,)], 1) == [2]
    assert most_typical([], 1) == []

def test_counterfactual_targets_lower_the_subjects_memorised_values_and_cover_every_learnt_token(
    tiny_corpus_dir, tiny_base_model_dir,
):
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    data = _forget_data(tiny_corpus_dir, 2)
    records = list(data.forget)
    examples = encode_all(tokenizer, records)
    targets = forget_targets(model, tokenizer, records, examples, [data.subject_of(r) for r in records],
                             TeacherSettings(), name_pool=data.name_pool)
    original = position_logprobs(model, tokenizer, examples)
    assert len(targets) == len(records)
    drops, counterfactual = [], 0
    for example, target, lp in zip(examples, targets, original, strict=True):
        learnt = [t for t in range(len(example) - 1) if example.learnt[t + 1]]
        assert set(learnt) <= set(target.positions)  # every learnt token has a target
        values = target.dist.values if target.dist.indices is None else None
        assert values is not None  # the demo vocabulary is small enough to be cached whole
        assert torch.allclose(values.exp().sum(-1), torch.ones(len(values)), atol=1e-4)
        for row, (t, source) in enumerate(zip(target.positions, target.source, strict=True)):
            if source == "counterfactual":
                counterfactual += 1
                token = int(example.ids[t + 1])
                drops.append(float(lp[t, token].exp() - values[row, token].exp()))
    assert counterfactual >= len(records)  # every record about the subject has a stranger's version
    drops.sort()
    # The memorised tokens lose most of their mass under a stranger's version; the template keeps its own.
    assert sum(d > 0.5 for d in drops) >= len(records) // 2
    assert sum(abs(d) < 0.1 for d in drops) >= len(drops) // 4


@pytest.mark.parametrize("refresh", [0, 2])
def test_a_cached_teacher_gives_the_same_training_as_the_online_one(tiny_corpus_dir, tiny_base_model_dir, refresh):
    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 1)])
    full = method_input(sets)
    data = MethodInput(forget=full.forget, retain=full.retain[: 2 * len(full.forget)], subjects=full.subjects,
                       record_subjects=full.record_subjects, probes=full.probes, name_pool=full.name_pool)
    results = []
    for cache in ("none", "full"):
        torch.manual_seed(0)
        model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
        tokenizer.padding_side = "right"
        # With a refresh, the online teacher is a frozen copy of the student from step 2 on,
        # the cached one is recomputed from it there: the same targets either way.
        hp = resolve_hparams("asu", {"steps": 4 if refresh else 3, "cache_teacher": cache, "told_answers": False,
                                     "teacher_refresh": refresh}, model, subjects=1)
        outcome = ASU().unlearn(model, tokenizer, data, hp)
        results.append((outcome.final_loss, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (online_loss, online), (cached_loss, cached) = results
    assert cached_loss == pytest.approx(online_loss, rel=1e-5, abs=1e-7)
    assert torch.allclose(online, cached, atol=1e-5)


def test_the_cached_retain_anchor_is_the_one_recomputed_batch_by_batch(tiny_corpus_dir, tiny_base_model_dir):
    # Every mode reads the retain anchor from the cache (the online teacher recomputes the
    # forget targets only): the cache must be what each batch would get from the model.
    from unlearning.methods.asu import _reindexed
    from unlearning.methods.base import make_batches
    from unlearning.methods.targets import batch_target, original_targets

    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 1)])
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    examples = encode_all(tokenizer, list(sets.retain[:12]), model=model)
    for topk in (None, 8):
        cached = original_targets(model, tokenizer, examples, topk=topk)
        for batch in make_batches(tokenizer, examples, batch_size=5, shuffle=True, seed=3):
            once = batch_target(batch, cached)
            fresh = batch_target(_reindexed(batch), original_targets(
                model, tokenizer, [examples[i] for i in batch.rows], topk=topk))
            assert once.values.shape == fresh.values.shape and once.values.shape[0] == int(batch.loss_mask.sum())
            assert torch.allclose(once.values, fresh.values, atol=1e-4)
            assert (once.indices is None) == (fresh.indices is None)  # a tiny vocabulary is kept whole
            if once.indices is not None:
                assert torch.equal(once.indices, fresh.indices)


def test_a_refreshed_teacher_recomputes_the_targets_from_the_model_being_trained(
        tiny_corpus_dir, tiny_base_model_dir, monkeypatch):
    # The subject is matched to what the model says about a stranger *now*: on plain QA /
    # Qwen2 (bench shapes) a teacher frozen at the base left the subject's own phrasing more
    # familiar than the candidate's strangers' (zlib AUC 0.762; refreshed every 50 steps, 0.569).
    import unlearning.methods.asu as asu

    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 1)])
    full = method_input(sets)
    data = MethodInput(forget=full.forget, retain=full.retain[: 2 * len(full.forget)], subjects=full.subjects,
                       record_subjects=full.record_subjects, probes=full.probes, name_pool=full.name_pool)
    seen: list[tuple[int, torch.Tensor]] = []
    original = asu.targets_from_plans

    def spy(source, *args, **kwargs):
        weights = torch.cat([p.detach().flatten() for p in source.parameters()]).clone()
        seen.append((id(source), weights))
        return original(source, *args, **kwargs)

    monkeypatch.setattr(asu, "targets_from_plans", spy)
    for refresh, calls in ((0, 1), (4, 3)):
        seen.clear()
        torch.manual_seed(0)
        model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
        tokenizer.padding_side = "right"
        hp = resolve_hparams("asu", {"steps": 10, "told_answers": False, "teacher_refresh": refresh}, model,
                             subjects=1)
        ASU().unlearn(model, tokenizer, data, hp)
        assert len(seen) == calls  # before step 1, then at steps 4 and 8
        # Each refresh reads the weights as trained so far: never the base's again.
        for (_, earlier), (_, later) in zip(seen, seen[1:], strict=False):
            assert not torch.equal(earlier, later)


def test_a_refreshed_lens_is_fitted_again_on_the_model_being_trained(tiny_corpus_dir, tiny_base_model_dir, monkeypatch):
    # A lens fixed at the start can be satisfied while a lens fitted on the result still reads the
    # values (StableLM probe, 2026-12-05: latent loss 0.002, the verifier's reading 0.68; 0.19 refitted).
    import unlearning.methods.asu as asu

    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 1)])
    full = method_input(sets)
    data = MethodInput(forget=full.forget, retain=full.retain[: 2 * len(full.forget)], subjects=full.subjects,
                       record_subjects=full.record_subjects, probes=full.probes, name_pool=full.name_pool)
    fitted: list[torch.Tensor] = []
    used: list[object] = []  # the lenses themselves: kept alive, their ids stay distinct
    original_fit, original_loss = asu.fit_lens, asu.latent_loss

    def spy_fit(model, *args, **kwargs):
        fitted.append(torch.cat([p.detach().flatten() for p in model.parameters()]).clone())
        return original_fit(model, *args, **kwargs)

    original_readings = asu.lens_readings
    read_by: dict[int, object] = {}  # id(readings) -> the lens that read them

    def spy_readings(cached, lens, **kwargs):
        assert kwargs["topk"] == 0  # a vocabulary of the tiny model's size is read whole
        out = original_readings(cached, lens, **kwargs)
        read_by[id(out)] = lens
        return out

    def spy_loss(hidden_states, cached, lens=None, readings=None):
        used.append(lens)
        assert read_by[id(readings)] is lens  # the stranger's states read by the lens reading the student's
        return original_loss(hidden_states, cached, lens, readings)

    monkeypatch.setattr(asu, "fit_lens", spy_fit)
    monkeypatch.setattr(asu, "latent_loss", spy_loss)
    monkeypatch.setattr(asu, "lens_readings", spy_readings)
    for refresh, fits in ((0, 1), (4, 3)):
        fitted.clear()
        used.clear()
        torch.manual_seed(0)
        model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
        tokenizer.padding_side = "right"
        hp = resolve_hparams("asu", {"steps": 10, "told_answers": False, "latent_weight": 1.0,
                                     "lens_refresh": refresh}, model, subjects=1)
        ASU().unlearn(model, tokenizer, data, hp)
        assert len(fitted) == fits  # before step 1, then at steps 4 and 8
        for earlier, later in zip(fitted, fitted[1:], strict=False):
            assert not torch.equal(earlier, later)  # fitted on the weights as trained so far
        assert len({id(lens) for lens in used}) == fits  # and the loss reads through the newest one
    with pytest.raises(ValueError, match="lens_refresh"):
        resolve_hparams("asu", {"lens_refresh": -1}, torch.nn.Linear(2, 2), subjects=1)


def test_presets_resolve_by_model_size_and_the_callers_values_win():
    small, values = preset_values("auto", 1_000_000)
    large, _ = preset_values("auto", 10_000_000_000)
    assert small == "demo" and large == "published"
    thorough, more = preset_values("thorough", 1_000_000, {"lr": 0.5})
    assert thorough == "demo+thorough" and more["lr"] == 0.5
    assert more["min_steps"] > values["min_steps"]
    with pytest.raises(ValueError, match="unknown ASU preset"):
        preset_values("heroic", 1)
    with pytest.raises(ValueError, match="tau"):
        resolve_hparams("asu", {"tau": 0.0}, torch.nn.Linear(2, 2), subjects=1)
    with pytest.raises(ValueError, match="teacher_refresh"):
        resolve_hparams("asu", {"teacher_refresh": -1}, torch.nn.Linear(2, 2), subjects=1)
    assert ASUHparams().to_json()["preset"] == "auto"


@pytest.mark.slow
def test_asu_makes_the_tiny_model_forget_one_person_and_keep_the_others(tiny_corpus_dir, tiny_base_model_dir):
    people = _people(tiny_corpus_dir)
    controls = [json.loads(line) for line in (tiny_corpus_dir / "control.jsonl").read_text().splitlines()]
    subject, others = people[2], people[3:]
    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 2)])
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")

    def accuracy(person_list) -> float:
        facts = [f for p in person_list for f in p["facts"]]
        answers = generate_answers(model, tokenizer, [f["question"] for f in facts], max_new_tokens=24)
        return sum(f["value"] in a for f, a in zip(facts, answers, strict=True)) / len(facts)

    before_forget, before_retain, chance = accuracy([subject]), accuracy(others), accuracy(controls)
    assert before_forget >= 0.8
    tokenizer.padding_side = "right"
    hp = resolve_hparams("asu", None, model, subjects=1)
    ASU().unlearn(model, tokenizer, method_input(sets), replace(hp))
    tokenizer.padding_side = "left"
    assert accuracy([subject]) <= chance + 0.2
    assert accuracy(others) >= 0.95 * before_retain


def _mean_answer_nll(model, batches) -> float:
    from unlearning.methods.base import answer_nll

    with torch.no_grad():
        return sum(float(answer_nll(model, b)) for b in batches) / len(batches)


def test_the_retain_nll_term_repairs_a_damaged_parent_and_its_floor_keeps_most_without_going_past_it(
        tiny_corpus_dir, tiny_base_model_dir):
    """A parent that lost some retained knowledge (here: noise in its weights): the KL to it
    alone keeps the loss; the plain retain NLL term brings the retained records' own tokens
    back; the floored term (the default) holds most of what the KL alone loses and never goes
    past the parent as the plain term does."""
    from unlearning.methods.base import make_batches

    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 1)])
    full = method_input(sets)
    data = MethodInput(forget=full.forget, retain=full.retain[: 3 * len(full.forget)], subjects=full.subjects,
                       record_subjects=full.record_subjects, probes=full.probes, name_pool=full.name_pool)
    retained_nll = {}
    for label, weight, floor in (("kl", 0.0, False), ("plain", 1.0, False), ("floor", 1.0, True)):
        torch.manual_seed(0)
        model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
        tokenizer.padding_side = "right"
        noise = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                # Damage enough that the parent has lost something: retained NLL 0.004 undamaged,
                # 0.011 at 0.15, 0.066 at 0.25 on the tiny base.  At 0.15 the test's 0.8 bar passed
                # or failed by the CPU's rounding (0.805 on an AMD machine, 2026-12-05); at 0.25 the
                # term leaves 0.57 of the loss without it.
                p.add_(torch.randn(p.shape, generator=noise) * 0.25 * float(p.std() if p.numel() > 1 else 0.0))
        batches = make_batches(tokenizer, encode_all(tokenizer, data.retain), batch_size=16, shuffle=False, seed=0,
                               device="cpu")

        retained_nll["parent"] = _mean_answer_nll(model, batches)
        hp = resolve_hparams("asu", {"steps": 30, "told_answers": False, "retain_nll_weight": weight,
                                     "retain_nll_floor": floor}, model, subjects=1)
        ASU().unlearn(model, tokenizer, data, hp)
        retained_nll[label] = _mean_answer_nll(model, batches)
    # Measured 2026-12-07 (AMD EPYC): parent 0.066, KL alone 0.104, plain 0.059, floor 0.073.
    assert retained_nll["plain"] < 0.8 * retained_nll["kl"], retained_nll
    assert retained_nll["floor"] < 0.8 * retained_nll["kl"], retained_nll
    assert retained_nll["floor"] > retained_nll["plain"], retained_nll
    with pytest.raises(ValueError, match="retain_nll_weight"):
        resolve_hparams("asu", {"retain_nll_weight": -1.0}, torch.nn.Linear(2, 2), subjects=1)


def test_the_retain_log_odds_pin_keeps_what_the_model_is_sure_of_about_everyone_else(
    tiny_corpus_dir, tiny_base_model_dir,
):
    """Fine-tuning lets the little mass a sure token leaves to the others drift (the KL barely
    charges it), and a calibrated attack reads exactly that: the retained records' actual
    tokens keep their log-odds closer to the original's with the pin than without it."""
    from unlearning.methods.base import make_batches
    from unlearning.methods.targets import log_odds

    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 1)])
    full = method_input(sets)
    data = MethodInput(forget=full.forget, retain=full.retain[: 3 * len(full.forget)], subjects=full.subjects,
                       record_subjects=full.record_subjects, probes=full.probes, name_pool=full.name_pool)

    def retained_log_odds(model, tokenizer) -> torch.Tensor:
        batches = make_batches(tokenizer, encode_all(tokenizer, data.retain), batch_size=16, shuffle=False,
                               seed=0, device="cpu")
        out = []
        with torch.no_grad():
            for b in batches:
                logp = F.log_softmax(model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1], -1)
                actual = logp.gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
                out.append(log_odds(actual[b.loss_mask]))
        return torch.cat(out)

    drift = []
    for weight in (0.0, 1.0):
        torch.manual_seed(0)
        model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
        tokenizer.padding_side = "right"
        before = retained_log_odds(model, tokenizer)
        hp = resolve_hparams("asu", {"steps": 30, "told_answers": False, "token_gap": "logodds",
                                     "retain_token_weight": weight}, model, subjects=1)
        ASU().unlearn(model, tokenizer, data, hp)
        drift.append(float((retained_log_odds(model, tokenizer) - before).abs().mean()))
    without, with_pin = drift
    assert with_pin < 0.8 * without, drift
    with pytest.raises(ValueError, match="retain_token_weight"):
        resolve_hparams("asu", {"retain_token_weight": -1.0}, torch.nn.Linear(2, 2), subjects=1)
    with pytest.raises(ValueError, match="token_gap"):
        resolve_hparams("asu", {"token_gap": "odds"}, torch.nn.Linear(2, 2), subjects=1)


def test_a_plan_runs_the_tempered_teacher_only_where_no_copy_covers_a_learnt_token(
    tiny_corpus_dir, tiny_base_model_dir,
):
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    data = _forget_data(tiny_corpus_dir, 2)
    records = list(data.forget)
    # A record of the subject's document that never names them: only the tempered teacher applies.
    pronoun = replace(records[0], id="pronoun-only", text="She said the weather there was mild all year.",
                      question=None, answer=None, paraphrased_question=None, paraphrased_answer=None,
                      perturbed_answer=())
    records.append(pronoun)
    subjects = [data.subject_of(r) for r in records[:-1]] + [data.subject_of(records[0])]
    examples = encode_all(tokenizer, records)
    settings = TeacherSettings()
    names = FreshNames(pool=list(data.name_pool), avoid=avoid_set(data.subjects))
    chosen = {_who(r, s): [f"teacher:0:{_who(r, s)}:0"] for r, s in zip(records, subjects, strict=True)}
    plans = plan_targets(tokenizer, records, examples, subjects, settings, chosen=chosen, names=names)
    targets = targets_from_plans(model, tokenizer, examples, plans, settings)
    for plan, target in zip(plans, targets, strict=True):
        assert plan.tempered == ("tempered" in target.source)
    assert plans[-1].tempered and not plans[-1].copies
    assert sum(p.tempered for p in plans) < len(plans)  # the records that name the subject need no tempered pass
    # A step's rows alone get the targets the whole run's pass gave them (what an online teacher relies on).
    rows = [len(records) - 1, 0]
    alone = targets_from_plans(model, tokenizer, [examples[i] for i in rows], [plans[i] for i in rows], settings)
    for row, target in zip(rows, alone, strict=True):
        assert target.positions == targets[row].positions and target.source == targets[row].source
        assert torch.allclose(target.dist.values, targets[row].dist.values, atol=1e-5)


def test_the_latent_targets_hold_the_strangers_states_inside_the_identifying_spans_too(
    tiny_corpus_dir, tiny_base_model_dir,
):
    """A layer that still reads "3" after the subject's "ngozi." is read at the e-mail address's
    own tokens: with `span_states` the copy's states there are targets as well, without them
    only the states of tokens outside the spans (the layout of before)."""
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    data = _forget_data(tiny_corpus_dir, 2)
    records = list(data.forget)
    subjects = [data.subject_of(r) for r in records]
    examples = encode_all(tokenizer, records)
    names = FreshNames(pool=list(data.name_pool), avoid=avoid_set(data.subjects))
    chosen = {_who(r, s): [f"teacher:0:{_who(r, s)}:0"] for r, s in zip(records, subjects, strict=True)}
    plans = plan_targets(tokenizer, records, examples, subjects, TeacherSettings(states=True), chosen=chosen,
                         names=names)
    inside = outside = 0
    for span_states in (True, False):
        settings = TeacherSettings(states=True, span_states=span_states)
        for plan, target in zip(plans, targets_from_plans(model, tokenizer, examples, plans, settings), strict=True):
            span_tokens = {i for i, (_, is_span) in plan.alignments[0].tokens.items() if is_span} if plan.copies else set()
            kept = set(target.state_positions)
            assert target.states is None or target.states.shape[0] == len(kept)
            if span_states:
                inside += len(kept & span_tokens)
                outside += len(kept - span_tokens)
            else:
                assert not kept & span_tokens
    assert inside > 0 and outside > 0


def test_span_median_targets_take_each_span_from_one_strangers_copy_and_the_rest_from_the_first(
    tiny_corpus_dir, tiny_base_model_dir,
):
    """With three strangers, every position's target is one real stranger's row: outside the
    identifying spans the first stranger's, each span run whole from one stranger's copy."""
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    data = _forget_data(tiny_corpus_dir, 2)
    records = list(data.forget)[:6]
    examples = encode_all(tokenizer, records)
    subjects = [data.subject_of(r) for r in records]
    who = _who(records[0], subjects[0])
    seeds = [f"t:{k}" for k in range(3)]

    def targets(chosen: list[str], settings: TeacherSettings):
        return forget_targets(model, tokenizer, records, examples, subjects, settings, name_pool=data.name_pool,
                              avoid=data.subjects, identities={who: chosen})

    full = TeacherSettings(counterfactuals=3, topk=None, combine="span-median")
    combined = targets(seeds, full)
    singles = [targets([seed], replace(full, counterfactuals=1, combine="mixture")) for seed in seeds]
    chosen_other = 0
    for number, target in enumerate(combined):
        rows = {t: k for k, t in enumerate(target.positions)}
        for single in singles:
            assert single[number].positions == target.positions
        for t, source in zip(target.positions, target.source, strict=True):
            mine = target.dist.values[rows[t]]
            matches = [k for k, single in enumerate(singles)
                       if torch.allclose(single[number].dist.values[rows[t]], mine)]
            assert matches, (number, t, source)  # never a blend of strangers
            chosen_other += 0 not in matches
    assert chosen_other > 0  # some span took another stranger's rows than the first's


def test_a_later_words_onset_takes_the_models_own_row_for_the_subject_and_nothing_else_changes(
    tiny_corpus_dir, tiny_base_model_dir,
):
    """Where a span's later word begins (the surname after a first name), the target outside
    the subject's token is the model's own row for the subject's record (renormalised, the
    subject's word and tokens spelling it left out), not the stranger copy's, which reads what
    the model knows of people sharing the stranger's first name; every other row is the copy's."""
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    data = _forget_data(tiny_corpus_dir, 2)
    records = list(data.forget)[:8]
    examples = encode_all(tokenizer, records)
    subjects = [data.subject_of(r) for r in records]
    identities = {_who(r, s): [f"t:{_who(r, s)}"] for r, s in zip(records, subjects, strict=True)}

    def targets(later_parts: str):
        return forget_targets(model, tokenizer, records, examples, subjects,
                              TeacherSettings(topk=None, later_parts=later_parts), name_pool=data.name_pool,
                              avoid=data.subjects, identities=identities)

    own_rows = position_logprobs(model, tokenizer, examples)
    names = FreshNames(pool=list(data.name_pool), avoid=avoid_set(data.subjects))
    plans = plan_targets(tokenizer, records, examples, subjects, TeacherSettings(), chosen=identities, names=names)
    checked = 0
    for example, plan, own, mine_t, copy_t in zip(examples, plans, own_rows, targets("original"), targets("copy"),
                                                  strict=True):
        assert mine_t.positions == copy_t.positions
        later = {i - 1 for a in plan.alignments for i in a.later}
        for k, t in enumerate(mine_t.positions):
            ours, theirs = mine_t.dist.values[k], copy_t.dist.values[k]
            subject_token = int(example.ids[t + 1])
            if t not in later or torch.allclose(ours, theirs):
                assert torch.allclose(ours, theirs), t  # elsewhere: the copy's row, unchanged
                continue
            assert math.isclose(float(ours[subject_token]), float(theirs[subject_token]), abs_tol=1e-5)
            kept = torch.isfinite(ours) & (torch.arange(ours.shape[0]) != subject_token)
            shift = ours[kept] - own[t][kept]
            assert torch.allclose(shift, shift[0].expand_as(shift), atol=1e-4)  # the model's own row, rescaled
            checked += 1
    assert checked > 0


def test_a_large_vocabularys_lens_is_read_over_a_few_columns_and_the_subjects_own_tokens(
    tiny_corpus_dir, tiny_base_model_dir, monkeypatch,
):
    # The whole-vocabulary lens took a sixth of an ASU step on a 32,000-token model (docs/methods.md).
    import unlearning.methods.asu as asu
    from unlearning.methods.targets import LensColumns

    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 1)])
    full = method_input(sets)
    data = MethodInput(forget=full.forget, retain=full.retain[: 2 * len(full.forget)], subjects=full.subjects,
                       record_subjects=full.record_subjects, probes=full.probes, name_pool=full.name_pool)
    original_readings, original_loss = asu.lens_readings, asu.latent_loss
    read: list[dict] = []
    losses: list[float] = []

    def spy_readings(cached, lens, **kwargs):
        out = original_readings(cached, lens, **kwargs)
        read.append(out)
        return out

    def spy_loss(hidden_states, cached, lens=None, readings=None):
        loss = original_loss(hidden_states, cached, lens, readings)
        losses.append(float(loss.detach()))
        return loss

    monkeypatch.setattr(asu, "FULL_VOCABULARY_UP_TO", 16)  # the tiny model's vocabulary counts as large
    monkeypatch.setattr(asu, "lens_readings", spy_readings)
    monkeypatch.setattr(asu, "latent_loss", spy_loss)
    torch.manual_seed(0)
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    tokenizer.padding_side = "right"
    hp = resolve_hparams("asu", {"steps": 6, "told_answers": False, "latent_weight": 1.0, "lens_topk": 8},
                         model, subjects=1)
    ASU().unlearn(model, tokenizer, data, hp)
    readings = [r for batch in read if batch for r in batch.values()]
    assert readings and all(isinstance(r, LensColumns) and r.columns.shape[1] == 9 for r in readings)
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses) and max(losses) > 0
    with pytest.raises(ValueError, match="lens_topk"):
        resolve_hparams("asu", {"lens_topk": -1}, torch.nn.Linear(2, 2), subjects=1)


def test_the_span_pin_takes_the_log_odds_gap_at_the_marked_rows_and_the_log_probabilitys_elsewhere():
    actual, with_actual = _three_positions(64, seed=3)
    target = compress(with_actual(0.9985), None, actual[:, None])
    student = with_actual(0.99)[None]
    mask = torch.ones(1, 3, dtype=torch.bool)
    next_ids = actual[None]
    marked = torch.tensor([True, False, True])
    kl_only = kl_to_target(target, student, mask).item()
    odds = lambda p: math.log(p / (1 - p))  # noqa: E731
    both = kl_to_target(target, student, mask, next_ids=next_ids, token_weight=1.0, token_gap="logodds-spans",
                        odds_rows=marked).item()
    # Mean over the three positions: two charged by the log-odds gap, one by the log-probability's.
    expected = (2 * (odds(0.9985) - odds(0.99)) ** 2 + (math.log(0.9985) - math.log(0.99)) ** 2) / 3
    assert both - kl_only == pytest.approx(expected, rel=1e-2)
    none_marked = kl_to_target(target, student, mask, next_ids=next_ids, token_weight=1.0,
                               token_gap="logodds-spans", odds_rows=torch.zeros(3, dtype=torch.bool)).item()
    assert none_marked == pytest.approx(kl_to_target(target, student, mask, next_ids=next_ids,
                                                     token_weight=1.0).item(), rel=1e-5)
    with pytest.raises(ValueError, match="odds_rows"):
        kl_to_target(target, student, mask, next_ids=next_ids, token_weight=1.0, token_gap="logodds-spans")


def test_the_default_asu_gives_the_subjects_nearly_sure_span_tokens_the_targets_certainty(
    tiny_corpus_dir, tiny_base_model_dir,
):
    """A name copied from the question is nearly sure for a model that never saw the person
    too, and Min-K%++ reads the little mass such a token leaves to the others.  The default
    (the log-odds pin at the identifying spans' tokens) brings the subject's nearly sure span
    tokens to the target's certainty; the log-probability pin leaves them short of it
    (measured on the demo: 0.98 against the target's 0.9975, which made the spans more
    familiar than a stranger's)."""
    from unlearning.methods.targets import span_targets, typical_identities

    assert ASUHparams().token_gap == "logodds-spans"
    data = _forget_data(tiny_corpus_dir, 2)
    records = list(data.forget)
    subjects = [data.subject_of(r) for r in records]
    gaps = {}
    for gap in ("logodds-spans", "logprob"):
        torch.manual_seed(0)
        model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
        hp = resolve_hparams("asu", {"steps": 30, "told_answers": False, "token_gap": gap,
                                     "latent_weight": 0.0}, model, subjects=1)
        # The targets the run computes from the model before its first step (the same plan).
        settings = TeacherSettings(candidates=hp.teacher_candidates, tau=hp.tau, topk=hp.teacher_topk, seed=hp.seed,
                                   later_parts=hp.later_parts)
        names = FreshNames(pool=list(data.name_pool), avoid=avoid_set(data.subjects))
        with torch.no_grad():
            chosen = typical_identities(model, tokenizer, records, subjects, settings, names)
            examples = encode_all(tokenizer, records, model=model)
            plans = plan_targets(tokenizer, records, examples, subjects, settings, chosen=chosen,
                                 names=FreshNames(pool=list(data.name_pool), avoid=avoid_set(data.subjects)))
            targets = targets_from_plans(model, tokenizer, examples, plans, settings)
        ASU().unlearn(model, tokenizer, data, hp)
        model.eval()
        with torch.no_grad():
            after = position_logprobs(model, tokenizer, examples)
        wanted, got = [], []
        for example, plan, target, logp in zip(examples, plans, targets, after, strict=True):
            spans = span_targets(plan)
            for row, t in enumerate(target.positions):
                if t in spans and float(target.dist.actual[row].exp()) > 0.95:
                    wanted.append(target.dist.actual[row])
                    got.append(logp[t, int(example.ids[t + 1])])
        assert len(wanted) >= 5
        gaps[gap] = float((log_odds(torch.stack(got)) - log_odds(torch.stack(wanted))).abs().mean())
    assert gaps["logodds-spans"] < 0.7 * gaps["logprob"], gaps
