"""The probe bank of one verification: forget, control, retained and held-out material.

Built once per `verify` call from the erasure sets, a control source and the
corpus:

* **forget**: the sets' probes (every record shape, `unlearning.probes`) and
  records;
* **control**: people the model never saw.  Either a *control corpus* (records
  about other people in any corpus format; their probes are built the same
  way as the subject's, with nobody's name assumed), or, without one,
  *counterfactual controls*: each forget record with every identifying span
  replaced by a fresh one of the same shape (`unlearning.identifiers`), and
  the subject's own probes mapped the same way, so the control prompts have the
  subject's prompt distribution exactly;
* **retain**: probes about retained people (the retain set and a sample of
  the corpus), for utility;
* **latent facts**: a context, the true value and a perturbed value (a given
  perturbed answer, else another person's value of the same kind), for the
  subject and the controls, and retained people's records to fit the lens on;
* **held-out** text for perplexity: a file, else the control records' text.

Its digest is part of the base-model cache key.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from unlearning.corpus import Corpus, CorpusError, Record, iter_records, load_corpus
from unlearning.identifiers import (
    Counterfactual,
    FreshNames,
    avoid_set,
    counterfactual,
    find_spans,
    identity_spans,
    name_parts_of,
    record_texts,
    replace_spans,
)
from unlearning.probes import (
    Probe,
    answer_frequencies,
    derive_value,
    probes_for,
    record_values,
    value_about_subject,
)
from unlearning.text import normalise_words, word_regex

from .leakage import contains_value
from .settings import VerifySettings

CONTROL_CORPUS = "control corpus"
PERTURBATIONS = 5  # perturbed values per latent fact
COUNTERFACTUAL = "counterfactual"
UTILITY_KINDS = ("original", "extraction")


@dataclass(frozen=True)
class Fact:
    """A context and its continuations: the true value and perturbed ones (same kind, other people)."""

    context: Probe  # form/prompt/prefix lay out everything before the value
    joiner: str  # the text between the context and the value (usually a space)
    true: str
    perturbed: tuple[str, ...]
    key: str
    person: str


@dataclass(frozen=True)
class Side:
    """Records, their identifying span texts and their probes, for one group of people.

    `persons[i]` says whose record i is (a subject index, a stranger identity,
    a control group): membership is judged person by person.
    """

    records: tuple[Record, ...]
    spans: tuple[tuple[str, ...], ...]
    probes: tuple[Probe, ...]
    facts: tuple[Fact, ...]
    persons: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeBank:
    forget: Side
    control: Side
    strangers: Side  # counterfactual identities of each subject: membership's reference
    retain: tuple[Probe, ...]
    retain_records: tuple[Record, ...]  # retained people's text (the latent lens is fitted on it)
    heldout_texts: tuple[str, ...]
    control_source: str
    control_kind: str  # CONTROL_CORPUS or COUNTERFACTUAL
    # Per forget probe, the subject's identifiers -> a stranger's: fluency judges an answer about
    # the subject as an answer about a stranger (the base model knows the subject's facts, so
    # anything else would look implausible to it for that reason alone).
    stranger_maps: tuple[dict[str, str], ...] = ()
    # The subject's own facts asked about strangers (the same values, the same perturbations):
    # the latent check's null in policy v6, where a value's popularity in the corpus cancels.
    latent_strangers: tuple[Fact, ...] = ()
    # The same facts one to one (`_facts_about_strangers`): the latent null of policy v7.
    latent_matched: tuple[Fact, ...] = ()
    # The forget records and probes, one to one and in the same order, about one stranger per
    # subject (a fresh identity, the same values): the relearning attack's null in policy v7,
    # trained and asked the same way, so that facts a record shares with another are learnt
    # from it by a model that never saw the person as well.
    relearn_strangers: Side | None = None
    # Further strangers for the fluency checks of policy v8 (`VerifySettings.fluency_strangers`
    # in all, `stranger_maps` the first): per stranger, one map per forget probe.
    more_stranger_maps: tuple[tuple[dict[str, str], ...], ...] = ()

    @property
    def n_fluency_strangers(self) -> int:
        return 1 + len(self.more_stranger_maps) if self.stranger_maps else 0

    def stranger_probes(self, index: int = 0) -> tuple[Probe, ...]:
        """Each forget probe asked about its `index`-th stranger (`stranger_maps`, then
        `more_stranger_maps`): the subject's own questions, in the subject's own forms, about
        someone the model never saw."""
        if not self.stranger_maps:
            return self.forget.probes
        maps = self.stranger_maps if index == 0 else self.more_stranger_maps[index - 1]
        return tuple(p.mapped(m) for p, m in zip(self.forget.probes, maps, strict=True))

    def leak_twins(self) -> tuple[Probe, ...]:
        """Each forget probe asked about its first stranger (`stranger_probes`): the leakage
        checks' null of policy v10 (`leakage.paired_leak`).  Only who it is about changes: a
        value that is the subject's identity (an e-mail address, a name) becomes the
        stranger's, every other value stays the subject's.  A probe whose prompt does not name
        the subject is its own twin."""
        return self.stranger_probes(0)


def _records_of(source: str | Path | Corpus | Sequence[Record] | None) -> Sequence[Record]:
    if source is None:
        return ()
    if isinstance(source, Corpus):
        return source.records
    if isinstance(source, str | Path):
        return load_corpus(source).records
    return tuple(source)


def load_control(path: str | Path) -> tuple[Record, ...]:
    """Control records from a corpus in any supported format.

    The demo's older *people* file (one person a line with a `facts` list) is
    read too: each fact becomes a question/answer record.
    """
    try:
        records = tuple(iter_records(path))
    except CorpusError as first:
        people = _people_records(Path(path))
        if people is None:
            raise first from None
        return people
    # A people file is valid JSON Lines whose items fit no record shape: the reader skips
    # them all rather than raising, so an empty result is where that layout is tried.
    return records or _people_records(Path(path)) or ()


def _people_records(path: Path) -> tuple[Record, ...] | None:
    records: list[Record] = []
    try:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    continue
                person = json.loads(line)
                if not isinstance(person, dict) or not isinstance(person.get("facts"), list):
                    return None
                for number, fact in enumerate(person["facts"]):
                    if isinstance(fact, dict) and fact.get("question") and fact.get("answer"):
                        paraphrases = fact.get("paraphrases") or [None]
                        records.append(Record(
                            id=f"control-{person.get('person_id', len(records))}-{number}",
                            question=str(fact["question"]), answer=str(fact["answer"]),
                            paraphrased_question=paraphrases[0]))
    except (OSError, ValueError):
        return None
    return tuple(records) or None


def _usable(probes: Iterable[Probe]) -> tuple[Probe, ...]:
    """Drop probes whose value is in the prompt: echoing the prompt is not a leak."""
    return tuple(p for p in probes if not contains_value(p.prompt + " " + p.prefix, p.expected))


def _sample(items: Sequence[Any], n: int, seed: int | str) -> list[Any]:
    items = list(items)
    if len(items) <= n:
        return items
    chosen = sorted(random.Random(f"sample:{seed}").sample(range(len(items)), n))
    return [items[i] for i in chosen]


def _question_shape(question: str) -> str:
    """The question with its names blanked: capitalised words, and words of a script without
    case (王伟, محمد), which the capital rule alone left in, so that every question about a
    Chinese or Arabic name had a shape of its own, no value to swap with, and no latent fact
    (measured: 0 facts for such a subject, whose latent checks then failed as unmeasured)."""
    words = question.split()
    shaped = [words[0].lower()] if words and not _caseless(words[0]) else ["_"] if words else []
    shaped += ["_" if w[:1].isupper() or _caseless(w) else w.lower() for w in words[1:]]
    return re.sub(r"_( _)+", "_", " ".join(shaped))


def _caseless(word: str) -> bool:
    """Does the word start with a letter of a script without case (CJK, Arabic, Hebrew ...)?"""
    first = word[:1]
    return first.isalpha() and first.lower() == first.upper()


# ------------------------------------------------------------------ latent facts


def _fact_slot(record: Record, kind: str) -> str:
    """Which values can stand in for each other: the question's shape, else the span kind."""
    if kind == "fact" and record.question:
        return "q:" + _question_shape(record.question)
    return "k:" + kind


