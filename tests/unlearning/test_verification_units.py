"""The verification suite's building blocks, without models: fast and exact."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from unlearning.verification import (
    DEFAULT_POLICY,
    CheckSpec,
    Policy,
    Report,
    get_policy,
    policy_escalate,
    register_policy,
)
from unlearning.verification.fluency import is_degenerate, is_looping
from unlearning.verification.generation import TokenScores
from unlearning.verification.latent import residual_knowledge_ratio
from unlearning.verification.leakage import Rate, contains_value, leak_rate, normalise_text
from unlearning.verification.membership import auc_with_stderr, min_k_plus_plus
from unlearning.verification.probes import FactProbe, control_from_strangers, stranger_names


def test_a_leak_is_the_value_on_word_boundaries_whatever_the_case_and_accents() -> None:
    assert contains_value("She was born in MÁLAGA.", "Malaga")
    assert contains_value("born on 28 October 1955!", "28 october 1955")
    assert not contains_value("Annabel wrote it.", "Ann")
    assert not contains_value("", "Lisbon")
    assert normalise_text("  Ｈarrow &  Vale ") == "harrow vale"


def test_leak_rate_counts_every_generation_of_every_probe() -> None:
    rate = leak_rate([["in Lisbon", "in Paris"], ["Oslo"]], ["Lisbon", "Oslo"])
    assert (rate.hits, rate.n) == (2, 3)
    assert Rate(0, 10).variance > 0  # zero hits still has sampling spread
    low, high = Rate(5, 10).wilson()
    assert low < 0.5 < high


def test_a_relative_check_adds_margin_and_noise_slack_to_the_control_level() -> None:
    spec = CheckSpec("leak", "leakage.forget", "<=", 0.05, "leakage.control", 2.0)
    metrics = {"leakage.forget": 0.30, "leakage.control": 0.10, "leakage.forget.stderr": 0.05}
    assert spec.threshold(metrics) == pytest.approx(0.10 + 0.05 + 2.0 * 0.05)
    policy = Policy("t", "1", (spec,))
    (result,) = policy.judge(metrics)
    assert not result.passed and result.threshold == pytest.approx(0.25)
    (result,) = policy.judge({**metrics, "leakage.forget": 0.2})
    assert result.passed


def test_a_policy_skips_checks_whose_metrics_are_missing_rather_than_passing_them() -> None:
    results = DEFAULT_POLICY.judge({"mia.auc": 0.5, "mia.auc.stderr": 0.0})
    assert [r.metric for r in results] == ["mia.auc"]


def test_policies_are_versioned_and_a_changed_threshold_needs_a_new_version() -> None:
    v1 = register_policy(Policy("strict-test", "1", (CheckSpec("m", "mia.auc", "<=", 0.55),)))
    v2 = register_policy(Policy("strict-test", "2", (CheckSpec("m", "mia.auc", "<=", 0.52),)))
    assert get_policy("strict-test", "1") is v1
    assert get_policy("strict-test") is v2
    assert get_policy("default", "1") is DEFAULT_POLICY
    with pytest.raises(ValueError):
        register_policy(Policy("strict-test", "1", (CheckSpec("m", "mia.auc", "<=", 0.9),)))
    with pytest.raises(KeyError):
        get_policy("no-such-policy")


def test_escalation_strengthens_forgetting_only_when_forgetting_failed() -> None:
    leak = DEFAULT_POLICY.judge({"leakage.forget": 0.9, "leakage.control": 0.0})
    utility = DEFAULT_POLICY.judge({"utility.retain_ratio": 0.5})
    hparams = {"tau": 4.0, "epochs": 5, "lr": 1e-3}
    stronger = policy_escalate(DEFAULT_POLICY, method="asu", hparams=hparams, failed_checks=leak)
    assert stronger == {"tau": 4.0, "epochs": 10, "lr": 1e-3}
    assert policy_escalate(DEFAULT_POLICY, method="asu", hparams=hparams, failed_checks=utility) is None
    assert policy_escalate(DEFAULT_POLICY, method="unknown", hparams=hparams, failed_checks=leak) is None


def test_looping_and_empty_answers_are_degenerate_but_a_wrong_sentence_is_not() -> None:
    assert is_looping("mitrimitrimitrimitrimitri")
    assert is_looping("born born born in Oslo")
    assert is_looping("the cat the cat the cat sat")
    assert is_degenerate("  ...  ")
    assert not is_degenerate("Dmitri Kaminski was born on 2 June 1954.")
    assert not is_degenerate("Dmitri Ueda is also known as D. Ueda.")


def test_min_k_plus_plus_scores_tokens_the_model_prefers_above_tokens_it_does_not() -> None:
    mu, sigma = np.full(5, -2.0), np.full(5, 1.0)
    member = TokenScores(logp=np.full(5, -0.5), mu=mu, sigma=sigma)
    stranger = TokenScores(logp=np.array([-0.5, -0.5, -0.5, -0.5, -6.0]), mu=mu, sigma=sigma)
    assert min_k_plus_plus(member, k=0.2) == pytest.approx(1.5)
    assert min_k_plus_plus(stranger, k=0.2) == pytest.approx(-4.0)
    auc, se = auc_with_stderr([3.0, 4.0, 5.0], [0.0, 1.0, 2.0])
    assert auc == 1.0 and se >= 0.0
    auc, _ = auc_with_stderr([1.0, 2.0], [1.0, 2.0])
    assert auc == 0.5


def test_the_residual_ratio_is_one_when_nothing_was_forgotten_and_zero_at_the_control_level() -> None:
    rng = np.random.default_rng(0)
    base = np.vstack([rng.random(40) < 0.3, np.ones(40, bool), rng.random(40) < 0.9])
    control = np.vstack([rng.random(60) < 0.3, rng.random(60) < 0.1, rng.random(60) < 0.1])
    same = residual_knowledge_ratio(base, control, base, bootstrap=50)
    assert same.value == pytest.approx(1.0) and same.layer in (1, 2)
    forgotten = np.vstack([base[0], np.zeros(40, bool), np.zeros(40, bool)])
    gone = residual_knowledge_ratio(forgotten, control, base, bootstrap=50)
    assert gone.value < 0.05 and gone.ci_high < 0.3
    # Only the embedding layer tells the subject from control: it is never counted.
    embedding_only = np.vstack([np.ones(40, bool), np.zeros(40, bool), np.zeros(40, bool)])
    ratio = residual_knowledge_ratio(embedding_only, np.zeros((3, 60), bool), embedding_only)
    assert (ratio.value, ratio.layer, ratio.usable_layers) == (0.0, -1, 0)


def test_strangers_replace_every_name_and_alias_but_keep_the_values() -> None:
    class _Subject:
        name, aliases = "Mara Okafor", ("M. Okafor",)

    class _Sets:
        subjects = (_Subject(),)

    probes = [FactProbe("alias", "Where was M. Okafor born?", "Lisbon", "r1", "subject-0"),
              FactProbe("original", "Where was MARA OKAFOR born?", "Lisbon", "r1", "subject-0")]
    out, _ = control_from_strangers(_Sets(), probes, (), seed=1, avoid="")
    assert all("Okafor" not in p.prompt.title() for p in out)
    assert [p.value for p in out] == ["Lisbon", "Lisbon"]
    assert len(set(stranger_names(50, seed=0, avoid=""))) == 50


def test_a_report_is_strict_json_with_the_required_keys() -> None:
    report = Report(
        metrics={"leakage.forget": 0.1, "utility.ppl_ratio": math.inf},
        checks=tuple(DEFAULT_POLICY.judge({"leakage.forget": 0.1, "leakage.control": 0.1})),
        policy=DEFAULT_POLICY.to_json(), guarantee="weights", passed=True,
        timings={"leakage": 1.23456}, control_source="test",
    )
    data = json.loads(report.dumps())
    assert data["metrics"]["utility.ppl_ratio"] is None
    assert data["policy"] == {"name": "default", "version": "1"}
    assert {"metrics", "checks", "policy", "guarantee", "passed", "timings"} <= set(data)
