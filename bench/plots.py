"""Matplotlib figures of the report (PNG, headless Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first


def _mean(entry: dict[str, Any], family: str, key: str) -> tuple[float, float] | None:
    stat = (entry.get(family) or {}).get(key)
    return None if not stat else (stat["mean"], stat["sd"])


def tradeoff_plot(summary: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Forgetting against utility, one point per method and forget fraction (error bars: sd over seeds)."""
    panels = (("tofu", "model_utility", "tofu", "forget_quality", "TOFU model utility",
               "forget quality (KS p-value vs oracle)", True),
              ("metrics", "utility.retain_ratio", "metrics", "leakage.forget", "retained-fact accuracy / base",
               "forget leakage (share of probes)", False))
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    drawn = False
    fractions = sorted({e["fraction"] for e in summary})
    markers = "osD^v<>pPX*h"
    methods = sorted({e["method"] for e in summary})
    for ax, (fx, kx, fy, ky, xlabel, ylabel, logy) in zip(axes, panels, strict=True):
        for entry in summary:
            x, y = _mean(entry, fx, kx), _mean(entry, fy, ky)
            if x is None or y is None:
                continue
            drawn = True
            colour = plt.cm.viridis(fractions.index(entry["fraction"]) / max(1, len(fractions) - 1) * 0.85)
            ax.errorbar(x[0], y[0], xerr=x[1], yerr=y[1], fmt=markers[methods.index(entry["method"]) % len(markers)],
                        color=colour, capsize=3, markersize=7)
            ax.annotate(f"{entry['method']} {entry['fraction']:.0%}", (x[0], y[0]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_title("better: up and right")
    axes[1].set_title("better: down and right")
    if not drawn:
        plt.close(fig)
        return None
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def continual_plot(steps: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Leakage and utility after each of the consecutive erasures."""
    rows = [s for s in steps if "cumulative_leakage" in s]
    if not rows:
        return None
    x = [s["step"] for s in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series = (("cumulative_leakage", "leakage, all subjects erased so far"),
              ("control_leakage", "control level (people never seen)"),
              ("retained_ratio_vs_base", "retained-fact accuracy / original base"),
              ("model_utility", "TOFU model utility"),
              ("well_formed", "well-formed answers (1 - gibberish rate)"))
    for key, label in series:
        values = [s.get(key) for s in rows]
        if all(v is not None for v in values):
            ax.plot(x, values, marker="o", label=label)
    ax.set_xlabel("erasure request (applied one after another)")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xticks(x)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