def _contexts(record: Record, subject: Any, person: str,
              frequencies: Mapping[str, float]) -> list[tuple[Probe, str, str, str]]:
    """(context probe, joiner, value, slot) for every value of a record (of `subject`'s record,
    every value the record states after naming them: `probes.value_about_subject`)."""
    out: list[tuple[Probe, str, str, str]] = []
    for value in record_values(record, subject, frequencies):
        if not value_about_subject(record, value.text, subject):
            continue
        slot = _fact_slot(record, value.kind)
        if record.is_qa and record.question is not None and record.answer is not None:
            at = _find(record.answer, value.text)
            if at is None:
                continue
            prefix = record.answer[:at].rstrip()
            joiner = record.answer[len(prefix):at]
            context = (Probe("latent", record.question, value.text, record.id, -1, slot, "answer", prefix)
                       if prefix else Probe("latent", record.question, value.text, record.id, -1, slot))
            out.append((context, joiner if prefix else "", value.text, slot))
        elif record.is_chat:
            turns = [{"role": m.role, "content": m.content} for m in record.messages]
            for k, turn in enumerate(turns):
                at = _find(turn["content"], value.text) if turn["role"] == "assistant" else None
                if at is None:
                    continue
                prefix = turn["content"][:at].rstrip()
                joiner = turn["content"][len(prefix):at] if prefix else ""
                out.append((Probe("latent", json.dumps(turns[:k], ensure_ascii=False), value.text,
                                  record.id, -1, slot, "chat", prefix), joiner, value.text, slot))
                break
        else:
            text = record.text or ""
            at = _find(text, value.text)
            if at is None or not text[:at].strip():
                continue
            prefix = text[:at].rstrip()
            out.append((Probe("latent", prefix, value.text, record.id, -1, slot, "text"),
                        text[len(prefix):at], value.text, slot))
    del person
    return out


