"""A smoke version of the benchmarks that fits inside `make test` (the real bench never does).

The report writer on a results tree shaped like a real run's, the TOFU
metrics and the wrk parser on known inputs, and one real cost ratio (ASU
step / plain fine-tuning step) on a tiny model built from a config.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import tofu
from bench.assets import Assets, forget_people
from bench.console import Console
from bench.quality import oracle_spread, summarise
from bench.report import write_report
from bench.results import is_missing, measure, not_measured
from bench.service import parse_wrk
from bench.settings import QUICK

WRK_OUTPUT = """Running 3s test @ http://127.0.0.1:8000/healthz
  2 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     7.12ms    8.10ms  60.01ms   90.00%
    Req/Sec   250.10     40.00   300.00     70.00%
  Latency Distribution
     50%    5.70ms
     75%    8.00ms
     90%   15.00ms
     99%    1.20s
  1504 requests in 3.02s, 300.00KB read
  Non-2xx or 3xx responses: 3
Requests/sec:    497.90
Transfer/sec:     99.00KB
"""


CHECKS = (("surface leakage (greedy)", "leakage.forget"), ("retained-fact accuracy", "utility.retain_ratio"),
          ("membership parity", "mia.auc_gap"))


def _cells(md: str, first: str) -> list[str]:
    """The cells after the first of the table row that starts with `first`."""
    line = next(line for line in md.splitlines() if line.startswith(f"| {first} |"))
    return [cell.strip() for cell in line.strip().strip("|").split("|")][1:]


def _run(method: str, seed: int, leak: float, utility: float, passed: bool,
         failing: tuple[str, ...] = ()) -> dict:
    checks = [{"name": name, "metric": metric, "value": 0.1, "threshold": 0.2, "comparator": "<=",
               "passed": name not in failing, "decides_pass": True, "status": "measured", "rule": None}
              for name, metric in CHECKS]
    return {"method": method, "fraction": 0.05, "seed": seed, "passed": passed, "guarantee": "weights",
            "erase_s": 2.0 + seed, "verify_s": 5.0, "policy": {"name": "default", "version": "2"},
            "checks": checks, "failed_checks": list(failing),
            "metrics": {"leakage.forget": leak, "leakage.control": 0.05, "utility.retain_ratio": utility,
                        "mia.auc_gap": 0.3, "mia.auc": float("nan")},
            "tofu": {"forget_quality": 0.5 * leak + 0.01, "model_utility": utility,
                     "forget_truth_ratio_median": 0.9}}


def test_it_counts_each_checks_verdicts_and_the_agreement_with_the_oracle() -> None:
    runs = [_run("retrain-oracle", s, 0.05, 1.0, False, failing=("membership parity",)) for s in range(2)]
    runs += [_run("asu-kl", 0, 0.1, 0.9, False, failing=("membership parity",)),
             _run("asu-kl", 1, 0.1, 0.9, False, failing=("membership parity", "retained-fact accuracy"))]
    summary = {e["method"]: e for e in summarise(runs)}
    asu = summary["asu-kl"]
    assert asu["checks"]["membership parity"]["passed"] == 0 and asu["checks"]["membership parity"]["runs"] == 2
    assert asu["checks"]["retained-fact accuracy"]["passed"] == 1
    assert asu["checks_total"] == 3 and asu["checks_passed"]["mean"] == pytest.approx(1.5)
    # Seed 0 agrees with the oracle on all three checks, seed 1 on two.
    assert asu["oracle_agreement"]["mean"] == pytest.approx(2.5)
    assert summary["retrain-oracle"]["oracle_agreement"]["mean"] == pytest.approx(3.0)


def test_the_oracles_spread_is_the_distance_between_training_seeds_and_places_each_method() -> None:
    runs = []
    for seed, (oracle, asu) in enumerate(((0.43, 0.53), (0.45, 0.70))):
        runs.append({**_run("retrain-oracle", seed, 0.05, 1.0, True), "metrics": {"mia.auc": oracle}})
        runs.append({**_run("asu-kl", seed, 0.1, 0.9, True), "metrics": {"mia.auc": asu}})
    others = [{"fraction": 0.05, "seed": seed, "training_seed": t, "passed": t != 2,
               "failed_checks": [] if t != 2 else ["membership parity"], "metrics": {"mia.auc": value}}
              for seed, values in enumerate(((0.61, 0.46), (0.50, 0.40))) for t, value in zip((1, 2), values, strict=True)]
    entry = oracle_spread(runs, others)[0]
    assert entry["training_seeds"] == [0, 1, 2] and entry["verifications"] == 6 and entry["passed"] == 4
    assert entry["failed_checks"] == {"membership parity": 2}
    slot = entry["metrics"]["mia.auc"]
    # Seed 0: oracles 0.43 / 0.61 / 0.46 (range 0.18); seed 1: 0.45 / 0.50 / 0.40 (0.10).
    assert slot["oracle_gap"]["mean"] == pytest.approx(0.14) and slot["oracle_gap"]["max"] == pytest.approx(0.18)
    asu = slot["methods"]["asu-kl"]
    # 0.53 lies inside seed 0's oracles, 0.70 outside seed 1's; gaps to the seed-0 oracle 0.10 and 0.25.
    assert asu["within"] == 1 and asu["runs"] == 2
    assert asu["gap"]["mean"] == pytest.approx(0.175) and asu["gap_max"] == pytest.approx(0.25)
    assert "retrain-oracle" not in slot["methods"]


def test_the_report_says_what_was_not_measured_and_draws_its_plots(tmp_path: Path) -> None:
    runs = [_run("asu-kl", s, 0.1 + 0.05 * s, 0.95, True) for s in range(2)]
    runs += [_run("graddiff", s, 0.3, 0.6, False, failing=("retained-fact accuracy",)) for s in range(2)]
    runs += [_run("retrain-oracle", s, 0.05, 1.0, True) for s in range(2)]
    results = {
        "meta": {"date": "2026-11-29 18:00 UTC", "command": "python -m bench run --quick", "mode": "quick",
                 "machine": {"cores": 2, "memory_gib": 23.5}, "duration_s": 12.0},
        "quality": {"runs": runs, "summary": summarise(runs), "oracle_spread": oracle_spread(runs, [
                        {"fraction": 0.05, "seed": s, "training_seed": 1, "passed": False,
                         "failed_checks": ["membership parity"], "metrics": {"leakage.forget": 0.02}}
                        for s in range(2)]),
                    "references": {"0.05": {"people": 10, "forget_facts": 110, "base": {"model_utility": 0.7}}}},
        "continual": {"method": "asu", "steps": [
            {"step": 1, "passed": False, "cumulative_leakage": 0.1, "control_leakage": 0.07,
             "retain_ratio_vs_parent": 0.98, "retained_ratio_vs_base": 0.96, "model_utility": 0.7,
             "well_formed": 0.97, "leakage_forget": 0.1, "checks_passed": 15, "checks_total": 16,
             "failed_checks": ["membership parity"]},
            {"step": 2, **not_measured("RuntimeError: the worker died")}]},
        "cost": {"step_time": {"ratios": {"asu_cached_gd": 1.02}, "per_step_s": {"asu_cached_gd": 0.02, "plain": 0.0196}},
                 "batching": not_measured("FileNotFoundError: no model")},
        "service": not_measured("OperationalError: PostgreSQL is down"),
        "shapes": {"people": 30, "max_steps": 1500, "cases": {
            "free_text/gpt2/gpt2": {"memorised": {"accuracy": 0.974}, **{
                name: {"passed": ok, "guarantee": "weights", "checks_passed": n, "checks": 14,
                       "failed": [] if ok else ["membership parity"],
                       "metrics": {"leakage.forget": leak, "leakage.control": 0.0, "mia.auc": 0.55}}
                for name, ok, n, leak in (("base", False, 5, 0.43), ("oracle", True, 14, 0.0),
                                          ("asu", False, 13, 0.14), ("kif", False, 12, 0.0))},
                "asu_escalated": {"passed": True, "guarantee": "weights", "checks_passed": 14, "checks": 14,
                                  "failed": [], "metrics": {"leakage.forget": 0.0},
                                  "changed": ["attack.relearn_recovery failed: stranger_anchor False -> True (set)"]},
                "more_persons": {"5": {"forget_records": 2, "oracle": {
                    "passed": False, "guarantee": "weights", "checks_passed": 13, "checks": 14,
                    "failed": ["latent residual knowledge"], "metrics": {"latent.residual_ratio": 0.71}},
                    "asu": {"passed": True, "guarantee": "weights", "checks_passed": 14, "checks": 14,
                            "failed": [], "metrics": {"latent.residual_ratio": 0.2}}}},
                "kif-distil": {"refused": "no layer separates the subjects"}},
            "chat/gpt_neox/llama": not_measured("RuntimeError: out of memory")}},
    }
    measure(results["cost"], "scan", lambda: 1 / 0)
    md_path, json_path = write_report(results, docs=tmp_path)
    md = md_path.read_text(encoding="utf-8")
    assert "not measured: FileNotFoundError: no model" in md
    assert "not measured: RuntimeError: the worker died" in md
    assert "**2 of 4 oracle verifications pass the policy** (failed: membership parity (2))" in md
    # leakage.forget: oracles 0.05 / 0.02 at both seeds; asu-kl 0.10 and 0.15 (outside, 0.05 and 0.10 off).
    spread = md[md.index("The oracle's own spread"):]
    assert _cells(spread, "`leakage.forget`") == ["0.050 / 0.020; 0.050 / 0.020", "0.030 (0.030)", "0/2, 0.075 (0.100)",
                                                   "0/2, 0.250 (0.250)"]
    step = _cells(md, "1")
    assert step[:4] == ["no", "15/16", "0.980", "0.960"] and step[-1] == "membership parity"
    assert "not measured: ZeroDivisionError" in md
    assert "Not measured: OperationalError: PostgreSQL is down" in md
    # Other corpus shapes: a row per candidate, the case named once; a case that failed says why.
    assert _cells(md, "free_text/gpt2/gpt2")[:4] == ["0.974", "base", "**FAIL** (weights)", "5/14"]
    assert "|  |  | asu | **FAIL** (weights) | 13/14 | 0.140 / 0.000 |" in md
    assert "|  |  | asu_escalated | PASS (weights) | 14/14 |" in md  # the service's retry, after the first
    assert "changed: attack.relearn_recovery failed: stranger_anchor False -> True (set)" in md
    # Further persons of the same base: their own rows, and a count over every erased person.
    assert "|  |  | person 5: oracle | **FAIL** (weights) | 13/14 |" in md
    assert "|  |  | person 5: asu | PASS (weights) | 14/14 |" in md
    assert "Over 2 erased persons: ASU passes 1 at once and 2 after the service's retry; the oracle passes 1." in md
    assert "not measured: RuntimeError: out of memory" in md
    assert "|  |  | kif-distil | refused: no layer separates the subjects |" in md  # the rest of the case kept
    assert "0.125 ± 0.035" in md  # asu-kl forget leakage over its two seeds
    # One column per method, the oracle first; a row per check with its verdicts.
    assert _cells(md, "check") == ["retrain-oracle", "asu-kl", "graddiff"]
    assert _cells(md, "retained-fact accuracy") == ["2/2 pass", "2/2 pass", "0/2 pass"]
    assert _cells(md, "**deciding checks passed**") == ["3.0/3 (mean of 2)", "3.0/3 (mean of 2)", "2.0/3 (mean of 2)"]
    assert _cells(md, "**verdicts equal to the oracle's**") == ["-", "3.0/3 (mean of 2)", "2.0/3 (mean of 2)"]
    assert _cells(md, "**report passed (runs)**") == ["2/2", "2/2", "0/2"]
    # The metric rows are the checks' metrics and their policy baselines, read from the runs.
    assert "| `mia.auc_gap` |" in md and "| `leakage.control` |" in md
    assert (tmp_path / "bench" / "quality_tradeoff.png").stat().st_size > 10_000
    assert (tmp_path / "bench" / "continual.png").stat().st_size > 10_000
    stored = json.loads(json_path.read_text(encoding="utf-8"))  # strict JSON: NaN became null
    assert stored["quality"]["runs"][0]["metrics"]["mia.auc"] is None
    assert is_missing(stored["cost"]["scan"])


def test_it_reads_throughput_and_p99_from_wrk() -> None:
    parsed = parse_wrk(WRK_OUTPUT)
    assert parsed["requests_per_s"] == 497.9
    assert parsed["requests"] == 1504 and parsed["non_2xx"] == 3
    assert parsed["p50_ms"] == pytest.approx(5.7) and parsed["p99_ms"] == pytest.approx(1200.0)


def test_forget_quality_is_high_for_alike_distributions_and_low_for_different_ones() -> None:
    rng = np.random.default_rng(0)
    oracle = rng.uniform(0.8, 1.2, 200)
    assert tofu.forget_quality(rng.uniform(0.8, 1.2, 200), oracle) > 0.05
    assert tofu.forget_quality(rng.uniform(0.0, 0.2, 200), oracle) < 1e-6
    assert tofu.rouge_l_recall("she was born in Lisbon", "She was born in Lisbon.") == pytest.approx(0.8)


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory: pytest.TempPathFactory) -> Assets:
    """A demo corpus of 8 people and a RANDOM tiny Llama (step cost needs no trained model)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from unlearning.checkpoints import save_checkpoint
    from unlearning.corpus import load_corpus
    from unlearning.demo.corpus import write_demo_corpus
    from unlearning.demo.tokenizer import train_tokenizer

    corpus_dir = tmp_path_factory.mktemp("corpus")
    write_demo_corpus(corpus_dir, people=8, seed=0)
    corpus = load_corpus(corpus_dir / "corpus.jsonl")
    tokenizer = train_tokenizer([t for r in corpus.records for t in (r.question, r.answer, r.text) if t],
                                vocab_size=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id))
    base_dir = tmp_path_factory.mktemp("base")
    save_checkpoint(model.eval(), tokenizer, base_dir, {"method": "random_init", "seeds": {"seed": 0}})
    return Assets(corpus_dir=corpus_dir, base_dir=base_dir, preset="tiny", base_training={})


