"""Per-subject before/after table for one method on the demo model (issue 3's acceptance table).

``python -m bench per-subject --method kif --fraction 0.05`` erases the same
people the quality benchmark forgets at that fraction, then prints, per
person (by id, never by name), the share of greedy answers that contain the
fact's value for the training question, the held-out paraphrase and the
alias-only question, before (base model) and after (candidate), followed by
the verification report's aggregate figures (control people, retained
accuracy, every check of the default policy).
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.assets import DEFAULT_CACHE, Assets, assets_ensure, forget_people
from bench.console import Console
from bench.engine import erase_timed, sets_for, verify_timed

if TYPE_CHECKING:
    from unlearning.verification.leakage import Rate

KINDS = ("original", "paraphrase", "alias")


def leak_by_subject(model_dir: Path, sets: Any) -> dict[tuple[int, str], Rate]:
    """(subject index, probe kind) -> leak rate of the greedy answers, by the verifier's own rule.

    Each probe is laid out and generated as the verifier does (`probe_ids`, `generate_texts`).
    """
    from unlearning.modeling import load_model
    from unlearning.verification.generation import generate_texts, probe_ids
    from unlearning.verification.leakage import leak_rate

    model, tokenizer = load_model(model_dir, device="cpu")
    probes = [p for p in sets.probes if p.kind in KINDS]
    answers = generate_texts(model, tokenizer, [probe_ids(tokenizer, p) for p in probes], max_new_tokens=32)
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i, probe in enumerate(probes):
        groups[(probe.subject, probe.kind)].append(i)
    return {key: leak_rate([answers[i] for i in rows], [probes[i].expected for i in rows])
            for key, rows in groups.items()}


def _rate(rate: Rate | None) -> str:
    return "-" if rate is None or not rate.n else f"{rate.value:.2f}"


def table(person_ids: Sequence[str], before: dict[tuple[int, str], Rate],
          after: dict[tuple[int, str], Rate]) -> list[str]:
    lines = ["| subject | " + " | ".join(KINDS) + " |", "|---|" + "---|" * len(KINDS)]
    for index, person in enumerate(person_ids):
        cells = [f"{_rate(before.get((index, k)))} -> {_rate(after.get((index, k)))}" for k in KINDS]
        lines.append(f"| {person} | " + " | ".join(cells) + " |")
    return lines


def run_per_subject(*, method: str, fraction: float, hparams: dict[str, Any], seed: int,
                    cache_root: Path = DEFAULT_CACHE, console: Console | None = None) -> str:
    """The demo model's table (trains the demo corpus and base model first if they are not cached)."""
    console = console or Console()
    assets = assets_ensure(preset="demo", people=200, cache_root=cache_root, console=console)
    return per_subject_table(assets, method=method, fraction=fraction, hparams=hparams, seed=seed,
                             work=cache_root / "work" / "per-subject", console=console)


def per_subject_table(assets: Assets, *, method: str, fraction: float, hparams: dict[str, Any],
                      seed: int, work: Path, console: Console) -> str:
    from unlearning.corpus import load_corpus

    people = forget_people(assets.people(), fraction)
    sets = sets_for(load_corpus(assets.corpus_file), people, seed=seed)
    out = work / method
    result = erase_timed(assets.base_dir, sets, method=method, hparams={**hparams, "seed": seed},
                         out_dir=out, console=console, label=f"erase {method}")
    report, verify_s = verify_timed(out, assets, sets, seed=seed, console=console, label="verify")
    before, after = leak_by_subject(assets.base_dir, sets), leak_by_subject(out, sets)
    shutil.rmtree(out, ignore_errors=True)
    m = report["metrics"]
    lines = [
        f"{method} ({json.dumps(result.hparams, sort_keys=True)}), {len(people)} of {len(assets.people())} "
        f"people ({assets.preset} preset), "
        f"seed {seed}: erase {result.seconds:.0f} s, verify {verify_s:.0f} s, "
        f"passed={report['passed']}, guarantee={report['guarantee']}",
        "",
        "Leak rate per subject, base -> candidate (greedy answers containing the fact's value):",
        "",
        *table([p["person_id"] for p in people], before, after),
        "",
        "| | original | paraphrase | alias |",
        "|---|---|---|---|",
        "| forget (all subjects) | " + " | ".join(f"{m.get(f'leakage.forget.{k}', float('nan')):.3f}" for k in KINDS) + " |",
        "| control people | " + " | ".join(f"{m.get(f'leakage.control.{k}', float('nan')):.3f}" for k in KINDS) + " |",
        "",
        f"Retained accuracy {m.get('utility.retain_accuracy', float('nan')):.3f} "
        f"(base {m.get('utility.base_retain_accuracy', float('nan')):.3f}, "
        f"ratio {m.get('utility.retain_ratio', float('nan')):.3f}).",
        "",
        "| check | value | threshold | passed |",
        "|---|---|---|---|",
    ]
    for check in report["checks"]:
        flag = "yes" if check["passed"] else "**no**"
        note = "" if check.get("decides_pass", True) else " (guarantee class only)"
        if check["value"] is None or check["threshold"] is None:  # judged by the policy's unmeasured rule
            lines.append(f"| {check['name']}{note} | unmeasured ({check.get('rule')}) | {check['comparator']} - "
                         f"| {flag} |")
            continue
        lines.append(f"| {check['name']}{note} | {check['value']:.3f} | {check['comparator']} "
                     f"{check['threshold']:.3f} | {flag} |")
    return "\n".join(lines)