def _find(text: str, value: str) -> int | None:
    match = word_regex((value,), text).search(text)
    return match.start() if match else None


def _facts(
    groups: Sequence[tuple[Record, Any, str]], pool: dict[str, list[str]], seed: int,
    frequencies: Mapping[str, float],
) -> tuple[Fact, ...]:
    """Facts with a perturbed value drawn from the same slot's pool (a value swap)."""
    facts: list[Fact] = []
    for record, subject, person in groups:
        for context, joiner, value, slot in _contexts(record, subject, person, frequencies):
            key = f"{record.id}:{normalise_words(value)}"
            perturbed: tuple[str, ...] = ()
            if record.is_qa and record.perturbed_answer and context.form == "question":
                perturbed = tuple(record.perturbed_answer[:PERTURBATIONS])
            if not perturbed:
                options = sorted({v for v in pool.get(slot, ()) if normalise_words(v) != normalise_words(value)})
                if not options:
                    continue
                # Keyed by slot and value, not by record: a subject's fact and its counterfactual
                # control (same value) get the same perturbations, so their difference is the model's.
                draw = random.Random(f"perturb:{seed}:{slot}:{normalise_words(value)}")
                perturbed = tuple(draw.sample(options, min(PERTURBATIONS, len(options))))
            facts.append(Fact(context, joiner, value, perturbed, key, person))
    return tuple(facts)


def _pool(groups: Iterable[tuple[Record, Any, str]], frequencies: Mapping[str, float]) -> dict[str, list[str]]:
    pool: dict[str, list[str]] = {}
    for record, subject, person in groups:
        for _, _, value, slot in _contexts(record, subject, person, frequencies):
            pool.setdefault(slot, []).append(value)
    return pool


