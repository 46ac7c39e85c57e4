"""The verification layer's building blocks, without a model: small hand-built inputs, exact answers.

Policy v2 (two-sided bounds, reason codes for unmeasured metrics), policy
documents, the report's JSON form and atomic save, leak matching, membership
AUCs against the strangers' empirical null, the latent ratio, fluency, and the
probe bank built from the tiny demo corpus.  The aggregation steps of the suite
(`_mia`, `_mia_family`, `_latent_family`) run for real; only the model-facing
step that feeds them (`_record_scores`, `_latent`) is replaced by fixed numbers.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from unlearning.corpus import load_corpus
from unlearning.demo.corpus import load_people
from unlearning.identifiers import find_spans, record_texts
from unlearning.probes import Probe
from unlearning.sets import ErasureSets, Subject, build_sets
from unlearning.verification import (
    DEFAULT_POLICY,
    CheckResult,
    CheckSpec,
    Policy,
    Report,
    ReportError,
    VerifySettings,
    get_policy,
    policy_escalate,
    policy_from_json,
    register_policy,
    suite,
)
from unlearning.verification.bank import (
    CONTROL_CORPUS,
    COUNTERFACTUAL,
    Side,
    _usable,
    build_bank,
    load_control,
)
from unlearning.verification.fluency import (
    gibberish_flags,
    is_degenerate,
    is_looping,
    median_nll,
    plausibility_limit,
)
from unlearning.verification.generation import TokenScores
from unlearning.verification.latent import residual_knowledge_ratio
from unlearning.verification.leakage import (
    Rate,
    contains_value,
    diff_stderr,
    leak_rate,
    leak_rates_by_kind,
    normalise_text,
)
from unlearning.verification.membership import auc_with_stderr, min_k_plus_plus, zlib_ratio
from unlearning.verification.policy import (
    BASE_SILENT,
    NO_QUESTIONS,
    NO_SPANS,
    NOT_COMPUTED,
    TOO_FEW_RECORDS,
    UNDERPOWERED,
)


def _by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


def _checks_on(results: list[CheckResult], metric: str) -> list[CheckResult]:
    return [r for r in results if r.metric == metric]


# ---------------------------------------------------------------- leak matching


def test_a_leak_is_the_value_on_word_boundaries_whatever_the_case_and_accents() -> None:
    assert contains_value("She was born in MÁLAGA.", "Malaga")
    assert contains_value("born on 28 October 1955!", "28 october 1955")
    assert contains_value("write to dmitriu@post.example.net please", "dmitriu@post.example.net")
    assert not contains_value("Annabel wrote it.", "Ann")  # inside a word is no leak
    assert not contains_value("born on 28 October 1956", "28 October 1955")
    assert not contains_value("", "Lisbon")
    assert not contains_value("Lisbon", "")  # an empty value never matches
    assert normalise_text("  Ｈarrow &  Vale ") == "harrow vale"


def test_leak_rate_counts_every_generation_of_every_probe_and_splits_by_kind() -> None:
    rate = leak_rate([["in Lisbon", "in Paris"], ["Oslo"], ["no idea"]], ["Lisbon", "Oslo", "Rome"])
    assert (rate.hits, rate.n) == (2, 4)
    assert rate.value == pytest.approx(0.5)
    by_kind = leak_rates_by_kind(["original", "alias", "original"], [["Lisbon"], ["x"], ["Rome"]],
                                 ["Lisbon", "Oslo", "Rome"])
    assert {k: (r.hits, r.n) for k, r in by_kind.items()} == {"original": (2, 2), "alias": (0, 1)}
    with pytest.raises(ValueError):
        leak_rate([["a"]], ["a", "b"])  # answers and values must pair up


def test_rates_carry_their_sampling_noise() -> None:
    assert Rate(0, 0).value == 0.0 and Rate(0, 0).variance == 0.0
    assert Rate(0, 10).variance > 0  # zero hits still has spread (p floored at 1/2n)
    assert Rate(3, 10).variance == pytest.approx(0.3 * 0.7 / 10)
    low, high = Rate(5, 10).wilson()
    assert low < 0.5 < high
    assert Rate(50, 100).wilson()[1] - Rate(50, 100).wilson()[0] < high - low  # more data, narrower
    a, b = Rate(3, 10), Rate(1, 20)
    assert diff_stderr(a, b) == pytest.approx(math.sqrt(a.variance + b.variance))


def test_probes_whose_value_is_already_in_the_prompt_are_not_used() -> None:
    echo = Probe("alias", "Is D. Ueda also known as Dmitri Ueda?", "Dmitri Ueda", "r1", 0)
    cloze_echo = Probe("cloze", "Continue the sentence.", "Lisbon", "r2", 0, form="answer",
                       prefix="Lisbon-born Dmitri Ueda was born in")
    honest = Probe("original", "Where was Dmitri Ueda born?", "Lisbon", "r2", 0)
    assert _usable([echo, cloze_echo, honest]) == (honest,)


# ---------------------------------------------------------------- policy v2: two-sided bounds


def test_a_relative_check_adds_margin_and_noise_slack_to_the_control_level() -> None:
    spec = CheckSpec("leak", "leakage.forget", "<=", 0.05, "leakage.control", 2.0)
    metrics = {"leakage.forget": 0.30, "leakage.control": 0.10, "leakage.forget.stderr": 0.05}
    assert spec.threshold(metrics) == pytest.approx(0.10 + 0.05 + 2.0 * 0.05)
    (result,) = Policy("t", "1", (spec,)).judge(metrics)
    assert not result.passed and result.threshold == pytest.approx(0.25) and result.status == "measured"
    (result,) = Policy("t", "1", (spec,)).judge({**metrics, "leakage.forget": 0.2})
    assert result.passed
    lower = CheckSpec("floor", "leakage.forget", ">=", -0.05, "leakage.control", 2.0)
    assert lower.threshold(metrics) == pytest.approx(0.10 - 0.05 - 2.0 * 0.05)  # slack goes down


def test_policy_v2_bounds_leakage_from_both_sides_of_the_control_level() -> None:
    control = Rate(40, 100)

    def judged(forget: Rate) -> dict[str, CheckResult]:
        metrics = {"leakage.forget": forget.value, "leakage.control": control.value,
                   "leakage.forget.stderr": diff_stderr(forget, control)}
        return _by_name(get_policy("default", "9").judge(metrics))

    at_chance = judged(Rate(41, 100))
    assert at_chance["surface leakage (greedy)"].passed
    assert at_chance["surface leakage not below strangers (greedy)"].passed
    leaks = judged(Rate(90, 100))
    assert not leaks["surface leakage (greedy)"].passed
    assert leaks["surface leakage not below strangers (greedy)"].passed
    # Never saying a value the model says about 40 % of strangers also reveals the erasure.
    silent = judged(Rate(0, 100))
    assert silent["surface leakage (greedy)"].passed
    assert not silent["surface leakage not below strangers (greedy)"].passed


def test_policy_v2_bounds_latent_traces_from_both_sides() -> None:
    base = np.vstack([np.zeros(20, bool), np.ones(20, bool)])  # layer 1 knows every fact
    control = np.vstack([np.zeros(40, bool), np.arange(40) % 2 == 0])  # chance: 0.5
    rows = {
        "kept": base,
        "like a stranger": np.vstack([np.zeros(20, bool), np.arange(20) % 2 == 0]),
        "below strangers": np.zeros((2, 20), bool),  # the lens now prefers the false value
    }
    verdicts = {}
    for label, forget in rows.items():
        rr = residual_knowledge_ratio(forget, control, base, bootstrap=50, seed=0)
        metrics = {"latent.matched_ratio": rr.value, "latent.matched_ratio.stderr": rr.stderr}
        verdicts[label] = [c.passed for c in _checks_on(DEFAULT_POLICY.judge(metrics), "latent.matched_ratio")]
    assert verdicts["kept"] == [False, True]  # upper bound fails
    assert verdicts["like a stranger"] == [True, True]
    assert verdicts["below strangers"] == [True, False]  # lower bound fails


def _bank_for_mia(subject_scores: dict[str, list[float]], stranger_scores: dict[str, list[float]],
                  *, spans: bool = False) -> tuple[SimpleNamespace, dict[int, list[Any]]]:
    """A bank whose sides only carry persons, and the scores `_record_scores` returns per side.

    Every attack gets the same score; the span attack gets None (no span) unless `spans`.
    """
    def side(groups: dict[str, list[float]]) -> tuple[Side, list[Any]]:
        persons = [p for p, scores in groups.items() for _ in scores]
        scores = [(x, x, x if spans else None) for values in groups.values() for x in values]
        return Side(records=(), spans=(), probes=(), facts=(), persons=tuple(persons)), scores

    forget, f_scores = side(subject_scores)
    strangers, s_scores = side(stranger_scores)
    return SimpleNamespace(forget=forget, strangers=strangers), {id(forget): f_scores, id(strangers): s_scores}


@pytest.fixture()
def fake_scores(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[Any]]:
    table: dict[int, list[Any]] = {}
    monkeypatch.setattr(suite, "_record_scores", lambda loaded, side, s: table[id(side)])
    return table


def test_membership_auc_is_judged_against_the_empirical_null_of_the_strangers(
    fake_scores: dict[int, list[Any]],
) -> None:
    # Three strangers of subject 0.  Each stranger against the other two: [1, 2] is below all
    # of {3, 4, 5, 6} (AUC 0), [3, 4] beats half of {1, 2, 5, 6} (0.5), [5, 6] beats all (1).
    strangers = {"0:0": [1.0, 2.0], "0:1": [3.0, 4.0], "0:2": [5.0, 6.0]}
    null_stderr = float(np.std([0.0, 0.5, 1.0], ddof=1))  # one subject: sqrt(var / 1)
    s = VerifySettings()
    for subject, auc in (([7.0, 8.0], 1.0), ([0.0, 0.5], 0.0), ([3.5, 3.6], 0.5)):
        bank, table = _bank_for_mia({"0": subject}, strangers)
        fake_scores.clear()
        fake_scores.update(table)
        out = suite._mia(None, bank, s)
        assert out["mia.auc"] == pytest.approx(auc)
        assert out["mia.auc_gap"] == pytest.approx(abs(auc - 0.5))  # two-sided
        assert out["mia.auc.stderr"] == pytest.approx(null_stderr)
        assert out["mia.auc_gap.stderr"] == pytest.approx(null_stderr)
        assert (out["mia.auc.n_forget"], out["mia.auc.n_control"], out["mia.auc.n_subjects"]) == (2, 6, 1)
        assert "mia.span_auc" not in out  # no record has an identifying span


def test_membership_is_averaged_over_subjects_each_against_its_own_strangers(
    fake_scores: dict[int, list[Any]],
) -> None:
    strangers = {"0:0": [1.0, 2.0], "0:1": [3.0, 4.0], "0:2": [5.0, 6.0],
                 "1:0": [10.0, 20.0], "1:1": [30.0, 40.0], "1:2": [50.0, 60.0]}
    # Subject 0 is above its strangers (AUC 1); subject 1's [7, 8] is below all of its own
    # strangers (AUC 0), although it would be above subject 0's.
    bank, table = _bank_for_mia({"0": [7.0, 8.0], "1": [7.0, 8.0]}, strangers)
    fake_scores.update(table)
    out = suite._mia(None, bank, VerifySettings())
    assert out["mia.auc"] == pytest.approx(0.5)
    assert out["mia.auc.n_subjects"] == 2
    assert out["mia.auc.stderr"] == pytest.approx(math.sqrt(np.var([0, 0.5, 1], ddof=1) / 2))


def test_membership_uses_at_most_the_configured_records_per_subject(fake_scores: dict[int, list[Any]]) -> None:
    strangers = {f"0:{k}": [float(k), float(k) + 0.5] for k in range(4)}
    bank, table = _bank_for_mia({"0": [9.0, 9.0, -9.0, -9.0]}, strangers)
    fake_scores.update(table)
    assert suite._mia(None, bank, VerifySettings(mia_records_per_subject=2))["mia.auc"] == 1.0
    assert suite._mia(None, bank, VerifySettings(mia_records_per_subject=4))["mia.auc"] == pytest.approx(0.5)


def _interleaved_strangers(n: int = 6) -> dict[str, list[float]]:
    """Strangers whose scores interleave: each looks like the others (a tight null)."""
    return {f"0:{k}": [j + 0.01 * k for j in range(8)] for k in range(n)}


@pytest.mark.parametrize("subject, expect_pass, v1_pass", [
    ([100.0 + j for j in range(8)], False, False),  # more familiar than every stranger: a member
    ([-100.0 + j for j in range(8)], False, True),  # LESS familiar than every stranger: erased too hard
    ([j + 0.025 for j in range(8)], True, True),  # among the strangers
])
def test_policy_v2_fails_membership_both_when_more_and_when_less_familiar_than_strangers(
    fake_scores: dict[int, list[Any]], subject: list[float], expect_pass: bool, v1_pass: bool,
) -> None:
    bank, table = _bank_for_mia({"0": subject}, _interleaved_strangers(), spans=True)
    fake_scores.update(table)
    metrics: dict[str, float] = {}
    clock = suite._Clock(None, "")  # type: ignore[arg-type]
    suite._mia_family(metrics, None, SimpleNamespace(mia={}), bank, VerifySettings(), clock)
    assert clock.unmeasured == {}
    v2 = {c.metric: c for c in DEFAULT_POLICY.judge(metrics, clock.unmeasured) if c.metric.startswith("mia.")}
    assert set(v2) == {"mia.auc_gap", "mia.zlib_auc_gap", "mia.span_auc_gap"}
    for metric in ("mia.auc_gap", "mia.zlib_auc_gap", "mia.span_auc_gap"):
        assert v2[metric].status == "measured" and v2[metric].passed is expect_pass, (metric, metrics)
    # v1 bounded the AUC from above only: it passes the candidate that looks less familiar.
    (v1,) = [c for c in get_policy("default", "1").judge(metrics) if c.metric == "mia.auc"]
    assert v1.passed is v1_pass


def test_membership_without_spans_or_with_too_few_strangers_is_unmeasured_with_a_reason(
    fake_scores: dict[int, list[Any]],
) -> None:
    bank, table = _bank_for_mia({"0": [5.0, 6.0]}, _interleaved_strangers(), spans=False)
    fake_scores.update(table)
    metrics: dict[str, float] = {}
    clock = suite._Clock(None, "")  # type: ignore[arg-type]
    suite._mia_family(metrics, None, SimpleNamespace(mia={}), bank, VerifySettings(), clock)
    assert clock.unmeasured == {"mia.span_auc_gap": NO_SPANS}
    span = _by_name(DEFAULT_POLICY.judge(metrics, clock.unmeasured))[
        "membership parity, Min-K%++ over identifying spans (|AUC - 0.5|)"]
    assert (span.status, span.value, span.passed, span.rule) == ("unmeasured", None, True,
                                                                 f"{NO_SPANS}: passes")

    # Two strangers give no null to judge against: nothing is measured, and that fails.
    bank, table = _bank_for_mia({"0": [5.0, 6.0]}, {"0:0": [1.0], "0:1": [2.0]}, spans=True)
    fake_scores.clear()
    fake_scores.update(table)
    metrics, clock = {}, suite._Clock(None, "")  # type: ignore[arg-type]
    suite._mia_family(metrics, None, SimpleNamespace(mia={}), bank, VerifySettings(), clock)
    assert not any(k.startswith("mia.auc") for k in metrics)
    assert clock.unmeasured == {"mia.auc_gap": NOT_COMPUTED, "mia.zlib_auc_gap": NOT_COMPUTED,
                                "mia.span_auc_gap": NO_SPANS}
    results = {c.metric: c for c in DEFAULT_POLICY.judge(metrics, clock.unmeasured)}
    assert not results["mia.auc_gap"].passed and results["mia.auc_gap"].rule == f"{NOT_COMPUTED}: fails"
    assert all(note.startswith(tuple(clock.unmeasured)) for note in clock.notes)


# ---------------------------------------------------------------- unmeasured metrics


def test_an_unmeasured_metric_passes_only_for_the_reasons_its_check_accepts() -> None:
    latent = "latent residual knowledge"
    for reason, passes in ((BASE_SILENT, True), (TOO_FEW_RECORDS, False), (NOT_COMPUTED, False)):
        result = _by_name(DEFAULT_POLICY.judge({}, {"latent.matched_ratio": reason}))[latent]
        assert (result.status, result.value, result.threshold) == ("unmeasured", None, None)
        assert result.passed is passes
        assert result.rule == f"{reason}: {'passes' if passes else 'fails'}"
    pressure = _by_name(DEFAULT_POLICY.judge({}, {"attack.pressure_leakage": NO_QUESTIONS}))
    assert pressure["prompt-pressure attack, against the same questions about a stranger"].passed
    relearn = _by_name(DEFAULT_POLICY.judge({}, {"attack.relearn_paired_recovery": NO_QUESTIONS}))
    assert not relearn[RELEARN_V7].passed


def test_a_missing_metric_is_skipped_for_bare_metrics_and_failed_when_the_suite_judges() -> None:
    bare = DEFAULT_POLICY.judge({"mia.auc_gap": 0.0, "mia.auc_gap.stderr": 0.0})
    assert [r.metric for r in bare] == ["mia.auc_gap"] and bare[0].passed
    # The suite always passes its unmeasured map: then nothing missing is left out, and
    # what was never computed fails.
    judged = DEFAULT_POLICY.judge({"mia.auc_gap": 0.0, "mia.auc_gap.stderr": 0.0}, {})
    assert len(judged) == len(DEFAULT_POLICY.checks)
    missing = [r for r in judged if r.metric != "mia.auc_gap"]
    assert missing and all(r.status == "unmeasured" for r in missing)
    assert all(r.rule == f"{NOT_COMPUTED}: fails" and not r.passed for r in missing)
    # A metric present whose control level is missing takes the control level's reason.
    (leak, *_) = DEFAULT_POLICY.judge({"leakage.forget": 0.0}, {"leakage.strangers": TOO_FEW_RECORDS})
    assert (leak.status, leak.rule) == ("unmeasured", f"{TOO_FEW_RECORDS}: fails")
    nan = _by_name(DEFAULT_POLICY.judge({"utility.ppl_ratio": float("nan")}, {}))["held-out perplexity"]
    assert nan.status == "unmeasured" and not nan.passed  # NaN is never a pass


def _latent_bank(n_forget: int, n_control: int) -> SimpleNamespace:
    """What `_latent_family` counts: facts on each side (the subject's facts about strangers as
    many as theirs) and retained records for the lens."""
    fact = SimpleNamespace()
    return SimpleNamespace(
        forget=SimpleNamespace(facts=(fact,) * n_forget), control=SimpleNamespace(facts=(fact,) * n_control),
        latent_strangers=(fact,) * n_forget, latent_matched=(fact,) * n_forget, retain_records=(object(),) * 20)


def test_the_latent_family_names_why_its_ratio_could_not_be_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    s = VerifySettings(bootstrap=20)
    silent = np.vstack([np.zeros(6, bool), np.arange(6) % 2 == 0])  # no better than strangers
    chance = np.vstack([np.zeros(8, bool), np.arange(8) % 2 == 0])
    silent_base = suite.LatentReadings(silent, silent)
    monkeypatch.setattr(suite, "_latent", lambda cand, bank, tests, s: [
        silent_base, suite.LatentReadings(chance, chance), suite.LatentReadings(silent, silent),
        suite.LatentReadings(silent, silent)])
    bank = _latent_bank(6, 8)
    metrics: dict[str, float] = {}
    clock = suite._Clock(None, "gates_off.")  # type: ignore[arg-type]
    suite._latent_family(metrics, None, SimpleNamespace(latent_forget=silent_base), bank, s, 0, clock)
    assert "latent.residual_ratio" not in metrics and metrics["latent.usable_layers"] == 0
    assert "latent.value_ratio" not in metrics and metrics["latent.value.usable_layers"] == 0
    assert clock.unmeasured == {"gates_off.latent.residual_ratio": BASE_SILENT,
                                "gates_off.latent.value_ratio": BASE_SILENT,
                                "gates_off.latent.paired_ratio": BASE_SILENT,
                                "gates_off.latent.matched_ratio": BASE_SILENT}
    results = _by_name(DEFAULT_POLICY.judge({}, clock.unmeasured))
    assert results["latent traces with gates off"].passed  # nothing the check could find

    bank = _latent_bank(1, 8)  # one forget fact: too few to measure, and that fails
    metrics, clock = {}, suite._Clock(None, "")  # type: ignore[arg-type]
    suite._latent_family(metrics, None, SimpleNamespace(latent_forget=silent_base), bank, s, 0, clock)
    assert clock.unmeasured == {"latent.residual_ratio": TOO_FEW_RECORDS, "latent.value_ratio": TOO_FEW_RECORDS,
                                "latent.paired_ratio": TOO_FEW_RECORDS, "latent.matched_ratio": TOO_FEW_RECORDS}
    assert not _by_name(DEFAULT_POLICY.judge(metrics, clock.unmeasured))["latent residual knowledge"].passed


def test_the_latent_family_reads_every_way_from_the_same_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first-token and the whole-value reading are separate metrics of one pass: a value whose
    first token alone is still preferred reads as known by the first and not by the second; the
    whole value is judged against control people and against the subject's facts about strangers."""
    s = VerifySettings(bootstrap=20)
    knows = np.vstack([np.zeros(6), np.ones(6)])
    half = np.vstack([np.zeros(6), np.full(6, 0.5)])
    chance = np.vstack([np.zeros(8), np.full(8, 0.5)])
    rare = np.vstack([np.zeros(6), np.full(6, 0.25)])  # the same values asked about strangers
    monkeypatch.setattr(suite, "_latent", lambda cand, bank, tests, s: [
        suite.LatentReadings(knows, half), suite.LatentReadings(chance, chance), suite.LatentReadings(rare, rare),
        suite.LatentReadings(rare, rare)])
    metrics: dict[str, float] = {}
    clock = suite._Clock(None, "")  # type: ignore[arg-type]
    suite._latent_family(metrics, None, SimpleNamespace(latent_forget=suite.LatentReadings(knows, knows)),
                         _latent_bank(6, 8), s, 0, clock)
    assert metrics["latent.residual_ratio"] == pytest.approx(1.0)
    assert metrics["latent.value_ratio"] == pytest.approx(0.0)
    assert metrics["latent.value.acc_forget"] == pytest.approx(0.5) and not clock.unmeasured
    # Against the subject's own values asked about strangers (rarely preferred: unpopular values),
    # the same 0.5 is above what a stranger gets: (0.5 - 0.25) / (1 - 0.25).
    assert metrics["latent.paired_ratio"] == pytest.approx(1 / 3)
    assert metrics["latent.matched_ratio"] == pytest.approx(1 / 3)  # v7's null, read the same way


