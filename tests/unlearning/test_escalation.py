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
                               failed_checks=_failed("attack.relearn_paired_recovery"))
    assert stronger is not None
    assert stronger["teacher_refresh"] > 0 and stronger["stranger_anchor"] is True
    methods.hparams_from_json("asu", stronger).validate()  # the retry's settings are valid ASU settings


def test_a_leak_or_whole_record_familiarity_switches_the_teacher_on_but_span_familiarity_does_not():
    # Plain QA (bench shapes, 2026-12-05): OPT person 3 answered its city after the default and
    # after doubled steps; Qwen2 person 3's zlib AUC was 0.762.  With the refreshed, anchored
    # teacher both pass every check.  On the demo the refresh left names more familiar.
    from unlearning import methods

    hp = methods.hparams_from_json("asu", {}).resolved(1).to_json()
    for metric in ("leakage.forget", "leakage.forget_sampled", "mia.auc_gap", "mia.zlib_auc_gap"):
        stronger = policy_escalate(DEFAULT_POLICY, method="asu", hparams=hp, failed_checks=_failed(metric))
        assert stronger is not None and stronger["teacher_refresh"] == 50 and stronger["stranger_anchor"] is True, metric
        assert any("teacher_refresh" in note for note in stronger["escalation"]), metric
        methods.hparams_from_json("asu", stronger).validate()
    spans = policy_escalate(DEFAULT_POLICY, method="asu", hparams=hp, failed_checks=_failed("mia.span_auc_gap"))
    assert spans is not None and spans["teacher_refresh"] == 0 and spans["stranger_anchor"] is False
    assert spans["steps"] == 2 * hp["steps"]


def test_a_latent_failure_refits_the_lens_during_the_retry_under_v7_only():
    # StableLM probe corpus (2026-12-05): the latent loss reached 0.002 against the lens fitted at
    # the start while the verifier's lens, fitted on the result, read 0.68; refitted every 50 steps: 0.19.
    from unlearning import methods
    from unlearning.verification import get_policy

    hp = methods.hparams_from_json("asu", {}).resolved(1).to_json()
    assert hp["lens_refresh"] == 0
    stronger = policy_escalate(DEFAULT_POLICY, method="asu", hparams=hp, failed_checks=_failed("latent.matched_ratio"))
    assert stronger is not None and stronger["lens_refresh"] == 50
    assert "latent.matched_ratio failed: lens_refresh 0 -> 50 (set)" in stronger["escalation"]
    assert stronger["steps"] == 2 * hp["steps"]  # the latent cure as before
    methods.hparams_from_json("asu", stronger).validate()
    # A leak does not refit the lens; v6's retry never did.
    leak = policy_escalate(DEFAULT_POLICY, method="asu", hparams=hp, failed_checks=_failed("leakage.forget"))
    assert leak is not None and leak["lens_refresh"] == 0
    v6 = policy_escalate(get_policy("default", "6"), method="asu", hparams=hp,
                         failed_checks=_failed("latent.paired_ratio"))
    assert v6 is not None and v6["lens_refresh"] == 0