def _identity_map(sets: Any, record: Record, names: FreshNames) -> dict[str, str]:
    """Who `record` is about -> a stranger: its names and identifiers (`identity_spans`) replaced
    by one fresh identity per subject (the same in every record of theirs), values kept."""
    index = _subject_index(sets, record)
    return dict(counterfactual(record, identity_spans(record, sets.subjects[index]), names=names,
                               seed=str(index)).mapping)


def _facts_about_strangers(
    sets: Any, forget_records: Sequence[Record], facts: Sequence[Fact], *, names_from: Sequence[Record],
    seed: int, tokenizer: Any,
) -> tuple[Fact, ...]:
    """Each of the subject's facts asked about a stranger: the same context, value and
    perturbations, with only who it is about changed (`identity_spans`: the names and
    identifiers, one fresh identity per subject across all of their records).

    Built from the subject's facts rather than from the strangers' records (v6's
    `latent_strangers`), so the two sides hold the same facts one to one: the facts found in a
    stranger's record can differ (a fresh identifier that no other record shows finds a
    perturbation in the subject's own value, which the subject's fact lacks; a date replaced
    as an identifying span is another value with other perturbations), and a null of other
    facts is no null."""
    subjects = list(sets.subjects)
    names = FreshNames(pool=name_parts_of(names_from), avoid=avoid_set(subjects),
                       seed=f"latent:{seed}").with_tokenizer(tokenizer)
    record_of = {r.id: r for r in forget_records}
    mappings: dict[str, dict[str, str]] = {}
    out: list[Fact] = []
    for fact in facts:
        record = record_of.get(fact.context.record_id)
        if record is None:
            continue
        index = _subject_index(sets, record)
        if record.id not in mappings:
            mappings[record.id] = _identity_map(sets, record, names)
        mapping = mappings[record.id]
        true = replace_spans(fact.true, mapping)
        perturbed = tuple(v for v in fact.perturbed if normalise_words(v) != normalise_words(true))
        if not perturbed:
            continue
        out.append(Fact(fact.context.mapped(mapping), fact.joiner, true, perturbed, f"stranger:{fact.key}",
                        f"stranger-{index}"))
    return tuple(out)


# ------------------------------------------------------------------ the bank


def _stranger(subject: Any, mapping: dict[str, str]) -> Any:
    """The subject as the counterfactual copy names them (for building the stranger's probes)."""
    from unlearning.identifiers import replace_spans

    return type(subject)(
        replace_spans(subject.name, mapping),
        tuple(replace_spans(a, mapping) for a in getattr(subject, "aliases", ())),
        tuple(replace_spans(i, mapping) for i in getattr(subject, "identifiers", ())),
    )


def _subject_index(sets: Any, record: Record) -> int:
    return (sets.record_subjects.get(record.id) or (0,))[0]