# ---------------------------------------------------------------- policies and their documents


def test_policies_are_versioned_and_a_changed_threshold_needs_a_new_version() -> None:
    v1 = register_policy(Policy("strict-test", "1", (CheckSpec("m", "mia.auc_gap", "<=", 0.05),)))
    v2 = register_policy(Policy("strict-test", "2", (CheckSpec("m", "mia.auc_gap", "<=", 0.02),)))
    assert register_policy(Policy("strict-test", "1", (CheckSpec("m", "mia.auc_gap", "<=", 0.05),))) == v1
    assert get_policy("strict-test", "1") == v1
    assert get_policy("strict-test") == v2 != v1
    assert get_policy("default") is DEFAULT_POLICY and DEFAULT_POLICY.version == "10"
    assert get_policy("default", "1").version == "1"
    with pytest.raises(ValueError, match="already exists"):
        register_policy(Policy("strict-test", "1", (CheckSpec("m", "mia.auc_gap", "<=", 0.9),)))
    with pytest.raises(KeyError):
        get_policy("no-such-policy")
    with pytest.raises(KeyError):
        get_policy("default", "99")


DROP = object()


def _document(**changes: Any) -> dict[str, Any]:
    check = {"name": "leak", "metric": "leakage.forget", "comparator": "<=", "margin": 0.02,
             "baseline": "leakage.control", "noise_z": 1.645, "unmeasured_passes": [NO_QUESTIONS]}
    doc: dict[str, Any] = {"name": "units-doc", "version": "1", "checks": [check],
                           "allow_suppression": False,
                           "escalation": {"asu": {"scale": {"steps": 3.0},
                                                  "cures": {"leakage.": {"scale": {"steps": 2.0}}},
                                                  "settings": {"attack.relearn": {"stranger_anchor": True}}}}}
    for key, value in changes.items():
        where, field = (check, key[6:]) if key.startswith("check_") else (doc, key)
        if value is DROP:
            where.pop(field)
        else:
            where[field] = value
    return doc