def test_truth_ratios_are_finite_and_perturbed_answers_differ_only_in_the_value(tiny_assets: Assets) -> None:
    from unlearning.corpus import load_corpus
    from unlearning.modeling import load_model

    people = tiny_assets.people()
    gone = {p["person_id"] for p in forget_people(people, 0.25)}
    records = [r for r in load_corpus(tiny_assets.corpus_file).records if (r.meta or {}).get("person") in gone]
    facts = tofu.facts_of(records, people, perturbed=3)
    assert len(facts) == len(records)  # every fact has a value found in its answer
    for fact in facts:
        assert fact.answer not in fact.perturbed and len(fact.perturbed) == 3
    ratios, probability = tofu.truth_ratios(*load_model(tiny_assets.base_dir), facts)
    assert np.isfinite(ratios).all() and ((probability > 0) & (probability <= 1)).all()


def test_the_step_cost_harness_times_every_asu_variant(tiny_assets: Assets, tmp_path: Path) -> None:
    from dataclasses import replace

    from bench.cost import step_time

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread is steadier on a shared machine
    try:
        result = step_time(replace(QUICK, forget_fractions=(0.25,), cost_steps=3), tiny_assets,
                           work=tmp_path, console=Console(quiet=True))
    finally:
        torch.set_num_threads(threads)
    ratios = result["ratios"]
    assert set(ratios) == {"asu_online_gd", "asu_cached_gd", "asu_online_kl", "asu_cached_kl", "asu_full_gd",
                           "asu_full_kl"}
    assert all(r > 0 for r in ratios.values())
    assert result["steps_done"] == {key: 3 for key in ("plain", *ratios)}  # a fixed step count, not the budget
    assert {result["preset"][key] for key in ratios} == {"published"}
    # Which variant is faster is a benchmark figure (make bench), not a test: a timing
    # comparison flips on a loaded machine.


