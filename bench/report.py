"""Write docs/benchmarks.json (every figure), docs/benchmarks.md and its plots under docs/bench/."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.plots import continual_plot, tradeoff_plot
from bench.results import NOT_MEASURED, is_missing

# Columns of the quality table: (label, family, key, digits).
QUALITY_COLUMNS = (
    ("leak forget", "metrics", "leakage.forget", 3),
    ("leak control", "metrics", "leakage.control", 3),
    ("latent resid.", "metrics", "latent.residual_ratio", 2),
    ("retain ratio", "metrics", "utility.retain_ratio", 3),
    ("ppl ratio", "metrics", "utility.ppl_ratio", 3),
    ("gibberish", "metrics", "fluency.gibberish_rate", 3),
    ("MIA AUC", "metrics", "mia.auc", 3),
    ("relearn", "metrics", "attack.relearn_recovery", 3),
    ("quant leak", "metrics", "attack.quant_leakage", 3),
    ("forget quality", "tofu", "forget_quality", 3),
    ("model utility", "tofu", "model_utility", 3),
    ("erase s", "seconds", "erase_s", 1),
    ("verify s", "seconds", "verify_s", 1),
)


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
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return lines + [""]


def _missing_family(name: str, value: Any) -> list[str] | None:
    if value is None:
        return [f"Not measured: the {name} benchmark was not run in this invocation.", ""]
    if is_missing(value):
        return [f"Not measured: {value[NOT_MEASURED]}", ""]
    return None


def _quality(quality: Any, plots: Path, docs: Path) -> list[str]:
    out = ["## Forgetting quality, side by side", ""]
    missing = _missing_family("quality", quality)
    if missing:
        return out + missing
    out += ["Every method starts from the same base model; each candidate is checked by the service's own",
            "verification suite and default policy (docs/verification.md).  `forget quality` is TOFU's KS-test",
            "p-value of the truth-ratio distribution against the retrain oracle (higher = closer to a model",
            "that never saw the people); `model utility` is TOFU's harmonic mean on retained people's facts.",
            "Mean ± sd over seeds; `passed` counts runs the default policy accepted.", ""]
    summary = quality["summary"]
    for fraction in sorted({e["fraction"] for e in summary}):
        ref = quality["references"].get(str(fraction), {})
        out.append(f"### Forget {fraction:.0%} of the people ({ref.get('people', '?')} people, "
                   f"{ref.get('forget_facts', '?')} facts)")
        out.append("")
        rows = []
        for entry in [e for e in summary if e["fraction"] == fraction]:
            row = [entry["method"], f"{entry['passed']}/{entry['measured']}"
                   + (f" ({entry['runs'] - entry['measured']} not measured)" if entry["runs"] > entry["measured"] else "")]
            row += [fmt((entry.get(family) or {}).get(key), digits) for _, family, key, digits in QUALITY_COLUMNS]
            failed = entry.get("failed_checks") or {}
            row.append(", ".join(f"{name} ({count})" for name, count in sorted(failed.items())) or "-")
            rows.append(row)
        base = ref.get("base", {})
        rows.append(["base (no erasure)", "-", *["-"] * 9, fmt(base.get("forget_quality")),
                     fmt(base.get("model_utility")), "-", "-", "-"])
        out += _table(["method", "passed", *[c[0] for c in QUALITY_COLUMNS], "failed checks (runs)"], rows)
        failures = [f"{e['method']}: {'; '.join(e['not_measured'])}" for e in summary
                    if e["fraction"] == fraction and e.get("not_measured")]
        out += [f"- not measured: {f}" for f in failures] + ([""] if failures else [])
    plot = tradeoff_plot(summary, plots / "quality_tradeoff.png")
    if plot is not None:
        out += [f"![forgetting vs utility]({plot.relative_to(docs).as_posix()})", ""]
    return out


def _continual(continual: Any, plots: Path, docs: Path) -> list[str]:
    out = ["## Continual erasure", ""]
    missing = _missing_family("continual", continual)
    if missing:
        return out + missing
    out += [f"{len(continual['steps'])} requests with `{continual['method']}`, each starting from the previous",
            "candidate, with the erased people's records tombstoned from the corpus as the service does.", ""]
    keys = (("passed", "verify passed", 0), ("leakage_forget", "leak (this request)", 3),
            ("cumulative_leakage", "leak (all erased so far)", 3), ("control_leakage", "control", 3),
            ("retain_ratio", "retain ratio", 3), ("model_utility", "model utility", 3),
            ("well_formed", "well-formed", 3), ("erase_s", "erase s", 1), ("verify_s", "verify s", 1))
    rows = [[str(s["step"]), *(fmt(s.get(k, s.get(NOT_MEASURED) and {NOT_MEASURED: s[NOT_MEASURED]}), d)
                               for k, _, d in keys)] for s in continual["steps"]]
    out += _table(["step", *[label for _, label, _ in keys]], rows)
    plot = continual_plot(continual["steps"], plots / "continual.png")
    if plot is not None:
        out += [f"![continual erasure]({plot.relative_to(docs).as_posix()})", ""]
    return out


def _cost(cost: Any) -> list[str]:
    out = ["## Cost", ""]
    missing = _missing_family("cost", cost)
    if missing:
        return out + missing
    step = cost.get("step_time")
    rows = []
    for key, label, limit in (("asu_online_gd", "ASU step (online teacher, GD retain) / plain fine-tuning step", "<= 4/3"),
                              ("asu_online_kl", "ASU step (online teacher, KL retain) / plain fine-tuning step", "<= 4/3"),
                              ("asu_cached_gd", "ASU step (cached teacher, GD retain) / plain fine-tuning step", "about 1"),
                              ("asu_cached_kl", "ASU step (cached teacher, KL retain) / plain fine-tuning step", "about 1")):
        ratio = _get(step, "ratios", key)
        rows.append([label, fmt(ratio), limit, fmt(_get(step, "per_step_s", key), 4) + " s vs "
                     + fmt(_get(step, "per_step_s", "plain"), 4) + " s"])
    batching = cost.get("batching")
    rows.append([f"one job for {fmt(_get(batching, 'subjects'))} subjects / one job for 1", fmt(_get(batching, "ratio")),
                 "< subjects", f"{fmt(_get(batching, 'many_s'), 1)} s vs {fmt(_get(batching, 'one_s'), 1)} s"])
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


def _service(service: Any) -> list[str]:
    out = ["## Service", ""]
    missing = _missing_family("service", service)
    if missing:
        return out + missing
    api = service.get("api")
    if is_missing(api) or api is None:
        out += [f"Request-creation API: {fmt(api) if api else 'not measured'}", ""]
    else:
        out += [f"`wrk` against gunicorn ({api.get('gunicorn_workers')} workers) + PostgreSQL, "
                f"{api.get('connections')} connections, {api.get('seconds')} s each.", ""]
        rows = [[name, fmt(_get(api, name, "requests_per_s"), 1), fmt(_get(api, name, "p50_ms"), 1),
                 fmt(_get(api, name, "p99_ms"), 1), fmt(_get(api, name, "non_2xx")), fmt(_get(api, name, "requests"))]
                for name in ("create_request", "trivial")]
        out += _table(["endpoint", "requests/s", "p50 ms", "p99 ms", "non-2xx", "requests"], rows)
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
        return out
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
    return out


METHODS_NOTE = [
    "## How each figure is measured", "",
    "- **Quality**: forget sets are nested (the 1% people are inside the 5% set, inside the 10% set); "
    "a seed sets the method's seed, the retain sampling and the verification sampling.  The retrain "
    "oracle is the base recipe (`train_base`, same preset and seed) trained on the corpus without the "
    "forgotten people, once per forget size, verified like a candidate.  Truth ratios use the true answer "
    "and answers with the value swapped for other people's values of the same attribute.",
    "- **Continual**: one person per request, each run from the previous candidate; earlier people's "
    "records are tombstoned before the next request's sets are built.",
    "- **Step cost**: seconds per optimiser step of the training loop (progress-callback timestamps, "
    "teacher pre-computation excluded), the faster of two rounds run in alternating order; the plain "
    "fine-tuning step is gradient difference (forward and backward on one forget and one retain batch); "
    "ASU runs its published recipe with the teacher online (`cache_teacher=none`) or cached (`full`).",
    "- **Batching**: one engine job = build sets + erase (default ASU) + verify with a cold cache.",
    "- **Set building on large corpora**: `python -m unlearning.sets_benchmark` writes the demo's 4,000 "
    "people among general text in shards under /tmp; each figure is `build_sets` on the corpus path in a fresh "
    "process (streamed: nothing loaded whole), against `rg -j1 -F -i -c -f patterns` (one thread) on the same files and the same "
    "names, aliases, e-mail addresses and phones, page cache warm for both; the reference is `load_corpus` + the "
    "in-memory scan.  The sharded figure runs `workers.scan` through a real Celery worker (`-c 1` and `-c 2`, "
    "filesystem broker) with the coordinator only waiting.  10 GB is extrapolated linearly from the larger corpus.",
    "- **Time to certificate**: `python -m workers.embedded demo` in a private `VAR_DIR` holding the "
    "benchmark's own corpus and base model; stage boundaries are the audit trail's timestamps.",
    "- **Service**: gunicorn (`deletion.wsgi`) on a fresh PostgreSQL database, `wrk -t2 --latency`; every "
    "created request names a new subject.  The audit chain is bulk-loaded with COPY using the domain's "
    "own hash function, then `audit_verify` walks it; a keyed seal is then placed 1,000 events before the head "
    "and `audit_seals_verify` (the check pages and the sealer run) is timed and its rows counted.", "",
]


def render_markdown(results: dict[str, Any], *, docs: Path) -> str:
    meta = results["meta"]
    machine = meta["machine"]
    plots = docs / "bench"
    lines = ["# Benchmarks", "",
             f"Measured {meta['date']} with `{meta['command']}` ({meta['mode']} mode) on {machine['cores']} CPU cores, "
             f"{machine['memory_gib']} GiB memory ({machine.get('cpu', '?')}; {machine.get('accelerator', 'no GPU')}); "
             f"load average at start {meta.get('load_average_start')}; the run took {fmt(meta.get('duration_s'), 0)} s.  "
             "Every figure is in `docs/benchmarks.json`; nothing here is typed in by hand.", ""]
    if meta["mode"] != "full":
        lines += ["**This is the quick smoke run** (tiny preset, one seed, short load tests): its figures show that",
                  "the harness works, not how the service performs.  `make bench` measures the real thing.", ""]
    lines += _quality(results.get("quality"), plots, docs)
    lines += _continual(results.get("continual"), plots, docs)
    lines += _cost(results.get("cost"))
    lines += _service(results.get("service"))
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
