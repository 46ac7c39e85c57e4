"""The verification suite on real models: the tiny demo base, and a model retrained without the subject.

The base memorised the subject (nothing was erased), so it must fail; a model
trained from scratch on the corpus minus the subject's records (the gold
standard of erasure) must pass every forgetting check.  Both are verified with
the full suite (attacks included) against the demo's control corpus, with
sample sizes a little under the defaults; a third run uses counterfactual
controls.  The base evidence is computed once and then taken from the cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from unlearning.corpus import load_corpus, write_jsonl
from unlearning.demo.corpus import load_people
from unlearning.demo.train_base import train_base
from unlearning.progress import Progress
from unlearning.sets import ErasureSets, Subject, build_sets
from unlearning.verification import (
    DEFAULT_POLICY,
    REQUIRED_METRICS,
    CheckResult,
    CheckSpec,
    Policy,
    Report,
    VerifySettings,
    clear_cache,
    register_policy,
    verify,
)
from unlearning.verification.attacks.relearn import RelearnSettings
from unlearning.verification.bank import CONTROL_CORPUS, COUNTERFACTUAL
from unlearning.verification.policy import NOT_COMPUTED

pytestmark = pytest.mark.slow

SUBJECT_ID = "p0003"
# A little under the defaults (control records, retained probes, lens positions, bootstrap,
# relearning budgets); membership keeps its default ten strangers, which its null needs.
SETTINGS = VerifySettings(max_control_records=60, max_retain_eval=100, lens_positions=1500,
                          bootstrap=100, relearn=RelearnSettings(budgets=(4, 12)))
FAMILIES = ("leakage", "latent", "mia", "utility", "fluency", "attack.relearn", "attack.quant",
            "attack.quant4", "attack.pressure")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Verification on one thread, like training: reproducible, and no spinning on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def subject_sets(tiny_corpus_dir: Path) -> ErasureSets:
    person = next(p for p in load_people(tiny_corpus_dir / "people.jsonl") if p["person_id"] == SUBJECT_ID)
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    return build_sets(corpus, [Subject(person["name"], tuple(person["aliases"]))], seed=0)


@pytest.fixture(scope="module")
def run_verify(tiny_corpus_dir: Path, tiny_base_model_dir: Path,
               subject_sets: ErasureSets) -> Callable[[Path], Report]:
    def run(candidate: Path) -> Report:
        return verify(candidate, tiny_base_model_dir, subject_sets,
                      control=tiny_corpus_dir / "control_records.jsonl",
                      corpus=tiny_corpus_dir / "corpus.jsonl", heldout=tiny_corpus_dir / "heldout.txt",
                      settings=SETTINGS, device="cpu")
    return run


@pytest.fixture(scope="module")
def base_report(run_verify: Callable[[Path], Report], tiny_base_model_dir: Path) -> Report:
    clear_cache()  # the first verification computes the base evidence itself
    return run_verify(tiny_base_model_dir)


@pytest.fixture(scope="module")
def retrained_dir(tiny_corpus_dir: Path, tiny_base_model_dir: Path, subject_sets: ErasureSets,
                  tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    without = write_jsonl(corpus.without(r.id for r in subject_sets.forget).records,
                          tmp_path_factory.mktemp("without") / "corpus.jsonl")
    threads = torch.get_num_threads()
    try:
        # On the base's tokenizer, as the bench's retrain oracle: verification refuses a candidate
        # whose tokenizer is not its base's (`check_same_tokenizer`).
        return train_base(without, tmp_path_factory.mktemp("retrained"), preset="tiny", seed=0,
                          threads=1, tokenizer=tiny_base_model_dir).out_dir
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def retrained_report(run_verify: Callable[[Path], Report], base_report: Report, retrained_dir: Path) -> Report:
    return run_verify(retrained_dir)  # after the base's: its base evidence comes from the cache


def _checks(report: Report, metric: str) -> list[CheckResult]:
    found = [c for c in report.checks if c.metric == metric]
    assert found, f"no check on {metric}"
    return found


def test_the_base_model_fails_verification_for_a_subject_it_memorised(base_report: Report) -> None:
    m = base_report.metrics
    assert not base_report.passed and base_report.guarantee == "weights"
    # It says the subject's facts when asked the training questions, and far more often
    # than it says a control person's.
    assert m["leakage.forget.original"] >= 0.9
    assert m["leakage.forget"] > m["leakage.control"] + 0.2
    failed = {c.metric for c in base_report.failed_checks}
    assert {"leakage.forget", "leakage.forget_sampled", "latent.matched_ratio", "mia.auc_gap",
            "attack.relearn_paired_recovery", "attack.quant_leakage", "attack.quant4_leakage"} <= failed
    # Upper bounds fail; the "not below strangers" bounds hold (it knows more, not less).
    upper, lower = _checks(base_report, "leakage.forget")
    assert (upper.comparator, upper.passed, lower.comparator, lower.passed) == ("<=", False, ">=", True)
    assert m["mia.auc"] > 0.5 + 2 * m["mia.auc.stderr"]  # members look more familiar than strangers
    # The candidate is the base: measured as a candidate, it gives what the base evidence holds.
    assert m["leakage.forget"] == m["leakage.base_forget"]
    assert m["latent.residual_ratio"] == pytest.approx(1.0) and m["latent.value_ratio"] == pytest.approx(1.0)
    assert m["latent.paired_ratio"] == pytest.approx(1.0) and m["latent.n_strangers"] > 0
    assert m["latent.matched_ratio"] == pytest.approx(1.0) and m["latent.n_matched"] == m["latent.n_forget"]
    assert m["mia.auc"] == m["mia.base_auc"]
    assert m["utility.base_retain_accuracy"] > 0.5  # so a ratio of 1 is not 0 / 0
    assert m["utility.retain_ratio"] == 1.0 and m["utility.ppl_ratio"] == 1.0


def test_a_full_run_measures_every_check_with_finite_values(base_report: Report, tmp_path: Path) -> None:
    assert base_report.unmeasured == {}
    for key in REQUIRED_METRICS:
        assert math.isfinite(base_report.metrics[key]), key
    assert all(math.isfinite(v) for v in base_report.metrics.values()), base_report.metrics
    assert not any(c.metric.startswith("gates_off.") for c in base_report.checks)  # no gates to switch
    assert [c.name for c in base_report.checks] == [
        c.name for c in DEFAULT_POLICY.checks if not c.metric.startswith("gates_off.")]
    for check in base_report.checks:
        assert check.status == "measured" and check.rule is None, check
        assert check.value is not None and math.isfinite(check.value), check
        assert check.threshold is not None and math.isfinite(check.threshold), check
    assert base_report.passed is all(c.passed for c in base_report.checks if c.decides_pass)
    assert base_report.policy == {"name": "default", "version": "10"}
    assert base_report.settings == asdict(SETTINGS)
    assert base_report.details["control_kind"] == CONTROL_CORPUS
    assert base_report.details["forget_records"] > 0 and base_report.details["control_records"] == 60
    assert base_report.control_source.startswith("control corpus")
    assert {"base", "load", "total", *FAMILIES} <= set(base_report.timings) and not base_report.cached
    # The serialised form survives a save and a load (settings' tuples come back as lists).
    assert Report.load(base_report.save(tmp_path / "report.json")).dumps() == base_report.dumps()


def test_a_model_retrained_without_the_subject_passes_the_forgetting_checks(
    retrained_report: Report, base_report: Report,
) -> None:
    m = retrained_report.metrics
    assert retrained_report.unmeasured == {}
    assert m["leakage.forget"] < base_report.metrics["leakage.forget"] - 0.3
    for metric in ("leakage.forget", "leakage.forget_sampled", "latent.matched_ratio", "mia.auc_gap",
                   "mia.span_auc_gap", "attack.relearn_paired_recovery", "attack.quant_leakage",
                   "attack.quant4_leakage", "attack.pressure_leakage", "utility.retain_ratio",
                   "utility.ppl_ratio", "fluency.content_paired_gibberish_rate", "fluency.content_strangers_gibberish_rate",
                   "fluency.degenerate_rate"):
        for check in _checks(retrained_report, metric):
            assert check.passed and check.status == "measured", (check, m)


def test_a_model_retrained_without_the_subject_passes_verification(retrained_report: Report) -> None:
    # Its strangers are as familiar as the subject is to it: the subject's first name, shared
    # with others in the corpus, becomes another one the corpus shows; the surname, only the
    # subject's, becomes an ordinary name the corpus never shows (unlearning.stranger_names).
    assert retrained_report.passed, [(c.name, c.value, c.threshold) for c in retrained_report.failed_checks]


def test_a_second_verification_against_the_same_base_takes_the_base_evidence_from_the_cache(
    retrained_report: Report, base_report: Report,
) -> None:
    assert retrained_report.cached and "base (cached)" in retrained_report.timings
    assert "base" not in retrained_report.timings
    # What the cache holds is what measuring the base as a candidate gave.
    for cached_key, measured_key in (("leakage.base_forget", "leakage.forget"), ("mia.base_auc", "mia.auc"),
                                     ("mia.base_zlib_auc", "mia.zlib_auc"),
                                     ("utility.base_retain_accuracy", "utility.retain_accuracy"),
                                     ("utility.base_ppl", "utility.ppl")):
        assert retrained_report.metrics[cached_key] == base_report.metrics[measured_key], cached_key


def test_without_a_control_corpus_the_controls_are_counterfactual_strangers(
    tiny_base_model_dir: Path, subject_sets: ErasureSets,
) -> None:
    seen: list[Progress] = []
    policy = register_policy(Policy("leak-only-test", "3", (
        CheckSpec("leak", "leakage.forget", "<=", 0.05, "leakage.control", 1.645),)))
    report = verify(tiny_base_model_dir, tiny_base_model_dir, subject_sets, policy=policy,
                    settings=replace(SETTINGS, attacks=False), progress=seen.append, device="cpu")
    assert report.control_source.startswith("counterfactual")
    assert report.details["control_kind"] == COUNTERFACTUAL
    assert report.policy == {"name": "leak-only-test", "version": "3"}
    assert [c.metric for c in report.checks] == ["leakage.forget"]
    assert not report.passed  # the base still leaks, against strangers asked the same questions
    assert report.metrics["leakage.forget"] > report.metrics["leakage.control"] + 0.2
    # The same probes, names swapped: as many control probes as forget probes survive.
    assert report.metrics["leakage.n_control_probes"] <= report.metrics["leakage.n_forget_probes"]
    assert {k: v for k, v in report.unmeasured.items() if k.startswith("attack.")} == {
        k: NOT_COMPUTED for k in ("attack.relearn_recovery", "attack.relearn_paired_recovery",
                                  "attack.quant_leakage", "attack.quant4_leakage", "attack.pressure_leakage")}
    assert seen and seen[-1].stage == "verify" and seen[-1].step == seen[-1].total
    assert [p.step for p in seen] == sorted(p.step for p in seen)
