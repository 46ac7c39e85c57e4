"""The single retry changes something real, and says what: no cure that leaves the settings as they were."""

from __future__ import annotations

from unlearning.erase import resolve_hparams
from unlearning.verification import DEFAULT_POLICY, CheckResult, policy_escalate


def _failed(metric: str) -> list[CheckResult]:
    return [CheckResult(metric, metric, 0.9, 0.7, "<=", False)]


def test_a_kif_membership_failure_without_distillation_trains_longer_instead_of_doubling_zero():
    hp = resolve_hparams("kif", {"preset": "standard"}, None, subjects=1).to_json()
    assert hp["distill_steps"] == 0
    stronger = policy_escalate(DEFAULT_POLICY, method="kif", hparams=hp, failed_checks=_failed("mia.auc"))
    assert stronger is not None
    assert stronger["distill_steps"] == 0 and stronger["steps"] == 2 * hp["steps"]
    assert stronger["escalation"] and all("distill_steps" not in note for note in stronger["escalation"])


def test_a_kif_membership_failure_with_distillation_distils_longer():
    hp = resolve_hparams("kif", {"distill_steps": 50}, None, subjects=1).to_json()
    stronger = policy_escalate(DEFAULT_POLICY, method="kif", hparams=hp, failed_checks=_failed("mia.auc"))
    assert stronger is not None and stronger["distill_steps"] == 100 and stronger["steps"] == hp["steps"]


def test_every_method_gets_a_retry_that_changes_its_settings_for_a_leak():
    for method in ("asu", "kif", "gradascent", "graddiff", "npo", "idk"):
        hp = resolve_hparams(method, None, None, subjects=1).to_json() if method != "asu" else {
            "steps": 200, "forget_weight": 1.0, "preset": "demo"}
        stronger = policy_escalate(DEFAULT_POLICY, method=method, hparams=hp,
                                   failed_checks=_failed("leakage.forget"))
        assert stronger is not None, method
        assert any(stronger[k] != hp.get(k) for k in stronger if k != "escalation"), method


def test_a_relearning_failure_switches_the_resolved_asu_settings_to_a_refreshed_anchored_teacher():
    from unlearning import methods

    hp = methods.hparams_from_json("asu", {}).resolved(1).to_json()
    assert hp["teacher_refresh"] == 0 and hp["stranger_anchor"] is False
    stronger = policy_escalate(DEFAULT_POLICY, method="asu", hparams=hp,
                               failed_checks=_failed("attack.relearn_recovery"))
    assert stronger is not None
    assert stronger["teacher_refresh"] > 0 and stronger["stranger_anchor"] is True
    methods.hparams_from_json("asu", stronger).validate()  # the retry's settings are valid ASU settings
