"""`python -m bench run --quick|--full [--only FAMILY ...]` - see bench/__init__.py."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.assets import DEFAULT_CACHE, REPO_ROOT, assets_ensure
from bench.console import Console
from bench.report import write_report
from bench.results import measure
from bench.settings import METHOD_VARIANTS, MODES, BenchSettings

FAMILIES = ("quality", "continual", "cost", "shapes", "service")


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model and accelerator of this machine (for the report header)."""
    info: dict[str, Any] = {"cores": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version()}
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * size / 2**30, 1)
    except (ValueError, OSError):
        info["memory_gib"] = None
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    info["torch"] = torch.__version__
    info["accelerator"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    info["torch_threads"] = torch.get_num_threads()
    info["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    return info


def run(settings: BenchSettings, *, families: tuple[str, ...], docs: Path, cache_root: Path,
        command: str, console: Console, keep: bool = False) -> dict[str, Any]:
    """Run the chosen families and write the report; returns the results tree."""
    started = time.monotonic()
    work = cache_root / "work" / settings.mode
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"meta": {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "command": command,
        "mode": settings.mode, "machine": machine(), "settings": settings.to_json(),
        "families": list(families), "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }}
    assets: Any = None
    if {"quality", "continual", "cost"} & set(families):
        console.section(f"bench {settings.mode}: assets ({settings.preset} preset)")
        assets = measure(results["meta"], "assets", lambda: assets_ensure(
            preset=settings.preset, people=settings.people, cache_root=cache_root, console=console))
    if isinstance(assets, dict):  # not measured: nothing that needs the model can run
        reason = {"not_measured": f"no base model: {assets['not_measured']}"}
        for family in ("quality", "continual", "cost"):
            if family in families:
                results[family] = reason
    elif assets is not None:
        results["meta"]["base_training"] = assets.base_training
    if "quality" in families and "quality" not in results:
        from bench.quality import run_quality

        console.section("quality")
        measure(results, "quality", lambda: run_quality(settings, assets, work=work / "quality",
                                                         cache_root=cache_root, console=console))
    if "continual" in families and "continual" not in results:
        from bench.continual import run_continual

        console.section("continual")
        measure(results, "continual", lambda: run_continual(settings, assets, work=work / "continual",
                                                             console=console))
    if "cost" in families and "cost" not in results:
        from bench.cost import run_cost

        console.section("cost")
        measure(results, "cost", lambda: run_cost(settings, assets, work=work / "cost", console=console))
    if "shapes" in families:
        from bench.shapes import run_shapes

        console.section("other corpus shapes")
        measure(results, "shapes", lambda: run_shapes(settings, work=work / "shapes", console=console))
    if "service" in families:
        from bench.service import run_service

        console.section("service")
        measure(results, "service", lambda: run_service(settings, work=work / "service", console=console))
    if keep:
        _carry_over(results, docs / "benchmarks.json", families)
    results["meta"]["duration_s"] = round(time.monotonic() - started, 1)
    # The raw tree first, so a report that fails to render loses no measurement.
    (work / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True, default=str), encoding="utf-8")
    md, js = write_report(results, docs=docs)
    console.say(f"wrote {md} and {js}")
    return results


def _carry_over(results: dict[str, Any], previous: Path, families: tuple[str, ...]) -> None:
    """Families not run now keep the figures of the report in `previous`, marked with its date
    and command (a report never passes old figures off as new ones)."""
    if not previous.is_file():
        return
    old = json.loads(previous.read_text(encoding="utf-8"))
    carried = dict(old.get("meta", {}).get("carried", {}))
    for family in FAMILIES:
        if family in families or family not in old:
            continue
        results[family] = old[family]
        carried[family] = carried.get(family) or {"date": old["meta"].get("date"),
                                                  "command": old["meta"].get("command"),
                                                  "mode": old["meta"].get("mode")}
    results["meta"]["carried"] = {k: v for k, v in carried.items() if k not in families}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="run the benchmarks and write docs/benchmarks.md")
    size = go.add_mutually_exclusive_group(required=True)
    size.add_argument("--quick", action="store_const", const="quick", dest="mode",
                      help="a few minutes: tiny preset, one seed, short load tests")
    size.add_argument("--full", action="store_const", const="full", dest="mode",
                      help="about 2.5 hours on 2 cores: demo preset, 3 forget sizes x 3 seeds")
    go.add_argument("--only", nargs="+", choices=FAMILIES, default=list(FAMILIES),
                    help="run only these families (the report says the others were not run)")
    go.add_argument("--docs", type=Path, default=REPO_ROOT / "docs", help="where the report goes")
    go.add_argument("--keep", action="store_true",
                    help="keep the last report's figures of the families not run now (marked with their date)")
    go.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                    help="models and corpora reused between runs (default var/bench)")
    go.add_argument("--seeds", type=int, help="override the number of seeds (quality)")
    go.add_argument("--fractions", type=float, nargs="+", help="override the forget fractions, e.g. 0.05 0.1")
    go.add_argument("--methods", nargs="+", choices=[v.label for v in METHOD_VARIANTS],
                    help="override the methods of the quality benchmark")
    go.add_argument("--oracle-seeds", type=int,
                    help="override how many training seeds of the retrain oracle (quality; 1: only the base's recipe)")
    go.add_argument("--threads", type=int,
                    help="torch CPU threads (default: torch's own choice, one per core)")
    per = sub.add_parser("per-subject", help="per-subject before/after leak table for one method (demo model)")
    per.add_argument("--method", default="asu", help="engine method (asu, kif, graddiff, ...)")
    per.add_argument("--fraction", type=float, default=0.05, help="share of the 200 demo people to erase")
    per.add_argument("--hparams", default="{}", help="JSON hyper-parameter overrides")
    per.add_argument("--seed", type=int, default=0)
    per.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.command == "per-subject":
        return _per_subject(args, parser)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("bench").setLevel(logging.INFO)
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    settings = MODES[args.mode]
    if args.seeds is not None:
        settings = replace(settings, seeds=tuple(range(args.seeds)))
    if args.fractions:
        settings = replace(settings, forget_fractions=tuple(args.fractions))
    if args.oracle_seeds is not None:
        if args.oracle_seeds < 1:
            parser.error("--oracle-seeds: at least 1 (the oracle of the base's own recipe)")
        settings = replace(settings, oracle_training_seeds=tuple(range(args.oracle_seeds)))
    if args.methods:
        settings = replace(settings, methods=tuple(v for v in METHOD_VARIANTS if v.label in args.methods))
    run(settings, families=tuple(f for f in FAMILIES if f in args.only), docs=args.docs,
        cache_root=args.cache, command=command, console=Console(), keep=args.keep)
    return 0


def _per_subject(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import json

    from bench.per_subject import run_per_subject
    from unlearning import methods

    if args.method not in methods.METHOD_NAMES:
        parser.error(f"--method: unknown method {args.method!r} (one of {', '.join(methods.METHOD_NAMES)})")
    if not 0 < args.fraction <= 1:
        parser.error("--fraction: must be in (0, 1]")
    try:
        hparams = json.loads(args.hparams)
        if not isinstance(hparams, dict):
            raise ValueError("not an object")
        methods.hparams_from_json(args.method, dict(hparams))
    except ValueError as exc:
        parser.error(f"--hparams: {exc}")
    logging.basicConfig(level=logging.WARNING)
    text = run_per_subject(method=args.method, fraction=args.fraction, hparams=hparams, seed=args.seed)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
