"""The baseline losses say what their papers say, measured on a model at its starting point."""

from __future__ import annotations

import math

import pytest
import torch

from unlearning import methods
from unlearning.corpus import load_corpus
from unlearning.methods.base import MethodInput, answer_nll, encode_all, make_batches
from unlearning.methods.npo import NPO, NPOHparams
from unlearning.modeling import load_model


def _data(corpus_dir) -> MethodInput:
    records = [r for r in load_corpus(corpus_dir / "corpus.jsonl").records if r.is_qa]
    forget = [r for r in records if r.meta.get("person") == "p0003"]
    retain = [r for r in records if r.meta.get("person") == "p0004"]
    return MethodInput(forget=forget, retain=retain)


def _forget_nll(model, tokenizer, data) -> float:
    batch = make_batches(tokenizer, encode_all(tokenizer, data.forget), batch_size=64, shuffle=False, seed=0)[0]
    with torch.no_grad():
        return float(answer_nll(model, batch))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gradascent", "graddiff", "npo"])
def test_forgetting_baselines_raise_the_forget_loss_of_a_trained_model(tiny_corpus_dir, tiny_base_model_dir, name):
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    tokenizer.padding_side = "right"
    data = _data(tiny_corpus_dir)
    before = _forget_nll(model, tokenizer, data)
    method = methods.get(name)
    method.unlearn(model, tokenizer, data, method.hparams_type(steps=3 * len(data.forget) // 8 + 3, lr=1e-3))
    assert _forget_nll(model, tokenizer, data) > before + 0.5


@pytest.mark.slow
def test_idk_teaches_the_refusal(tiny_corpus_dir, tiny_base_model_dir):
    from unlearning.methods.idk import REFUSALS
    from unlearning.modeling import generate_answers

    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    tokenizer.padding_side = "right"
    data = _data(tiny_corpus_dir)
    methods.get("idk").unlearn(model, tokenizer, data, methods.get("idk").hparams_type(steps=8 * (len(data.forget) // 8 + 1), lr=3e-3))
    tokenizer.padding_side = "left"
    answers = generate_answers(model, tokenizer, [r.question for r in data.forget], max_new_tokens=16)
    assert sum(a in REFUSALS for a in answers) >= len(answers) // 2


def test_npo_starts_at_two_over_beta_log_two(tiny_corpus_dir, tiny_base_model_dir):
    """At the reference model log(pi/pi_ref) = 0, so the forget term is (2/beta) log 2 (Zhang et al. 2024)."""
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    tokenizer.padding_side = "right"
    data = _data(tiny_corpus_dir)
    hp = NPOHparams(steps=1, lr=0.0, retain_weight=0.0, beta=0.5, batch_size=64)
    outcome = NPO().unlearn(model, tokenizer, data, hp)
    assert outcome.final_loss == pytest.approx(2.0 / 0.5 * math.log(2.0), rel=1e-5)


def test_the_registry_names_every_method_and_rejects_others():
    assert set(methods.METHOD_NAMES) == {"asu", "kif", "gradascent", "graddiff", "npo", "idk"}
    with pytest.raises(methods.UnknownMethod, match="choose one of"):
        methods.get("rmu")
    with pytest.raises(ValueError, match="unknown hyper-parameters"):
        methods.hparams_from_json("asu", {"tau": 2.0, "temperature": 3})
