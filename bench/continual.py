"""Continual benchmark: erasure requests applied one after another to the same model (issue 7 item 2).

Each request erases one person, starting from the previous candidate (as the
service promotes it), with the records of everyone erased before tombstoned
from the corpus (so retain data never includes them).  After each step:
the service's verification of that request, plus the leakage over every
person erased so far (greedy answers to their original questions that
contain the fact), the control level, and TOFU-style model utility on
people never erased.
"""

from __future__ import annotations

import logging
import random
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


def _contains(answer: str, value: str) -> bool:
    return value.casefold() in answer.casefold()


def leak_rate(model_dir: Path, facts: Sequence[tuple[str, str]]) -> float:
    """Share of (question, value) whose greedy answer contains the value."""
    from unlearning.modeling import generate_answers, load_model

    model, tokenizer = load_model(model_dir)
    answers = generate_answers(model, tokenizer, [q for q, _ in facts])
    return float(np.mean([_contains(a, v) for a, (_, v) in zip(answers, facts, strict=True)]))


def _facts(people: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(f["question"], f["value"]) for p in people for f in p["facts"]]


def run_continual(settings: BenchSettings, assets: Assets, *, work: Path, console: Console) -> dict[str, Any]:
    from unlearning.corpus import load_corpus

    corpus = load_corpus(assets.corpus_file)
    everyone = assets.people()
    order = forget_people(everyone, 1.0)
    requests = order[: settings.continual_requests]
    gone_ids = {p["person_id"] for p in requests}
    kept = [p for p in everyone if p["person_id"] not in gone_ids]
    retained_records = [r for r in corpus.records if r.is_qa and (r.meta or {}).get("person") in
                        {p["person_id"] for p in kept}]
    retained_records = random.Random(0).sample(retained_records, min(settings.utility_facts, len(retained_records)))
    retain_facts = tofu.facts_of(retained_records, everyone + assets.control_people(), perturbed=settings.tofu_perturbed)
    control = assets.control_people()
    control_leak = leak_rate(assets.base_dir, _facts(control))
    base_utility = tofu.model_utility(*_load(assets.base_dir), retain_facts)["model_utility"]

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
            retain_facts=retain_facts, console=console))
        steps.append({"step": index, **step})
        if "cumulative_leakage" not in step:
            break  # the chain is broken: later steps would have no model to start from
        if current != assets.base_dir:
            import shutil

            shutil.rmtree(current, ignore_errors=True)
        current = out
        erased.append(person)
    return {"method": settings.continual_method, "steps": steps, "control_leakage": control_leak,
            "base_model_utility": base_utility,
            "base_leakage": leak_rate(assets.base_dir, _facts(requests))}


def _load(model_dir: Path) -> tuple[Any, Any]:
    from unlearning.modeling import load_model

    return load_model(model_dir)


def _step(settings: BenchSettings, assets: Assets, corpus: Any, person: dict[str, Any], start: Path,
          out: Path, index: int, *, erased: list[dict[str, Any]], control_leak: float,
          retain_facts: Sequence[tofu.Fact], console: Console) -> dict[str, Any]:
    sets = sets_for(corpus, [person], seed=index)
    result = erase_timed(start, sets, method=settings.continual_method, hparams={"seed": index}, out_dir=out,
                         console=console, label=f"continual erase {index}")
    report, verify_s = verify_timed(out, assets, sets, seed=index, console=console,
                                    label=f"continual verify {index}")
    metrics = report["metrics"]
    gibberish = metrics.get("fluency.gibberish_rate")
    row = {
        "passed": report["passed"], "erase_s": result.seconds, "verify_s": verify_s,
        "leakage_forget": metrics.get("leakage.forget"), "retain_ratio": metrics.get("utility.retain_ratio"),
        "well_formed": None if gibberish is None else 1.0 - gibberish,
        "cumulative_leakage": leak_rate(out, _facts(erased)), "control_leakage": control_leak,
        "model_utility": tofu.model_utility(*_load(out), retain_facts)["model_utility"],
    }
    console.say(f"continual step {index}: leak(all erased)={row['cumulative_leakage']:.3f} "
                f"retain={row['retain_ratio']} utility={row['model_utility']:.3f} passed={row['passed']}")
    return row