def test_the_wider_model_of_the_step_cost_keeps_the_base_tokenizer_and_takes_the_shape(
    tiny_assets: Assets, tmp_path: Path
) -> None:
    from bench.cost import wide_model
    from unlearning.modeling import load_model

    directory, parameters = wide_model(tiny_assets, (64, 3, 96), tmp_path / "wide")
    model, tokenizer = load_model(directory, device="cpu")
    base, base_tokenizer = load_model(tiny_assets.base_dir, device="cpu")
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.intermediate_size) == (64, 3, 96)
    assert model.config.vocab_size == base.config.vocab_size and parameters == model.num_parameters()
    text = "Where does Ada Lovelace live?"
    assert tokenizer(text)["input_ids"] == base_tokenizer(text)["input_ids"]
    larger, _ = wide_model(tiny_assets, (64, 3, 96, base.config.vocab_size + 500), tmp_path / "larger")
    assert load_model(larger, device="cpu")[0].config.vocab_size == base.config.vocab_size + 500
    with pytest.raises(ValueError, match="vocabulary"):
        wide_model(tiny_assets, (64, 3, 96, 10), tmp_path / "smaller")


def test_the_cost_table_gives_the_wider_models_rows_beside_the_demos() -> None:
    from bench.report import _cost

    cost = {"step_time": {"ratios": {"asu_cached_kl": 1.12}, "per_step_s": {"asu_cached_kl": 0.038, "plain": 0.034},
                          "wide_model": {"hidden_size": 512, "layers": 6, "parameters": 20_027_904,
                                         "vocabulary": 32_000,
                                         "ratios": {"asu_cached_kl": 1.03},
                                         "per_step_s": {"asu_cached_kl": 0.55, "plain": 0.534}}}}
    md = "\n".join(_cost(cost))
    assert ("| ASU step (cached teacher, KL retain: the default) / plain fine-tuning step, on a wider model "
            "(width 512, 6 layers, vocabulary 32,000, 20.0M parameters, random weights) | 1.030 | <= 1.05 | "
            "0.5500 s vs 0.5340 s |") in md
    assert "cached teacher, GD retain" not in md  # a row not measured is left out


