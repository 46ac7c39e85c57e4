"""The engine calls every family shares: sets for some people, one erasure, one verification."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.assets import Assets, subject_of
from bench.console import Console


def sets_for(corpus: Any, people: Sequence[dict[str, Any]], *, seed: int) -> Any:
    from unlearning.sets import build_sets

    sets = build_sets(corpus, [subject_of(p) for p in people], seed=seed)
    if sets.unmatched:
        raise RuntimeError(f"{len(sets.unmatched)} subjects matched no record of the corpus")
    return sets


def erase_timed(model_dir: Path, sets: Any, *, method: str, hparams: dict[str, Any], out_dir: Path,
                console: Console, label: str) -> Any:
    from unlearning.erase import erase

    shutil.rmtree(out_dir, ignore_errors=True)
    with console.task(label) as progress:
        return erase(model_dir, sets, method=method, out_dir=out_dir, hparams=hparams,
                     progress=progress)


def verify_timed(candidate: Path, assets: Assets, sets: Any, *, seed: int, console: Console,
                 label: str, base_dir: Path | None = None, corpus: Any = None) -> tuple[dict[str, Any], float]:
    """The service's own verification and its wall time in seconds.

    As `workers.stages` calls it: the default policy (`DEFAULT_POLICY`), the control
    people as records (`control_records.jsonl`), held-out text, and retained records
    from the corpus (`corpus`: the corpus with erased people's records tombstoned;
    default the whole corpus file, whose forget records the bank leaves out itself).
    `base_dir` is the checkpoint the candidate was made from (default the base model).
    """
    from unlearning.verification import DEFAULT_POLICY, verify

    started = time.perf_counter()
    with console.task(label) as progress:
        report = verify(candidate, base_dir or assets.base_dir, sets, control=assets.control_records_file,
                        corpus=assets.corpus_file if corpus is None else corpus,
                        heldout=assets.heldout_file, seed=seed, policy=DEFAULT_POLICY, progress=progress)
    return report.to_json(), time.perf_counter() - started
