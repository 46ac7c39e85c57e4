"""`verify`: run every check family on a candidate checkpoint and judge it by a policy.

Order of work: build the probe bank (forget, control, retained, held-out);
compute, or take from the cache, what depends only on the base model; load
the candidate and run each family (leakage, latent, membership, utility,
fluency, attacks); for a checkpoint with KIF gates, load it again with the
gates off and run the families that ask whether the facts are in the weights
(that pass decides the guarantee class); judge the metrics with the policy.
A metric that cannot be measured is named in `Report.unmeasured` with a
reason code (never NaN); the policy's rule for that reason decides.

Cached (in process, keyed by the base directory's file names, sizes and
mtimes, the probe bank's digest, the settings and the seed): the base model
and tokenizer themselves (fluency scores candidate answers under the base),
the base's greedy and sampled leakage, its latent-probe correctness on the
forget facts, its retained accuracy, held-out perplexity, the fluency
reference limit and its membership AUCs.  A second `verify` against the same
base (an escalated retry, the next job in a worker process) skips all that.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from unlearning.corpus import Corpus, Record
from unlearning.identifiers import replace_spans
from unlearning.logits import ReadoutHead, readout_of
from unlearning.modeling import check_same_tokenizer, default_device, load_model, whole_tokens
from unlearning.probes import Probe
from unlearning.progress import ProgressCallback, ProgressTracker
from unlearning.prompting import encode_record, text_ids, tokenize_after
from unlearning.text import word_regex

from .attacks.prompt_pressure import pressure_probes
from .attacks.quantization import quantised4_copy, quantised_copy
from .attacks.relearn import RelearnSettings, relearn_curve, split_records
from .bank import Fact, ProbeBank, Side, bank_digest, build_bank
from .fluency import (
    content_scores,
    copied_names,
    degenerate_rate,
    gibberish_flags,
    plausibility_limit,
)
from .generation import (
    TokenScores,
    continuation_states,
    generate_texts,
    probe_encoding,
    probe_ids,
    readout_head,
    score_continuations,
    score_examples,
    states_and_head_inputs,
)
from .latent import fit_translators, lens_token_logprobs, residual_knowledge_ratio
from .leakage import Rate, diff_stderr, leak_rate, leak_rates_by_kind, paired_leak
from .membership import auc_with_stderr, min_k_plus_plus, zlib_ratio
from .policy import (
    BASE_SILENT,
    DEFAULT_POLICY,
    NO_QUESTIONS,
    NO_SPANS,
    NOT_COMPUTED,
    TOO_FEW_RECORDS,
    CheckResult,
    Policy,
)
from .report import Report
from .settings import VerifySettings
from .utility import accuracy, perplexity, ratio

logger = logging.getLogger(__name__)

ANSWERING_FORMS = ("question", "chat")  # probes whose generation is a whole answer


@dataclass(frozen=True)
class _Loaded:
    model: Any
    tokenizer: Any
    max_new_tokens: int


def _budget(tokenizer: Any, bank: ProbeBank, s: VerifySettings) -> int:
    """New tokens per generation: enough for the longest answer or value the probes expect.

    A fixed budget would cut long answers (an e-mail address is the last and
    longest part of its sentence) and hide their leaks.
    """
    if s.max_new_tokens is not None:
        return s.max_new_tokens
    longest = 8
    for side in (bank.forget, bank.control):
        for record in side.records[:200]:
            example = encode_record(tokenizer, record)
            if record.shape != "text":
                longest = max(longest, sum(example.learnt))
    for probe in (*bank.forget.probes, *bank.control.probes, *bank.retain):
        longest = max(longest, len(text_ids(tokenizer, " " + probe.expected)) + 8)
    return min(64, longest + 4)


def _load(path: str | Path, device: str, bank: ProbeBank, s: VerifySettings, *, gates: bool = True) -> _Loaded:
    model, tokenizer = load_model(path, device=device, gates=gates)
    return _Loaded(model, tokenizer, _budget(tokenizer, bank, s))


@dataclass
class _BaseEvidence:
    loaded: _Loaded
    forget_greedy: Rate
    forget_sampled: Rate
    latent_forget: LatentReadings
    retain_accuracy: float
    ppl: float
    fluency_limit: float
    degenerate_rate: float
    mia: dict[str, float]
    # Per answering forget probe asked about its stranger: is the base's own answer gibberish?
    stranger_flags: tuple[bool, ...] = ()
    # The same over content tokens (policy v4: a copied name's tokens left out).
    content_limit: float = math.inf
    stranger_content_flags: tuple[bool, ...] = ()
    # The same about the further strangers of policy v8 (`ProbeBank.more_stranger_maps`), over
    # content tokens: one tuple per stranger.
    more_stranger_content_flags: tuple[tuple[bool, ...], ...] = ()
    # The base's greedy leak rate of the subject's probes asked about a stranger (`_twin_leak`).
    stranger_leak: Rate | None = None


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


def _generate(loaded: _Loaded, probes: Sequence[Probe], s: VerifySettings, seed: int, *,
              samples: int = 0) -> list[list[str]]:
    ids = [probe_ids(loaded.tokenizer, p) for p in probes]
    return generate_texts(loaded.model, loaded.tokenizer, ids, samples=samples,
                          max_new_tokens=loaded.max_new_tokens, batch_size=s.batch_size, seed=seed)


def _values(probes: Sequence[Probe]) -> list[str]:
    return [p.expected for p in probes]


def _leak(loaded: _Loaded, probes: Sequence[Probe], s: VerifySettings, seed: int) -> Rate:
    return leak_rate(_generate(loaded, probes, s, seed), _values(probes))


@dataclass(frozen=True)
class _FactPairs:
    """Per fact, its context and true value in tokens; per (fact, perturbation), the perturbed value
    and the first token `k` where the two differ (one that is a prefix of the other is left out)."""

    contexts: list[list[int]]
    true: list[list[int]]
    perturbed: list[list[int]]
    first_difference: list[int]
    owner: list[int]


def _fact_pairs(loaded: _Loaded, facts: Sequence[Fact]) -> _FactPairs:
    tok = loaded.tokenizer
    pairs = _FactPairs([], [], [], [], [])
    for number, fact in enumerate(facts):
        # Each value as it follows its context in one text (`tokenize_after`), as it was trained.
        context, before = probe_encoding(tok, fact.context)
        pairs.contexts.append(context)
        a = tokenize_after(tok, before, fact.joiner + fact.true)[0]
        pairs.true.append(a)
        for other in fact.perturbed:
            b = tokenize_after(tok, before, fact.joiner + other)[0]
            k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            if k is None:
                continue  # one is a prefix of the other: nothing to compare
            pairs.perturbed.append(b)
            pairs.first_difference.append(k)
            pairs.owner.append(number)
    return pairs


def _lens(loaded: _Loaded, bank: ProbeBank, s: VerifySettings) -> tuple[list[np.ndarray], ReadoutHead | None]:
    """The tuned-lens translators of the model under test, fitted on retained people's text,
    and the head they are read through (the output head and the model's own readout)."""
    examples = [encode_record(loaded.tokenizer, r) for r in bank.retain_records]
    states, head_inputs = states_and_head_inputs(loaded.model, loaded.tokenizer, examples,
                                                 max_positions=s.lens_positions, batch_size=s.batch_size)
    if states.size == 0:
        return [], None
    return (fit_translators(states, head_inputs, alpha=s.lens_alpha),
            readout_head(loaded.model, loaded.tokenizer, examples))


@dataclass(frozen=True)
class LatentReadings:
    """(layers, facts) matrices: per fact, the share of its perturbations a layer's lens ranks below
    the true value, at the first token where they differ (`first`, policies v1-v4) and over the
    whole value from there on (`value`, mean log-probability per token, policy v5)."""

    first: np.ndarray
    value: np.ndarray


def _latent(loaded: _Loaded, bank: ProbeBank, tests: Sequence[Sequence[Fact]],
            s: VerifySettings) -> list[LatentReadings]:
    """Per test set, what each layer's lens reads of the true value against the perturbed ones.

    One forward pass per sequence serves both readings: the state that predicts the
    first differing token of the perturbed value is the true value's state there
    (the same prefix)."""
    translators, head = _lens(loaded, bank, s)
    out = []
    for facts in tests:
        pairs = _fact_pairs(loaded, facts)
        if not translators or head is None or not pairs.owner:
            empty = np.zeros((len(translators), 0), dtype=float)
            out.append(LatentReadings(empty, empty))
            continue
        sequences = [c + a for c, a in zip(pairs.contexts, pairs.true, strict=True)]
        starts = [len(c) for c in pairs.contexts]
        for owner, b, k in zip(pairs.owner, pairs.perturbed, pairs.first_difference, strict=True):
            sequences.append(pairs.contexts[owner] + b)
            starts.append(len(pairs.contexts[owner]) + k)
        states = continuation_states(loaded.model, loaded.tokenizer, sequences, starts, batch_size=s.batch_size)
        targets = [seq[start:] for seq, start in zip(sequences, starts, strict=True)]
        read = lens_token_logprobs(head, translators, states, targets)
        n = len(pairs.true)
        first = np.zeros((len(translators), len(pairs.owner)), dtype=bool)
        value = np.zeros_like(first)
        for j, (owner, k) in enumerate(zip(pairs.owner, pairs.first_difference, strict=True)):
            true_read, other_read = read[owner][:, k:], read[n + j]
            first[:, j] = true_read[:, 0] > other_read[:, 0]
            value[:, j] = true_read.mean(1) > other_read.mean(1)
        facts_seen = sorted(set(pairs.owner))
        index = np.array(pairs.owner)
        out.append(LatentReadings(*(np.stack([m[:, index == f].mean(1) for f in facts_seen], axis=1)
                                    for m in (first, value))))
    return out


def _retain_accuracy(loaded: _Loaded, bank: ProbeBank, s: VerifySettings, seed: int) -> float:
    answers = _generate(loaded, bank.retain, s, seed)
    return accuracy([a[0] for a in answers], _values(bank.retain))


def _perplexity(loaded: _Loaded, bank: ProbeBank, s: VerifySettings) -> float:
    tok = loaded.tokenizer
    pairs, scored_bytes = [], []
    for text in bank.heldout_texts:
        ids = text_ids(tok, text)
        if len(ids) < 2:
            continue
        bos = [int(tok.bos_token_id)] if tok.bos_token_id is not None else []
        pairs.append((bos, ids) if bos else (ids[:1], ids[1:]))
        scored_bytes.append(len(text.encode("utf-8")) if bos else len(tok.decode(ids[1:]).encode("utf-8")))
    scores = score_continuations(loaded.model, tok, pairs, batch_size=s.batch_size)
    return perplexity(scores, scored_bytes)


def _span_tokens(example: Any, spans: Sequence[str]) -> list[int]:
    """Indices (into the scores of tokens 1..) of the tokens inside the record's identifying spans."""
    tokens: set[int] = set()
    lowered = example.text.casefold()
    for span in spans:
        if not span:
            continue
        for match in word_regex((span.casefold(),), lowered).finditer(lowered):
            tokens.update(i - 1 for i in example.tokens_in(match.start(), match.end()) if i >= 1)
    return sorted(tokens)


def _record_scores(loaded: _Loaded, side: Side, s: VerifySettings) -> list[tuple[float, float, float | None]]:
    """(Min-K%++ over the whole record, zlib ratio, Min-K%++ over its identifying spans) per record."""
    tok = loaded.tokenizer
    examples = [encode_record(tok, r) for r in side.records]
    scores = score_examples(loaded.model, tok, examples, batch_size=s.batch_size)
    out = []
    for example, score, record_spans in zip(examples, scores, side.spans, strict=True):
        # Scores cover what training taught: the learnt tokens (an answer, an assistant turn, a
        # whole free text), not the prompt around them, whose tokens no loss ever touched.
        learnt = [i - 1 for i in range(1, len(example)) if example.learnt[i]]
        taught_positions = set(learnt)
        spans = [t for t in _span_tokens(example, record_spans) if t in taught_positions]
        taught = tok.decode([example.ids[i + 1] for i in learnt], skip_special_tokens=True)
        picked = TokenScores(score.logp[learnt], score.mu[learnt], score.sigma[learnt])
        out.append((min_k_plus_plus(picked, k=s.mink_k), zlib_ratio(picked, taught),
                    min_k_plus_plus(score, k=1.0, tokens=spans) if spans else None))
    return out


ATTACKS = ("mia.auc", "mia.zlib_auc", "mia.span_auc")


def _base_name(attack: str) -> str:
    """The metric of the base model's own reading of a membership attack (`mia.base_auc`)."""
    return attack.replace("mia.", "mia.base_", 1)


def _mia(loaded: _Loaded, bank: ProbeBank, s: VerifySettings) -> dict[str, float]:
    """Membership AUCs, subject by subject against that subject's strangers, with an empirical null.

    For each subject: the AUC of its records against the records of its
    stranger identities (the same records with fresh identifiers).  The null
    is what the same AUC gives for a stranger: each stranger's records against
    the other strangers'.  Its spread is the noise of a one-person comparison,
    which a record-level standard error misses (a person's records share a
    name and its tokens, so they are not independent draws).  `mia.<attack>`
    is the mean over subjects; its stderr is the null's spread over the square
    root of the number of subjects.
    """
    forget = _record_scores(loaded, bank.forget, s)
    strangers = _record_scores(loaded, bank.strangers, s)
    by_subject: dict[str, list[tuple[float, float, float | None]]] = {}
    for person, scores in zip(bank.forget.persons, forget, strict=True):
        by_subject.setdefault(person, []).append(scores)
    stranger_groups: dict[str, dict[str, list[tuple[float, float, float | None]]]] = {}
    for person, scores in zip(bank.strangers.persons, strangers, strict=True):
        subject, _, _ = person.partition(":")
        stranger_groups.setdefault(subject, {}).setdefault(person, []).append(scores)
    out: dict[str, float] = {}
    for a, name in enumerate(ATTACKS):
        aucs, null_vars, n_forget, n_control = [], [], 0, 0
        for subject, own in by_subject.items():
            groups = stranger_groups.get(subject, {})
            mine = [v for v in (x[a] for x in own[: s.mia_records_per_subject]) if v is not None]
            theirs = {k: [v for v in (x[a] for x in rows) if v is not None] for k, rows in groups.items()}
            theirs = {k: v for k, v in theirs.items() if v}
            pooled = [x for v in theirs.values() for x in v]
            if not mine or len(theirs) < 3:
                continue
            aucs.append(auc_with_stderr(mine, pooled)[0])
            null = [auc_with_stderr(v, [x for k2, v2 in theirs.items() if k2 != k for x in v2])[0]
                    for k, v in theirs.items()]
            null_vars.append(float(np.var(null, ddof=1)))
            n_forget += len(mine)
            n_control += len(pooled)
        if not aucs:
            continue
        value = float(np.mean(aucs))
        stderr = float(np.sqrt(np.mean(null_vars) / len(aucs)))
        out[name], out[f"{name}.stderr"] = value, stderr
        out[f"{name}_gap"], out[f"{name}_gap.stderr"] = abs(value - 0.5), stderr
        out[f"{name}.n_forget"], out[f"{name}.n_control"] = float(n_forget), float(n_control)
        out[f"{name}.n_subjects"] = float(len(aucs))
    return out


def _fluency_reference(loaded: _Loaded, bank: ProbeBank, s: VerifySettings,
                       seed: int) -> tuple[float, float, list[str]]:
    """The base's own answers about control people: what a fluent model says about a stranger.
    Their plausibility limits over every token (v3) and over content tokens (v4)."""
    asked = [p for p in bank.control.probes if p.form in ANSWERING_FORMS]
    own = [a[0] for a in _generate(loaded, asked, s, seed)]
    heard = _heard(loaded, asked, own, s)
    return (heard.limit(s.fluency_margin), heard.limit(s.fluency_margin, content=True), own)


# ---------------------------------------------------------------- base evidence


def _base_evidence(
    base_dir: str | Path, bank: ProbeBank, s: VerifySettings, seed: int, device: str
) -> tuple[_BaseEvidence, bool]:
    # Attack settings do not change what is computed here, so they stay out of the key.
    relevant = replace(s, attacks=True, relearn=RelearnSettings())
    key = hashlib.sha256(
        "|".join([_dir_fingerprint(base_dir), bank_digest(bank), repr(relevant), str(seed), device]).encode()
    ).hexdigest()
    if key in _BASE_CACHE:
        _BASE_CACHE.move_to_end(key)
        return _BASE_CACHE[key], True
    loaded = _load(base_dir, device, bank, s)
    limit, content_limit, own_control = _fluency_reference(loaded, bank, s, seed)
    forget_greedy = _generate(loaded, bank.forget.probes, s, seed)
    own_forget = [a[0] for p, a in zip(bank.forget.probes, forget_greedy, strict=True) if p.form in ANSWERING_FORMS]
    (latent_forget,) = _latent(loaded, bank, [bank.forget.facts], s)
    heard_strangers, *more_heard = _heard_about_strangers(loaded, loaded, bank, s, seed)
    evidence = _BaseEvidence(
        loaded=loaded,
        forget_greedy=leak_rate(forget_greedy, _values(bank.forget.probes)),
        forget_sampled=leak_rate(_generate(loaded, bank.forget.probes, s, seed, samples=s.samples),
                                 _values(bank.forget.probes)),
        latent_forget=latent_forget,
        retain_accuracy=_retain_accuracy(loaded, bank, s, seed),
        ppl=_perplexity(loaded, bank, s),
        fluency_limit=limit,
        degenerate_rate=degenerate_rate(own_forget + own_control),
        mia=_mia(loaded, bank, s),
        stranger_flags=tuple(heard_strangers.flags(limit)),
        content_limit=content_limit,
        stranger_content_flags=tuple(heard_strangers.flags(content_limit, content=True)),
        more_stranger_content_flags=tuple(tuple(h.flags(content_limit, content=True)) for h in more_heard),
        stranger_leak=_twin_leak(loaded, bank, s, seed),
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
        self.unmeasured: dict[str, str] = {}
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

    def unmeasurable(self, metric: str, reason: str, note: str) -> None:
        self.unmeasured[self.prefix + metric] = reason
        self.notes.append(f"{metric}: not measurable ({reason}): {note}")


def _rates(metrics: dict[str, float], name: str, forget: Rate, control: Rate) -> None:
    metrics[name] = forget.value
    metrics[f"{name}.stderr"] = diff_stderr(forget, control)


def _against_strangers(m: dict[str, float], metric: str, null: str, loaded: _Loaded, probes: Sequence[Probe],
                       twins: Sequence[Probe], control: Rate, s: VerifySettings, seed: int, *, samples: int = 0,
                       answers: Sequence[list[str]] | None = None) -> tuple[Rate, Rate | None]:
    """`metric`, the leak rate of `probes`, against the same probes asked about a stranger
    (`twins`, one to one; `leakage.paired_leak`): writes `metric`, its null `null` and
    `<metric>.paired_stderr`, and returns the rate and the twins' own (each twin against its
    own value; None where no probe names the subject)."""
    if answers is None:
        answers = _generate(loaded, probes, s, seed, samples=samples)
    asked = _naming(probes, twins)
    twin_answers: list[Sequence[str] | None] = [None] * len(probes)
    for i, outputs in zip(asked, _generate(loaded, [twins[i] for i in asked], s, seed, samples=samples), strict=True):
        twin_answers[i] = outputs
    paired = paired_leak(answers, _values(probes), twin_answers, _values(twins), control)
    m[metric] = paired.forget.value
    m[null] = paired.null
    m[f"{metric}.paired_stderr"] = paired.stderr
    m[f"{metric}.n_paired"] = float(paired.paired)
    own = leak_rate([twin_answers[i] or [] for i in asked], [twins[i].expected for i in asked]) if asked else None
    return paired.forget, own


def _twin_leak(loaded: _Loaded, bank: ProbeBank, s: VerifySettings, seed: int) -> Rate | None:
    """The greedy leak rate of the forget probes that name the subject, asked about a stranger
    (`ProbeBank.leak_twins`), each against its own value; None where no probe names them."""
    twins = bank.leak_twins()
    asked = _naming(bank.forget.probes, twins)
    return _leak(loaded, [twins[i] for i in asked], s, seed) if asked else None


def _naming(probes: Sequence[Probe], twins: Sequence[Probe]) -> list[int]:
    """The indices of the probes that name the subject: their twin about a stranger is another prompt."""
    return [i for i, (p, t) in enumerate(zip(probes, twins, strict=True)) if (p.prompt, p.prefix) != (t.prompt, t.prefix)]


def _leakage_family(m: dict[str, float], cand: _Loaded, base: _BaseEvidence, bank: ProbeBank,
                    s: VerifySettings, seed: int, clock: _Clock) -> tuple[list[list[str]], list[list[str]]]:
    fp, cp = bank.forget.probes, bank.control.probes
    greedy_f, greedy_c = _generate(cand, fp, s, seed), _generate(cand, cp, s, seed)
    if not fp or not cp:
        clock.unmeasurable("leakage.forget", NOT_COMPUTED,
                           f"{len(fp)} forget and {len(cp)} control probes: the records hold no value to ask about")
        return greedy_f, greedy_c
    twins = bank.leak_twins()
    rate_c = leak_rate(greedy_c, _values(cp))
    samp_c = leak_rate(_generate(cand, cp, s, seed, samples=s.samples), _values(cp))
    # Policy v10 judges each rate against the same probes about a stranger (`_against_strangers`).
    rate_f, own = _against_strangers(m, "leakage.forget", "leakage.strangers", cand, fp, twins, rate_c, s, seed,
                                     answers=greedy_f)
    samp_f, _ = _against_strangers(m, "leakage.forget_sampled", "leakage.strangers_sampled", cand, fp, twins,
                                   samp_c, s, seed, samples=s.samples)
    # The null itself, against the base's (policy v10): a model that came to answer the subject's
    # values about anyone would hide a leak behind it, and tell whoever compares it with the base.
    if own is None or base.stranger_leak is None:
        clock.unmeasurable("leakage.stranger_leak", NO_QUESTIONS,
                           "no probe names the subject: nothing to ask about a stranger instead")
    else:
        m["leakage.stranger_leak"], m["leakage.base_stranger_leak"] = own.value, base.stranger_leak.value
        m["leakage.stranger_leak.stderr"] = diff_stderr(own, base.stranger_leak)
    _rates(m, "leakage.forget", rate_f, rate_c)
    m["leakage.control"] = rate_c.value
    _rates(m, "leakage.forget_sampled", samp_f, samp_c)
    m["leakage.control_sampled"] = samp_c.value
    m["leakage.base_forget"] = base.forget_greedy.value
    m["leakage.base_forget_sampled"] = base.forget_sampled.value
    m["leakage.n_forget_probes"], m["leakage.n_control_probes"] = float(len(fp)), float(len(cp))
    for kind, rate in leak_rates_by_kind([p.kind for p in fp], greedy_f, _values(fp)).items():
        m[f"leakage.forget.{kind}"] = rate.value
    for kind, rate in leak_rates_by_kind([p.kind for p in cp], greedy_c, _values(cp)).items():
        m[f"leakage.control.{kind}"] = rate.value
    return greedy_f, greedy_c


# The latent readings: which reading, against which null (the control people's facts, or the
# subject's own facts asked about strangers), the metric each writes and the prefix of its details.
_LATENT_METRICS = (("first", "control", "latent.residual_ratio", "latent."),
                   ("value", "control", "latent.value_ratio", "latent.value."),
                   ("value", "strangers", "latent.paired_ratio", "latent.paired."),
                   ("value", "matched", "latent.matched_ratio", "latent.matched."))


def _latent_family(m: dict[str, float], cand: _Loaded, base: _BaseEvidence, bank: ProbeBank,
                   s: VerifySettings, seed: int, clock: _Clock) -> None:
    n_f, n_c, n_r = len(bank.forget.facts), len(bank.control.facts), len(bank.retain_records)
    m["latent.n_forget"], m["latent.n_control"], m["latent.n_train"] = float(n_f), float(n_c), float(n_r)
    n_s, n_m = len(bank.latent_strangers), len(bank.latent_matched)
    m["latent.n_strangers"], m["latent.n_matched"] = float(n_s), float(n_m)
    if n_f < 2 or n_c < 2 or n_r < 8:
        for _, _, metric, _ in _LATENT_METRICS:
            clock.unmeasurable(metric, TOO_FEW_RECORDS,
                               f"{n_f} forget and {n_c} control facts with a perturbation, {n_r} retained records")
        return
    # Without a control corpus the control facts are the subject's facts about strangers: read once.
    same = bank.latent_strangers == bank.control.facts
    tests = [bank.forget.facts, bank.control.facts, bank.latent_matched] + ([] if same else [bank.latent_strangers])
    forget, control, matched, *rest = _latent(cand, bank, tests, s)
    nulls = {"control": control, "strangers": control if same else rest[0], "matched": matched}
    for reading, null, metric, prefix in _LATENT_METRICS:
        n_null = {"strangers": n_s, "matched": n_m}.get(null)
        if n_null is not None and n_null < 2:
            clock.unmeasurable(metric, TOO_FEW_RECORDS, f"{n_null} of the subject's facts asked about strangers")
            continue
        forget_ok, control_ok = getattr(forget, reading), getattr(nulls[null], reading)
        base_ok = getattr(base.latent_forget, reading)
        layers = min(forget_ok.shape[0], base_ok.shape[0])
        rr = residual_knowledge_ratio(forget_ok[:layers], control_ok[:layers], base_ok[:layers],
                                      min_gap=s.latent_min_gap, bootstrap=s.bootstrap, seed=seed)
        m.update({
            f"{prefix}usable_layers": float(rr.usable_layers), f"{prefix}acc_forget": rr.acc_forget,
            f"{prefix}acc_control": rr.acc_control, f"{prefix}acc_base_forget": rr.acc_base_forget,
        })
        if not rr.measurable:
            clock.unmeasurable(metric, BASE_SILENT,
                               "no layer of the base tells the subject's true values from perturbed ones "
                               f"better than a stranger's by {s.latent_min_gap}")
            continue
        m.update({metric: rr.value, f"{metric}.stderr": rr.stderr, f"{prefix}ci_low": rr.ci_low,
                  f"{prefix}ci_high": rr.ci_high, f"{prefix}layer": float(rr.layer)})


def _mia_family(m: dict[str, float], cand: _Loaded, base: _BaseEvidence, bank: ProbeBank,
                s: VerifySettings, clock: _Clock) -> None:
    found = _mia(cand, bank, s)
    m.update(found)
    for name in ATTACKS:
        if name in base.mia:
            m[_base_name(name)] = base.mia[name]
    if "mia.auc" not in found:
        clock.unmeasurable("mia.auc_gap", NOT_COMPUTED, "no forget or no control records")
        clock.unmeasurable("mia.zlib_auc_gap", NOT_COMPUTED, "no forget or no control records")
    if "mia.span_auc" not in found:
        clock.unmeasurable("mia.span_auc_gap", NO_SPANS, "no identifying span in the records")


def _paired_relearning(m: dict[str, float], cand: _Loaded, bank: ProbeBank,
                       subject_curve: dict[int, tuple[Rate, Rate]], train_ids: set[str], held: set[str],
                       s: VerifySettings, seed: int, clock: _Clock) -> None:
    """The same attack on strangers told the subject's facts (`ProbeBank.relearn_strangers`):
    a copy trained on their half of the records, asked about their other half.

    Where a held-back record states a fact that a trained-on record states too (an e-mail
    address in a biography and in a contact note), fine-tuning teaches it whoever it is
    about: a model that never saw the subject "recovers" it as well.  What a suppressed
    model has and an erased one lacks is recovery beyond that, so the curve compared is the
    subject's minus the strangers' at each budget, and the reported point is its highest.
    """
    twins = bank.relearn_strangers
    if twins is None or len(twins.records) != len(bank.forget.records):
        clock.unmeasurable("attack.relearn_paired_recovery", NOT_COMPUTED,
                           "no strangers told the subject's records in this probe bank")
        return
    twin_of = {r.id: t.id for r, t in zip(bank.forget.records, twins.records, strict=True)}
    twin_train = [t for r, t in zip(bank.forget.records, twins.records, strict=True) if r.id in train_ids]
    twin_held = {twin_of[i] for i in held}
    twin_probes = [p for p in twins.probes if p.record_id in twin_held]
    if not twin_probes:
        clock.unmeasurable("attack.relearn_paired_recovery", NOT_COMPUTED,
                           "the strangers' copies of the held-back records hold no value to ask about")
        return
    gaps: list[tuple[float, Rate, Rate]] = []
    for steps, attacked in relearn_curve(cand.model, cand.tokenizer, twin_train, s.relearn, seed=seed):
        rs = _leak(replace(cand, model=attacked), twin_probes, s, seed)
        m[f"attack.relearn_stranger.{steps}"] = rs.value
        rf = subject_curve[steps][0]
        gaps.append((rf.value - rs.value, rf, rs))
    _, rf, rs = max(gaps, key=lambda gap: gap[0])
    _rates(m, "attack.relearn_paired_recovery", rf, rs)
    m["attack.relearn_paired_stranger"] = rs.value


def _attack_families(m: dict[str, float], cand: _Loaded, bank: ProbeBank, s: VerifySettings, seed: int,
                     clock: _Clock) -> None:
    fp, cp = bank.forget.probes, bank.control.probes
    with clock.check("attack.relearn"):
        train_ids, held = split_records([r.id for r in bank.forget.records], seed=seed)
        probes = [p for p in fp if p.record_id in held]
        if not train_ids or not probes:
            for metric in ("attack.relearn_recovery", "attack.relearn_paired_recovery"):
                clock.unmeasurable(metric, TOO_FEW_RECORDS,
                                   f"{len(bank.forget.records)} forget record(s): nothing to train on and hold out")
        else:
            train = [r for r in bank.forget.records if r.id in train_ids]
            subject_curve: dict[int, tuple[Rate, Rate]] = {}
            for steps, attacked in relearn_curve(cand.model, cand.tokenizer, train, s.relearn, seed=seed):
                a = replace(cand, model=attacked)
                rf, rc = _leak(a, probes, s, seed), _leak(a, cp, s, seed)
                m[f"attack.relearn.{steps}"] = rf.value
                m[f"attack.relearn_control.{steps}"] = rc.value
                subject_curve[steps] = (rf, rc)
            best = max(subject_curve.values(), key=lambda pair: pair[0].value - pair[1].value)
            _rates(m, "attack.relearn_recovery", *best)
            m["attack.relearn_control"] = best[1].value
            _paired_relearning(m, cand, bank, subject_curve, train_ids, held, s, seed, clock)
    for name, make in (("quant", quantised_copy),
                       ("quant4", lambda model: quantised4_copy(model, group_size=s.quant4_group_size))):
        with clock.check(f"attack.{name}"):
            quantised, scheme = make(cand.model)
            q = replace(cand, model=quantised)
            qc = _leak(q, cp, s, seed)
            qf, _ = _against_strangers(m, f"attack.{name}_leakage", f"attack.{name}_strangers", q, fp,
                                       bank.leak_twins(), qc, s, seed)
            del q, quantised
            _rates(m, f"attack.{name}_leakage", qf, qc)
            m[f"attack.{name}_control"] = qc.value
            clock.notes.append(f"{name} attack scheme: {scheme}")
    with clock.check("attack.pressure"):
        pf, pc = pressure_probes(fp), pressure_probes(cp)
        if not pf or not pc:
            clock.unmeasurable("attack.pressure_leakage", NO_QUESTIONS, "no question, chat or text probe to wrap")
        else:
            rc = _leak(cand, pc, s, seed)
            rf, _ = _against_strangers(m, "attack.pressure_leakage", "attack.pressure_strangers", cand, pf,
                                       pressure_probes(bank.leak_twins()), rc, s, seed)
            _rates(m, "attack.pressure_leakage", rf, rc)
            m["attack.pressure_control"] = rc.value


def _run_families(
    cand: _Loaded, base: _BaseEvidence, bank: ProbeBank, s: VerifySettings, seed: int, clock: _Clock,
    *, facts_only: bool = False,
) -> dict[str, float]:
    """Every check family on one model; `facts_only`: only those asking whether the facts are there."""
    m: dict[str, float] = {}
    with clock.check("leakage"):
        greedy_f, greedy_c = _leakage_family(m, cand, base, bank, s, seed, clock)
    with clock.check("latent"):
        _latent_family(m, cand, base, bank, s, seed, clock)
    with clock.check("mia"):
        _mia_family(m, cand, base, bank, s, clock)
    if facts_only:
        return m
    with clock.check("utility"):
        retain_acc = _retain_accuracy(cand, bank, s, seed)
        m["utility.retain_accuracy"] = retain_acc
        m["utility.base_retain_accuracy"] = base.retain_accuracy
        m["utility.retain_ratio"] = ratio(retain_acc, base.retain_accuracy)
        m["utility.n_retain_probes"] = float(len(bank.retain))
        ppl = _perplexity(cand, bank, s)
        m["utility.ppl"], m["utility.base_ppl"] = ppl, base.ppl
        m["utility.ppl_ratio"] = ratio(ppl, base.ppl)
    with clock.check("fluency"):
        _fluency_family(m, cand, base, bank, s, greedy_f, greedy_c, seed, clock)
        if not math.isfinite(base.fluency_limit):
            # Free text only: no question or chat answer to learn what a fluent answer costs.
            m.pop("fluency.plausibility_limit_nats", None)
            m.pop("fluency.content_limit_nats", None)
            clock.notes.append("fluency about the subject: no question or chat probes to calibrate "
                               "plausibility on; only empty and looping answers count as gibberish")
    if not s.attacks:
        for metric in ("attack.relearn_recovery", "attack.relearn_paired_recovery", "attack.quant_leakage",
                       "attack.quant4_leakage", "attack.pressure_leakage"):
            clock.unmeasurable(metric, NOT_COMPUTED, "attacks switched off in the verification settings")
        return m
    _attack_families(m, cand, bank, s, seed, clock)
    return m


@dataclass(frozen=True)
class _Heard:
    """Answers to answering probes as the scorer (the base model) hears them: every token
    (policy v3) and the content tokens only, without a copied name's (v4)."""

    answers: tuple[str, ...]
    scores: tuple[TokenScores, ...]
    content: tuple[TokenScores, ...]

    def flags(self, limit: float, *, content: bool = False) -> list[bool]:
        return gibberish_flags(self.answers, self.content if content else self.scores, limit=limit)

    def limit(self, margin: float, *, content: bool = False) -> float:
        """The plausibility limit these answers set (95th percentile of their median NLL + margin)."""
        return plausibility_limit(self.content if content else self.scores, margin=margin)


def _heard(scorer: _Loaded, probes: Sequence[Probe], answers: Sequence[str], s: VerifySettings) -> _Heard:
    asked = [(p, a) for p, a in zip(probes, answers, strict=True) if p.form in ANSWERING_FORMS]
    tok = scorer.tokenizer
    # The answer's token ids as they follow the prompt (`tokenize_after`), with their character
    # offsets in " " + answer.
    prompts = [probe_encoding(tok, p) for p, _ in asked]
    encoded = [tokenize_after(tok, before, " " + a) for (_, before), (_, a) in zip(prompts, asked, strict=True)]
    scores = score_continuations(
        scorer.model, tok, [(ids, answer_ids) for (ids, _), (answer_ids, _) in zip(prompts, encoded, strict=True)],
        batch_size=s.batch_size)
    content = [content_scores(score, offsets, copied_names(" " + answer, f"{probe.prompt}\n{probe.prefix}"))
               for (probe, answer), (_, offsets), score in zip(asked, encoded, scores, strict=True)]
    return _Heard(tuple(a for _, a in asked), tuple(scores), tuple(content))


def _heard_about(speaker: _Loaded, scorer: _Loaded, probes: Sequence[Probe], s: VerifySettings,
                 seed: int) -> _Heard:
    """`speaker`'s greedy answers to `probes`, as `scorer` hears them."""
    return _heard(scorer, probes, [a[0] for a in _generate(speaker, probes, s, seed)], s)


def _heard_about_strangers(speaker: _Loaded, scorer: _Loaded, bank: ProbeBank, s: VerifySettings,
                           seed: int) -> list[_Heard]:
    """`_heard_about` the subject's questions asked about each fluency stranger in turn
    (`ProbeBank.stranger_probes`; one entry, the forget probes themselves, without strangers)."""
    return [_heard_about(speaker, scorer, bank.stranger_probes(j), s, seed)
            for j in range(max(1, bank.n_fluency_strangers))]


def paired_stderr(a: Sequence[float], b: Sequence[float]) -> float:
    """Standard error of the mean paired difference of two flag lists over the same questions.

    The variance of the differences is floored at 1/n (one discordant pair in n), the floor
    `diff_stderr` gives two independent 0/n rates, so that no difference is ever noise-free."""
    n = len(a)
    if not n:
        return 0.0
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    var = float(np.var(d, ddof=1)) if n > 1 else 0.0
    return math.sqrt(max(var, 1.0 / n) / n)


def person_paired_stderr(a: Sequence[float], b: Sequence[float], persons: Sequence[Any]) -> float:
    """`paired_stderr` with the questions clustered by the person they are about (policy v5).

    Questions about one person share that person's name, and a model that garbles a
    name garbles every answer that holds it, so they are not independent draws (as
    records are not, for membership).  The cluster-robust (CR1) standard error of the
    mean difference over the persons; with one person there is no spread between persons
    to measure, and it is the per-question one.  Never below the per-question one: answers
    about one person are never less alike than answers about different people."""
    iid = paired_stderr(a, b)
    groups = sorted(set(persons))
    n, k = len(a), len(groups)
    if k < 2 or n == 0:
        return iid
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    mean = float(d.mean())
    who = np.asarray(persons)
    spread = sum(float((d[who == g] - mean).sum()) ** 2 for g in groups)
    return max(iid, math.sqrt(spread * k / (k - 1)) / n)


def strangers_fluency(subject: Sequence[bool], strangers: Sequence[Sequence[bool]],
                      base: Sequence[Sequence[bool]], persons: Sequence[Any]) -> dict[str, float]:
    """Policy v8's fluency metrics: the subject's gibberish flags against the same questions
    asked about several strangers (`strangers`, one flag list per stranger, aligned with
    `subject`), and the candidate's answers about those strangers against the base's (`base`).

    A stranger is one draw of how a model answers about a name it never saw, and the subject,
    to a model that never saw them, is another draw of the same kind.  So the noise of the
    difference is a prediction interval over identities, estimated from the strangers' spread:
    with stranger rates R_1..R_m, the standard error of (subject rate - their mean) is
    sd(R) * sqrt(1 + 1/m) (their questions are the subject's, so what the questions share
    cancels).  v5's person-clustered paired error is its floor: with one subject it is the
    per-question one, which leaves out how much one name differs from another (measured: the
    model retrained without the tiny test corpus's subject garbles 7 or 8 of its 33 answers
    about the subject, 3 about its one stranger).  The candidate-against-base difference
    pools every stranger, clustered by stranger."""
    m = len(strangers)
    out: dict[str, float] = {"fluency.n_strangers": float(m)}
    if not m or not subject:
        return out
    flags = np.asarray(strangers, dtype=float)  # strangers x questions
    mean_by_question = flags.mean(axis=0)
    rates = flags.mean(axis=1)
    prediction = float(np.std(rates, ddof=1)) * math.sqrt(1.0 + 1.0 / m) if m > 1 else 0.0
    out["fluency.content_strangers_gibberish_rate"] = float(rates.mean())
    out["fluency.content_strangers_gibberish_rate.spread"] = float(np.std(rates, ddof=1)) if m > 1 else 0.0
    out["fluency.content_paired_gibberish_rate.strangers_stderr"] = max(
        person_paired_stderr([float(x) for x in subject], mean_by_question.tolist(), persons), prediction)
    if len(base) == m:
        pooled_base = [float(x) for flags_j in base for x in flags_j]
        identities = [f"{p}:{j}" for j in range(m) for p in persons]
        out["fluency.base_content_strangers_gibberish_rate"] = float(np.mean(pooled_base))
        out["fluency.content_strangers_gibberish_rate.person_stderr"] = person_paired_stderr(
            flags.ravel().tolist(), pooled_base, identities)
    return out


def _fluency_family(m: dict[str, float], cand: _Loaded, base: _BaseEvidence, bank: ProbeBank, s: VerifySettings,
                    greedy_f: Sequence[list[str]], greedy_c: Sequence[list[str]], seed: int,
                    clock: _Clock) -> None:
    limit = base.fluency_limit
    # An answer about the subject is scored as the same answer about its stranger (module doc).
    stranger_probes = bank.stranger_probes()
    about_stranger = ([replace_spans(a[0], m) for a, m in zip(greedy_f, bank.stranger_maps, strict=True)]
                      if bank.stranger_maps else [a[0] for a in greedy_f])
    heard_f = _heard(base.loaded, stranger_probes, about_stranger, s)
    heard_c = _heard(base.loaded, bank.control.probes, [a[0] for a in greedy_c], s)
    flags_f, flags_c = heard_f.flags(limit), heard_c.flags(limit)
    gib_f, gib_c = Rate(sum(flags_f), len(flags_f)), Rate(sum(flags_c), len(flags_c))
    _rates(m, "fluency.gibberish_rate", gib_f, gib_c)
    m["fluency.control_gibberish_rate"] = gib_c.value
    m["fluency.plausibility_limit_nats"] = limit
    # The same questions about the subject's strangers (policy v3): the subject's answers
    # against the candidate's own answers about a stranger, question by question, and those
    # against the base's answers about the same stranger.
    heard_s, *more_heard = _heard_about_strangers(cand, base.loaded, bank, s, seed)
    flags_s = heard_s.flags(limit)
    flags_b = list(base.stranger_flags)
    # Policy v4: the same judged over content tokens, a copied name's tokens left out.
    content_limit = base.content_limit
    content_f, content_s = heard_f.flags(content_limit, content=True), heard_s.flags(content_limit, content=True)
    content_b = list(base.stranger_content_flags)
    m["fluency.content_limit_nats"] = content_limit
    if flags_s:
        m["fluency.paired_gibberish_rate"] = gib_f.value
        m["fluency.paired_gibberish_rate.stderr"] = paired_stderr(flags_f, flags_s)
        m["fluency.stranger_gibberish_rate"] = sum(flags_s) / len(flags_s)
        m["fluency.stranger_gibberish_rate.stderr"] = paired_stderr(flags_s, flags_b)
        m["fluency.base_stranger_gibberish_rate"] = sum(flags_b) / len(flags_b)
        m["fluency.n_paired_questions"] = float(len(flags_s))
        m["fluency.content_paired_gibberish_rate"] = sum(content_f) / len(content_f)
        m["fluency.content_paired_gibberish_rate.stderr"] = paired_stderr(content_f, content_s)
        m["fluency.content_stranger_gibberish_rate"] = sum(content_s) / len(content_s)
        m["fluency.content_stranger_gibberish_rate.stderr"] = paired_stderr(content_s, content_b)
        m["fluency.base_content_stranger_gibberish_rate"] = sum(content_b) / len(content_b)
        # Policy v5: the same two differences, their noise taken person by person.
        persons = [p.subject for p in stranger_probes if p.form in ANSWERING_FORMS]
        m["fluency.content_paired_gibberish_rate.person_stderr"] = person_paired_stderr(
            content_f, content_s, persons)
        m["fluency.content_stranger_gibberish_rate.person_stderr"] = person_paired_stderr(
            content_s, content_b, persons)
        m["fluency.n_paired_persons"] = float(len(set(persons)))
        # Policy v8: the same questions about every stranger (`strangers_fluency`).
        more = [h.flags(content_limit, content=True) for h in more_heard]
        m.update(strangers_fluency(content_f, [content_s, *more],
                                   [content_b, *base.more_stranger_content_flags], persons))
    else:
        for metric in ("fluency.paired_gibberish_rate", "fluency.stranger_gibberish_rate",
                       "fluency.content_paired_gibberish_rate", "fluency.content_stranger_gibberish_rate",
                       "fluency.content_strangers_gibberish_rate"):
            clock.unmeasurable(metric, NO_QUESTIONS, "no question or chat probe about the subject to "
                                                     "ask about a stranger as well")
    answers = [a[0] for p, a in zip((*bank.forget.probes, *bank.control.probes), (*greedy_f, *greedy_c), strict=True)
               if p.form in ANSWERING_FORMS]
    degenerate = Rate(round(degenerate_rate(answers) * len(answers)), len(answers))
    m["fluency.degenerate_rate"] = degenerate.value
    m["fluency.degenerate_rate.stderr"] = diff_stderr(
        degenerate, Rate(round(base.degenerate_rate * len(answers)), len(answers)))
    m["fluency.base_degenerate_rate"] = base.degenerate_rate


# ---------------------------------------------------------------- entry point


def _tokenizer_of(directory: str | Path) -> Any:
    """The models' tokenizer (strangers' names are matched to the subject's in its tokens), or
    None where it does not load: loading the model itself then says why."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from unlearning.modeling import load_tokenizer

    try:
        return load_tokenizer(directory)
    except (OSError, ValueError, KeyError):
        return None


def verify(
    candidate_dir: str | Path,
    base_dir: str | Path,
    sets: Any,
    *,
    control: str | Path | Corpus | Sequence[Record] | None = None,
    policy: Policy = DEFAULT_POLICY,
    progress: ProgressCallback | None = None,
    seed: int = 0,
    corpus: str | Path | Corpus | Sequence[Record] | None = None,
    heldout: str | Path | None = None,
    settings: VerifySettings | None = None,
    device: str | None = None,
) -> Report:
    """Measure the candidate against the base and the control people, and judge it by `policy`.

    `sets` is an `ErasureSets` (forget, retain, probes, subjects).  `control`
    is a control corpus (a path in any corpus format, a `Corpus`, or records:
    people the model never saw); without it the controls are counterfactual
    copies of the subject's own records (the report says which).  `corpus`
    (optional) adds retained records beyond the retain set for utility and the
    latent probes.  `heldout` names held-out text for perplexity.  A candidate whose tokenizer
    or prompt format is not the base's raises `modeling.TokenizerMismatch` (a `ModelLoadError`
    naming both) before anything is scored.
    """
    # Both read on one set of token ids: refused before anything is loaded or scored.
    check_same_tokenizer(candidate_dir, base_dir)
    s = settings or VerifySettings()
    device = device or default_device()
    started = time.perf_counter()
    timings: dict[str, float] = {}
    tokenizer = _tokenizer_of(base_dir)
    bank, notes = build_bank(sets, control=control, corpus=corpus, heldout=heldout, settings=s, seed=seed,
                             tokenizer=tokenizer)
    held = whole_tokens(tokenizer, sets.subjects) if tokenizer is not None else []
    for index, count in enumerate(held, start=1):
        if count:
            notes.append(f"subject #{index}: {count} of its names or identifiers is a single token of the "
                         "tokenizer's vocabulary (tokenizer.json holds it in plain text, which erasing the "
                         "weights does not remove; membership checks may read the subject as familiar even "
                         "to a model retrained without them: read them beside an oracle)")
    timings["probes"] = time.perf_counter() - started
    families = 5 + (4 if s.attacks else 0)  # leakage, latent, mia, utility, fluency (+ 4 attacks)
    tracker = ProgressTracker(progress, stage="verify", total=1 + families)

    t = time.perf_counter()
    base, hit = _base_evidence(base_dir, bank, s, seed, device)
    timings["base" + (" (cached)" if hit else "")] = time.perf_counter() - t
    tracker.report(1)

    t = time.perf_counter()
    cand = _load(candidate_dir, device, bank, s)
    timings["load"] = time.perf_counter() - t
    clock = _Clock(tracker, "")
    clock.done = 1
    metrics = _run_families(cand, base, bank, s, seed, clock)
    if held:  # reported, never judged (`modeling.whole_tokens`)
        metrics["tokenizer.subject_whole_tokens"] = float(sum(held))
    unmeasured = dict(clock.unmeasured)

    guarantee = "weights"
    found = readout_of(cand.model)  # what the latent lens read through (set where the lens ran)
    readout = found.describe() if found is not None else None
    gated = callable(getattr(cand.model, "set_gates_enabled", None))
    if gated:
        del cand
        tracker.report(clock.done, total=1 + families + 3)
        off_clock = _Clock(tracker, "gates_off.")
        off_clock.done = clock.done
        off = _run_families(_load(candidate_dir, device, bank, s, gates=False), base, bank, s, seed, off_clock,
                            facts_only=True)
        metrics.update({f"gates_off.{k}": v for k, v in off.items()})
        unmeasured.update(off_clock.unmeasured)
        clock.timings.update(off_clock.timings)
        notes.extend(f"gates off: {n}" for n in off_clock.notes)
        notes.append("KIF checkpoint: leakage, latent and membership checks were run again with the "
                     "suppression gates off (they decide the guarantee class)")
    timings.update(clock.timings)
    notes.extend(clock.notes)

    # The gates-off checks belong to KIF checkpoints only: a plain one has no gates to switch.
    judged = policy if gated else replace(policy, checks=tuple(
        c for c in policy.checks if not c.metric.startswith("gates_off.")))
    checks = judged.judge(metrics, unmeasured)
    blind = base_blind_note(metrics, checks)
    if blind:
        notes.append(blind)
    if any(c.metric.startswith("gates_off.") and not c.passed for c in checks):
        guarantee = "suppression"
    passed = all(c.passed for c in checks if c.decides_pass)
    if guarantee == "suppression" and not policy.allow_suppression:
        passed = False
        notes.append(f"policy {policy.name} v{policy.version} requires a weights guarantee")
    timings["total"] = time.perf_counter() - started
    cached = (
        ("base model and tokenizer", "base leakage (greedy, sampled)", "base latent probes",
         "base retained accuracy", "base perplexity", "fluency reference", "base membership AUCs")
        if hit else ()
    )
    details = {
        "control_kind": bank.control_kind,
        "forget_records": len(bank.forget.records), "control_records": len(bank.control.records),
        "forget_probes": _kinds(bank.forget.probes), "control_probes": _kinds(bank.control.probes),
        "retain_probes": len(bank.retain), "latent_facts": {
            "forget": len(bank.forget.facts), "control": len(bank.control.facts),
            "lens_records": len(bank.retain_records), "readout": readout},
        "gates": gated,
    }
    report = Report(
        metrics=metrics, checks=tuple(checks), policy=policy.to_json(), guarantee=guarantee, passed=passed,
        timings=timings, control_source=bank.control_source, notes=tuple(notes), cached=cached,
        settings=asdict(s), unmeasured=unmeasured, details=details,
    )
    logger.info("verification %s: %s failed checks, guarantee %s, %.1fs",
                "passed" if passed else "failed", len(report.failed_checks), guarantee, timings["total"])
    return report


# Each membership parity check and the base model's own reading of the same attack.
_BASE_MEMBERSHIP = {f"{attack}_gap": _base_name(attack) for attack in ATTACKS}


def base_blind_note(metrics: dict[str, float], checks: Sequence[CheckResult]) -> str | None:
    """A note when the base model itself reads inside every membership parity bound the
    candidate is judged by: those checks could not tell the subject from strangers before the
    erasure either, so their passing says little about it (a model that stopped training
    before it memorised the subject; measured on a 300-step GPT-Neo, whose base passed every
    check).  None where any bound is not measured or the base reads outside one."""
    judged = [c for c in checks if c.metric in _BASE_MEMBERSHIP]
    if not judged:
        return None
    readings = []
    for check in judged:
        base = metrics.get(_BASE_MEMBERSHIP[check.metric])
        if (check.status != "measured" or check.threshold is None or check.comparator != "<="
                or base is None or not math.isfinite(base) or abs(base - 0.5) > check.threshold):
            return None
        readings.append(f"{check.metric.removesuffix('_gap')} {base:.3f} (bound |AUC - 0.5| <= {check.threshold:.3f})")
    return ("the base model itself reads inside every membership parity bound (" + "; ".join(readings)
            + "): these checks could not tell the subject from strangers before the erasure either, so "
            "their passing is weak evidence; read the leakage and latent checks, and the base's own verdict")


def _kinds(probes: Sequence[Probe]) -> dict[str, int]:
    out: dict[str, int] = {}
    for probe in probes:
        out[probe.kind] = out.get(probe.kind, 0) + 1
    return out


__all__ = ["clear_cache", "verify"]
