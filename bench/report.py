"""Write docs/benchmarks.json (every figure), docs/benchmarks.md and its plots under docs/bench/."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.plots import continual_plot, tradeoff_plot
from bench.results import NOT_MEASURED, is_missing

# Figures of the quality table besides the report's own metrics: (label, family, key, digits).
# The metric rows themselves are read from the runs' checks and the policy that judged them.
EXTRA_ROWS = (
    ("TOFU forget quality (KS p vs oracle)", "tofu", "forget_quality", 3),
    ("TOFU forget truth ratio (median)", "tofu", "forget_truth_ratio_median", 3),
    ("TOFU model utility", "tofu", "model_utility", 3),
    ("erase s", "seconds", "erase_s", 1),
    ("verify s", "seconds", "verify_s", 1),
)
ORACLE = "retrain-oracle"


def _relearn(m: dict[str, Any]) -> str:
    """The relearning reading the newest policy decides on (against strangers relearning the same
    records, "subject / strangers"), else the older one of a report measured before it."""
    if "attack.relearn_paired_recovery" in m:
        return f"{fmt(m.get('attack.relearn_paired_recovery'))} / {fmt(m.get('attack.relearn_paired_stranger'))}"
    return fmt(m.get("attack.relearn_recovery"))


def fmt(value: Any, digits: int = 3) -> str:
    """A figure for the page: mean ± sd, a number, or "not measured: reason"."""
    if value is None:
        return "-"
    if is_missing(value):
        return f"not measured: {value[NOT_MEASURED]}"
    if isinstance(value, dict) and "mean" in value:
        if value.get("n", 1) > 1:
            return f"{_num(value['mean'], digits)} ± {_num(value['sd'], digits)}"
        return _num(value["mean"], digits)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return _num(value, digits)
    return str(value)


def _num(x: float, digits: int) -> str:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, float) and x != 0 and abs(x) < 10 ** (-digits):
        return f"{x:.1e}"
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def _get(tree: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(tree, dict) or is_missing(tree):
            return tree if is_missing(tree) else None
        tree = tree.get(key)
    return tree


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines + [""]


def _missing_family(name: str, value: Any) -> list[str] | None:
    if value is None:
        return [f"Not measured: the {name} benchmark was not run in this invocation.", ""]
    if is_missing(value):
        return [f"Not measured: {value[NOT_MEASURED]}", ""]
    return None


def _policy_of(runs: Sequence[dict[str, Any]]) -> Any:
    """The registered policy the runs were judged by (None when it is not registered here)."""
    from unlearning.verification import get_policy

    for run in runs:
        info = run.get("policy") or {}
        if info.get("name"):
            try:
                return get_policy(str(info["name"]), info.get("version"))
            except KeyError:
                return None
    return None


def _check_names(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Every check name the runs were judged on, in the order the reports list them."""
    names: list[str] = []
    for entry in entries:
        for name in entry.get("checks") or {}:
            if name not in names:
                names.append(name)
    return names


def _metric_names(entries: Sequence[dict[str, Any]], policy: Any) -> list[str]:
    """The metrics the checks judge, each followed by the baseline its threshold is built on."""
    baselines = {c.metric: c.baseline for c in policy.checks} if policy is not None else {}
    names: list[str] = []
    for entry in entries:
        for check in (entry.get("checks") or {}).values():
            for name in (check["metric"], baselines.get(check["metric"])):
                if name and name not in names:
                    names.append(name)
    return names


def _verdict(check: dict[str, Any] | None) -> str:
    if check is None or not check.get("runs"):
        return "-"
    runs, passed = check["runs"], check["passed"]
    word = ("pass" if passed == runs else "**FAIL**") if runs == 1 else f"{passed}/{runs} pass"
    if check.get("unmeasured"):
        word += " (unmeasured: " + "; ".join(str(r) for r in check["unmeasured"]) + ")"
    return word


def _count(stat: dict[str, Any] | None, total: int) -> str:
    """A count of checks out of `total`: one run's, or the mean over several."""
    if not stat:
        return "-"
    if stat.get("n", 1) > 1:
        return f"{stat['mean']:.1f}/{total} (mean of {stat['n']})"
    return f"{stat['mean']:.0f}/{total}"


