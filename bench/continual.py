"""Continual benchmark: one-person erasure requests applied one after another to the same model.

Each request erases one person, starting from the previous candidate (as the
service promotes it), with the records of everyone erased before tombstoned
from the corpus (so neither the retain set nor the verifier's retained
records include them).  Each candidate is verified as the service verifies
it: against the checkpoint it was made from (the previous candidate), by the
default policy; the step records that verdict and every failed check.

Because each verification compares with the previous step, a loss that
stays under the policy's limit at every step can still add up.  So after each
step the bench also measures, on fixed samples, against the ORIGINAL base
model: the retained-accuracy ratio (greedy answers to retained people's
questions that contain the value, the verifier's own rule, candidate / base),
TOFU-style model utility, the leakage over every person erased so far, and
the control level (people the model never saw).
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench import tofu
from bench.assets import Assets, forget_people
from bench.console import Console
from bench.engine import erase_timed, sets_for, verify_timed
from bench.results import measure
from bench.settings import BenchSettings

logger = logging.getLogger(__name__)


def _answers(model_dir: Path, questions: Sequence[str]) -> list[str]:
    from unlearning.modeling import generate_answers, load_model

    model, tokenizer = load_model(model_dir)
    return generate_answers(model, tokenizer, list(questions))


def contains_rate(model_dir: Path, facts: Sequence[tuple[str, str]]) -> float:
    """Share of (question, value) whose greedy answer contains the value (the verifier's rule)."""
    from unlearning.verification.leakage import contains_value

    if not facts:
        raise ValueError("no facts to ask about")
    answers = _answers(model_dir, [q for q, _ in facts])
    return float(np.mean([contains_value(a, v) for a, (_, v) in zip(answers, facts, strict=True)]))


def leak_rate(model_dir: Path, facts: Sequence[tuple[str, str]]) -> float:
    """Share of a person's facts the model still states (greedy answer to the training question)."""
    return contains_rate(model_dir, facts)


def _facts(people: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(f["question"], f["value"]) for p in people for f in p["facts"]]


def run_continual(settings: BenchSettings, assets: Assets, *, work: Path, console: Console) -> dict[str, Any]:
    from unlearning.corpus import load_corpus

    corpus = load_corpus(assets.corpus_file)
    everyone = assets.people()
    order = forget_people(everyone, 1.0)
    requests = order[: settings.continual_requests]
    gone_ids = {p["person_id"] for p in requests}
    kept_ids = {p["person_id"] for p in everyone if p["person_id"] not in gone_ids}
    retained_records = [r for r in corpus.records if r.is_qa and (r.meta or {}).get("person") in kept_ids]
    retained_records = random.Random(0).sample(retained_records, min(settings.utility_facts, len(retained_records)))
    retain_facts = tofu.facts_of(retained_records, everyone + assets.control_people(), perturbed=settings.tofu_perturbed)
    retained_questions = [(r.question, str((r.meta or {})["value"])) for r in retained_records]
    control = assets.control_people()
    control_leak = leak_rate(assets.base_dir, _facts(control))
    base_utility = tofu.model_utility(*_load(assets.base_dir), retain_facts)["model_utility"]
    base_accuracy = contains_rate(assets.base_dir, retained_questions)

    steps: list[dict[str, Any]] = []
    current = assets.base_dir
    erased: list[dict[str, Any]] = []
    for index, person in enumerate(requests, 1):
        tombstoned = corpus.without([r.id for r in corpus.records
                                     if (r.meta or {}).get("person") in {p["person_id"] for p in erased}])
        holder: dict[str, Any] = {}
        out = work / f"step-{index:02d}"
        step = measure(holder, "step", lambda c=current, t=tombstoned, p=person, o=out, i=index: _step(
            settings, assets, t, p, c, o, i, erased=[*erased, p], control_leak=control_leak,
            retain_facts=retain_facts, retained_questions=retained_questions, base_accuracy=base_accuracy,
            console=console))
        steps.append({"step": index, **step})
        if "cumulative_leakage" not in step:
            break  # the chain is broken: later steps would have no model to start from
        if current != assets.base_dir:
            shutil.rmtree(current, ignore_errors=True)
        current = out
        erased.append(person)
    if current != assets.base_dir:
        shutil.rmtree(current, ignore_errors=True)
    measured = [s for s in steps if "passed" in s]
    from bench.pipeline import service_walk

    walk: dict[str, Any] = {}
    measure(walk, "walk", lambda: service_walk(settings, assets, work=work, console=console))
    return {"method": settings.continual_method, "requests": len(requests), "steps": steps,
            "service_walk": walk["walk"],
            "control_leakage": control_leak, "base_model_utility": base_utility,
            "base_retained_accuracy": base_accuracy, "retained_sample": len(retained_questions),
            "base_leakage": leak_rate(assets.base_dir, _facts(requests)),
            "passed_steps": sum(bool(s["passed"]) for s in measured), "measured_steps": len(measured),
            "verified_against": "the checkpoint it was made from (the previous step's candidate)"}


def _load(model_dir: Path) -> tuple[Any, Any]:
    from unlearning.modeling import load_model

    return load_model(model_dir)


def _step(settings: BenchSettings, assets: Assets, corpus: Any, person: dict[str, Any], start: Path,
          out: Path, index: int, *, erased: list[dict[str, Any]], control_leak: float,
          retain_facts: Sequence[tofu.Fact], retained_questions: Sequence[tuple[str, str]],
          base_accuracy: float, console: Console) -> dict[str, Any]:
    sets = sets_for(corpus, [person], seed=index)
    result = erase_timed(start, sets, method=settings.continual_method, hparams={"seed": index}, out_dir=out,
                         console=console, label=f"continual erase {index}")
    report, verify_s = verify_timed(out, assets, sets, seed=index, console=console,
                                    label=f"continual verify {index}", base_dir=start, corpus=corpus.records)
    metrics = report["metrics"]
    gibberish = metrics.get("fluency.gibberish_rate")
    accuracy = contains_rate(out, retained_questions)
    decided = [c for c in report["checks"] if c.get("decides_pass", True)]
    row = {
        "passed": report["passed"], "erase_s": result.seconds, "verify_s": verify_s, "steps": result.steps,
        "checks_passed": sum(bool(c["passed"]) for c in decided), "checks_total": len(decided),
        "failed_checks": [c["name"] for c in decided if not c["passed"]],
        "leakage_forget": metrics.get("leakage.forget"),
        "retain_ratio_vs_parent": metrics.get("utility.retain_ratio"),
        "retained_accuracy": accuracy,
        "retained_ratio_vs_base": accuracy / base_accuracy if base_accuracy else None,
        "well_formed": None if gibberish is None else 1.0 - gibberish,
        "cumulative_leakage": leak_rate(out, _facts(erased)), "control_leakage": control_leak,
        "model_utility": tofu.model_utility(*_load(out), retain_facts)["model_utility"],
    }
    console.say(f"continual step {index}: passed={row['passed']} ({row['checks_passed']}/{row['checks_total']}) "
                f"retained vs base={row['retained_ratio_vs_base']:.3f} leak(all erased)={row['cumulative_leakage']:.3f}")
    return row