def test_a_policy_document_is_read_registered_and_judges_like_the_same_policy_in_code() -> None:
    policy = policy_from_json(json.loads(json.dumps(_document())))
    assert get_policy("units-doc", "1") is policy
    (spec,) = policy.checks
    assert spec == CheckSpec("leak", "leakage.forget", "<=", 0.02, "leakage.control", 1.645,
                             unmeasured_passes=(NO_QUESTIONS,))
    assert policy.allow_suppression is False
    assert policy.escalation["asu"].cures == {"leakage.": ({"steps": 2.0}, {})}
    assert policy.escalation["asu"].settings == {"attack.relearn": {"stranger_anchor": True}}
    (result,) = policy.judge({"leakage.forget": 0.2, "leakage.control": 0.0, "leakage.forget.stderr": 0.05})
    assert not result.passed and result.threshold == pytest.approx(0.02 + 1.645 * 0.05)


@pytest.mark.parametrize("changes, complaint", [
    ({"checks": DROP}, "checks"),
    ({"name": DROP}, "name"),
    ({"checks": []}, "comparator"),
    ({"checks": "leakage.forget <= 0.05"}, "not a policy document"),
    ({"check_comparator": "<"}, "comparator"),
    ({"check_margin": "a little"}, "a little"),
    ({"check_margin": DROP}, "margin"),
    ({"check_noise_z": None}, "not a policy document"),
    ({"check_metric": DROP}, "metric"),
    ({"check_decides_pass": "false"}, "decides_pass"),
    ({"allow_suppression": "false"}, "allow_suppression"),
    ({"check_unmeasured_passes": BASE_SILENT}, "unmeasured_passes"),
    ({"check_unchanged": True}, "unchanged"),
    ({"escalation": {"asu": ["steps"]}}, "not a policy document"),
])
def test_a_bad_policy_document_is_refused_with_a_value_error_naming_the_problem(
    changes: dict[str, Any], complaint: str,
) -> None:
    doc = _document(**changes, version=f"bad-{sorted(changes)[0]}")
    with pytest.raises(ValueError, match=complaint):
        policy_from_json(doc)
    with pytest.raises(KeyError):
        get_policy("units-doc", doc["version"])  # nothing half-read was registered


def test_a_policy_document_for_a_registered_version_must_not_change_its_thresholds() -> None:
    policy_from_json(_document(version="7"))
    with pytest.raises(ValueError, match="already exists"):
        policy_from_json(_document(version="7", check_margin=0.5))
    with pytest.raises(ValueError):
        policy_from_json([_document()])  # type: ignore[arg-type]


def test_escalation_applies_the_cure_of_each_failed_check() -> None:
    leak = DEFAULT_POLICY.judge({"leakage.forget": 0.9, "leakage.strangers": 0.0})
    utility = DEFAULT_POLICY.judge({"utility.retain_ratio": 0.5})
    hparams = {"steps": 100, "forget_weight": 1.0, "retain_weight": 1.0, "lr": 1e-3, "tau": 4.0}
    harder = policy_escalate(DEFAULT_POLICY, method="asu", hparams=hparams, failed_checks=leak)
    assert harder == {**hparams, "steps": 200, "forget_weight": 1.5}
    gentler = policy_escalate(DEFAULT_POLICY, method="asu", hparams=hparams, failed_checks=utility)
    assert gentler == {**hparams, "retain_weight": 2.0, "lr": pytest.approx(5e-4)}
    passed = DEFAULT_POLICY.judge({"leakage.forget": 0.0, "leakage.strangers": 0.0})
    assert all(c.passed for c in passed)
    assert policy_escalate(DEFAULT_POLICY, method="asu", hparams=hparams, failed_checks=passed) is None
    assert policy_escalate(DEFAULT_POLICY, method="unknown", hparams=hparams, failed_checks=leak) is None
    noted = policy_escalate(DEFAULT_POLICY, method="asu", hparams={**hparams, "escalation": []},
                            failed_checks=leak)
    assert noted is not None and any("leakage.forget failed: steps 100 -> 200" in n for n in noted["escalation"])


