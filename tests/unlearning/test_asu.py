"""ASU: the teacher is the tempered original, the cache changes nothing, and it forgets."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from unlearning.corpus import load_corpus
from unlearning.erase import method_input
from unlearning.methods.asu import ASU, ASUHparams, answer_logprobs, copied_answer_tokens
from unlearning.methods.base import QA, MethodInput, answer_logits, make_batches
from unlearning.methods.population import population_logprobs
from unlearning.modeling import generate_answers, load_model
from unlearning.sets import Subject, build_sets


def _subject(corpus_dir, index: int) -> Subject:
    people = [json.loads(line) for line in (corpus_dir / "people.jsonl").read_text().splitlines()]
    return Subject(people[index]["name"], tuple(people[index]["aliases"]))


def _pairs(corpus_dir, *, person: str) -> tuple[list[QA], list[QA]]:
    corpus = load_corpus(corpus_dir / "corpus.jsonl")
    forget = [QA(r.question, r.answer) for r in corpus.records if r.is_qa and r.meta.get("person") == person]
    retain = [QA(r.question, r.answer) for r in corpus.records if r.is_qa and r.meta.get("person") != person]
    return forget, retain


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_teacher_at_tau_one_is_exactly_the_plain_model_and_differs_at_tau_four(
    tiny_corpus_dir, tiny_arch_model_dir, impl, side
):
    model, tokenizer = load_model(tiny_arch_model_dir("llama"), device="cpu", attn_implementation=impl)
    forget, _ = _pairs(tiny_corpus_dir, person="p0000")
    batch = make_batches(tokenizer, forget[:4], batch_size=4, shuffle=False, seed=0)[0]
    if side == "left":
        # Move every row's padding to the front, and give the real tokens their own positions.
        lengths = batch.attention_mask.sum(-1)
        for b, n in enumerate(lengths.tolist()):
            batch.input_ids[b] = batch.input_ids[b].roll(batch.input_ids.shape[1] - n)
            batch.attention_mask[b] = batch.attention_mask[b].roll(batch.input_ids.shape[1] - n)
            batch.answer_mask[b] = batch.answer_mask[b].roll(batch.input_ids.shape[1] - n)
    with torch.no_grad():
        plain = F.log_softmax(answer_logits(model, batch)[batch.answer_mask], dim=-1)
    assert (answer_logprobs(model, batch, 1.0) - plain).abs().max().item() == 0.0
    assert (answer_logprobs(model, batch, 4.0) - plain).abs().max().item() > 1e-3


def test_copied_tokens_are_the_name_not_the_fact(tiny_arch_model_dir):
    _, tokenizer = load_model(tiny_arch_model_dir("llama"), device="cpu")
    pair = QA("What did the mother of Quentin Cardoso do?", "Quentin Cardoso's mother worked as a baker.")
    flags = copied_answer_tokens(tokenizer, pair)
    ids = tokenizer(pair.answer, add_special_tokens=False)["input_ids"]
    assert len(flags) == len(ids) + 1 and flags[-1] is False  # EOS
    copied = "".join(tokenizer.decode([t]) for t, f in zip(ids, flags, strict=False) if f)
    assert "Quentin" in copied and "Cardoso" in copied and "mother" in copied
    assert "baker" not in copied and "worked" not in copied


@pytest.mark.parametrize("shaping", [False, True])
def test_a_cached_teacher_gives_the_same_training_as_the_online_one(tiny_corpus_dir, tiny_base_model_dir, shaping):
    forget, retain = _pairs(tiny_corpus_dir, person="p0001")
    data = MethodInput(forget=forget, retain=retain[: len(forget)])
    hp = ASUHparams.published(epochs=2, tau=3.0, keep_copied_tokens=shaping,
                                 fact_target="suppress" if shaping else "tempered")
    results = []
    for cache in ("none", "full"):
        torch.manual_seed(0)
        model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
        tokenizer.padding_side = "right"
        outcome = ASU().unlearn(model, tokenizer, data, replace(hp, cache_teacher=cache))
        results.append((outcome.final_loss, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (online_loss, online), (cached_loss, cached) = results
    assert cached_loss == pytest.approx(online_loss, rel=1e-6, abs=1e-9)
    assert torch.allclose(online, cached, atol=1e-6)


def test_a_refreshing_teacher_needs_the_cache():
    with pytest.raises(ValueError, match="cached teacher"):
        ASU().unlearn(torch.nn.Linear(1, 1), None, MethodInput([], []), ASUHparams(cache_teacher="none", teacher_refresh_every=1))


def test_the_population_teacher_is_the_original_speaking_of_other_people(tiny_corpus_dir, tiny_base_model_dir):
    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 2)], retain_per_forget=3)
    data = method_input(sets)
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    tokenizer.padding_side = "right"
    batch = make_batches(tokenizer, data.forget, batch_size=64, shuffle=False, seed=0)[0]
    strangers = sorted({n for n in data.control_names if n})
    people, covered = population_logprobs(model, tokenizer, data.forget, data.forget_names, strangers, batch, size=4, seed=0)
    assert covered.float().mean() > 0.4  # everything after the name, in most answers
    original = answer_logprobs(model, batch, 1.0)
    targets = batch.targets[batch.answer_mask]
    rows = covered.nonzero().flatten()
    own = original[rows, targets[rows]].exp()
    theirs = people[rows, targets[rows]].exp()
    # The memorised tokens lose most of their mass; the template tokens keep theirs.
    assert (theirs < 0.5 * own).sum() >= len(data.forget) // 2
    assert (theirs > 0.9).sum() >= len(rows) // 3
    assert torch.allclose(people[rows].exp().sum(-1), torch.ones(len(rows)), atol=1e-4)


@pytest.mark.slow
def test_asu_makes_the_tiny_model_forget_one_person_and_keep_the_others(tiny_corpus_dir, tiny_base_model_dir):
    people = [json.loads(line) for line in (tiny_corpus_dir / "people.jsonl").read_text().splitlines()]
    controls = [json.loads(line) for line in (tiny_corpus_dir / "control.jsonl").read_text().splitlines()]
    subject, others = people[2], people[3:]
    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [_subject(tiny_corpus_dir, 2)], retain_per_forget=10)
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")

    def accuracy(person_list) -> float:
        facts = [f for p in person_list for f in p["facts"]]
        answers = generate_answers(model, tokenizer, [f["question"] for f in facts], max_new_tokens=24)
        return sum(f["value"] in a for f, a in zip(facts, answers, strict=True)) / len(facts)

    before_forget, before_retain, chance = accuracy([subject]), accuracy(others), accuracy(controls)
    assert before_forget >= 0.8
    tokenizer.padding_side = "right"
    ASU().unlearn(model, tokenizer, method_input(sets), ASUHparams())
    tokenizer.padding_side = "left"
    assert accuracy([subject]) <= chance + 0.2
    assert accuracy(others) >= 0.95 * before_retain
