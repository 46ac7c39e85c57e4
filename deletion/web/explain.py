"""Verification checks in plain words, for the officer who has to act on a failure.

Each stored check has a metric, its value, a threshold and a comparator.  This maps a
metric to what was measured and against whom; a metric it does not know (the engine
adds checks over time) falls back to the check's own name, so a new check is never
hidden, only described less well.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# metric -> (what was measured, compared with whom or what)
MEASURES: dict[str, tuple[str, str]] = {
    "leakage.forget": ("the share of questions about the subject that the model still answers "
                       "with the erased fact (greedy answers)", "people the model never saw"),
    "leakage.forget_sampled": ("the share of sampled answers about the subject that still contain "
                               "an erased fact", "people the model never saw"),
    "latent.residual_ratio": ("how much of the subject's facts a linear probe can still read from "
                              "the model's internal activations, at the first word where a true and "
                              "a false value differ (policies up to v4)", "the model before the erasure"),
    "latent.value_ratio": ("how much of the subject's facts a linear probe can still read from "
                           "the model's internal activations, over the whole of each value, against "
                           "other people's facts (policy v5)", "the model before the erasure"),
    "latent.paired_ratio": ("how much of the subject's facts a linear probe can still read from "
                            "the model's internal activations, over the whole of each value, against "
                            "the same facts told about strangers (policy v6)", "the model before the erasure"),
    "latent.matched_ratio": ("how much of the subject's facts a linear probe can still read from "
                             "the model's internal activations, over the whole of each value, against "
                             "the very same facts asked about strangers", "the model before the erasure"),
    "utility.retain_ratio": ("how many facts about other people the model still knows",
                             "the model before the erasure"),
    "utility.ppl_ratio": ("how well the model still predicts ordinary held-out text (perplexity)",
                          "the model before the erasure"),
    "fluency.gibberish_rate": ("the share of answers about the subject that are empty, looping or "
                               "implausible", "answers about people the model never saw"),
    "fluency.degenerate_rate": ("the share of degenerate answers overall", "the model before the erasure"),
    "mia.auc": ("whether a membership-inference attack (Min-K%++) can tell the subject's records "
                "from strangers' (0.5 = it cannot)", "records of people the model never saw"),
    "mia.auc_gap": ("how far a membership-inference attack separates the subject's records from "
                    "strangers' beyond chance", "records of people the model never saw"),
    "attack.relearn_recovery": ("how many of the subject's facts come back after a few steps of "
                                "fine-tuning on the others (a relearning attack)",
                                "the same attack on people the model never saw"),
    "attack.relearn_paired_recovery": ("how many of the subject's facts come back after a few steps of "
                                       "fine-tuning on the others (a relearning attack)",
                                       "the same attack on the same records told about a stranger"),
    "attack.relearn_curve": ("how quickly the subject's facts come back under a relearning attack",
                             "the same attack on people the model never saw"),
    "attack.quant_leakage": ("the share of erased facts an 8-bit copy of the model still gives away",
                             "people the model never saw"),
    "attack.quant4_leakage": ("the share of erased facts a 4-bit copy of the model still gives away",
                              "people the model never saw"),
    "attack.pressure_leakage": ("the share of erased facts the model gives away under coercive "
                                "prompts", "people the model never saw"),
    "gates_off.leakage.forget": ("leakage with the KIF gates switched off (tells suppression from "
                                 "erasure)", "people the model never saw"),
    "gates_off.latent.residual_ratio": ("latent traces with the KIF gates switched off (first word)",
                                        "the model before the erasure"),
    "gates_off.latent.value_ratio": ("latent traces with the KIF gates switched off (policy v5)",
                                     "the model before the erasure"),
    "gates_off.latent.paired_ratio": ("latent traces with the KIF gates switched off (policy v6)",
                                      "the model before the erasure"),
    "gates_off.latent.matched_ratio": ("latent traces with the KIF gates switched off",
                                       "the model before the erasure"),
}
WORDS = {"<=": "at most", ">=": "at least", "<": "below", ">": "above"}


@dataclass(frozen=True)
class CheckExplained:
    metric: str
    name: str
    sentence: str
    passed: bool | None


def _number(value: float | None) -> str:
    if value is None:
        return "not measured"
    return f"{value:.1%}" if 0 <= value <= 1 else f"{value:.3g}"


def explain(row: Any) -> CheckExplained:
    """One stored check (a VerificationResult) in a sentence."""
    name = str((row.details or {}).get("check") or row.metric) if isinstance(row.details, dict) else row.metric
    what, against = MEASURES.get(row.metric, (f"the check “{name}”", "the policy's threshold"))
    bound = WORDS.get(row.comparator or "", row.comparator or "")
    verdict = ("passed" if row.passed else "failed") if row.passed is not None else "was recorded"
    sentence = (f"We measured {what}: {_number(row.value)}, compared with {against}. The policy "
                f"allows {bound} {_number(row.threshold)}, so this check {verdict}.")
    rule = (row.details or {}).get("rule") if isinstance(row.details, dict) else None
    if rule:
        sentence += f" The policy's rule for this sample: {rule}."
    return CheckExplained(row.metric, name, sentence, row.passed)


def failed_checks(rows: list[Any]) -> list[CheckExplained]:
    return [explain(r) for r in rows if r.passed is False
            and (not isinstance(r.details, dict) or r.details.get("decides_pass", True))]