def test_a_relearning_failure_turns_on_the_refreshed_teacher_with_anchored_strangers() -> None:
    relearned = [c for c in DEFAULT_POLICY.judge({"attack.relearn_paired_recovery": 1.0,
                                                   "attack.relearn_paired_stranger": 0.0})
                 if not c.passed]
    assert relearned
    hparams = {"steps": 100, "forget_weight": 1.0, "teacher_refresh": 0, "stranger_anchor": False,
               "escalation": []}
    stronger = policy_escalate(DEFAULT_POLICY, method="asu", hparams=hparams, failed_checks=relearned)
    assert stronger is not None
    assert stronger["teacher_refresh"] == 50 and stronger["stranger_anchor"] is True
    assert stronger["steps"] == 200  # the attack cure as well
    assert "attack.relearn_paired_recovery failed: stranger_anchor False -> True (set)" in stronger["escalation"]
    # Already on, or a method without those fields: nothing set, nothing noted.
    on = policy_escalate(DEFAULT_POLICY, method="asu", failed_checks=relearned,
                         hparams={**hparams, "teacher_refresh": 50, "stranger_anchor": True})
    assert on is not None and not any("(set)" in n for n in on["escalation"])
    kif = policy_escalate(DEFAULT_POLICY, method="kif", failed_checks=relearned,
                          hparams={"steps": 100, "distill_steps": 10, "escalation": []})
    assert kif is not None and "stranger_anchor" not in kif and "teacher_refresh" not in kif
    # Failures the teacher does not cause leave it as it was (a leak does switch it on:
    # tests/unlearning/test_escalation.py).
    kept = [c for c in DEFAULT_POLICY.judge({"utility.retain_ratio": 0.5}) if not c.passed]
    gentler = policy_escalate(DEFAULT_POLICY, method="asu", failed_checks=kept,
                              hparams={**hparams, "retain_weight": 1.0, "lr": 1e-3})
    assert gentler is not None and gentler["teacher_refresh"] == 0 and gentler["stranger_anchor"] is False


# ---------------------------------------------------------------- the report


def _report(**changes: Any) -> Report:
    metrics = {"leakage.forget": 0.25, "leakage.control": 0.0, "leakage.forget.stderr": 0.05,
               "utility.ppl_ratio": 1.125, "mia.auc_gap": 0.03125, "mia.auc_gap.stderr": 0.0625}
    unmeasured = {"latent.matched_ratio": BASE_SILENT}
    checks = tuple(DEFAULT_POLICY.judge(metrics, unmeasured))
    fields: dict[str, Any] = dict(
        metrics=metrics, checks=checks, policy=DEFAULT_POLICY.to_json(), guarantee="weights",
        passed=all(c.passed for c in checks if c.decides_pass), timings={"leakage": 1.5, "total": 2.25},
        control_source="control corpus (3 records)", notes=("a note",), cached=("base perplexity",),
        settings={"samples": 1}, unmeasured=unmeasured, details={"forget_records": 3})
    fields.update(changes)
    return Report(**fields)


def test_a_report_survives_its_json_round_trip() -> None:
    report = _report()
    data = json.loads(report.dumps())
    back = Report.from_json(data)
    assert back.to_json() == report.to_json()
    assert back.checks == report.checks  # status and rule of unmeasured checks included
    assert back.unmeasured == {"latent.matched_ratio": BASE_SILENT}
    assert back.failed_checks == report.failed_checks and back.failed_checks
    assert not back.passed
    latent = _by_name(list(back.checks))["latent residual knowledge"]
    assert (latent.status, latent.rule, latent.passed) == ("unmeasured", f"{BASE_SILENT}: passes", True)
    assert Report.from_json({**data, "seconds": 3.0}).to_json() == report.to_json()  # extra keys kept out


def test_a_report_is_strict_json_with_non_finite_values_written_as_null() -> None:
    report = _report(metrics={"utility.ppl_ratio": math.inf, "x": math.nan, "y": 0.1234567891})
    text = report.dumps()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["metrics"] == {"utility.ppl_ratio": None, "x": None, "y": 0.123457}
    back = Report.from_json(data)
    assert math.isnan(back.metrics["utility.ppl_ratio"]) and back.metrics["y"] == 0.123457


@pytest.mark.parametrize("damage", [
    lambda d: d.pop("guarantee"),
    lambda d: d.pop("passed"),
    lambda d: d["metrics"].update({"leakage.forget": "a lot"}),
    lambda d: d.update(checks=[{"name": "x"}]),
    lambda d: d.update(timings=["leakage"]),
    lambda d: d.clear() or d.update(report=[1, 2]),
])
def test_a_damaged_report_document_is_refused_with_a_report_error(damage: Any) -> None:
    data = _report().to_json()
    damage(data)
    with pytest.raises(ReportError):
        Report.from_json(data)


def test_a_report_is_saved_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "deep" / "report.json"
    report = _report()
    assert report.save(target) == target
    assert Report.load(target).to_json() == report.to_json()
    before = target.read_bytes()

    def crash(src: str, dst: str) -> None:
        raise OSError("disk pulled out")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", crash)
        with pytest.raises(OSError, match="disk pulled out"):
            _report(guarantee="suppression").save(target)
    assert target.read_bytes() == before  # the old report is whole
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]  # and no temporary file is left

    with pytest.raises(ValueError):  # a value JSON cannot hold fails before anything is replaced
        _report(timings={"total": math.nan}).save(target)
    assert target.read_bytes() == before
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]

    target.write_text("{not json", encoding="utf-8")
    with pytest.raises(ReportError):
        Report.load(target)
    with pytest.raises(ReportError):
        Report.load(tmp_path / "missing.json")
    target.write_text("[]", encoding="utf-8")  # JSON, but no report
    with pytest.raises(ReportError):
        Report.load(target)


# ---------------------------------------------------------------- membership scores


def test_min_k_plus_plus_scores_tokens_the_model_prefers_above_tokens_it_does_not() -> None:
    mu, sigma = np.full(5, -2.0), np.full(5, 1.0)
    member = TokenScores(logp=np.full(5, -0.5), mu=mu, sigma=sigma)
    stranger = TokenScores(logp=np.array([-0.5, -0.5, -0.5, -0.5, -6.0]), mu=mu, sigma=sigma)
    assert min_k_plus_plus(member, k=0.2) == pytest.approx(1.5)  # (-0.5 - -2) / 1
    assert min_k_plus_plus(stranger, k=0.2) == pytest.approx(-4.0)  # the lowest 20 %: one token
    assert min_k_plus_plus(stranger, k=0.4) == pytest.approx((-4.0 + 1.5) / 2)
    assert min_k_plus_plus(stranger, k=1.0, tokens=[0, 1, 99]) == pytest.approx(1.5)  # out of range ignored
    assert min_k_plus_plus(stranger, k=1.0, tokens=[]) == 0.0


def test_the_zlib_ratio_divides_the_log_likelihood_by_the_compressed_length() -> None:
    scores = TokenScores(logp=np.array([-1.0, -2.0]), mu=np.zeros(2), sigma=np.ones(2))
    text = "Dmitri Ueda was born in Lisbon."
    assert zlib_ratio(scores, text) == pytest.approx(-3.0 / len(zlib.compress(text.encode())))
    # The same likelihood on text that compresses well (merely easy text) scores lower.
    assert zlib_ratio(scores, "ab" * 40) < zlib_ratio(scores, "q7Zp@x!Kd0w#LmRv2^Yc8&Nf5*Tb3Hs")


def test_auc_with_hanley_mcneil_stderr() -> None:
    assert auc_with_stderr([3.0, 4.0, 5.0], [0.0, 1.0, 2.0])[0] == 1.0
    assert auc_with_stderr([0.0, 1.0], [3.0, 4.0])[0] == 0.0
    assert auc_with_stderr([1.0, 2.0], [1.0, 2.0])[0] == 0.5
    assert auc_with_stderr([], [1.0]) == (0.5, 0.0)
    auc, se = auc_with_stderr([2.0, 3.0], [1.0, 2.5])  # 3 of 4 pairs ordered
    q1, q2 = 0.75 / 1.25, 2 * 0.75**2 / 1.75
    assert auc == pytest.approx(0.75)
    assert se == pytest.approx(math.sqrt((0.75 * 0.25 + (q1 - 0.75**2) + (q2 - 0.75**2)) / 4))


@pytest.mark.parametrize("seed", range(6))
def test_auc_is_the_roc_auc_of_scikit_learn_ties_included(seed: int) -> None:
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    n1, n0 = int(rng.integers(1, 15)), int(rng.integers(1, 400))
    # Rounded to one decimal so that many scores tie, within and across the two groups.
    positive = np.round(rng.normal(0.3 * seed, 1.0, n1), 1).tolist()
    negative = np.round(rng.normal(0.0, 1.0, n0), 1).tolist()
    expected = roc_auc_score([1] * n1 + [0] * n0, positive + negative)
    assert auc_with_stderr(positive, negative)[0] == pytest.approx(expected, abs=1e-12)


# ---------------------------------------------------------------- latent ratio and fluency


def test_the_residual_ratio_is_one_when_nothing_was_forgotten_and_zero_at_the_control_level() -> None:
    rng = np.random.default_rng(0)
    base = np.vstack([rng.random(40) < 0.3, np.ones(40, bool), rng.random(40) < 0.9])
    control = np.vstack([rng.random(60) < 0.3, rng.random(60) < 0.1, rng.random(60) < 0.1])
    same = residual_knowledge_ratio(base, control, base, bootstrap=50)
    assert same.value == pytest.approx(1.0) and same.layer in (1, 2) and same.measurable
    forgotten = np.vstack([base[0], np.zeros(40, bool), np.zeros(40, bool)])
    gone = residual_knowledge_ratio(forgotten, control, base, bootstrap=50)
    assert gone.value < 0.05 and gone.ci_high < 0.3
    # Only the embedding layer tells the subject from control: it is never counted.
    embedding_only = np.vstack([np.ones(40, bool), np.zeros(40, bool), np.zeros(40, bool)])
    ratio = residual_knowledge_ratio(embedding_only, np.zeros((3, 60), bool), embedding_only)
    assert (ratio.value, ratio.layer, ratio.usable_layers, ratio.measurable) == (0.0, -1, 0, False)


def test_looping_and_empty_answers_are_degenerate_but_a_wrong_sentence_is_not() -> None:
    assert is_looping("mitrimitrimitrimitrimitri")
    assert is_looping("born born born in Oslo")
    assert is_looping("the cat the cat the cat sat")
    assert is_degenerate("  ...  ")
    assert not is_degenerate("Dmitri Kaminski was born on 2 June 1954.")
    assert not is_degenerate("Dmitri Ueda is also known as D. Ueda.")


