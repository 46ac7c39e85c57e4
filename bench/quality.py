"""Quality benchmark: every method and the retrain oracle, side by side (issue 7 item 1).

For each forget fraction (nested sets of people, as TOFU's forget01/05/10)
and each seed (method seed, retain sampling and verification sampling), run
every method from the same base model, verify the candidate with the
service's own verification suite and default policy, and add TOFU's forget
quality (truth ratios versus the retrain oracle) and model utility.  The
retrain oracle (`train_base` on the corpus without the forgotten people, with
the base model's tokenizer) is trained once per fraction (TOFU also has one
retain model per split) and verified like a candidate for every seed: it is
what a perfect erasure looks like to the same checks.

Every check of the policy is kept per run (name, verdict, measured or the
reason it was not), so the report can show, per method, which checks pass,
how many, and on how many the verdict is the oracle's.
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench import tofu
from bench.assets import Assets, forget_people, oracle_ensure
from bench.console import Console
from bench.engine import erase_timed, sets_for, verify_timed
from bench.results import is_missing, measure
from bench.settings import BenchSettings, MethodVariant

logger = logging.getLogger(__name__)

ORACLE = "retrain-oracle"
BASE = "base (no erasure)"


def _records_of(corpus: Any, people: Sequence[dict[str, Any]]) -> list[Any]:
    ids = {p["person_id"] for p in people}
    return [r for r in corpus.records if r.is_qa and (r.meta or {}).get("person") in ids]


def retained_facts(corpus: Any, assets: Assets, settings: BenchSettings) -> list[tofu.Fact]:
    """A fixed sample of facts about people no fraction ever forgets (model utility)."""
    everyone = assets.people()
    never = [p for p in everyone
             if p["person_id"] not in {q["person_id"] for q in forget_people(everyone, max(settings.forget_fractions))}]
    records = _records_of(corpus, never)
    records = random.Random(0).sample(records, min(settings.utility_facts, len(records)))
    return tofu.facts_of(records, everyone + assets.control_people(), perturbed=settings.tofu_perturbed)


def _checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's checks as the table needs them (no value is added or renamed here)."""
    keep = ("name", "metric", "value", "threshold", "comparator", "passed", "decides_pass", "status", "rule")
    return [{k: c.get(k) for k in keep} for c in report["checks"]]


def _run_row(label: str, fraction: float, seed: int, report: dict[str, Any], verify_s: float,
             tofu_eval: dict[str, Any], oracle_ratios: Sequence[float], **extra: Any) -> dict[str, Any]:
    ratios = np.asarray(tofu_eval["forget_truth_ratios"])
    return {
        "method": label, "fraction": fraction, "seed": seed, "verify_s": round(verify_s, 2),
        "passed": report["passed"], "guarantee": report["guarantee"], "policy": report["policy"],
        "failed_checks": [c["name"] for c in report["checks"] if c.get("decides_pass", True) and not c["passed"]],
        "checks": _checks(report), "unmeasured": report.get("unmeasured", {}),
        "metrics": report["metrics"],
        "tofu": {"forget_quality": tofu.forget_quality(ratios, np.asarray(oracle_ratios)),
                 "forget_truth_ratio_median": float(np.median(ratios)),
                 "forget_probability": tofu_eval["forget_probability"],
                 "model_utility": tofu_eval["model_utility"],
                 "utility_parts": {k: tofu_eval[k] for k in ("probability", "truth_ratio_score", "rouge_l")}},
        **extra,
    }