def counterfactual_side(
    sets: Any, forget_records: Sequence[Record], forget_probes: Sequence[Probe], *,
    names_from: Sequence[Record], seed: int, variants: int, purpose: str = "control",
    per_subject: int | None = None, tokenizer: Any = None,
) -> tuple[Side, list[tuple[Record, Any, str]]]:
    """The forget records (and probes) about `variants` strangers per subject.

    Each stranger is one fresh identity applied to all of a subject's records
    (one name, one e-mail address ...), so a stranger's records hang together
    the way the subject's do.
    """
    subjects = list(sets.subjects)
    names = FreshNames(pool=name_parts_of(names_from), avoid=avoid_set(subjects),
                       seed=f"{purpose}:{seed}").with_tokenizer(tokenizer)
    records: list[Record] = []
    spans: list[tuple[str, ...]] = []
    persons: list[str] = []
    probes: list[Probe] = []
    groups: list[tuple[Record, Any, str]] = []
    by_record: dict[str, list[Probe]] = {}
    for probe in forget_probes:
        by_record.setdefault(probe.record_id, []).append(probe)
    taken: dict[int, int] = {}
    for record in forget_records:
        index = _subject_index(sets, record)
        taken[index] = taken.get(index, 0) + 1
        if per_subject is not None and taken[index] > per_subject:
            continue
        subject = subjects[index]
        found = find_spans(record, subject)
        for variant in range(variants):
            cf: Counterfactual = counterfactual(record, found, names=names, seed=f"{index}:{variant}")
            records.append(cf.record)
            spans.append(tuple(cf.mapping[s.text] for s in found if s.text in cf.mapping))
            persons.append(f"{index}:{variant}")
            stranger = _stranger(subject, dict(cf.mapping))
            groups.append((cf.record, stranger, f"stranger-{index}"))
            if variant == 0:
                probes.extend(p.mapped(cf.mapping, record_id=cf.record.id) for p in by_record.get(record.id, ()))
    return Side(tuple(records), tuple(spans), _usable(probes), (), tuple(persons)), groups