def test_an_answer_is_gibberish_when_the_base_finds_most_of_it_implausible() -> None:
    def scores(nll: list[float]) -> TokenScores:
        return TokenScores(logp=-np.array(nll), mu=np.zeros(len(nll)), sigma=np.ones(len(nll)))

    reference = [scores([0.5, 1.0, 1.5]), scores([1.0, 1.0]), scores([2.0])]
    limit = plausibility_limit(reference, margin=2.0)
    assert limit == pytest.approx(float(np.percentile([1.0, 1.0, 2.0], 95)) + 2.0)
    assert median_nll(scores([0.1, 9.0, 0.2])) == pytest.approx(0.2)  # one surprising value token
    flags = gibberish_flags(
        ["Dmitri Ueda was born in Oslo.", "zq vok prell dunst", "born born born born"],
        [scores([0.1, 9.0, 0.2]), scores([6.0, 7.0, 5.0]), scores([0.1, 0.1])], limit=limit)
    assert flags == [False, True, True]
    assert plausibility_limit([], margin=2.0) == math.inf


# ---------------------------------------------------------------- the probe bank (no model)


SUBJECT_ID = "p0003"


@pytest.fixture(scope="module")
def tiny_sets(tiny_corpus_dir: Path) -> ErasureSets:
    person = next(p for p in load_people(tiny_corpus_dir / "people.jsonl") if p["person_id"] == SUBJECT_ID)
    return build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"),
                      [Subject(person["name"], tuple(person["aliases"]))], seed=0)


def _subject_words(sets: ErasureSets) -> set[str]:
    subject = sets.subjects[0]
    return {w for name in (subject.name, *subject.aliases) for w in normalise_text(name).split() if len(w) > 2}


def test_counterfactual_controls_ask_the_subjects_own_probes_about_strangers(tiny_sets: ErasureSets) -> None:
    bank, notes = build_bank(tiny_sets, control=None, corpus=None, heldout=None,
                             settings=VerifySettings(), seed=0)
    assert bank.control_kind == COUNTERFACTUAL and bank.control_source.startswith("counterfactual")
    assert any("no control corpus" in n for n in notes)
    assert bank.forget.probes and len(bank.control.probes) <= len(bank.forget.probes)
    words = _subject_words(tiny_sets)
    assert words
    for probe in bank.control.probes:
        assert not words & set(normalise_text(f"{probe.prompt} {probe.prefix} {probe.expected}").split()), probe
        assert probe.record_id.endswith("~cf")
    # Same prompt shapes: each control probe is a forget probe with the identifiers swapped.
    shapes = Counter((p.kind, p.form) for p in bank.forget.probes)
    assert not Counter((p.kind, p.form) for p in bank.control.probes) - shapes
    assert len(bank.stranger_maps) == len(bank.forget.probes)


def test_the_fluency_strangers_change_who_an_answer_is_about_never_what_it_says(tiny_sets: ErasureSets) -> None:
    # An answer about the subject is scored by the base as the same answer about a stranger:
    # the names change, a date or an address in it is its content and stays.
    bank, _ = build_bank(tiny_sets, control=None, corpus=None, heldout=None, settings=VerifySettings(), seed=0)
    record_of = {r.id: r for r in tiny_sets.forget}
    dated = [(p, m) for p, m in zip(bank.forget.probes, bank.stranger_maps, strict=True)
             if any(s.kind == "date" for s in find_spans(record_of[p.record_id], tiny_sets.subjects[0]))]
    assert dated and all(m for _, m in dated)
    for probe, mapping in dated:
        kinds = {s.text: s.kind for s in find_spans(record_of[probe.record_id], tiny_sets.subjects[0])}
        assert all(kinds.get(key) in (None, "name", "name_part", "email", "url", "identifier") for key in mapping), mapping


def test_the_stranger_probes_are_the_subjects_questions_about_someone_else(tiny_sets: ErasureSets) -> None:
    bank, _ = build_bank(tiny_sets, control=None, corpus=None, heldout=None, settings=VerifySettings(), seed=0)
    asked = bank.stranger_probes()
    assert len(asked) == len(bank.forget.probes)
    words = _subject_words(tiny_sets)
    changed = 0
    for original, probe in zip(bank.forget.probes, asked, strict=True):
        assert (probe.kind, probe.form, probe.record_id) == (original.kind, original.form, original.record_id)
        changed += probe.prompt != original.prompt
        assert not words & set(normalise_text(probe.prompt).split()), probe.prompt
    assert changed >= len(asked) // 2


def test_paired_stderr_is_the_spread_of_the_differences_never_below_one_discordant_pair() -> None:
    same = [True, False] * 10
    assert suite.paired_stderr(same, same) == pytest.approx(math.sqrt((1 / 20) / 20))
    a, b = [True] * 10 + [False] * 10, [False] * 20
    d = np.array([1.0] * 10 + [0.0] * 10)
    assert suite.paired_stderr(a, b) == pytest.approx(math.sqrt(np.var(d, ddof=1) / 20))
    assert suite.paired_stderr([], []) == 0.0


def test_person_paired_stderr_counts_people_not_questions() -> None:
    # Two people, 30 questions each: one person's name garbled in 10 answers, the other's in none.
    persons = [0] * 30 + [1] * 30
    subject = [True] * 10 + [False] * 50
    stranger = [False] * 60
    iid = suite.paired_stderr(subject, stranger)
    clustered = suite.person_paired_stderr(subject, stranger, persons)
    # CR1 by hand: per person the summed deviation from the mean difference 1/6.
    by_hand = math.sqrt(((10 - 30 / 6) ** 2 + (0 - 30 / 6) ** 2) * 2 / 1) / 60
    assert clustered == pytest.approx(by_hand) and clustered > 2 * iid
    # The same ten answers spread over both people are the per-question noise again.
    spread = ([True] * 5 + [False] * 25) * 2
    assert suite.person_paired_stderr(spread, stranger, persons) == pytest.approx(suite.paired_stderr(spread, stranger))
    # One person: no spread between people to measure, the per-question error.
    assert suite.person_paired_stderr(subject, stranger, [0] * 60) == iid
    assert suite.person_paired_stderr([], [], []) == 0.0


def _flags(n_true: int, n: int = 33, start: int = 0) -> list[bool]:
    return [start <= i < start + n_true for i in range(n)]


V8_SUBJECT = "fluency about the subject, against the same questions about several strangers (content tokens)"
V8_STRANGERS = "fluency about strangers in the subject's questions, against the base (content tokens)"


def test_the_subject_is_judged_against_the_spread_of_several_strangers() -> None:
    # Measured on the tiny test corpus: the model retrained without the subject garbles 7 of
    # the 33 answers about the subject and 3, 10 and 4 about three strangers.
    subject, strangers = _flags(7), [_flags(3), _flags(10, start=20), _flags(4, start=5)]
    base = [_flags(3), _flags(3), _flags(3)]
    m = suite.strangers_fluency(subject, strangers, base, [0] * 33)
    rates = np.array([3, 10, 4]) / 33
    assert m["fluency.n_strangers"] == 3
    assert m["fluency.content_strangers_gibberish_rate"] == pytest.approx(17 / 99)
    assert m["fluency.content_strangers_gibberish_rate.spread"] == pytest.approx(np.std(rates, ddof=1))
    assert m["fluency.content_paired_gibberish_rate.strangers_stderr"] == pytest.approx(
        np.std(rates, ddof=1) * math.sqrt(1 + 1 / 3))
    assert m["fluency.base_content_strangers_gibberish_rate"] == pytest.approx(3 / 33)
    judged = _by_name(DEFAULT_POLICY.judge({"fluency.content_paired_gibberish_rate": 7 / 33, **m}))
    assert judged[V8_SUBJECT].passed and judged[V8_STRANGERS].passed
    # Babble about the subject is outside any stranger's range.
    babble = suite.strangers_fluency(_flags(30), strangers, base, [0] * 33)
    assert not _by_name(DEFAULT_POLICY.judge({"fluency.content_paired_gibberish_rate": 30 / 33, **babble}))[
        V8_SUBJECT].passed
    # A candidate that garbles every stranger's questions fails against the base.
    garbled = suite.strangers_fluency(subject, [_flags(25)] * 3, base, [0] * 33)
    assert not _by_name(DEFAULT_POLICY.judge({"fluency.content_paired_gibberish_rate": 7 / 33, **garbled}))[
        V8_STRANGERS].passed


def test_strangers_who_agree_leave_the_per_question_error_as_the_floor() -> None:
    subject, stranger = _flags(10), _flags(3)
    m = suite.strangers_fluency(subject, [stranger] * 3, [stranger] * 3, [0] * 33)
    assert m["fluency.content_strangers_gibberish_rate.spread"] == pytest.approx(0.0, abs=1e-12)
    assert m["fluency.content_paired_gibberish_rate.strangers_stderr"] == pytest.approx(
        suite.paired_stderr(subject, stranger))
    # Pooled over the strangers, clustered by stranger: identical answers leave the floor of 1/n.
    assert m["fluency.content_strangers_gibberish_rate.person_stderr"] == pytest.approx(math.sqrt(1 / 99 / 99))
    assert suite.strangers_fluency([], [], [], []) == {"fluency.n_strangers": 0.0}


def test_policy_v8_changes_only_the_two_paired_fluency_checks_and_no_threshold() -> None:
    v7, v8 = get_policy("default", "7"), get_policy("default", "8")
    assert v8.version == "8" and v7.escalation == v8.escalation
    changed = {(a.metric, b.metric, b.baseline, b.stderr)
               for a, b in zip(v7.checks, v8.checks, strict=True) if a != b}
    assert changed == {
        ("fluency.content_paired_gibberish_rate", "fluency.content_paired_gibberish_rate",
         "fluency.content_strangers_gibberish_rate", "fluency.content_paired_gibberish_rate.strangers_stderr"),
        ("fluency.content_stranger_gibberish_rate", "fluency.content_strangers_gibberish_rate",
         "fluency.base_content_strangers_gibberish_rate", "fluency.content_strangers_gibberish_rate.person_stderr"),
    }
    for a, b in zip(v7.checks, v8.checks, strict=True):  # never an easier threshold
        assert (a.comparator, a.margin, a.noise_z, a.decides_pass, a.unmeasured_passes) == (
            b.comparator, b.margin, b.noise_z, b.decides_pass, b.unmeasured_passes)
    # Without questions about the subject there is nothing to ask strangers: v7's rule.
    judged = _by_name(v8.judge({}, {"fluency.content_paired_gibberish_rate": NO_QUESTIONS,
                                    "fluency.content_strangers_gibberish_rate": NO_QUESTIONS}))
    assert judged[V8_SUBJECT].passed and judged[V8_STRANGERS].passed