def _columns(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The oracle first, then the methods in the order they ran."""
    return sorted(entries, key=lambda e: (e["method"] != ORACLE,))


def _quality(quality: Any, plots: Path, docs: Path) -> list[str]:
    out = ["## Forgetting quality, side by side", ""]
    missing = _missing_family("quality", quality)
    if missing:
        return out + missing
    policy = _policy_of(quality.get("runs") or [])
    named = (f"`{policy.name}` v{policy.version}" if policy is not None
             else fmt((quality.get("policy") or {}).get("name")))
    out += ["Every method starts from the same base model; each candidate is checked by the service's own",
            f"verification suite and its default policy ({named}, docs/verification.md).  The retrain oracle is",
            "the base recipe trained again without the forgotten people (same preset, seed and tokenizer):",
            "what a perfect erasure looks like to the same checks, so a check the oracle fails is a check",
            "that cannot tell an erasure from a model that never saw the people.  `forget quality` is TOFU's",
            "KS-test p-value of the truth-ratio distribution against the oracle (higher = closer to it);",
            "`model utility` is TOFU's harmonic mean on retained people's facts.  Over several seeds a cell",
            "counts the runs that passed, and a figure is mean ± sd.", ""]
    summary = quality["summary"]
    for fraction in sorted({e["fraction"] for e in summary}):
        ref = quality["references"].get(str(fraction), {})
        entries = _columns([e for e in summary if e["fraction"] == fraction])
        header = [e["method"] for e in entries]
        out.append(f"### Forget {fraction:.0%} of the people ({ref.get('people', '?')} people, "
                   f"{ref.get('forget_facts', '?')} facts)")
        out.append("")
        out += ["Verdict of every check, per method (a check marked unmeasured was judged by the policy's rule",
                "for its reason code):", ""]
        rows = []
        for name in _check_names(entries):
            deciding = all((e.get("checks") or {}).get(name, {}).get("decides_pass", True) for e in entries)
            rows.append([name + ("" if deciding else " (guarantee class only)"),
                         *[_verdict((e.get("checks") or {}).get(name)) for e in entries]])
        rows.append(["**deciding checks passed**", *[_count(e.get("checks_passed"), e.get("checks_total", 0))
                                                     for e in entries]])
        rows.append(["**verdicts equal to the oracle's**", *[
            "-" if e["method"] == ORACLE else _count(e.get("oracle_agreement"), e.get("checks_total", 0))
            for e in entries]])
        rows.append(["**report passed (runs)**", *[
            f"{e['passed']}/{e['measured']}" + (f" ({e['runs'] - e['measured']} not measured)"
                                                if e["runs"] > e["measured"] else "") for e in entries]])
        out += _table(["check", *header], rows)
        base = ref.get("base", {})
        out += ["The figures behind the checks (each check's metric, then the baseline its threshold is built on):", ""]
        rows = [[f"`{name}`", *[fmt((e.get("metrics") or {}).get(name), 3) for e in entries], "-"]
                for name in _metric_names(entries, policy)]
        rows += [[label, *[fmt((e.get(family) or {}).get(key), digits) for e in entries],
                  fmt(base.get(key), digits) if family == "tofu" else "-"]
                 for label, family, key, digits in EXTRA_ROWS]
        out += _table(["figure", *header, "base (no erasure)"], rows)
        failures = [f"{e['method']}: {'; '.join(e['not_measured'])}" for e in entries if e.get("not_measured")]
        out += [f"- not measured: {f}" for f in failures] + ([""] if failures else [])
        out += _oracle_spread(quality, fraction)
    plot = tradeoff_plot(summary, plots / "quality_tradeoff.png")
    if plot is not None:
        out += [f"![forgetting vs utility]({plot.relative_to(docs).as_posix()})", ""]
    return out


def _oracle_spread(quality: Any, fraction: float) -> list[str]:
    """How far oracles of different training seeds are apart, and where each method lies."""
    entry = next((e for e in quality.get("oracle_spread") or () if e["fraction"] == fraction), None)
    if not entry or not entry.get("metrics"):
        return []
    seeds = "/".join(str(t) for t in entry["training_seeds"])
    failed = "; ".join(f"{name} ({n})" for name, n in sorted(entry["failed_checks"].items()))
    out = [f"The oracle's own spread: the same recipe trained with training seeds {seeds} (0 is the oracle "
           "above), each verified at every seed.  "
           f"**{entry['passed']} of {entry['verifications']} oracle verifications pass the policy**"
           + (f" (failed: {failed})" if failed else "") + ".  Per verification seed the oracles' values "
           f"(training seeds {seeds}); the largest distance between two oracles; and per method, the runs "
           "inside the oracles' range and the distance to the seed-0 oracle (mean, max):", ""]
    methods = sorted({m for slot in entry["metrics"].values() for m in slot["methods"]})
    rows = []
    for metric, slot in entry["metrics"].items():
        per_seed = "; ".join(" / ".join(fmt(v, 3) for _, v in sorted(vs.items(), key=lambda kv: int(kv[0])))
                             for _, vs in sorted(slot["per_seed"].items(), key=lambda kv: int(kv[0])))
        cells = []
        for method in methods:
            m = slot["methods"].get(method)
            cells.append("-" if m is None else
                         f"{m['within']}/{m['runs']}, {fmt((m.get('gap') or {}).get('mean'), 3)} "
                         f"({fmt(m.get('gap_max'), 3)})")
        rows.append([f"`{metric}`", per_seed,
                     f"{fmt(slot['oracle_gap']['mean'], 3)} ({fmt(slot['oracle_gap']['max'], 3)})", *cells])
    return out + _table(["figure", "oracles", "oracle vs oracle (mean, max)", *methods], rows)


def _continual(continual: Any, plots: Path, docs: Path) -> list[str]:
    out = ["## Continual erasure", ""]
    missing = _missing_family("continual", continual)
    if missing:
        return out + missing
    out += [f"{len(continual['steps'])} one-person requests in a row with `{continual['method']}`, each starting from",
            "the previous candidate, with the erased people's records tombstoned from the corpus as the service",
            f"does.  Each candidate is verified as the service verifies it, by the default policy, against "
            f"{continual.get('verified_against', 'its parent')} "
            f"({fmt(continual.get('passed_steps'))} of {fmt(continual.get('measured_steps'))} steps passed).",
            "`retain ratio vs parent` is that verification's figure; `retained vs base` compares with the ORIGINAL",
            f"base model on a fixed sample of {fmt(continual.get('retained_sample'))} retained people's questions "
            f"(base accuracy {fmt(continual.get('base_retained_accuracy'))}; the verifier's rule: the greedy answer",
            "contains the value), so it shows what the per-step checks let add up.", ""]
    keys = (("passed", "verify passed", 0), ("checks", "checks passed", 0),
            ("retain_ratio_vs_parent", "retain ratio vs parent", 3),
            ("retained_ratio_vs_base", "retained vs base", 3),
            ("leakage_forget", "leak (this request)", 3),
            ("cumulative_leakage", "leak (all erased so far)", 3), ("control_leakage", "control", 3),
            ("model_utility", "model utility", 3),
            ("well_formed", "well-formed", 3), ("erase_s", "erase s", 1), ("verify_s", "verify s", 1),
            ("failed_checks", "failed checks", 0))

    def cell(step: dict[str, Any], key: str, digits: int) -> str:
        if NOT_MEASURED in step:
            return fmt({NOT_MEASURED: step[NOT_MEASURED]}) if key == "passed" else "-"
        if key == "checks":
            return f"{step.get('checks_passed')}/{step.get('checks_total')}"
        if key == "failed_checks":
            return ", ".join(step.get("failed_checks") or []) or "-"
        return fmt(step.get(key), digits)

    rows = [[str(s["step"]), *(cell(s, k, d) for k, _, d in keys)] for s in continual["steps"]]
    out += _table(["step", *[label for _, label, _ in keys]], rows)
    plot = continual_plot(continual["steps"], plots / "continual.png")
    if plot is not None:
        out += [f"![continual erasure]({plot.relative_to(docs).as_posix()})", ""]
    return out + _walk(continual.get("service_walk"))


def _walk(walk: Any) -> list[str]:
    out = ["### The service walk", ""]
    missing = _missing_family("service walk", walk)
    if missing is not None:
        return out + missing
    rows = walk["rows"]
    out += [f"{walk['requests']} demo people filed one after another as separate immediate requests through the",
            "real embedded pipeline (`python -m workers.embedded demo --requests N`: SQLite, the embedded broker, a"]
    first = rows[0] if rows else {}
    if "retained_accuracy_fixed" not in first:  # a walk measured before the fixed sample (a carried figure)
        out += ["real worker process and beat), each job starting from the model the previous one promoted.  `retained",
                "vs parent` is the verifier's ratio on that job's retained sample; `since v1` multiplies them along the",
                f"lineage.  **Certified {walk['certified']} of {walk['requests']}** (goal: all).", ""]
        table = [[str(n), "yes" if r["certified"] else "**no**", fmt(r["seconds"], 1),
                  f"v{r['checkpoint_version']}" if r.get("checkpoint_version") else "-",
                  fmt(r.get("retained_accuracy")), fmt(r.get("retained_ratio_vs_parent")),
                  fmt(r.get("retained_ratio_since_v1")), ", ".join(r.get("failed") or []) or "-"]
                 for n, r in enumerate(rows, 1)]
        return out + _table(["request", "certified", "seconds to end of job", "serving", "retained accuracy",
                             "vs parent", "since v1", "failed checks"], table)
    questions = first.get("retained_questions")
    v1 = first.get("retained_accuracy_fixed_v1")
    label = f"v{first.get('start_version') or 1}"
    out += ["real worker process and beat), each job starting from the model the previous one promoted.",
            "`vs parent` is the job's verifier: its candidate over its parent on that job's own retained sample.",
            "`retained` is the accuracy of the model serving after the request (the promoted checkpoint, or the",
            f"unchanged one after a rejection) on one fixed sample of {questions} retained questions about people",
            "the walk does not file, drawn once with a fixed seed, asked greedily and scored as the verifier scores its",
            f"retained accuracy; `since {label}` is that over {label}'s on the same questions, scored before the first",
            f"request: a ratio of two readings of one sample, not a product of per-job ratios.  **Certified "
            f"{walk['certified']} of {walk['requests']}** (goal: all).", ""]
    if v1 is None:
        out += [f"The fixed sample was not scored: {first.get('retained_fixed_error') or 'no reason recorded'}.", ""]
    table = [["before", "-", "-", label, "-", fmt(v1), fmt(1.0 if v1 else None), "-"]]
    table += [[str(n), "yes" if r["certified"] else "**no**", fmt(r["seconds"], 1),
               f"v{r.get('serving_version') or r.get('checkpoint_version')}"
               if r.get("serving_version") or r.get("checkpoint_version") else "-",
               fmt(r.get("retained_ratio_vs_parent")), fmt(r.get("retained_accuracy_fixed")),
               fmt(r.get("retained_ratio_since_v1")), ", ".join(r.get("failed") or []) or "-"]
              for n, r in enumerate(rows, 1)]
    return out + _table(["request", "certified", "seconds to end of job", "serving", "vs parent",
                         f"retained (fixed {questions} questions)", f"since {label}", "failed checks"], table)


def _cost(cost: Any) -> list[str]:
    out = ["## Cost", ""]
    missing = _missing_family("cost", cost)
    if missing:
        return out + missing
    step = cost.get("step_time")
    rows = []
    for key, label, limit in (("asu_online_gd", "ASU step (online teacher, GD retain) / plain fine-tuning step", "<= 4/3"),
                              ("asu_online_kl", "ASU step (online teacher, KL retain) / plain fine-tuning step", "<= 4/3"),
                              ("asu_cached_gd", "ASU step (cached teacher: its top 64 tokens, the default; GD retain) "
                                                "/ plain fine-tuning step", "<= 1.05"),
                              ("asu_cached_kl", "ASU step (cached teacher: its top 64 tokens; KL retain: the default) "
                                                "/ plain fine-tuning step", "<= 1.05"),
                              ("asu_full_gd", "ASU step (cached teacher: the whole vocabulary; GD retain) "
                                              "/ plain fine-tuning step", "-"),
                              ("asu_full_kl", "ASU step (cached teacher: the whole vocabulary; KL retain) "
                                              "/ plain fine-tuning step", "-")):
        if key.startswith("asu_full") and _get(step, "ratios", key) is None:
            continue
        if key.startswith("asu_cached") and _get(step, "cache_teacher") is None:
            # Runs before 2026-12-06 cached the whole vocabulary in these rows.
            label = label.replace("its top 64 tokens", "the whole vocabulary").replace(", the default;", ";")
        ratio = _get(step, "ratios", key)
        rows.append([label, fmt(ratio), limit, fmt(_get(step, "per_step_s", key), 4) + " s vs "
                     + fmt(_get(step, "per_step_s", "plain"), 4) + " s"])
    wide = _get(step, "wide_model")
    if isinstance(wide, dict):
        vocabulary = f", vocabulary {fmt(wide.get('vocabulary'))}" if wide.get("vocabulary") else ""
        shape = (f"width {wide.get('hidden_size')}, {wide.get('layers')} layers{vocabulary}, "
                 f"{fmt((wide.get('parameters') or 0) / 1e6, 1)}M parameters, random weights")
        for key, label, limit in (("asu_cached_gd", "cached teacher, GD retain", "<= 1.05"),
                                  ("asu_cached_kl", "cached teacher, KL retain: the default", "<= 1.05"),
                                  ("asu_online_gd", "online teacher, GD retain", "<= 4/3")):
            if _get(wide, "ratios", key) is None:
                continue
            rows.append([f"ASU step ({label}) / plain fine-tuning step, on a wider model ({shape})",
                         fmt(_get(wide, "ratios", key)), limit,
                         fmt(_get(wide, "per_step_s", key), 4) + " s vs " + fmt(_get(wide, "per_step_s", "plain"), 4)
                         + " s"])
    batching = cost.get("batching")
    rounds = _get(batching, "rounds")
    rows.append([f"one job for {fmt(_get(batching, 'subjects'))} subjects / one job for 1", fmt(_get(batching, "ratio")),
                 "<= 3", f"{fmt(_get(batching, 'many_s'), 1)} s vs {fmt(_get(batching, 'one_s'), 1)} s"
                 + (f" (best of {rounds} alternating rounds: "
                    + ", ".join(fmt(x, 1) for x in _get(batching, "many_runs_s") or []) + " s vs "
                    + ", ".join(fmt(x, 1) for x in _get(batching, "one_runs_s") or []) + " s)"
                    if isinstance(rounds, int) and rounds > 1 else "")])
    scan = cost.get("scan")
    for row in ([] if is_missing(scan) or scan is None else scan.get("runs") or []):
        rows.append([f"set building throughput / `rg -F -i -f` ({row['subjects']} subjects, "
                     f"{fmt(row['corpus_mb'], 0)} MB, parse included)", fmt(row.get("ratio")), ">= 0.25",
                     f"{fmt(row.get('mb_per_s'), 1)} MB/s vs {fmt(row.get('rg_mb_s'), 1)} MB/s"])
    if scan is not None and not is_missing(scan):
        rows.append(["sharded scan, Celery worker of 2 processes / of 1 (2 cores)",
                     fmt(scan.get("two_process_speedup")), ">= 1.7",
                     f"{fmt(_get(scan, 'sharded', '2', 'seconds'), 2)} s vs {fmt(_get(scan, 'sharded', '1', 'seconds'), 2)} s"])
    elif is_missing(scan):
        rows.append(["set building throughput / `rg -F -i -f`", fmt(scan), ">= 0.25", "-"])
    vu = cost.get("verify_vs_unlearn")
    rows.append(["verification time / unlearning time (cold base cache)", fmt(_get(vu, "ratio_cold")), "-",
                 f"{fmt(_get(vu, 'verify_cold_s'), 1)} s vs {fmt(_get(vu, 'erase_s'), 1)} s"])
    rows.append(["verification time / unlearning time (warm base cache)", fmt(_get(vu, "ratio_warm")), "-",
                 f"{fmt(_get(vu, 'verify_warm_s'), 1)} s vs {fmt(_get(vu, 'erase_s'), 1)} s"])
    out += _table(["ratio", "measured", "goal", "figures"], rows)
    for key in ("step_time", "batching", "scan", "verify_vs_unlearn"):
        part = cost.get(key)
        if isinstance(part, dict) and part.get("remeasured"):
            out += [f"*`{key}` re-measured after this run: {part['remeasured']}*", ""]
    out += _scan(cost.get("scan"))
    out += _certificate_time(cost.get("time_to_certificate"))
    return out


def _scan(scan: Any) -> list[str]:
    """Set building at each corpus size, peak memory, the sharded figure and the 10 GB figure."""
    out = ["### Set building on large corpora", ""]
    if scan is None or is_missing(scan):
        return out + [fmt(scan) if scan is not None else "Not measured.", ""]
    rows = []
    for row in scan.get("runs") or []:
        reference = row.get("reference") or {}
        rows.append([f"{fmt(row['corpus_mb'], 0)} MB", str(row["subjects"]), fmt(row["seconds"], 2),
                     fmt(row["mb_per_s"], 1), fmt(row["peak_rss_mb"], 0), fmt(row["rg_s"], 2), fmt(row["ratio"], 2),
                     ">= 0.25", f"{fmt(reference['seconds'], 2)} s, {fmt(reference['peak_rss_mb'], 0)} MB"
                     if reference else "-", f"{row['forget']} / {row['retain']}"])
    out += _table(["corpus", "subjects", "ours s", "MB/s", "peak MB", "rg s", "rg ratio", "goal",
                   "reference (load + in-memory)", "forget / retain"], rows)
    ten = scan.get("ten_gb") or {}
    one = ten.get("one_process_s") or {}
    out += [f"**10 GB, approved request to sets** (extrapolated, {ten.get('method')}): "
            + ", ".join(f"{fmt(v, 0)} s for {k} subject(s) in one process" for k, v in one.items())
            + f"; {fmt(ten.get('two_worker_processes_s'), 0)} s with a Celery worker of 2 processes "
            f"(goal <= {fmt(ten.get('goal_s'), 0)} s).  Sharded scan speed-up, 2 processes / 1: "
            f"{fmt(scan.get('two_process_speedup'), 2)} (goal >= 1.7); load average during the run "
            f"{fmt(scan.get('load_average'), 1)} on 2 cores.  Index: "
            + ("built" if (scan.get("index") or {}).get("built") else f"none ({(scan.get('index') or {}).get('reason')})")
            + ".", ""]
    return out + _index(scan.get("index"))


def _index(index: Any) -> list[str]:
    """The corpus index: build, look-up against the scan and ripgrep, and the 10 GB figure."""
    if not isinstance(index, dict) or not index.get("built"):
        return []
    out = ["#### The corpus index", "",
           "A request's forget set by look-up in the inverted index of keyed token hashes "
           "(`unlearning/corpus/index.py`), then the reference matcher on the candidates only.", ""]
    out += _table(["corpus", "build s", "MB/s", "index MB", "build peak MB"],
                  [[f"{fmt(b['corpus_mb'], 0)} MB", fmt(b["seconds"], 1), fmt(b["mb_per_s"], 1),
                    fmt(b["index_mb"], 0), fmt(b["peak_rss_mb"], 0)] for b in index.get("builds") or []])
    out += _table(["corpus", "subjects", "forget set s (first / warm)", "build_sets s", "scan s", "rg s",
                   "look-up peak MB", "same sets as the scan"],
                  [[f"{fmt(r['corpus_mb'], 0)} MB", str(r["subjects"]),
                    f"{fmt(r.get('forget_set_first_s'), 2)} / {fmt(r.get('forget_set_s'), 2)}",
                    fmt(r.get("build_sets_s"), 2), fmt(r.get("scan_s"), 2), fmt(r.get("rg_s"), 2),
                    fmt(r.get("peak_rss_mb"), 0),
                    {True: "yes", False: "**NO**"}.get(r.get("identical_to_scan"), "not checked")]
                   for r in index.get("lookups") or []])
    ten = index.get("ten_gb") or {}
    out += [f"**10 GB by the index** (extrapolated: {ten.get('method')}): build {fmt(ten.get('build_s'), 0)} s once, "
            f"{fmt(ten.get('index_gb'), 1)} GB of index; a request's forget set "
            + ", ".join(f"{fmt(v, 1)} s for {k} subject(s)" for k, v in (ten.get("forget_set_s") or {}).items())
            + f" (goal <= {fmt(ten.get('goal_s'), 0)} s).", ""]
    return out


def _certificate_time(ttc: Any) -> list[str]:
    out = ["### Time to certificate for one request, by stage", ""]
    if ttc is None:
        return out + ["Not measured.", ""]
    if is_missing(ttc):
        out += [fmt(ttc), ""]
        partial = ttc.get("partial") or {}
        if partial.get("stages"):
            out += [f"Stages reached before it stopped (the job was left in `{partial.get('job_stage')}`):", ""]
            out += _table(["stage", "seconds"], [[s["stage"], fmt(s["seconds"], 2)] for s in partial["stages"]])
        return out
    out += [f"Through the real pipeline (`python -m workers.embedded demo --preset {ttc.get('preset')}`: "
            "SQLite, embedded broker, a real worker process).  "
            f"Submission to certificate: **{fmt(ttc.get('submission_to_certificate_s'), 1)} s**"
            f" (process wall time {fmt(ttc.get('process_wall_s'), 1)} s).", ""]
    stages = ttc.get("stages") or []
    out += _table(["stage", "seconds"], [[s["stage"], fmt(s["seconds"], 2)] for s in stages])
    return out


def _shapes(shapes: Any) -> list[str]:
    """Other corpus shapes: one row per (shape, architecture, tokenizer) and candidate."""
    out = ["## Other corpus shapes", ""]
    missing = _missing_family("shapes", shapes)
    if missing is not None:
        return out + missing
    out += [f"Per case, persons of the {shapes['people']} are erased one at a time from the same base: the first by ASU and",
            "by KIF at their defaults (and KIF with its gates distilled into the weights, `distill_steps` 120),",
            "the others (rows `person N:`, where measured) by ASU alone; each person has a model retrained",
            "without them (the oracle, on the base's own tokenizer) beside it, and everything is",
            "verified by the default policy against the shape's control records (people never",
            f"trained on).  The bases train up to {shapes['max_steps']} steps (tiny preset).  Built by `bench/shapes.py`",
            "from the fixtures of tests/real_shaped.py.  An ASU candidate that fails gets the service's one",
            "escalated retry (each failed check's cure, `policy_escalate`): row `asu_escalated`, with what it changed.", ""]
    header = ["shape / arch / tokenizer", "memorised", "candidate", "verdict", "checks", "leak (subj / ctrl)",
              "MIA Min-K% / zlib / span", "latent", "retained", "relearn", "4-bit", "failed"]
    rows: list[list[str]] = []
    for key, case in shapes["cases"].items():
        if _missing_family(key, case) is not None:
            rows.append([key, "-", "-", f"not measured: {case.get('not_measured')}", *["-"] * 8])
            continue
        first = f"person {case['person']}: " if "person" in case else ""
        _shape_rows(rows, case, ("base", "oracle", "asu", "asu_escalated", "kif", "kif-distil"), key, first)
        for person, more in (case.get("more_persons") or {}).items():
            _shape_rows(rows, more, ("oracle", "asu", "asu_escalated"), "", f"person {person}: ")
    counts = _shape_counts(shapes["cases"])
    if counts["persons"]:
        out += [f"Over {counts['persons']} erased persons: ASU passes {counts['asu']} at once and "
                f"{counts['asu'] + counts['escalated']} after the service's retry; the oracle passes {counts['oracle']}.", ""]
    return out + _table(header, rows)


def _shape_counts(cases: dict[str, Any]) -> dict[str, int]:
    counts = {"persons": 0, "asu": 0, "escalated": 0, "oracle": 0}
    for case in cases.values():
        if _missing_family("", case) is not None:
            continue
        for person in [case, *(case.get("more_persons") or {}).values()]:
            if "asu" not in person or "refused" in person["asu"]:
                continue
            counts["persons"] += 1
            counts["asu"] += bool(person["asu"].get("passed"))
            counts["escalated"] += bool(not person["asu"].get("passed") and person.get("asu_escalated", {}).get("passed"))
            counts["oracle"] += bool(person.get("oracle", {}).get("passed"))
    return counts


def _shape_rows(rows: list[list[str]], case: dict[str, Any], names: Sequence[str], key: str, prefix: str) -> None:
    """The rows of one erased person: a row per candidate, then what an escalated retry changed."""
    for name in names:
        if name not in case:
            continue
        r = case[name]
        label = prefix + name
        lead = [key if name == names[0] else "",
                fmt(case["memorised"]["accuracy"]) if name == "base" and "memorised" in case else ""]
        if "refused" in r:
            rows.append([*lead, label, f"refused: {r['refused']}", *["-"] * 8])
            continue
        m = r["metrics"]
        rows.append([
            *lead, label,
            ("PASS" if r["passed"] else "**FAIL**") + (f" ({r['guarantee']})" if r.get("guarantee") else ""),
            f"{r['checks_passed']}/{r['checks']}",
            f"{fmt(m.get('leakage.forget'))} / {fmt(m.get('leakage.control'))}",
            f"{fmt(m.get('mia.auc'))} / {fmt(m.get('mia.zlib_auc'))} / {fmt(m.get('mia.span_auc'))}",
            fmt(m.get("latent.matched_ratio", m.get("latent.paired_ratio",
                                                   m.get("latent.value_ratio", m.get("latent.residual_ratio"))))),
            fmt(m.get("utility.retain_ratio")),
            _relearn(m), fmt(m.get("attack.quant4_leakage")),
            "; ".join(r["failed"]) or "-",
        ])
        if r.get("changed"):
            rows.append(["", "", "", "changed: " + "; ".join(r["changed"]), *["-"] * 8])


def _service(service: Any) -> list[str]:
    out = ["## Service", ""]
    missing = _missing_family("service", service)
    if missing:
        return out + missing
    api = service.get("api")
    if is_missing(api) or api is None:
        out += [f"Request-creation API: {fmt(api) if api else 'not measured'}", ""]
    else:
        warm = api.get("warm_up_requests_per_s") or []
        out += [f"`wrk` against gunicorn ({api.get('gunicorn_workers')} workers) + PostgreSQL, "
                f"{api.get('connections')} connections, {api.get('seconds')} s each"
                + (f", after {len(warm)} warm-up bursts of 2 s on the trivial endpoint "
                   f"({', '.join(fmt(r, 0) for r in warm)} req/s: until two agree within 10 %)" if warm else "")
                + ".", ""]
        rows = [[name, fmt(_get(api, name, "requests_per_s"), 1), fmt(_get(api, name, "p50_ms"), 1),
                 fmt(_get(api, name, "p99_ms"), 1), fmt(_get(api, name, "non_2xx")), fmt(_get(api, name, "requests"))]
                for name in ("create_request", "trivial")]
        for row, name in zip(rows, ("create_request", "trivial"), strict=True):
            cpu = _get(api, name, "cpu_ms_per_request") or {}
            row += [fmt(cpu.get("server"), 2), fmt(cpu.get("postgres"), 2)]
        out += _table(["endpoint", "requests/s", "p50 ms", "p99 ms", "non-2xx", "requests",
                       "server CPU ms / request", "PostgreSQL CPU ms / request"], rows)
        goals = api.get("goals") or {}
        out += _table(["figure", "measured", "goal"], [
            ["create_request / trivial requests/s", fmt(api.get("create_vs_trivial"), 2),
             f">= {fmt(goals.get('create_vs_trivial'), 2)}"],
            ["create_request p99 ms", fmt(_get(api, "create_request", "p99_ms"), 1),
             f"<= {fmt(goals.get('create_p99_ms'), 0)}"],
        ])
    audit = service.get("audit")
    if is_missing(audit) or audit is None:
        out += [f"Audit chain verification: {fmt(audit)}", ""]
    else:
        incremental = audit.get("incremental") or {}
        out += _table(["audit chain", "measured", "goal"], [
            [f"full walk over {fmt(audit.get('events'))} events (chain ok: {fmt(audit.get('ok'))})",
             f"{fmt(audit.get('events_per_s'), 0)} events/s ({fmt(audit.get('verify_s'), 1)} s)",
             f">= {fmt(audit.get('goal_events_per_s'), 0)} events/s"],
            ["check from the last seal (what a page and the sealer run)",
             f"{fmt(incremental.get('events_read'))} events read in {fmt(incremental.get('seconds'), 3)} s "
             f"(ok: {fmt(incremental.get('ok'))})",
             f"reads the {fmt(incremental.get('tail'))}-event tail only"],
        ])
    certificates = service.get("certificates")
    if is_missing(certificates) or certificates is None:
        out += [f"Certificate chain verification: {fmt(certificates) if certificates else 'not measured'}", ""]
        return out
    tail = certificates.get("incremental") or {}
    out += _table(["certificate chain", "measured", "reads"], [
        [f"full walk over {fmt(certificates.get('certificates'))} certificates (chain ok: "
         f"{fmt(certificates.get('ok'))})",
         f"{fmt(certificates.get('full_per_s'), 0)} certificates/s ({fmt(certificates.get('full_s'), 2)} s)",
         "every hash and Ed25519 signature (`?full=1`, the daily beat run)"],
        ["check from the last signed verified head (what the page and the API run)",
         f"{fmt(tail.get('checked'))} certificates in {fmt(tail.get('seconds'), 3)} s "
         f"({fmt(tail.get('per_s'), 0)} certificates/s; ok: {fmt(tail.get('ok'))})",
         f"the {fmt(tail.get('tail'))}-certificate tail only"],
    ])
    return out


METHODS_NOTE = [
    "## How each figure is measured", "",
    "- **Quality**: forget sets are nested (the 1% people are inside the 5% set, inside the 10% set); "
    "a seed sets the method's seed, the retain sampling and the verification sampling.  Each method runs "
    "with its own defaults (its `standard` preset; ASU's `auto`, which picks `demo` for these small "
    "models) and the step budget rule.  The retrain oracle is the base recipe (`train_base`, same preset "
    "and seed, the base model's tokenizer) trained on the corpus without the forgotten people's records "
    "(every record the erasure's forget set holds), once per forget size, verified like a candidate.  "
    "Truth ratios use the true answer and answers with the value swapped for other people's values of "
    "the same attribute.  The check names, metric names and verdicts are the verification reports' own.",
    "- **Continual**: one person per request, each run from the previous candidate; earlier people's "
    "records are tombstoned before the next request's sets are built and before it is verified; each "
    "candidate is verified against its parent, as the service verifies against the serving checkpoint.",
    "- **Step cost**: seconds per optimiser step of the training loop (progress-callback timestamps, "
    "teacher pre-computation excluded), a fixed number of steps per run (`steps`, not the budget rule), "
    "forget and retain batches of 8, the fastest of three rounds run in alternating order; the plain "
    "fine-tuning step is gradient difference (forward and backward on one forget and one retain batch); "
    "ASU runs its `published` preset with the teacher recomputed every step from a frozen copy "
    "(`cache_teacher=none`) or cached before step 1: its top 64 tokens and the rest's mass (`topk`, the "
    "default), or the whole vocabulary (`full`; the cached rows measured this one until 2026-12-06).  "
    "The wider model's rows: the same runs on a Llama-style model with the demo's tokenizer, random "
    "weights, of the width, depth and vocabulary given (full mode; a quarter of the steps; the "
    "vocabulary of a released model from 2026-12-07, the demo's 2,048 tokens before): every term "
    "read through the output head pays for the whole vocabulary, as in a released model.",
    "- **Batching**: one engine job = build sets + erase (default ASU) + verify with a cold cache; "
    "each side the fastest of its runs, the 1-subject and the n-subject jobs taken in alternation "
    "(two rounds from 2026-12-06 20:45; one run each before).",
    "- **Set building on large corpora**: `python -m unlearning.sets_benchmark` writes the demo's 4,000 "
    "people among general text in shards under /tmp; each figure is `build_sets` on the corpus path in a fresh "
    "process (streamed: nothing loaded whole), against `rg -j1 -F -i -c -f patterns` (one thread) on the same files and the same "
    "names, aliases, e-mail addresses and phones, page cache warm for both; the reference is `load_corpus` + the "
    "in-memory scan.  The sharded figure runs `workers.scan` through a real Celery worker (`-c 1` and `-c 2`, "
    "filesystem broker) with the coordinator only waiting.  10 GB is extrapolated linearly from the larger corpus.",
    "- **Time to certificate**: `python -m workers.embedded demo` in a private `VAR_DIR` holding the "
    "benchmark's own corpus and base model; stage boundaries are the audit trail's timestamps.",
    "- **Service**: gunicorn (`deletion.wsgi`) on a fresh PostgreSQL database, `wrk -t2 --latency`; every "
    "created request names a new subject; before either endpoint is measured, 2-second bursts on the trivial "
    "endpoint run until two agree within 10 % (every worker serving).  The audit chain is bulk-loaded with "
    "COPY using the domain's own hash function, not analysed (as after a restore), then `audit_verify` "
    "walks it; a keyed seal is then placed 1,000 events before the head "
    "and `audit_seals_verify` (the check pages and the sealer run) is timed and its rows counted.  The "
    "certificate chain is bulk-loaded the same way (signed with a bench Ed25519 key), walked in full by "
    "`certificate_chain_check(full=True)`, then checked from a signed verified head 100 certificates "
    "before the head.", "",
]


def render_markdown(results: dict[str, Any], *, docs: Path) -> str:
    meta = results["meta"]
    machine = meta["machine"]
    plots = docs / "bench"
    lines = ["# Benchmarks", "",
             f"Measured {meta['date']} with `{meta['command']}` ({meta['mode']} mode) on {machine['cores']} CPU cores, "
             f"{machine['memory_gib']} GiB memory ({machine.get('cpu', '?')}; {machine.get('accelerator', 'no GPU')}; "
             f"torch threads {machine.get('torch_threads', '?')}"
             + (f", OMP_NUM_THREADS={machine['omp_num_threads']}" if machine.get("omp_num_threads") else "") + "); "
             f"load average at start {meta.get('load_average_start')}; the run took {fmt(meta.get('duration_s'), 0)} s.  "
             "Every figure is in `docs/benchmarks.json`; nothing here is typed in by hand.", ""]
    if meta["mode"] != "full":
        lines += ["**This is the quick smoke run** (tiny preset, one seed, short load tests): its figures show that",
                  "the harness works, not how the service performs.  `make bench` measures the real thing.", ""]
    carried = meta.get("carried") or {}
    for family, section in (("quality", lambda: _quality(results.get("quality"), plots, docs)),
                            ("continual", lambda: _continual(results.get("continual"), plots, docs)),
                            ("cost", lambda: _cost(results.get("cost"))),
                            ("shapes", lambda: _shapes(results.get("shapes"))),
                            ("service", lambda: _service(results.get("service")))):
        part = section()
        if family in carried:  # figures of an earlier run, kept with --keep
            was = carried[family]
            part[2:2] = [f"*Carried over from the run of {was.get('date')} (`{was.get('command')}`, "
                         f"{was.get('mode')} mode): not re-measured by this invocation.*", ""]
        lines += part
    lines += METHODS_NOTE
    return "\n".join(lines).rstrip() + "\n"


def finite(tree: Any) -> Any:
    """JSON has no NaN or infinity: such a figure is written as null."""
    if isinstance(tree, float) and not math.isfinite(tree):
        return None
    if isinstance(tree, dict):
        return {str(k): finite(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [finite(v) for v in tree]
    return tree


def write_report(results: dict[str, Any], *, docs: Path) -> tuple[Path, Path]:
    """Write benchmarks.json and benchmarks.md (plots under docs/bench/); return both paths."""
    docs.mkdir(parents=True, exist_ok=True)
    md = docs / "benchmarks.md"
    md.write_text(render_markdown(results, docs=docs), encoding="utf-8")
    js = docs / "benchmarks.json"
    js.write_text(json.dumps(finite(results), indent=1, sort_keys=True, default=str, allow_nan=False) + "\n",
                  encoding="utf-8")
    return md, js