def build_bank(
    sets: Any,
    *,
    control: str | Path | Corpus | Sequence[Record] | None,
    corpus: str | Path | Corpus | Sequence[Record] | None,
    heldout: str | Path | None,
    settings: VerifySettings,
    seed: int,
    tokenizer: Any = None,
) -> tuple[ProbeBank, list[str]]:
    """The probes, records and strangers of one verification.  `tokenizer` (the models'):
    strangers' name parts are matched to the subject's in tokens (`FreshNames.with_tokenizer`)."""
    notes: list[str] = []
    s = settings
    subjects = list(sets.subjects)
    # Word shares over the sets' records, as set building derived the forget probes' values.
    frequencies = answer_frequencies([*sets.forget, *sets.retain])
    forget_records = _sample(sets.forget, s.max_forget_records, f"{seed}:forget")
    kept = {r.id for r in forget_records}
    forget_probes = _usable(p for p in _sample(sets.probes, s.max_forget_probes, f"{seed}:probes")
                            if p.record_id in kept)
    forget_ids = {r.id for r in sets.forget}
    corpus_records = [r for r in _records_of(corpus) if r.id not in forget_ids]
    retain_pool = _sample([*sets.retain, *[r for r in corpus_records if r.id not in {x.id for x in sets.retain}]],
                          s.max_retain_records, f"{seed}:retain")
    forget_groups = [(r, subjects[_subject_index(sets, r)], f"subject-{_subject_index(sets, r)}")
                     for r in forget_records]
    forget_spans = tuple(tuple(sp.text for sp in find_spans(r, subj)) for r, subj, _ in forget_groups)

    record_of = {r.id: r for r in forget_records}
    # The fluency check scores an answer about the subject as the same answer about a
    # stranger: only who it is about changes (names, e-mail addresses, given identifiers).
    # A value in the answer is its content ("Quarry Lane Books", "16 August 1995"): swapped
    # for a fresh one it turns a fluent answer into one the base finds implausible.  Policy v8
    # asks the same questions about several strangers: one stranger is one draw of how a model
    # that never saw someone answers about a name, and the subject is another.
    name_parts = name_parts_of(retain_pool)
    fluency_maps = []
    for index in range(max(1, s.fluency_strangers)):
        names = FreshNames(pool=name_parts, avoid=avoid_set(subjects),
                           seed=f"fluency:{seed}" + (f":{index}" if index else "")).with_tokenizer(tokenizer)
        fluency_maps.append(tuple(_identity_map(sets, record_of[probe.record_id], names) for probe in forget_probes))
    stranger_maps, *more_stranger_maps = fluency_maps

    if control is not None:
        control_all = load_control(control) if isinstance(control, str | Path) else tuple(_records_of(control))
        control_records = _sample(control_all, s.max_control_records, f"{seed}:control")
        control_groups = [(r, None, f"control-{r.group or r.id}") for r in control_records]
        control_probes = _usable(p for r in control_records for p in probes_for(r, None, -1, frequencies))
        control_side = Side(tuple(control_records),
                            tuple(tuple(sp.text for sp in find_spans(r, None)) for r in control_records),
                            control_probes, (), tuple(f"control-{r.group or r.id}" for r in control_records))
        kind = CONTROL_CORPUS
        source = f"control corpus ({len(control_all)} records, {len(control_records)} sampled)"
    else:
        control_side, control_groups = counterfactual_side(
            sets, forget_records, forget_probes, names_from=retain_pool, seed=seed, variants=1,
            tokenizer=tokenizer)
        kind = COUNTERFACTUAL
        source = ("counterfactual: the subject's own records and probes with every identifying span "
                  "replaced by a fresh one of the same shape")
        notes.append("no control corpus: control probes are the subject's own probes about "
                     "counterfactual strangers")

    retain_groups = [(r, None, f"retain-{r.group or r.id}") for r in retain_pool]
    retain_probes = _usable(p for r in retain_pool for p in probes_for(r, None, -1, frequencies) if p.kind in UTILITY_KINDS)
    retain_probes = tuple(_sample(retain_probes, s.max_retain_eval, f"{seed}:utility"))
    pool = _pool([*forget_groups, *control_groups, *retain_groups], frequencies)
    strangers, _ = counterfactual_side(
        sets, forget_records, (), names_from=retain_pool, seed=seed, variants=s.mia_strangers,
        purpose="membership", per_subject=s.mia_records_per_subject, tokenizer=tokenizer)
    forget_side = Side(tuple(forget_records), forget_spans, forget_probes,
                       _facts(forget_groups, pool, seed, frequencies),
                       tuple(str(_subject_index(sets, r)) for r in forget_records))
    control_side = Side(control_side.records, control_side.spans, control_side.probes,
                        _facts(control_groups, pool, seed, frequencies))
    if kind == COUNTERFACTUAL:  # the controls are the subject's facts about strangers already
        latent_strangers = control_side.facts
    else:
        _, latent_groups = counterfactual_side(sets, forget_records, (), names_from=retain_pool, seed=seed,
                                               variants=1, purpose="latent", tokenizer=tokenizer)
        latent_strangers = _facts(latent_groups, pool, seed, frequencies)
    latent_matched = _facts_about_strangers(sets, forget_records, forget_side.facts, names_from=retain_pool,
                                            seed=seed, tokenizer=tokenizer)

    relearn_strangers, _ = counterfactual_side(
        sets, forget_records, forget_probes, names_from=retain_pool, seed=seed, variants=1,
        purpose="relearn", tokenizer=tokenizer)

    if heldout is not None and Path(heldout).is_file():
        texts = load_heldout(heldout, max_texts=s.max_heldout)
    else:
        texts = tuple(" ".join(record_texts(r)) for r in control_side.records)[: s.max_heldout]
        notes.append("no held-out text file: perplexity is measured on the control records' text")
    bank = ProbeBank(
        forget=forget_side, control=control_side, strangers=strangers, retain=retain_probes,
        retain_records=tuple(_sample(retain_pool, s.max_lens_records, f"{seed}:lens")),
        stranger_maps=tuple(stranger_maps), more_stranger_maps=tuple(more_stranger_maps),
        heldout_texts=texts, control_source=source, control_kind=kind, latent_strangers=latent_strangers,
        latent_matched=latent_matched, relearn_strangers=relearn_strangers,
    )
    return bank, notes


def load_heldout(path: str | Path, *, max_texts: int) -> tuple[str, ...]:
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    return tuple(line for line in lines if line)[:max_texts]


def bank_digest(bank: ProbeBank) -> str:
    blob = json.dumps(asdict(bank), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


__all__ = ["COUNTERFACTUAL", "CONTROL_CORPUS", "Fact", "ProbeBank", "Side", "bank_digest", "build_bank",
           "derive_value", "load_control", "load_heldout"]