LATENT_V9 = "latent residual knowledge"


def test_policy_v9_never_lets_the_latent_allowance_reach_the_unchanged_models_reading() -> None:
    v8, v9 = get_policy("default", "8"), get_policy("default", "9")
    assert v9 is get_policy("default", "9") and v8.escalation == v9.escalation
    changed = {b.metric for a, b in zip(v8.checks, v9.checks, strict=True) if a != b}
    assert changed == {"latent.matched_ratio", "gates_off.latent.matched_ratio"}
    for a, b in zip(v8.checks, v9.checks, strict=True):  # never an easier threshold
        assert replace(b, unchanged=None) == a
    # One person, five facts: the lens reads the values as the base did (1.0), error 0.48.
    few = {"latent.matched_ratio": 1.0, "latent.matched_ratio.stderr": 0.48}
    old, new = _by_name(v8.judge(few))[LATENT_V9], _by_name(v9.judge(few))[LATENT_V9]
    assert old.passed and old.threshold == pytest.approx(0.25 + 1.645 * 0.48) and old.rule is None
    assert not new.passed and new.threshold == pytest.approx((0.25 + 1.0) / 2)
    assert new.status == "measured" and new.rule is not None and new.rule.startswith(UNDERPOWERED)
    assert "22%" in new.rule  # P(N(0, 0.48) > 0.375): a reading at the limit fails as often
    assert _by_name(v9.judge({**few, "latent.matched_ratio": 0.6}))[LATENT_V9].passed
    # Where the allowance stays below the unchanged reading, v9 judges as v8 did.
    many = {"latent.matched_ratio": 0.5, "latent.matched_ratio.stderr": 0.2}
    old, new = _by_name(v8.judge(many))[LATENT_V9], _by_name(v9.judge(many))[LATENT_V9]
    assert (new.passed, new.threshold, new.rule) == (old.passed, old.threshold, None)
    assert not _by_name(v9.judge({**many, "latent.matched_ratio": 0.6}))[LATENT_V9].passed


def test_an_unchanged_reading_can_be_a_metric_and_a_bound_below_it_is_left_alone() -> None:
    spec = CheckSpec("leak", "leakage.forget", "<=", 0.05, "leakage.control", 1.645,
                     unchanged="leakage.base_forget")
    m = {"leakage.forget": 0.2, "leakage.control": 0.0, "leakage.forget.stderr": 0.1,
         "leakage.base_forget": 0.2}  # 0.05 + 1.645 * 0.1 reaches 0.2
    threshold, rule = spec.limit(m)
    assert threshold == pytest.approx(0.125) and rule is not None and UNDERPOWERED in rule
    assert spec.limit({**m, "leakage.base_forget": 0.5}) == (pytest.approx(0.05 + 0.1645), None)
    # The base itself inside the bound: nothing to balance (the base-blind note's case).
    assert spec.limit({**m, "leakage.base_forget": 0.04}) == (pytest.approx(0.05 + 0.1645), None)
    assert spec.limit({k: v for k, v in m.items() if k != "leakage.base_forget"})[1] is None
    doc = _document(check_unchanged="leakage.base_forget", version="unchanged-metric")
    assert policy_from_json(doc).checks[0].unchanged == "leakage.base_forget"


def test_the_fluency_checks_ask_the_subjects_questions_about_several_different_strangers(
    tiny_sets: ErasureSets,
) -> None:
    bank, _ = build_bank(tiny_sets, control=None, corpus=None, heldout=None, settings=VerifySettings(), seed=0)
    assert bank.n_fluency_strangers == VerifySettings().fluency_strangers == 3
    words = _subject_words(tiny_sets)
    asked = [bank.stranger_probes(j) for j in range(3)]
    for probes in asked:
        assert [(p.kind, p.form, p.record_id) for p in probes] == [
            (p.kind, p.form, p.record_id) for p in bank.forget.probes]
        assert not any(words & set(normalise_text(p.prompt).split()) for p in probes)
    # Three identities: the first question that names someone names three different people.
    differing = [i for i, p in enumerate(bank.forget.probes) if asked[0][i].prompt != p.prompt]
    assert differing and len({asked[j][differing[0]].prompt for j in range(3)}) == 3
    one, _ = build_bank(tiny_sets, control=None, corpus=None, heldout=None,
                        settings=VerifySettings(fluency_strangers=1), seed=0)
    assert one.n_fluency_strangers == 1 and one.more_stranger_maps == ()
    assert one.stranger_probes() == bank.stranger_probes()


def test_policy_v5_takes_the_paired_fluency_checks_noise_person_by_person() -> None:
    v4, v5 = get_policy("default", "4"), get_policy("default", "5")
    named = {c.metric: c.stderr for c in v5.checks if c.stderr}
    assert named == {"fluency.content_paired_gibberish_rate": "fluency.content_paired_gibberish_rate.person_stderr",
                     "fluency.content_stranger_gibberish_rate":
                         "fluency.content_stranger_gibberish_rate.person_stderr"}
    metrics = {"fluency.content_paired_gibberish_rate": 0.15, "fluency.content_stranger_gibberish_rate": 0.015,
               "fluency.content_paired_gibberish_rate.stderr": 0.04,
               "fluency.content_paired_gibberish_rate.person_stderr": 0.15}
    (four,) = _checks_on(v4.judge(metrics), "fluency.content_paired_gibberish_rate")
    (five,) = _checks_on(v5.judge(metrics), "fluency.content_paired_gibberish_rate")
    assert four.threshold == pytest.approx(0.015 + 0.05 + 1.645 * 0.04) and not four.passed
    assert five.threshold == pytest.approx(0.015 + 0.05 + 1.645 * 0.15) and five.passed
    # Babble about one of two people still fails: the clustered error cannot grow past the rate.
    babble = dict(metrics, **{"fluency.content_paired_gibberish_rate": 0.5})
    assert not _checks_on(v5.judge(babble), "fluency.content_paired_gibberish_rate")[0].passed


def test_a_policy_file_may_name_the_metric_holding_a_checks_standard_error() -> None:
    from unlearning.verification import policy_from_json

    policy = policy_from_json({"name": "stderr-file-test", "version": "1", "checks": [
        {"name": "m", "metric": "mia.auc_gap", "comparator": "<=", "margin": 0.1, "noise_z": 2.0,
         "stderr": "mia.auc_gap.person_stderr"}]})
    (check,) = policy.judge({"mia.auc_gap": 0.3, "mia.auc_gap.stderr": 0.0, "mia.auc_gap.person_stderr": 0.1})
    assert check.threshold == pytest.approx(0.3) and check.passed


def test_policy_v3_judges_fluency_about_the_subject_against_the_same_questions_about_a_stranger() -> None:
    # Measured on the demo: alias questions ("... of Q. Cardoso?") are answered "." about the
    # subject and about a stranger alike; the control corpus has no such question.
    def metrics(subject: list[bool], stranger: list[bool], base: list[bool]) -> dict[str, float]:
        control = Rate(1, 400)
        rate = Rate(sum(subject), len(subject))
        return {
            "fluency.gibberish_rate": rate.value, "fluency.control_gibberish_rate": control.value,
            "fluency.gibberish_rate.stderr": diff_stderr(rate, control),
            "fluency.paired_gibberish_rate": rate.value,
            "fluency.paired_gibberish_rate.stderr": suite.paired_stderr(subject, stranger),
            "fluency.stranger_gibberish_rate": sum(stranger) / len(stranger),
            "fluency.stranger_gibberish_rate.stderr": suite.paired_stderr(stranger, base),
            "fluency.base_stranger_gibberish_rate": sum(base) / len(base),
        }

    alias = [True] * 8 + [False] * 36
    like_a_stranger = metrics(alias, alias, [True] * 6 + [False] * 38)
    v2, v3 = get_policy("default", "2"), get_policy("default", "3")
    assert not _by_name(v2.judge(like_a_stranger))["fluency about the subject"].passed
    judged = {c.metric: c for c in v3.judge(like_a_stranger)}
    assert judged["fluency.paired_gibberish_rate"].passed and judged["fluency.stranger_gibberish_rate"].passed
    assert "fluency.gibberish_rate" not in judged
    # Babble about the subject only fails the first check ...
    only_subject = {c.metric: c for c in v3.judge(metrics([True] * 20 + [False] * 24, alias,
                                                          [True] * 6 + [False] * 38))}
    assert not only_subject["fluency.paired_gibberish_rate"].passed
    # ... babble about everyone asked this way fails the second.
    everyone = [True] * 20 + [False] * 24
    judged = {c.metric: c for c in v3.judge(metrics(everyone, everyone, [True] * 6 + [False] * 38))}
    assert judged["fluency.paired_gibberish_rate"].passed
    assert not judged["fluency.stranger_gibberish_rate"].passed
    # No question probe at all (free text only): a named rule, never a silent pass.
    absent = {c.metric: c for c in v3.judge({}, {"fluency.paired_gibberish_rate": NO_QUESTIONS,
                                                  "fluency.stranger_gibberish_rate": NO_QUESTIONS})}
    assert absent["fluency.paired_gibberish_rate"].passed
    assert absent["fluency.paired_gibberish_rate"].rule == f"{NO_QUESTIONS}: passes"
    assert not {c.metric: c for c in v3.judge({}, {"fluency.paired_gibberish_rate": NOT_COMPUTED})}[
        "fluency.paired_gibberish_rate"].passed