def _one_method(variant: MethodVariant, *, fraction: float, seed: int, sets: Any, assets: Assets,
                forget: Sequence[tofu.Fact], retain: Sequence[tofu.Fact],
                oracle_ratios: Sequence[float], work: Path, console: Console) -> dict[str, Any]:
    tag = f"{variant.label} {fraction:.0%} seed {seed}"
    out = work / f"{variant.label}-{fraction}-{seed}"
    result = erase_timed(assets.base_dir, sets, method=variant.method,
                         hparams={**variant.overrides, "seed": seed}, out_dir=out,
                         console=console, label=f"erase {tag}")
    report, verify_s = verify_timed(out, assets, sets, seed=seed, console=console, label=f"verify {tag}")
    row = _run_row(variant.label, fraction, seed, report, verify_s, tofu.evaluate(out, forget, retain),
                   oracle_ratios, erase_s=round(result.seconds, 2), steps=result.steps,
                   preset=result.hparams.get("preset"))
    shutil.rmtree(out, ignore_errors=True)  # candidates are large and never reused
    decided = [c for c in row["checks"] if c["decides_pass"]]
    console.say(f"{tag}: passed={row['passed']} checks {sum(c['passed'] for c in decided)}/{len(decided)} "
                f"FQ={row['tofu']['forget_quality']:.3g} MU={row['tofu']['model_utility']:.3f}")
    return row


def run_quality(settings: BenchSettings, assets: Assets, *, work: Path, cache_root: Path,
                console: Console) -> dict[str, Any]:
    from unlearning.corpus import load_corpus

    corpus = load_corpus(assets.corpus_file)
    everyone = assets.people()
    pools = everyone + assets.control_people()
    retain = retained_facts(corpus, assets, settings)
    runs: list[dict[str, Any]] = []
    other_oracles: list[dict[str, Any]] = []  # the oracle of other training seeds, verified alike
    references: dict[str, Any] = {}
    for fraction in settings.forget_fractions:
        forgotten = forget_people(everyone, fraction)
        forget = tofu.facts_of(_records_of(corpus, forgotten), pools, perturbed=settings.tofu_perturbed)
        console.section(f"quality: forget {fraction:.0%} ({len(forgotten)} people, {len(forget)} facts)")
        oracle_dir, oracle_training = oracle_ensure(assets, forgotten, cache_root=cache_root, console=console)
        others = {t: oracle_ensure(assets, forgotten, cache_root=cache_root, console=console, seed=t)[0]
                  for t in settings.oracle_training_seeds if t != 0}
        oracle_eval = tofu.evaluate(oracle_dir, forget, retain)
        base_eval = tofu.evaluate(assets.base_dir, forget, retain)
        oracle_ratios = oracle_eval["forget_truth_ratios"]
        references[f"{fraction}"] = {
            "people": len(forgotten), "forget_facts": len(forget), "retain_facts": len(retain),
            "oracle_training": oracle_training,
            "base": {"forget_quality": tofu.forget_quality(np.asarray(base_eval["forget_truth_ratios"]),
                                                           np.asarray(oracle_ratios)),
                     "model_utility": base_eval["model_utility"],
                     "forget_truth_ratio_median": float(np.median(base_eval["forget_truth_ratios"])),
                     "forget_probability": base_eval["forget_probability"]},
        }
        for seed in settings.seeds:
            sets = sets_for(corpus, forgotten, seed=seed)
            holder: dict[str, Any] = {}
            report = measure(holder, "oracle", partial(
                verify_timed, oracle_dir, assets, sets, seed=seed, console=console,
                label=f"verify oracle {fraction:.0%} seed {seed}"))
            if not is_missing(report):
                runs.append(_run_row(ORACLE, fraction, seed, report[0], report[1], oracle_eval, oracle_ratios))
            for training_seed, other in others.items():
                row = measure(holder, f"oracle t{training_seed}", partial(
                    _other_oracle, other, training_seed, fraction=fraction, seed=seed, sets=sets, assets=assets,
                    console=console))
                if not is_missing(row):
                    other_oracles.append(row)
            for variant in settings.methods:
                row = measure(holder, variant.label, partial(
                    _one_method, variant, fraction=fraction, seed=seed, sets=sets, assets=assets,
                    forget=forget, retain=retain, oracle_ratios=oracle_ratios, work=work, console=console))
                if is_missing(row):
                    runs.append({"method": variant.label, "fraction": fraction, "seed": seed, **row})
                else:
                    runs.append(row)
    from unlearning.verification import DEFAULT_POLICY

    return {"runs": runs, "references": references, "summary": summarise(runs), "policy": DEFAULT_POLICY.to_json(),
            "oracle_seeds": other_oracles, "oracle_spread": oracle_spread(runs, other_oracles),
            "methods": {v.label: {"method": v.method, "overrides": v.overrides} for v in settings.methods}}


