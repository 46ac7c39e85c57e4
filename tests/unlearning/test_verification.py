"""The verification suite tells models apart on the tiny preset.

Four models, built once per session: the base (it knows the subject), a model
retrained from scratch on the corpus minus the subject's records (the gold
standard), a model wrecked by long gradient ascent, and a KIF checkpoint
(suppression gates over unchanged base weights).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from unlearning.corpus import load_corpus, write_jsonl
from unlearning.demo.corpus import load_people
from unlearning.demo.train_base import train_base
from unlearning.erase import erase
from unlearning.progress import Progress
from unlearning.sets import ErasureSets, Subject, build_sets
from unlearning.verification import (
    REQUIRED_METRICS,
    CheckSpec,
    Policy,
    Report,
    VerifySettings,
    register_policy,
    verify,
)

pytestmark = pytest.mark.slow

SUBJECT_ID = "p0003"
# Smaller samples than the default keep the file fast; the tiny corpus has few people anyway.
SETTINGS = VerifySettings(max_control_facts=40, bootstrap=100, max_retain_eval=100)


@pytest.fixture(scope="session")
def subject_sets(tiny_corpus_dir: Path) -> ErasureSets:
    person = next(p for p in load_people(tiny_corpus_dir / "people.jsonl") if p["person_id"] == SUBJECT_ID)
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    return build_sets(corpus, [Subject(person["name"], tuple(person["aliases"]))], seed=0)


@pytest.fixture(scope="session")
def retrained_dir(tiny_corpus_dir: Path, subject_sets: ErasureSets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    without = write_jsonl(corpus.without(r.id for r in subject_sets.forget).records,
                          tmp_path_factory.mktemp("without") / "corpus.jsonl")
    threads = torch.get_num_threads()
    try:
        return train_base(without, tmp_path_factory.mktemp("retrained"), preset="tiny", seed=0, threads=1).out_dir
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def wrecked_dir(tiny_base_model_dir: Path, subject_sets: ErasureSets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wrecked")
    erase(tiny_base_model_dir, subject_sets, method="gradascent", out_dir=out,
          hparams={"lr": 1e-2, "epochs": 40}, device="cpu")
    return out


@pytest.fixture(scope="session")
def kif_dir(tiny_base_model_dir: Path, subject_sets: ErasureSets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kif")
    erase(tiny_base_model_dir, subject_sets, method="kif", out_dir=out, device="cpu")
    return out


@pytest.fixture(scope="session")
def verified(
    tiny_corpus_dir: Path, tiny_base_model_dir: Path, subject_sets: ErasureSets,
) -> Callable[..., Report]:
    reports: dict[tuple[Path, bool], Report] = {}

    def run(candidate: Path, *, attacks: bool = True) -> Report:
        if (candidate, attacks) not in reports:
            reports[(candidate, attacks)] = verify(
                candidate, tiny_base_model_dir, subject_sets,
                control=tiny_corpus_dir / "control.jsonl", corpus=tiny_corpus_dir / "corpus.jsonl",
                settings=replace(SETTINGS, attacks=attacks), device="cpu",
            )
        return reports[(candidate, attacks)]

    return run


def _check(report: Report, metric: str) -> Any:
    return next(c for c in report.checks if c.metric == metric)


def test_the_base_model_fails_because_it_leaks(verified: Callable[..., Report], tiny_base_model_dir: Path) -> None:
    report = verified(tiny_base_model_dir)
    assert not report.passed
    assert not _check(report, "leakage.forget").passed
    assert not _check(report, "latent.residual_ratio").passed
    assert report.metrics["leakage.forget.original"] >= 0.9
    assert report.metrics["leakage.forget"] > report.metrics["leakage.control"] + 0.2
    assert report.guarantee == "weights"


def test_a_model_retrained_without_the_subject_passes_leakage_and_latent_checks(
    verified: Callable[..., Report], retrained_dir: Path,
) -> None:
    report = verified(retrained_dir)
    for metric in ("leakage.forget", "leakage.forget_sampled", "latent.residual_ratio",
                   "fluency.gibberish_rate", "attack.relearn_recovery", "attack.quant_leakage"):
        assert _check(report, metric).passed, (metric, report.to_json()["metrics"])
    assert report.metrics["leakage.forget.original"] <= 0.2


def test_a_model_wrecked_by_long_gradient_ascent_fails_fluency_and_utility(
    verified: Callable[..., Report], wrecked_dir: Path,
) -> None:
    report = verified(wrecked_dir, attacks=False)  # attacks are beside the point here
    assert not report.passed
    assert not _check(report, "fluency.degenerate_rate").passed
    assert not _check(report, "utility.retain_ratio").passed
    assert not _check(report, "utility.ppl_ratio").passed


def test_a_kif_checkpoint_whose_facts_return_with_gates_off_is_classed_suppression(
    verified: Callable[..., Report], kif_dir: Path,
) -> None:
    report = verified(kif_dir, attacks=False)
    assert report.guarantee == "suppression"
    assert report.metrics["gates_off.leakage.forget"] > report.metrics["gates_off.leakage.control"] + 0.2
    assert report.metrics["gates_off.leakage.forget"] > report.metrics["leakage.forget"]
    assert {"gates_off.leakage", "gates_off.latent", "gates_off.mia"} <= set(report.timings)


def test_the_report_has_every_required_metric_and_is_strict_json(
    verified: Callable[..., Report], retrained_dir: Path, tmp_path: Path,
) -> None:
    report = verified(retrained_dir)
    data = json.loads(report.save(tmp_path / "report.json").read_text())
    for key in REQUIRED_METRICS:
        assert isinstance(data["metrics"][key], float), key
    assert data["policy"] == {"name": "default", "version": "1"}
    assert data["passed"] is all(c["passed"] for c in data["checks"] if c["decides_pass"])
    assert {"leakage", "latent", "utility", "fluency", "mia", "attack.relearn", "attack.quant",
            "attack.pressure", "total"} <= set(data["timings"])
    assert "control people file" in data["control_source"]


def test_a_second_verification_against_the_same_base_reuses_the_cached_base_results(
    verified: Callable[..., Report], tiny_base_model_dir: Path, retrained_dir: Path,
) -> None:
    verified(tiny_base_model_dir)
    second = verified(retrained_dir)
    assert second.cached and any(name.startswith("base (cached)") for name in second.timings)
    assert second.metrics["leakage.base_forget"] == verified(tiny_base_model_dir).metrics["leakage.forget"]


def test_without_a_control_file_control_probes_ask_about_generated_strangers(
    tiny_base_model_dir: Path, subject_sets: ErasureSets,
) -> None:
    seen: list[Progress] = []
    policy = register_policy(Policy("leak-only-test", "3", (
        CheckSpec("leak", "leakage.forget", "<=", 0.05, "leakage.control", 1.645),)))
    report = verify(tiny_base_model_dir, tiny_base_model_dir, subject_sets, policy=policy,
                    settings=replace(SETTINGS, attacks=False), progress=seen.append, device="cpu")
    assert "generated strangers" in report.control_source
    assert report.policy == {"name": "leak-only-test", "version": "3"}
    assert [c.metric for c in report.checks] == ["leakage.forget"]
    assert not report.passed  # the base still leaks against strangers
    assert report.metrics["leakage.control"] < 0.1
    assert seen and seen[-1].step == seen[-1].total and seen[-1].stage == "verify"