def test_policy_v4_judges_fluency_over_content_tokens_with_v3s_thresholds() -> None:
    v3, v4 = get_policy("default", "3"), get_policy("default", "4")
    changed = {(a.metric, b.metric) for a, b in zip(v3.checks, v4.checks, strict=True) if a != b}
    assert changed == {("fluency.paired_gibberish_rate", "fluency.content_paired_gibberish_rate"),
                       ("fluency.stranger_gibberish_rate", "fluency.content_stranger_gibberish_rate")}
    for a, b in zip(v3.checks, v4.checks, strict=True):  # never an easier threshold
        assert (a.comparator, a.margin, a.noise_z, a.decides_pass, a.unmeasured_passes) == (
            b.comparator, b.margin, b.noise_z, b.decides_pass, b.unmeasured_passes)
    babble = {"fluency.content_paired_gibberish_rate": 0.30, "fluency.content_paired_gibberish_rate.stderr": 0.05,
              "fluency.content_stranger_gibberish_rate": 0.02, "fluency.content_stranger_gibberish_rate.stderr": 0.02,
              "fluency.base_content_stranger_gibberish_rate": 0.0}
    judged = {c.metric: c for c in v4.judge(babble)}
    assert not judged["fluency.content_paired_gibberish_rate"].passed
    assert judged["fluency.content_stranger_gibberish_rate"].passed
    assert "fluency.paired_gibberish_rate" not in judged  # v3's metric does not decide v4


def test_policy_v6_judges_latent_traces_against_the_subjects_own_values_about_strangers() -> None:
    v5, v6 = get_policy("default", "5"), get_policy("default", "6")
    assert get_policy("default", "6") is v6 and DEFAULT_POLICY.version == "10"
    changed = {(a.metric, b.metric) for a, b in zip(v5.checks, v6.checks, strict=True) if a != b}
    assert changed == {("latent.value_ratio", "latent.paired_ratio"),
                       ("gates_off.latent.value_ratio", "gates_off.latent.paired_ratio")}
    for a, b in zip(v5.checks, v6.checks, strict=True):  # never an easier threshold
        assert (a.name, a.comparator, a.margin, a.noise_z, a.decides_pass, a.unmeasured_passes, a.stderr) == (
            b.name, b.comparator, b.margin, b.noise_z, b.decides_pass, b.unmeasured_passes, b.stderr)
    # A person whose values are rare reads below the control people to a model that never saw
    # them (v5 fails it), and like the strangers asked the same questions (v6 passes it).
    rare = {"latent.value_ratio": -0.9, "latent.value_ratio.stderr": 0.1,
            "latent.paired_ratio": 0.1, "latent.paired_ratio.stderr": 0.1}
    assert not all(c.passed for c in v5.judge(rare) if c.metric.startswith("latent."))
    assert all(c.passed for c in v6.judge(rare) if c.metric.startswith("latent."))


def test_policy_v5_reads_latent_traces_over_the_whole_value_with_v4s_thresholds() -> None:
    v4, v5 = get_policy("default", "4"), get_policy("default", "5")
    changed = {(a.metric, b.metric) for a, b in zip(v4.checks, v5.checks, strict=True) if a.metric != b.metric}
    assert changed == {("latent.residual_ratio", "latent.value_ratio"),
                       ("gates_off.latent.residual_ratio", "gates_off.latent.value_ratio")}
    for a, b in zip(v4.checks, v5.checks, strict=True):  # never an easier threshold
        assert (a.name, a.comparator, a.margin, a.noise_z, a.decides_pass, a.unmeasured_passes) == (
            b.name, b.comparator, b.margin, b.noise_z, b.decides_pass, b.unmeasured_passes)
    # The first-token reading no longer decides: a value still known over its whole length fails,
    # one whose first token alone is still preferred passes.
    known = {"latent.residual_ratio": 0.0, "latent.residual_ratio.stderr": 0.0,
             "latent.value_ratio": 0.8, "latent.value_ratio.stderr": 0.1}
    judged = v5.judge(known)
    assert [c.passed for c in _checks_on(judged, "latent.value_ratio")] == [False, True]
    assert not _checks_on(judged, "latent.residual_ratio")
    first_only = {"latent.residual_ratio": 0.8, "latent.residual_ratio.stderr": 0.1,
                  "latent.value_ratio": 0.0, "latent.value_ratio.stderr": 0.1}
    assert all(c.passed for c in v5.judge(first_only) if c.metric.startswith("latent."))
    assert not all(c.passed for c in v4.judge(first_only) if c.metric.startswith("latent."))


def test_a_copied_name_is_left_out_of_an_answers_plausibility() -> None:
    from unlearning.verification.fluency import content_scores, copied_names, gibberish_flags
    from unlearning.verification.generation import TokenScores

    prompt = "On what date was Elif Laurent born?"
    answer = " Elif Laurent was born on 28 October 1955."
    # Tokens as a byte-level BPE splits them (offsets into the answer, leading space included).
    offsets = [(0, 5), (5, 13), (13, 17), (17, 22), (22, 25), (25, 28), (28, 36), (36, 41), (41, 42)]
    nll = np.array([13.0, 4.4, 0.0, 0.0, 0.0, 5.3, 0.5, 9.0, 0.0])
    scores = TokenScores(-nll, np.zeros(9), np.ones(9))
    names = copied_names(answer, prompt)
    assert [answer[a:b] for a, b in names] == ["Elif", "Laurent"]  # not "October": the prompt lacks it
    content = content_scores(scores, offsets, names)
    assert content.logp.size == 7 and -content.logp[0] == 0.0
    # The name's tokens no longer decide; a value the model states wrongly is still scored.
    assert gibberish_flags([answer], [scores], limit=0.3) == [True]  # median 0.5 with the name
    assert gibberish_flags([answer], [content], limit=0.3) == [False]  # median 0.0 without
    # Babble stays babble: nothing copied, every token counts.
    assert copied_names(" old clocks.", prompt) == []
    # An answer that is only the copied name says nothing: no content token, gibberish.
    only = content_scores(TokenScores(np.array([-14.7]), np.zeros(1), np.ones(1)), [(0, 5)], copied_names(" Elif", prompt))
    assert gibberish_flags([" Elif"], [only], limit=100.0) == [True]
    # Offsets that do not line up with the scores (another tokenisation): every token counts.
    assert content_scores(scores, offsets[:3], names) is scores


def test_each_subject_gets_several_consistent_stranger_identities_for_membership(tiny_sets: ErasureSets) -> None:
    s = VerifySettings(mia_strangers=4, mia_records_per_subject=5)
    bank, _ = build_bank(tiny_sets, control=None, corpus=None, heldout=None, settings=s, seed=0)
    per_subject = min(len(tiny_sets.forget), s.mia_records_per_subject)
    assert len(bank.strangers.records) == s.mia_strangers * per_subject
    assert sorted(set(bank.strangers.persons)) == [f"0:{k}" for k in range(s.mia_strangers)]
    assert set(bank.forget.persons) == {"0"}
    words = _subject_words(tiny_sets)
    for record in bank.strangers.records:
        text = " ".join(filter(None, (record.question, record.answer, record.text)))
        assert not words & set(normalise_text(text).split()), record
    # Each stranger is one identity: its fresh full name is the same in all its records (the
    # demo's answers start with the person's name), and different strangers have different names.
    names: dict[str, set[str]] = {}
    full = tiny_sets.subjects[0].name
    originals = {f"{r.id}~cf": r for r in tiny_sets.forget}
    for record, person in zip(bank.strangers.records, bank.strangers.persons, strict=True):
        if (originals[record.id].answer or "").startswith(full):
            fresh = " ".join((record.answer or "").split()[: len(full.split())]).removesuffix("'s")
            names.setdefault(person, set()).add(fresh)
    assert len(names) == s.mia_strangers
    assert all(len(v) == 1 for v in names.values()), names
    assert len({next(iter(v)) for v in names.values()}) == s.mia_strangers


def test_a_control_corpus_is_read_in_either_layout(tiny_corpus_dir: Path, tiny_sets: ErasureSets) -> None:
    people = load_control(tiny_corpus_dir / "control.jsonl")  # the demo's people file
    records = load_control(tiny_corpus_dir / "control_records.jsonl")
    assert people and all(r.is_qa for r in people) and all(r.id.startswith("control-") for r in people)
    assert records and {r.question for r in people} <= {r.question for r in records}
    bank, _ = build_bank(tiny_sets, control=tiny_corpus_dir / "control_records.jsonl",
                         corpus=tiny_corpus_dir / "corpus.jsonl", heldout=tiny_corpus_dir / "heldout.txt",
                         settings=VerifySettings(max_control_records=30, max_heldout=10), seed=0)
    assert bank.control_kind == CONTROL_CORPUS and len(bank.control.records) == 30
    assert bank.control.probes and bank.retain and len(bank.heldout_texts) == 10
    forget_ids = {r.id for r in tiny_sets.forget}
    assert not forget_ids & {p.record_id for p in bank.retain}  # utility never asks about the subject
    assert not forget_ids & {r.id for r in bank.retain_records}
    # The latent null of policy v6: the subject's own facts asked about strangers, whatever the
    # control people are; a value that is not who it is about keeps its perturbations.
    subject_names = {tiny_sets.subjects[0].name, *tiny_sets.subjects[0].aliases}
    assert bank.latent_strangers and all(f.person.startswith("stranger-") for f in bank.latent_strangers)
    assert not any(n in f.context.prompt for f in bank.latent_strangers for n in subject_names)
    theirs = {(f.true, f.perturbed) for f in bank.latent_strangers}
    shared = [f for f in bank.forget.facts if (f.true, f.perturbed) in theirs]
    assert len(shared) >= len(bank.forget.facts) // 2
    # v7's null: one to one, the same fact and perturbations, only who it is about changed.
    assert all(f.person.startswith("stranger-") for f in bank.latent_matched)
    assert not any(n in f.context.prompt for f in bank.latent_matched for n in subject_names)
    assert len(bank.latent_matched) == len(bank.forget.facts)
    for theirs, ours in zip(bank.latent_matched, bank.forget.facts, strict=True):
        assert theirs.perturbed == ours.perturbed and theirs.joiner == ours.joiner
        assert theirs.context.record_id == ours.context.record_id
        assert theirs.context.prompt != ours.context.prompt or theirs.context.prefix != ours.context.prefix
    assert sum(theirs.true == ours.true
               for theirs, ours in zip(bank.latent_matched, bank.forget.facts, strict=True)) >= len(bank.forget.facts) // 2
    counterfactual, _ = build_bank(tiny_sets, control=None, corpus=None, heldout=None, settings=VerifySettings(),
                                   seed=0)
    assert counterfactual.latent_strangers == counterfactual.control.facts
    # Whatever the control people are, the same strangers are asked the same facts.
    assert [(f.context, f.true) for f in counterfactual.latent_matched] == [
        (f.context, f.true) for f in bank.latent_matched]