def test_the_per_subject_table_has_a_row_per_erased_person_by_id_and_every_check(
    tiny_assets: Assets, tmp_path: Path
) -> None:
    from bench.per_subject import per_subject_table

    text = per_subject_table(tiny_assets, method="gradascent", fraction=0.25, hparams={"steps": 2},
                             seed=0, work=tmp_path, console=Console(quiet=True))
    people = forget_people(tiny_assets.people(), 0.25)
    rows = [line for line in text.splitlines() if re.match(r"\| p\d+ \|", line)]
    assert [row.split(" | ")[0][2:] for row in rows] == [p["person_id"] for p in people]
    for row in rows:
        for cell in row.strip("|").split("|")[1:]:
            before, after = (float(x) for x in cell.split("->"))
            assert 0.0 <= before <= 1.0 and 0.0 <= after <= 1.0
    assert "| surface leakage (greedy), against the same questions about a stranger |" in text
    assert "| retained-fact accuracy |" in text
    for person in tiny_assets.people():  # references only: no names in the table
        assert person["name"] not in text
    assert not (tmp_path / "gradascent").exists()  # the candidate is removed


def test_the_retrain_oracle_reuses_the_base_models_tokenizer(
    tiny_assets: Assets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from bench.assets import oracle_ensure, same_tokenizer
    from unlearning.corpus import load_corpus
    from unlearning.demo import train_base
    from unlearning.demo.tokenizer import train_tokenizer

    # A few optimiser steps: the test is about what the oracle is trained with, not how well.
    monkeypatch.setitem(train_base.PRESETS, "tiny", replace(train_base.PRESETS["tiny"], max_steps=2, epochs=1))
    people = forget_people(tiny_assets.people(), 0.25)
    oracle, training = oracle_ensure(tiny_assets, people, cache_root=tmp_path, console=Console(quiet=True))
    assert same_tokenizer(oracle, tiny_assets.base_dir)
    assert training["tokenizer"] == "the base model's"
    gone = {p["person_id"] for p in people}
    corpus = load_corpus(tiny_assets.corpus_file)
    assert training["records_dropped"] >= sum((r.meta or {}).get("person") in gone for r in corpus.records) > 0
    # A tokenizer trained on the smaller corpus (what train_base does unless told) is told apart.
    kept = corpus.without([r.id for r in corpus.records if (r.meta or {}).get("person") in gone])
    own = train_tokenizer([t for r in kept.records for t in (r.question, r.answer, r.text) if t], vocab_size=512)
    other = tmp_path / "other"
    from unlearning.checkpoints import save_checkpoint
    from unlearning.modeling import load_model

    model, _ = load_model(oracle, device="cpu")
    model.resize_token_embeddings(len(own))
    save_checkpoint(model, own, other, {"method": "test", "seeds": {"seed": 0}})
    assert not same_tokenizer(other, tiny_assets.base_dir)


def test_keep_carries_the_families_not_run_over_from_the_last_report_marked_with_its_date(tmp_path: Path) -> None:
    from bench.__main__ import _carry_over

    previous = {"meta": {"date": "2026-11-30 10:00 UTC", "command": "python -m bench run --full", "mode": "full"},
                "cost": {"step_time": {"ratios": {"asu_cached_gd": 1.01}}}, "shapes": {"cases": {}}}
    (tmp_path / "benchmarks.json").write_text(json.dumps(previous), encoding="utf-8")
    results = {"meta": {"date": "2026-12-01 17:00 UTC", "command": "python -m bench run --full --only shapes",
                        "mode": "full", "machine": {"cores": 2, "memory_gib": 23.5}},
               "shapes": {"people": 30, "max_steps": 3000, "cases": {}}}
    _carry_over(results, tmp_path / "benchmarks.json", ("shapes",))
    assert results["cost"] == previous["cost"] and results["shapes"]["people"] == 30  # new figures win
    assert results["meta"]["carried"] == {"cost": {"date": "2026-11-30 10:00 UTC",
                                                   "command": "python -m bench run --full", "mode": "full"}}
    md = write_report(results, docs=tmp_path / "docs")[0].read_text(encoding="utf-8")
    assert "*Carried over from the run of 2026-11-30 10:00 UTC (`python -m bench run --full`, full mode)" in md
    assert md.count("Carried over") == 1


def test_a_cost_figure_measured_again_after_the_run_says_so_beside_the_table() -> None:
    from bench.report import _cost

    cost = {"batching": {"subjects": 20, "ratio": 2.9, "many_s": 147.3, "one_s": 50.9,
                         "remeasured": "17:15 UTC at commit abc (the bench's batching alone)"},
            "step_time": {"ratios": {"asu_cached_kl": 1.06}, "per_step_s": {"asu_cached_kl": 0.066, "plain": 0.062}}}
    md = "\n".join(_cost(cost))
    assert "| one job for 20 subjects / one job for 1 | 2.900 | <= 3 | 147.3 s vs 50.9 s |" in md
    assert "*`batching` re-measured after this run: 17:15 UTC at commit abc (the bench's batching alone)*" in md
    assert "`step_time` re-measured" not in md


def test_batching_takes_each_side_at_its_fastest_of_alternating_rounds(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    from bench import cost
    from bench.report import _cost

    calls: list[int] = []
    seconds = iter([40.0, 130.0, 35.0, 140.0])  # 1, n, 1, n: each side's best is another round's

    def job(assets: object, corpus: object, people: list[dict[str, object]], **_: object) -> dict[str, float]:
        calls.append(len(people))
        total = next(seconds)
        return {"sets_s": 0.0, "erase_s": total / 2, "verify_s": total / 2, "total_s": total}

    monkeypatch.setattr(cost, "_job", job)
    monkeypatch.setattr("unlearning.corpus.load_corpus", lambda path: [])
    assets = type("A", (), {"corpus_file": tmp_path / "c.jsonl",
                            "people": lambda self: [{"person_id": i} for i in range(30)]})()
    result = cost.batching(QUICK, assets, work=tmp_path, console=Console(quiet=True))  # type: ignore[arg-type]
    n = QUICK.batching_subjects
    assert calls == [1, n, 1, n]
    assert (result["one_s"], result["many_s"], result["ratio"]) == (35.0, 130.0, 130.0 / 35.0)
    assert result["one_runs_s"] == [40.0, 35.0] and result["many_runs_s"] == [130.0, 140.0]
    md = "\n".join(_cost({"batching": result}))
    assert (f"| one job for {n} subjects / one job for 1 | 3.714 | <= 3 | 130.0 s vs 35.0 s (best of 2 "
            "alternating rounds: 130.0, 140.0 s vs 40.0, 35.0 s) |") in md


def test_the_index_table_gives_build_look_up_and_the_10_gb_figure() -> None:
    from bench.report import _index

    index = {"built": True,
             "builds": [{"corpus_mb": 100.0, "seconds": 17.2, "mb_per_s": 5.8, "index_mb": 71.0, "peak_rss_mb": 418}],
             "lookups": [{"corpus_mb": 100.0, "subjects": 100, "forget_set_first_s": 0.9, "forget_set_s": 0.64,
                          "build_sets_s": 2.38, "scan_s": 3.6, "rg_s": 0.51, "peak_rss_mb": 153,
                          "identical_to_scan": True}],
             "ten_gb": {"method": "linear", "build_s": 2580.0, "index_gb": 7.5, "forget_set_s": {"100": 16.0},
                        "goal_s": 60.0}}
    md = "\n".join(_index(index))
    assert "| 100 MB | 100 | 0.90 / 0.64 | 2.38 | 3.60 | 0.51 | 153 | yes |" in md
    assert "16.0 s for 100 subject(s) (goal <= 60 s)" in md
    assert _index({"built": False, "reason": "no rg"}) == []


def test_the_service_bench_counts_the_cpu_of_a_process_and_its_children() -> None:
    import subprocess
    import sys

    from bench.service import _cpu_seconds

    # the child burns 0.5 s of its own clock; /proc counts whole scheduler ticks, which can
    # fall a tick or more short of process_time() on a loaded machine (CI read 0.29 for 0.3)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"])
    try:
        for _ in range(200):  # until /proc shows most of the child's 0.5 s
            if _cpu_seconds({parent.pid}, b"") >= 0.3:
                break
            time.sleep(0.1)
        assert 0.3 <= _cpu_seconds({parent.pid}, b"") < 5
        assert _cpu_seconds({-1}, b"") == 0.0  # nobody's
    finally:
        for child in subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", child])
        parent.kill()
        parent.wait()


def test_a_scan_started_by_a_large_process_reports_its_own_peak_memory() -> None:
    import subprocess
    import sys

    held = bytearray(300_000_000)  # the benchmark holding models when it starts the scan
    held[::4096] = b"\x01" * len(held[::4096])
    code = "from unlearning.sets_benchmark import peak_rss_mb; print(peak_rss_mb())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[2])
    assert 5 < float(child.stdout) < 250  # the child's own interpreter, not the parent's 300 MB
    del held


def test_the_oracle_seeds_override_needs_the_bases_own_recipe(capsys) -> None:
    # `--oracle-seeds 0` would leave the quality bench without its reference oracle: refused, exit 2.
    from bench.__main__ import main

    with pytest.raises(SystemExit) as stopped:
        main(["run", "--full", "--only", "quality", "--oracle-seeds", "0"])
    assert stopped.value.code == 2
    assert "--oracle-seeds" in capsys.readouterr().err


def test_the_walk_table_gives_each_models_fixed_sample_accuracy_and_its_ratio_to_v1s() -> None:
    from bench.report import _walk

    rows = [{"reference": "ER-2026-00001", "certified": True, "seconds": 61.6, "checkpoint_version": 2,
             "serving_version": 2, "retained_accuracy": 0.92, "retained_ratio_vs_parent": 0.995,
             "retained_accuracy_fixed": 0.88, "retained_accuracy_fixed_v1": 0.9, "start_version": 1,
             "retained_questions": 200, "retained_ratio_since_v1": 0.88 / 0.9, "failed": []}]
    text = "\n".join(_walk({"requests": 1, "certified": 1, "rows": rows}))
    assert "one fixed sample of 200 retained questions" in text and "not a product" in text
    assert "| request | certified | seconds to end of job | serving | vs parent | retained (fixed 200 questions) " \
           "| since v1 | failed checks |" in text
    assert "| before | - | - | v1 | - | 0.900 | 1.000 | - |" in text
    assert "| 1 | yes | 61.6 | v2 | 0.995 | 0.880 | 0.978 | - |" in text
    # A walk measured before the fixed sample (a carried figure) keeps its own wording and columns.
    old = [{k: v for k, v in rows[0].items() if not k.startswith(("retained_accuracy_fixed", "retained_q"))}]
    text = "\n".join(_walk({"requests": 1, "certified": 1, "rows": old}))
    assert "`since v1` multiplies them along the" in text and "| 1 | yes | 61.6 | v2 | 0.920 | 0.995 | 0.978 | - |" in text
