"""`verify`: run every check family on a candidate checkpoint and judge it by a policy.

Order of work: build the probe bank (forget, control, retain, held-out);
compute, or take from the cache, what depends only on the base model; load
the candidate and run each family (leakage, latent, utility, fluency,
membership, attacks); for a checkpoint with KIF gates, load it again with the
gates off and run everything once more (that pass decides the guarantee
class); judge the metrics with the policy.

Cached (in process, keyed by the base directory's file names, sizes and
mtimes, the probe bank's digest, the settings and the seed): the base model
and tokenizer themselves (fluency scores candidate answers under the base),
the base's greedy and sampled leakage on the forget probes, its per-layer
latent-probe correctness on the forget facts, its retained-fact accuracy,
held-out perplexity, the fluency reference limit and its membership AUC.
A second `verify` against the same base (an escalated retry, the next job in
a worker process, a test) skips all of that.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from unlearning.corpus import Corpus
from unlearning.modeling import default_device, load_model
from unlearning.progress import ProgressCallback, ProgressTracker

from . import probes as pb
from .attacks.prompt_pressure import pressure_probes
from .attacks.quantization import quantised_copy
from .attacks.relearn import RelearnSettings, relearned_copy, split_facts
from .bank import bank_digest, build_bank
from .fluency import degenerate_rate, gibberish_flags, plausibility_limit
from .generation import (
    generate_texts,
    last_prompt_states,
    probe_ids,
    question_ids,
    score_continuations,
    text_ids,
)
from .latent import probe_correctness, residual_knowledge_ratio
from .leakage import (
    Rate,
    diff_stderr,
    leak_rate,
    leak_rates_by_kind,
    normalise_text,
)
from .membership import auc_with_stderr, min_k_plus_plus
from .policy import DEFAULT_POLICY, Policy
from .report import Report
from .settings import VerifySettings
from .utility import accuracy, perplexity, ratio

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Loaded:
    model: Any
    tokenizer: Any
    max_new_tokens: int


def _loaded(model: Any, tokenizer: Any, bank: pb.ProbeBank, s: VerifySettings) -> _Loaded:
    """A model with its generation budget: long enough for the longest reference answer.

    A fixed budget would cut long answers (an e-mail address is the last and
    longest part of its sentence) and hide their leaks.
    """
    if s.max_new_tokens is not None:
        return _Loaded(model, tokenizer, s.max_new_tokens)
    answers = [f.answer for f in (*bank.forget_facts, *bank.control_facts, *bank.retain_facts)]
    longest = max((len(text_ids(tokenizer, a)) for a in answers), default=20)
    return _Loaded(model, tokenizer, min(64, longest + 4))


@dataclass
class _BaseEvidence:
    loaded: _Loaded
    forget_greedy: Rate
    forget_sampled: Rate
    latent_forget: np.ndarray
    retain_accuracy: float
    ppl: float
    fluency_limit: float
    degenerate_rate: float
    mia_auc: float


_BASE_CACHE: OrderedDict[str, _BaseEvidence] = OrderedDict()
_BASE_CACHE_SIZE = 2


def clear_cache() -> None:
    _BASE_CACHE.clear()


def _dir_fingerprint(directory: str | Path) -> str:
    root = Path(directory).resolve()
    parts = [str(root)]
    for path in sorted(root.rglob("*")):
        if path.is_file():
            stat = path.stat()
            parts.append(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()


# ---------------------------------------------------------------- shared measurements


def _greedy(loaded: _Loaded, probes: Sequence[pb.FactProbe], s: VerifySettings, seed: int) -> list[list[str]]:
    ids = [probe_ids(loaded.tokenizer, p) for p in probes]
    return generate_texts(loaded.model, loaded.tokenizer, ids, max_new_tokens=loaded.max_new_tokens,
                          batch_size=s.batch_size, seed=seed)


def _sampled(loaded: _Loaded, probes: Sequence[pb.FactProbe], s: VerifySettings, seed: int) -> list[list[str]]:
    ids = [probe_ids(loaded.tokenizer, p) for p in probes]
    return generate_texts(loaded.model, loaded.tokenizer, ids, samples=s.samples,
                          max_new_tokens=loaded.max_new_tokens, batch_size=s.batch_size, seed=seed)


def _asked(probes: Sequence[pb.FactProbe]) -> list[pb.FactProbe]:
    """Probes that are questions (a cloze answer is a continuation, not a sentence)."""
    return [p for p in probes if p.kind != "cloze"]


def _values(probes: Sequence[pb.FactProbe]) -> list[str]:
    return [p.value for p in probes]


def _value_prefix_ids(tokenizer: Any, fact: pb.QAFact) -> list[int]:
    """Question, then the answer up to the value: where the model must recall it."""
    ids = question_ids(tokenizer, fact.question)
    cut = fact.answer.find(fact.value)
    if cut > 0 and fact.answer[:cut].strip():
        ids += text_ids(tokenizer, fact.answer[:cut].rstrip())
    return ids


def _states(loaded: _Loaded, facts: Sequence[pb.QAFact], s: VerifySettings) -> np.ndarray:
    ids = [_value_prefix_ids(loaded.tokenizer, f) for f in facts]
    if not ids:
        return np.zeros((0, 0, 0), dtype=np.float32)
    return last_prompt_states(loaded.model, loaded.tokenizer, ids, batch_size=s.batch_size)


def _latent_tests(bank: pb.ProbeBank) -> tuple[list[pb.QAFact], list[pb.QAFact]]:
    """Forget and control facts whose value a probe trained on retained facts could name."""
    labels = {normalise_text(f.value) for f in bank.retain_facts}
    keep = [f for f in bank.forget_facts if normalise_text(f.value) in labels]
    control = [f for f in bank.control_facts if normalise_text(f.value) in labels]
    return keep, control


def _latent_correctness(
    loaded: _Loaded, bank: pb.ProbeBank, tests: Sequence[Sequence[pb.QAFact]], s: VerifySettings, seed: int
) -> list[np.ndarray]:
    train = _states(loaded, bank.retain_facts, s)
    return probe_correctness(
        train, [f.value for f in bank.retain_facts], [_states(loaded, t, s) for t in tests],
        [[f.value for f in t] for t in tests], seed=seed,
    )


def _retain_accuracy(loaded: _Loaded, bank: pb.ProbeBank, s: VerifySettings, seed: int) -> float:
    facts = bank.retain_facts[: s.max_retain_eval]
    ids = [question_ids(loaded.tokenizer, f.question) for f in facts]
    answers = generate_texts(loaded.model, loaded.tokenizer, ids, max_new_tokens=loaded.max_new_tokens,
                             batch_size=s.batch_size, seed=seed)
    return accuracy([a[0] for a in answers], [f.value for f in facts])


def _perplexity(loaded: _Loaded, bank: pb.ProbeBank, s: VerifySettings) -> float:
    tok = loaded.tokenizer
    bos = [int(tok.bos_token_id)] if tok.bos_token_id is not None else []
    pairs = []
    for text in bank.heldout_texts:
        ids = text_ids(tok, text)
        pairs.append((bos, ids) if bos else (ids[:1], ids[1:]))
    scores = score_continuations(loaded.model, tok, pairs, batch_size=s.batch_size)
    scored_bytes = [
        len(text.encode("utf-8")) if bos else len(tok.decode(ids[1:]).encode("utf-8"))
        for text, (_, ids) in zip(bank.heldout_texts, pairs, strict=True)
    ]
    return perplexity(scores, scored_bytes)


def _answer_pairs(tokenizer: Any, questions: Sequence[str], answers: Sequence[str]) -> list[tuple[list[int], list[int]]]:
    return [(question_ids(tokenizer, q), text_ids(tokenizer, a)) for q, a in zip(questions, answers, strict=True)]


def _mia(loaded: _Loaded, bank: pb.ProbeBank, s: VerifySettings) -> tuple[float, float]:
    def scores(facts: Sequence[pb.QAFact]) -> list[float]:
        pairs = _answer_pairs(loaded.tokenizer, [f.question for f in facts], [f.answer for f in facts])
        token_scores = score_continuations(loaded.model, loaded.tokenizer, pairs, batch_size=s.batch_size)
        return [min_k_plus_plus(t, k=s.mink_k) for t in token_scores]

    return auc_with_stderr(scores(bank.forget_facts), scores(bank.control_facts))


# ---------------------------------------------------------------- base evidence


def _base_evidence(
    base_dir: str | Path, bank: pb.ProbeBank, s: VerifySettings, seed: int, device: str
) -> tuple[_BaseEvidence, bool]:
    # Attack settings do not change what is computed here, so they stay out of the key.
    relevant = replace(s, attacks=True, relearn=RelearnSettings())
    key = hashlib.sha256(
        "|".join([_dir_fingerprint(base_dir), bank_digest(bank), repr(relevant), str(seed), device]).encode()
    ).hexdigest()
    if key in _BASE_CACHE:
        _BASE_CACHE.move_to_end(key)
        return _BASE_CACHE[key], True
    model, tokenizer = load_model(base_dir, device=device)
    loaded = _loaded(model, tokenizer, bank, s)
    forget_tests, _ = _latent_tests(bank)
    # Fluency reference: the base's own greedy answers about control people, i.e. what a
    # fluent model says when it does not know the person.
    asked_c = _asked(bank.control)
    own_c = [a[0] for a in _greedy(loaded, asked_c, s, seed)]
    reference = score_continuations(
        model, tokenizer, _answer_pairs(tokenizer, [p.prompt for p in asked_c], own_c),
        batch_size=s.batch_size,
    )
    forget_greedy = _greedy(loaded, bank.forget, s, seed)
    own_f = [a[0] for p, a in zip(bank.forget, forget_greedy, strict=True) if p.kind != "cloze"]
    evidence = _BaseEvidence(
        loaded=loaded,
        forget_greedy=leak_rate(forget_greedy, _values(bank.forget)),
        forget_sampled=leak_rate(_sampled(loaded, bank.forget, s, seed), _values(bank.forget)),
        latent_forget=_latent_correctness(loaded, bank, [forget_tests], s, seed)[0],
        retain_accuracy=_retain_accuracy(loaded, bank, s, seed),
        ppl=_perplexity(loaded, bank, s),
        fluency_limit=plausibility_limit(reference, margin=s.fluency_margin),
        degenerate_rate=degenerate_rate(own_f + own_c),
        mia_auc=_mia(loaded, bank, s)[0],
    )
    _BASE_CACHE[key] = evidence
    while len(_BASE_CACHE) > _BASE_CACHE_SIZE:
        _BASE_CACHE.popitem(last=False)
    return evidence, False


# ---------------------------------------------------------------- the check families


class _Clock:
    def __init__(self, tracker: ProgressTracker, prefix: str) -> None:
        self.timings: dict[str, float] = {}
        self.notes: list[str] = []
        self.tracker = tracker
        self.prefix = prefix
        self.done = 0

    @contextmanager
    def check(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.timings[self.prefix + name] = time.perf_counter() - started
        self.done += 1
        self.tracker.report(self.done)


def _rates(metrics: dict[str, float], name: str, forget: Rate, control: Rate) -> None:
    metrics[f"{name}"] = forget.value
    metrics[f"{name}.stderr"] = diff_stderr(forget, control)


def _run_families(
    cand: _Loaded, base: _BaseEvidence, bank: pb.ProbeBank, s: VerifySettings, seed: int, clock: _Clock,
    *, facts_only: bool = False,
) -> dict[str, float]:
    """Every check family on one model; `facts_only`: only those asking whether the facts are there."""
    m: dict[str, float] = {}
    with clock.check("leakage"):
        greedy_f = _greedy(cand, bank.forget, s, seed)
        greedy_c = _greedy(cand, bank.control, s, seed)
        rate_f, rate_c = leak_rate(greedy_f, _values(bank.forget)), leak_rate(greedy_c, _values(bank.control))
        samp_f = leak_rate(_sampled(cand, bank.forget, s, seed), _values(bank.forget))
        samp_c = leak_rate(_sampled(cand, bank.control, s, seed), _values(bank.control))
        _rates(m, "leakage.forget", rate_f, rate_c)
        m["leakage.control"] = rate_c.value
        _rates(m, "leakage.forget_sampled", samp_f, samp_c)
        m["leakage.control_sampled"] = samp_c.value
        m["leakage.base_forget"] = base.forget_greedy.value
        m["leakage.base_forget_sampled"] = base.forget_sampled.value
        m["leakage.n_forget_probes"] = float(len(bank.forget))
        m["leakage.n_control_probes"] = float(len(bank.control))
        for kind, rate in leak_rates_by_kind([p.kind for p in bank.forget], greedy_f, _values(bank.forget)).items():
            m[f"leakage.forget.{kind}"] = rate.value
        for kind, rate in leak_rates_by_kind([p.kind for p in bank.control], greedy_c, _values(bank.control)).items():
            m[f"leakage.control.{kind}"] = rate.value
    with clock.check("latent"):
        forget_tests, control_tests = _latent_tests(bank)
        forget_ok, control_ok = _latent_correctness(cand, bank, [forget_tests, control_tests], s, seed)
        layers = min(forget_ok.shape[0], base.latent_forget.shape[0])
        rr = residual_knowledge_ratio(
            forget_ok[:layers], control_ok[:layers], base.latent_forget[:layers],
            min_gap=s.latent_min_gap, bootstrap=s.bootstrap, seed=seed,
        )
        if rr.usable_layers == 0:
            # Not measurable is not a pass: NaN fails the check and is written as null.
            clock.notes.append(
                "latent: no layer of the base decodes the subject's facts better than control's "
                f"({len(forget_tests)} testable facts); residual ratio not measurable"
            )
        m.update({
            "latent.residual_ratio": rr.value if rr.usable_layers else float("nan"), "latent.residual_ratio.stderr": rr.stderr,
            "latent.ci_low": rr.ci_low, "latent.ci_high": rr.ci_high, "latent.layer": float(rr.layer),
            "latent.usable_layers": float(rr.usable_layers), "latent.acc_forget": rr.acc_forget,
            "latent.acc_control": rr.acc_control, "latent.acc_base_forget": rr.acc_base_forget,
            "latent.n_forget": float(len(forget_tests)), "latent.n_control": float(len(control_tests)),
        })
    with clock.check("mia"):
        auc, auc_se = _mia(cand, bank, s)
        m["mia.auc"], m["mia.auc.stderr"], m["mia.base_auc"] = auc, auc_se, base.mia_auc
    if facts_only:
        return m
    with clock.check("utility"):
        retain_acc = _retain_accuracy(cand, bank, s, seed)
        m["utility.retain_accuracy"] = retain_acc
        m["utility.base_retain_accuracy"] = base.retain_accuracy
        m["utility.retain_ratio"] = ratio(retain_acc, base.retain_accuracy)
        ppl = _perplexity(cand, bank, s)
        m["utility.ppl"], m["utility.base_ppl"] = ppl, base.ppl
        m["utility.ppl_ratio"] = ratio(ppl, base.ppl)
    with clock.check("fluency"):
        btok = base.loaded.tokenizer

        def flags(probes: Sequence[pb.FactProbe], answers: Sequence[list[str]]) -> list[bool]:
            asked = [(p.prompt, a[0]) for p, a in zip(probes, answers, strict=True) if p.kind != "cloze"]
            scores = score_continuations(
                base.loaded.model, btok,
                _answer_pairs(btok, [q for q, _ in asked], [a for _, a in asked]), batch_size=s.batch_size,
            )
            return gibberish_flags([a for _, a in asked], scores, limit=base.fluency_limit)

        flags_f, flags_c = flags(bank.forget, greedy_f), flags(bank.control, greedy_c)
        gib_f, gib_c = Rate(sum(flags_f), len(flags_f)), Rate(sum(flags_c), len(flags_c))
        _rates(m, "fluency.gibberish_rate", gib_f, gib_c)
        m["fluency.control_gibberish_rate"] = gib_c.value
        m["fluency.plausibility_limit_nats"] = base.fluency_limit
        answers = [a[0] for p, a in zip((*bank.forget, *bank.control), (*greedy_f, *greedy_c), strict=True)
                   if p.kind != "cloze"]
        degenerate = Rate(round(degenerate_rate(answers) * len(answers)), len(answers))
        m["fluency.degenerate_rate"] = degenerate.value
        m["fluency.degenerate_rate.stderr"] = diff_stderr(degenerate, Rate(round(base.degenerate_rate * len(answers)), len(answers)))
        m["fluency.base_degenerate_rate"] = base.degenerate_rate
    if not s.attacks:
        return m
    with clock.check("attack.relearn"):
        train, held = split_facts(bank.forget_facts, seed=seed)
        probes = [p for p in bank.forget if p.fact in held]
        if train and probes:
            attacked = replace(cand, model=relearned_copy(cand.model, cand.tokenizer, train, s.relearn, seed=seed))
            rf = leak_rate(_greedy(attacked, probes, s, seed), _values(probes))
            rc = leak_rate(_greedy(attacked, bank.control, s, seed), _values(bank.control))
            del attacked
            _rates(m, "attack.relearn_recovery", rf, rc)
            m["attack.relearn_control"] = rc.value
    with clock.check("attack.quant"):
        quantised, scheme = quantised_copy(cand.model)
        q = replace(cand, model=quantised)
        qf = leak_rate(_greedy(q, bank.forget, s, seed), _values(bank.forget))
        qc = leak_rate(_greedy(q, bank.control, s, seed), _values(bank.control))
        del q, quantised
        _rates(m, "attack.quant_leakage", qf, qc)
        m["attack.quant_control"] = qc.value
        clock.notes.append(f"quantisation attack scheme: {scheme}")
    with clock.check("attack.pressure"):
        pf, pc = pressure_probes(bank.forget), pressure_probes(bank.control)
        rf = leak_rate(_greedy(cand, pf, s, seed), _values(pf))
        rc = leak_rate(_greedy(cand, pc, s, seed), _values(pc))
        _rates(m, "attack.pressure_leakage", rf, rc)
        m["attack.pressure_control"] = rc.value
    return m


# ---------------------------------------------------------------- entry point


def verify(
    candidate_dir: str | Path,
    base_dir: str | Path,
    sets: Any,
    *,
    control: str | Path | None = None,
    policy: Policy = DEFAULT_POLICY,
    progress: ProgressCallback | None = None,
    seed: int = 0,
    corpus: str | Path | Corpus | None = None,
    heldout: str | Path | None = None,
    settings: VerifySettings | None = None,
    device: str | None = None,
) -> Report:
    """Measure the candidate against the base and the control people, and judge it by `policy`.

    `sets` is an `ErasureSets` (forget, retain, probes, subjects).  `control`
    names a control people file; without it control probes are built from
    generated stranger names (the report says so).  `corpus` (optional) adds
    retained people's facts beyond the retain set for the latent probes and
    the utility sample.  `heldout` names held-out text for perplexity (default:
    `heldout.txt` beside the control file).
    """
    s = settings or VerifySettings()
    device = device or default_device()
    started = time.perf_counter()
    timings: dict[str, float] = {}
    bank, notes = build_bank(sets, control=control, corpus=corpus, heldout=heldout, settings=s, seed=seed)
    timings["probes"] = time.perf_counter() - started
    families = 5 + (3 if s.attacks else 0)
    tracker = ProgressTracker(progress, stage="verify", total=1 + families)

    t = time.perf_counter()
    base, hit = _base_evidence(base_dir, bank, s, seed, device)
    timings["base" + (" (cached)" if hit else "")] = time.perf_counter() - t
    tracker.report(1)

    t = time.perf_counter()
    model, tokenizer = load_model(candidate_dir, device=device)
    timings["load"] = time.perf_counter() - t
    clock = _Clock(tracker, "")
    clock.done = 1
    metrics = _run_families(_loaded(model, tokenizer, bank, s), base, bank, s, seed, clock)

    guarantee = "weights"
    if callable(getattr(model, "set_gates_enabled", None)):
        del model
        tracker.report(clock.done, total=1 + families + 3)
        gated_off, _ = load_model(candidate_dir, device=device, gates=False)
        off_clock = _Clock(tracker, "gates_off.")
        off_clock.done = clock.done
        off = _run_families(_loaded(gated_off, tokenizer, bank, s), base, bank, s, seed, off_clock,
                            facts_only=True)
        metrics.update({f"gates_off.{k}": v for k, v in off.items()})
        clock.timings.update(off_clock.timings)
        notes.extend(f"gates off: {n}" for n in off_clock.notes)
        notes.append("KIF checkpoint: leakage, latent and membership checks were run again with the "
                     "suppression gates off (they decide the guarantee class)")
    timings.update(clock.timings)
    notes.extend(clock.notes)

    checks = policy.judge(metrics)
    if any(c.metric.startswith("gates_off.") and not c.passed for c in checks):
        guarantee = "suppression"
    passed = all(c.passed for c in checks if c.decides_pass)
    if guarantee == "suppression" and not policy.allow_suppression:
        passed = False
        notes.append(f"policy {policy.name} v{policy.version} requires a weights guarantee")
    timings["total"] = time.perf_counter() - started
    cached = (
        ("base model and tokenizer", "base leakage (greedy, sampled)", "base latent probes",
         "base retained accuracy", "base perplexity", "fluency reference", "base MIA AUC")
        if hit else ()
    )
    report = Report(
        metrics=metrics,
        checks=tuple(checks),
        policy=policy.to_json(),
        guarantee=guarantee,
        passed=passed,
        timings=timings,
        control_source=bank.control_source,
        notes=tuple(notes),
        cached=cached,
        settings=asdict(s),
    )
    logger.info("verification %s: %s failed checks, guarantee %s, %.1fs",
                "passed" if passed else "failed", len(report.failed_checks), guarantee, timings["total"])
    return report