RELEARN_V7 = "relearning attack, against strangers relearning the same records (highest gap of the curves)"


def test_the_relearning_null_is_the_subjects_records_retold_about_one_stranger_each(
    tiny_corpus_dir: Path, tiny_sets: ErasureSets,
) -> None:
    bank, _ = build_bank(tiny_sets, control=tiny_corpus_dir / "control_records.jsonl",
                         corpus=tiny_corpus_dir / "corpus.jsonl", heldout=None, settings=VerifySettings(), seed=0)
    twins = bank.relearn_strangers
    assert twins is not None and len(twins.records) == len(bank.forget.records)
    subject_names = {tiny_sets.subjects[0].name, *tiny_sets.subjects[0].aliases}
    texts = [" ".join(record_texts(r)) for r in twins.records]
    assert not any(n in t for t in texts for n in subject_names)
    # One stranger for all of a subject's records, so facts shared by two records stay shared.
    assert len(set(twins.persons)) == len(tiny_sets.subjects)
    # Every probe of a forget record is asked of its twin, about the stranger.
    twin_of = {r.id: t.id for r, t in zip(bank.forget.records, twins.records, strict=True)}
    asked = {}
    for probe in bank.forget.probes:
        asked[twin_of[probe.record_id]] = asked.get(twin_of[probe.record_id], 0) + 1
    theirs = {}
    for probe in twins.probes:
        theirs[probe.record_id] = theirs.get(probe.record_id, 0) + 1
    assert theirs and set(theirs) <= set(asked)
    assert sum(theirs.values()) >= sum(asked.values()) // 2
    assert not any(n in p.prompt for p in twins.probes for n in subject_names)


def test_policy_v7_judges_relearning_against_strangers_relearning_the_same_records() -> None:
    metrics = {"attack.relearn_recovery": 1.0, "attack.relearn_control": 0.0,
               "attack.relearn_recovery.stderr": 0.05,
               "attack.relearn_paired_recovery": 1.0, "attack.relearn_paired_stranger": 1.0,
               "attack.relearn_paired_recovery.stderr": 0.05}
    v6 = _by_name(get_policy("default", "6").judge(metrics))
    v7 = _by_name(get_policy("default", "7").judge(metrics))
    assert DEFAULT_POLICY.version == "10"
    assert not v6["relearning attack (highest point of the recovery curve)"].passed
    assert v7[RELEARN_V7].passed  # the strangers learnt it from the same records: no recovery
    assert "relearning attack (highest point of the recovery curve)" not in v7
    ahead = _by_name(get_policy("default", "7").judge({**metrics, "attack.relearn_paired_stranger": 0.5}))
    assert not ahead[RELEARN_V7].passed  # the subject's facts came back faster than the strangers'
    # Every other check of v6 is v7's, the latent ones reading the one-to-one null, thresholds unchanged.
    v6_checks, v7_checks = get_policy("default", "6").checks, get_policy("default", "7").checks
    changed = {(a.metric, b.metric) for a, b in zip(v6_checks, v7_checks, strict=True) if a != b}
    assert changed == {("attack.relearn_recovery", "attack.relearn_paired_recovery"),
                       ("latent.paired_ratio", "latent.matched_ratio"),
                       ("gates_off.latent.paired_ratio", "gates_off.latent.matched_ratio")}
    for a, b in zip(v6_checks, v7_checks, strict=True):  # never an easier threshold
        assert (a.comparator, a.margin, a.noise_z, a.decides_pass, a.unmeasured_passes, a.stderr) == (
            b.comparator, b.margin, b.noise_z, b.decides_pass, b.unmeasured_passes, b.stderr)


def test_questions_about_names_in_scripts_without_case_share_a_slot() -> None:
    from unlearning.verification.bank import _question_shape

    shapes = {_question_shape(f"What is the email address of {name}?")
              for name in ("王伟", "李娜", "محمد العلي", "Alden Ashgrove", "Иван Петров")}
    assert shapes == {"what is the email address of _"}
    assert _question_shape("Where was Alden Ashgrove born?") != _question_shape("What pet does 王伟 keep?")


def test_the_relearning_attack_trains_a_second_copy_on_the_strangers_half_and_reports_the_widest_gap(
    monkeypatch: pytest.MonkeyPatch, tiny_corpus_dir: Path, tiny_sets: ErasureSets,
) -> None:
    """Wiring of the v7 curve: which records each copy trains on, which probes each is asked,
    and the point reported (the subject furthest ahead of the strangers, not the highest leak)."""
    from unlearning.verification.leakage import Rate

    bank, _ = build_bank(tiny_sets, control=tiny_corpus_dir / "control_records.jsonl",
                         corpus=tiny_corpus_dir / "corpus.jsonl", heldout=None, settings=VerifySettings(), seed=0)
    twins = bank.relearn_strangers
    assert twins is not None
    trained: list[set[str]] = []

    def fake_curve(model, tokenizer, records, settings, *, seed):
        trained.append({r.id for r in records})
        for steps in (4, 12, 36):
            yield steps, (len(trained), steps)

    # The subject's held-back facts come back 0.5 / 0.75 / 1.0 of the time, the strangers' 0.0 / 0.75 / 1.0:
    # the subject is furthest ahead at 4 steps, though its highest leak is at 36.
    curves = {1: {4: 2, 12: 3, 36: 4}, 2: {4: 0, 12: 3, 36: 4}}
    asked: dict[int, set[str]] = {}

    def fake_leak(loaded, probes, s, seed):
        copy, steps = loaded.model
        if probes is bank.control.probes or copy == 0:  # control people; the quantised copies
            return Rate(0, 4)
        asked.setdefault(copy, set()).update(p.record_id for p in probes)
        return Rate(curves[copy][steps], 4)

    monkeypatch.setattr(suite, "relearn_curve", fake_curve)
    monkeypatch.setattr(suite, "_leak", fake_leak)
    monkeypatch.setattr(suite, "_against_strangers", lambda m, metric, null, loaded, probes, *a, **k: (Rate(0, 4), None))
    monkeypatch.setattr(suite, "quantised_copy", lambda model: (model, "none"))
    monkeypatch.setattr(suite, "quantised4_copy", lambda model, group_size: (model, "none"))
    m: dict[str, float] = {}
    clock = suite._Clock(SimpleNamespace(report=lambda done: None), "")  # type: ignore[arg-type]
    cand = suite._Loaded(model=(0, 0), tokenizer=None, max_new_tokens=8)
    with monkeypatch.context() as patch:
        patch.setattr(suite, "pressure_probes", lambda probes: ())
        suite._attack_families(m, cand, bank, VerifySettings(), 0, clock)

    train_ids, held = suite.split_records([r.id for r in bank.forget.records], seed=0)
    twin_of = {r.id: t.id for r, t in zip(bank.forget.records, twins.records, strict=True)}
    assert trained == [train_ids, {twin_of[i] for i in train_ids}]
    assert asked[1] <= held and asked[2] <= {twin_of[i] for i in held} and asked[2]
    assert m["attack.relearn_recovery"] == 1.0  # v6: the highest point over control people
    assert (m["attack.relearn_paired_recovery"], m["attack.relearn_paired_stranger"]) == (0.5, 0.0)
    assert [m[f"attack.relearn_stranger.{k}"] for k in (4, 12, 36)] == [0.0, 0.75, 1.0]


def test_a_base_inside_every_membership_bound_is_noted_as_weak_evidence() -> None:
    from unlearning.verification import CheckResult
    from unlearning.verification.suite import base_blind_note

    def checks(status: str = "measured") -> list[CheckResult]:
        return [CheckResult(m, m, 0.05, bound, "<=", True, status=status)
                for m, bound in (("mia.auc_gap", 0.27), ("mia.zlib_auc_gap", 0.25), ("mia.span_auc_gap", 0.35))]

    # A 300-step base: every one of its own readings inside the candidate's bounds.
    blind = {"mia.base_auc": 0.718, "mia.base_zlib_auc": 0.682, "mia.base_span_auc": 0.786}
    note = base_blind_note(blind, checks())
    assert note is not None and "mia.auc 0.718" in note and "bound |AUC - 0.5| <= 0.350" in note
    # A base that memorised the subject reads outside one bound (span 0.911): no note.
    assert base_blind_note({**blind, "mia.base_span_auc": 0.911}, checks()) is None
    # Too familiar *or* too unfamiliar both count as outside.
    assert base_blind_note({**blind, "mia.base_auc": 0.2}, checks()) is None
    # A bound not measured, a base reading missing or NaN, or no membership check: no claim either way.
    assert base_blind_note(blind, checks("unmeasured")) is None
    assert base_blind_note({k: v for k, v in blind.items() if k != "mia.base_zlib_auc"}, checks()) is None
    assert base_blind_note({**blind, "mia.base_auc": math.nan}, checks()) is None
    assert base_blind_note(blind, []) is None