def _other_oracle(oracle_dir: Path, training_seed: int, *, fraction: float, seed: int, sets: Any, assets: Assets,
                  console: Console) -> dict[str, Any]:
    """The retrain oracle of another training seed, verified exactly as the seed-0 oracle is."""
    report, verify_s = verify_timed(oracle_dir, assets, sets, seed=seed, console=console,
                                    label=f"verify oracle t{training_seed} {fraction:.0%} seed {seed}")
    row = {"fraction": fraction, "seed": seed, "training_seed": training_seed, "verify_s": round(verify_s, 2),
           "passed": report["passed"],
           "failed_checks": [c["name"] for c in report["checks"] if c.get("decides_pass", True) and not c["passed"]],
           "metrics": {k: v for k, v in report["metrics"].items() if k in SPREAD_METRICS}}
    console.say(f"oracle t{training_seed} {fraction:.0%} seed {seed}: passed={row['passed']} "
                f"mia.auc={row['metrics'].get('mia.auc', float('nan')):.3f}")
    return row


# The figures the acceptance compares with the oracle's, and the oracle's own spread of them.
SPREAD_METRICS = ("mia.auc", "mia.zlib_auc", "mia.span_auc", "utility.retain_ratio",
                  "fluency.content_paired_gibberish_rate", "latent.matched_ratio", "leakage.forget")


