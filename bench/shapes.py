"""Other corpus shapes: the engine on corpora, tokenizers and architectures the demo lacks.

Each case is one corpus shape of tests/real_shaped.py (free text with unique e-mail
addresses, phone numbers and street addresses and pronoun-only records; freely phrased
question/answer records; chat threads), one decoder architecture and one tokenizer style
(`unlearning.demo.tokenizer.STYLES`), all built here.  Per case: train the base (its
memorisation by record shape), erase one person with ASU and with KIF at their defaults,
train the retrain-without oracle on the base's own tokenizer, and verify all four with the
default policy against the shape's control records (people never trained on).  Two more
persons (`PERSONS`) are then erased from the same base, one at a time, by ASU with their own
oracles: one person's figures are one draw.  An ASU
candidate that fails gets the one escalated retry the service would run (`report_escalation`:
each failed check's cure), verified the same way.  The report gives the verdict and the
failed checks of each, and the ASU and oracle figures side by side.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

from bench.console import Console

# (shape, architecture, tokenizer style): the three headline cases first.
HEADLINE = (("free_text", "gpt2", "gpt2"), ("plain_qa", "qwen2", "qwen2"), ("chat", "gpt_neox", "llama"))
CROSSED = (("free_text", "llama", "llama"), ("plain_qa", "opt", "gpt2"), ("chat", "mistral", "qwen2"))
# (label, method, hyper-parameter overrides): the defaults, and KIF distilled into the weights.
CANDIDATES = (("asu", "asu", {}), ("kif", "kif", {}), ("kif-distil", "kif", {"distill_steps": 120}))
PEOPLE = 30
PERSONS = (3, 5, 11)  # erased one at a time from the same base; KIF on the first only
METRICS = ("leakage.forget", "leakage.control", "mia.auc", "mia.zlib_auc", "mia.span_auc",
           "latent.residual_ratio", "latent.value_ratio", "latent.paired_ratio", "latent.matched_ratio",
           "utility.retain_ratio", "fluency.gibberish_rate",
           "attack.relearn_recovery", "attack.relearn_paired_recovery", "attack.relearn_paired_stranger",
           "attack.quant4_leakage")


def _verdict(report: dict[str, Any]) -> dict[str, Any]:
    checks = report["checks"]
    return {
        "passed": report["passed"], "guarantee": report.get("guarantee"),
        "checks_passed": sum(bool(c["passed"]) for c in checks if c.get("decides_pass", True)),
        "checks": sum(1 for c in checks if c.get("decides_pass", True)),
        "failed": sorted({c["name"] for c in checks if c.get("decides_pass", True) and not c["passed"]}),
        "metrics": {k: report["metrics"].get(k) for k in METRICS},
        "control_source": report.get("control_source"),
    }


def run_case(shape: str, arch: str, style: str, *, work: Path, console: Console, max_steps: int) -> dict[str, Any]:
    """One shape: the base trained once, then each of `PERSONS` erased from it in turn (the
    first with every candidate, the others with ASU and the oracle; `more_persons`)."""
    import torch

    from tests.real_shaped import shaped_corpus
    from unlearning.corpus import Corpus
    from unlearning.demo.train_base import PRESETS, train_base

    torch.manual_seed(0)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    records, persons, control = shaped_corpus(shape, PEOPLE, seed=0)
    corpus = Corpus(tuple(records))
    preset = dataclasses.replace(PRESETS["tiny"], max_steps=max_steps)
    out: dict[str, Any] = {"shape": shape, "arch": arch, "tokenizer": style, "people": PEOPLE,
                           "person": PERSONS[0], "seconds": {}}
    started = time.perf_counter()
    with console.task(f"{shape}/{arch}: train the base") as progress:
        trained = train_base(corpus, work / "base", preset=preset, arch=arch, tokenizer_style=style,
                             progress=progress)
    out["seconds"]["train"] = round(time.perf_counter() - started, 1)
    out["memorised"] = {"accuracy": trained.accuracy, "by_shape": dict(trained.accuracy_by_shape),
                        "steps": trained.steps}
    for number, index in enumerate(PERSONS):
        where = out if number == 0 else out.setdefault("more_persons", {}).setdefault(str(index), {"seconds": {}})
        _erase_person(persons[index], corpus, control, where, work=work, console=console, preset=preset, arch=arch,
                      tag=f"{shape}/{arch} person {index}",
                      candidates=CANDIDATES if number == 0 else CANDIDATES[:1], with_base=number == 0)
    shutil.rmtree(work, ignore_errors=True)  # checkpoints are large; the figures are kept
    return out


def _erase_person(person: Any, corpus: Any, control: Any, out: dict[str, Any], *, work: Path, console: Console,
                  preset: Any, arch: str, tag: str, candidates: tuple[tuple[str, str, dict[str, Any]], ...],
                  with_base: bool) -> None:
    """Train the oracle without one person, erase them with each candidate method (ASU, when it
    fails, once more with the service's escalated settings) and verify everything."""
    from unlearning.demo.train_base import train_base
    from unlearning.erase import erase
    from unlearning.sets import Subject, build_sets
    from unlearning.verification import DEFAULT_POLICY, report_escalation, verify

    sets = build_sets(corpus, [Subject(person.name, (), person.identifiers)])
    out["forget_records"] = len(sets.forget)
    for stale in ("oracle", *(label for label, _, _ in candidates), "asu-escalated"):
        shutil.rmtree(work / stale, ignore_errors=True)
    started = time.perf_counter()
    with console.task(f"{tag}: train the retrain-without oracle") as progress:
        train_base(corpus.without(r.id for r in sets.forget), work / "oracle", preset=preset, arch=arch,
                   tokenizer=work / "base", progress=progress)
    out["seconds"]["oracle_train"] = round(time.perf_counter() - started, 1)
    made = {"base": work / "base"} if with_base else {}
    made["oracle"] = work / "oracle"
    resolved: dict[str, Any] = {}
    for label, method, hparams in candidates:
        started = time.perf_counter()
        try:
            with console.task(f"{tag}: erase with {label}") as progress:
                result = erase(work / "base", sets, method=method, out_dir=work / label,
                               hparams=dict(hparams), progress=progress)
            made[label], resolved[label] = result.out_dir, result.hparams
        except ValueError as refusal:  # the method's own refusal (a user would get it as a 4xx / exit 2)
            out[label] = {"refused": str(refusal)}
            console.say(f"{tag}: {label} refused: {refusal}")
        out["seconds"][f"erase_{label}"] = round(time.perf_counter() - started, 1)

    def judge(name: str, candidate: Path) -> dict[str, Any]:
        started = time.perf_counter()
        with console.task(f"{tag}: verify {name}") as progress:
            report = verify(candidate, work / "base", sets, control=control, corpus=corpus,
                            policy=DEFAULT_POLICY, progress=progress).to_json()
        out["seconds"][f"verify_{name}"] = round(time.perf_counter() - started, 1)
        out[name] = _verdict(report)
        return report

    reports = {name: judge(name, candidate) for name, candidate in made.items()}
    asu = reports.get("asu")
    if asu is not None and not asu["passed"]:  # the service's one escalated retry
        stronger = report_escalation(asu, method="asu", hparams=resolved["asu"])
        if stronger is not None:
            started = time.perf_counter()
            with console.task(f"{tag}: erase with asu, escalated") as progress:
                again = erase(work / "base", sets, method="asu", out_dir=work / "asu-escalated",
                              hparams=stronger, progress=progress).out_dir
            out["seconds"]["erase_asu_escalated"] = round(time.perf_counter() - started, 1)
            judge("asu_escalated", again)
            out["asu_escalated"]["changed"] = list(stronger.get("escalation") or [])


def run_shapes(settings: Any, *, work: Path, console: Console) -> dict[str, Any]:
    from bench.results import measure

    cases = HEADLINE if settings.mode == "quick" else HEADLINE + CROSSED
    max_steps = 1500 if settings.mode == "quick" else 3000
    results: dict[str, Any] = {"people": PEOPLE, "max_steps": max_steps, "cases": {}}
    for shape, arch, style in cases:
        key = f"{shape}/{arch}/{style}"
        measure(results["cases"], key, lambda s=shape, a=arch, t=style: run_case(
            s, a, t, work=work / f"{s}-{a}", console=console, max_steps=max_steps))
    return results
