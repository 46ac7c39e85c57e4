"""How big each benchmark is: `--quick` (a few minutes) and `--full` (about 2.5 hours on 2 cores)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class MethodVariant:
    """One row of the quality table: an engine method with hyper-parameter overrides."""

    label: str
    method: str
    overrides: dict[str, Any] = field(default_factory=dict)


# The line-up: ASU with both retain losses, KIF, and open-unlearning's core baselines.
# Every other hyper-parameter is the method's own default (docs/methods.md).
METHOD_VARIANTS: tuple[MethodVariant, ...] = (
    MethodVariant("asu-kl", "asu", {"retain_loss": "kl"}),
    MethodVariant("asu-gd", "asu", {"retain_loss": "gd"}),
    MethodVariant("kif", "kif"),
    MethodVariant("gradascent", "gradascent"),
    MethodVariant("graddiff", "graddiff"),
    MethodVariant("npo", "npo"),
    MethodVariant("idk", "idk"),
)


@dataclass(frozen=True)
class BenchSettings:
    mode: str
    preset: str  # train_base preset of the base model and of the retrain oracle
    people: int  # people in the demo corpus (workers.bootstrap uses the same counts)
    forget_fractions: tuple[float, ...]
    seeds: tuple[int, ...]
    methods: tuple[MethodVariant, ...]
    tofu_perturbed: int  # perturbed answers per fact for the truth ratio
    utility_facts: int  # retained facts scored for TOFU-style model utility
    continual_requests: int
    continual_method: str
    cost_steps: int  # optimiser steps of each timed step-cost run (fixed: the budget rule is bypassed)
    batching_subjects: int
    scan_megabytes: float
    scan_subjects: tuple[int, ...]
    scan_large_megabytes: float  # the larger corpus (10 GB is extrapolated from it)
    scan_shards: int  # shards of each generated scan corpus (the sharded-worker figure)
    pipeline_timeout_s: float
    wrk_seconds: int
    wrk_connections: int
    gunicorn_workers: int
    audit_events: int
    # Training seeds of the retrain oracle (seed 0 is the base's own recipe and the reference of
    # every comparison; the others are the same recipe from another initialisation and data
    # order): how far two models that never saw the people are from each other, the resolution
    # of "within x of the oracle".
    oracle_training_seeds: tuple[int, ...] = (0,)
    # The step cost once more on a model of the proportions of a real one (random weights: the
    # cost of a step does not depend on them): hidden size, layers, MLP width and vocabulary size
    # (0: the demo's; the tokenizer is the demo's either way, and a larger vocabulary's extra rows
    # are tokens it never writes, which cost what they cost in a released model: every term read
    # through the output head pays for the whole vocabulary); None: not measured.
    cost_wide_model: tuple[int, int, int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


QUICK = BenchSettings(
    mode="quick", preset="tiny", people=24, forget_fractions=(0.1,), seeds=(0,),
    methods=METHOD_VARIANTS, tofu_perturbed=4, utility_facts=60,
    continual_requests=3, continual_method="asu", cost_steps=12, batching_subjects=6,
    # The benchmark corpus holds 4,000 people's records (about 15 MB) before any general text.
    scan_megabytes=20.0, scan_subjects=(1, 20), scan_large_megabytes=60.0, scan_shards=4,
    pipeline_timeout_s=420.0,
    wrk_seconds=3, wrk_connections=4, gunicorn_workers=2, audit_events=20_000,
)

FULL = BenchSettings(
    mode="full", preset="demo", people=200, forget_fractions=(0.01, 0.05, 0.10), seeds=(0, 1, 2),
    methods=METHOD_VARIANTS, tofu_perturbed=5, utility_facts=200,
    continual_requests=10, continual_method="asu", cost_steps=80, batching_subjects=20,
    cost_wide_model=(512, 6, 1376, 32_000),
    scan_megabytes=100.0, scan_subjects=(1, 100), scan_large_megabytes=1000.0, scan_shards=8,
    pipeline_timeout_s=600.0,
    wrk_seconds=15, wrk_connections=8, gunicorn_workers=2, audit_events=1_000_000,
    oracle_training_seeds=(0, 1, 2),
)

MODES = {"quick": QUICK, "full": FULL}