def oracle_spread(runs: Sequence[dict[str, Any]], others: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fraction: how far retrain oracles of different training seeds are from each other.

    For each verification seed, the oracles of every training seed (0 and the others) give
    one value of each metric; `oracle_gap` is the largest distance between two of them
    (mean and max over verification seeds), and per method `within` counts the runs whose
    value lies inside the oracles' range at that seed, `gap` the distance to the seed-0
    oracle's.  Verdicts: how many oracle verifications passed the policy.
    """
    out = []
    for fraction in sorted({r["fraction"] for r in others}):
        by_seed: dict[int, list[dict[str, Any]]] = {}
        for run in runs:
            if run["method"] == ORACLE and run["fraction"] == fraction and "metrics" in run:
                by_seed.setdefault(run["seed"], []).append({"training_seed": 0, **run})
        for row in others:
            if row["fraction"] == fraction and row["seed"] in by_seed:
                by_seed[row["seed"]].append(row)
        oracles = [o for rows in by_seed.values() for o in rows]
        failed: dict[str, int] = {}
        for o in oracles:
            for name in o.get("failed_checks", ()):
                failed[name] = failed.get(name, 0) + 1
        entry: dict[str, Any] = {"fraction": fraction, "training_seeds": sorted({o["training_seed"] for o in oracles}),
                                 "verifications": len(oracles), "passed": sum(bool(o["passed"]) for o in oracles),
                                 "failed_checks": failed, "metrics": {}}
        methods = sorted({r["method"] for r in runs if r["fraction"] == fraction and r["method"] != ORACLE})
        for metric in SPREAD_METRICS:
            values: dict[int, dict[int, float]] = {}  # verification seed -> training seed -> value
            for seed, rows in sorted(by_seed.items()):
                found = {o["training_seed"]: o["metrics"].get(metric) for o in rows}
                found = {t: float(v) for t, v in found.items() if v is not None and np.isfinite(v)}
                if len(found) > 1 and 0 in found:
                    values[seed] = found
            if not values:
                continue
            gaps = [max(vs.values()) - min(vs.values()) for vs in values.values()]
            slot: dict[str, Any] = {"per_seed": {str(k): {str(t): v for t, v in vs.items()} for k, vs in values.items()},
                                    "oracle_gap": {"mean": float(np.mean(gaps)), "max": float(max(gaps))},
                                    "methods": {}}
            for method in methods:
                within, gap = 0, []
                for run in runs:
                    if (run["method"], run["fraction"]) != (method, fraction) or "metrics" not in run:
                        continue
                    value, vs = run["metrics"].get(metric), values.get(run["seed"])
                    if value is None or not vs:
                        continue
                    within += min(vs.values()) <= value <= max(vs.values())
                    gap.append(abs(value - vs[0]))
                if gap:
                    slot["methods"][method] = {"within": within, "runs": len(gap), "gap": _stats(gap),
                                               "gap_max": float(max(gap))}
            entry["metrics"][metric] = slot
        out.append(entry)
    return out


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    finite = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not finite:
        return None
    spread = float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0
    return {"mean": float(np.mean(finite)), "sd": spread, "n": len(finite)}


def _decided(run: dict[str, Any]) -> dict[str, bool]:
    return {c["name"]: bool(c["passed"]) for c in run.get("checks") or () if c.get("decides_pass", True)}


def summarise(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread over seeds of every metric, and every check's verdicts, per (fraction, method).

    `checks`: per check of the policy (in the report's order), how many runs it
    passed and why it was unmeasured where it was; `checks_passed`: deciding checks
    passed per run; `oracle_agreement`: per run, the deciding checks whose verdict
    is the retrain oracle's for the same fraction and seed.
    """
    oracle = {(r["fraction"], r["seed"]): _decided(r) for r in runs if r["method"] == ORACLE and "metrics" in r}
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["fraction"], run["method"]), []).append(run)
    summary = []
    for (fraction, method), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        ok = [r for r in group if "metrics" in r]
        entry: dict[str, Any] = {"fraction": fraction, "method": method, "runs": len(group),
                                 "measured": len(ok), "passed": sum(bool(r["passed"]) for r in ok)}
        if len(ok) < len(group):
            entry["not_measured"] = sorted({r.get("not_measured", "") for r in group if "metrics" not in r})
        names = sorted({k for r in ok for k in r["metrics"]})
        entry["metrics"] = {k: _stats([r["metrics"].get(k) for r in ok]) for k in names}
        entry["tofu"] = {k: _stats([r["tofu"][k] for r in ok])
                         for k in ("forget_quality", "model_utility", "forget_truth_ratio_median")} if ok else {}
        entry["seconds"] = {k: _stats([r[k] for r in ok if k in r]) for k in ("erase_s", "verify_s")}
        failed: dict[str, int] = {}
        for run in ok:
            for name in run.get("failed_checks", ()):
                failed[name] = failed.get(name, 0) + 1
        entry["failed_checks"] = failed
        checks: dict[str, dict[str, Any]] = {}
        for run in ok:
            for c in run.get("checks") or ():
                slot = checks.setdefault(c["name"], {"metric": c["metric"], "decides_pass": c.get("decides_pass", True),
                                                     "runs": 0, "passed": 0, "unmeasured": []})
                slot["runs"] += 1
                slot["passed"] += bool(c["passed"])
                if c.get("status") == "unmeasured" and c.get("rule") not in slot["unmeasured"]:
                    slot["unmeasured"].append(c.get("rule"))
        entry["checks"] = checks
        decided = [_decided(r) for r in ok if r.get("checks")]
        entry["checks_total"] = max((len(d) for d in decided), default=0)
        entry["checks_passed"] = _stats([float(sum(d.values())) for d in decided])
        agreement = []
        for run, verdicts in zip([r for r in ok if r.get("checks")], decided, strict=True):
            reference = oracle.get((run["fraction"], run["seed"]))
            if reference is not None:
                shared = set(reference) & set(verdicts)
                agreement.append(float(sum(reference[n] == verdicts[n] for n in shared)))
        entry["oracle_agreement"] = _stats(agreement)
        summary.append(entry)
    return summary
