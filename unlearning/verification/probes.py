"""What the verifier asks: forget probes, control probes and the fact lists behind them.

Everything here is plain data built once per `verify` call.  Forget probes
come from the erasure sets (`ErasureSets.probes`, see docs/internals.md);
control probes come from a control people file (people generated the same
way as the subjects but never trained on) or, without one, from the
subject's own probes with the subject's name and aliases replaced by
generated names the model never saw.  The second form keeps the expected
values, so it measures how often the model says the subject's value about a
stranger: the chance level for exactly those values.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unlearning.corpus import Record
from unlearning.probes import derive_value

logger = logging.getLogger(__name__)

PROBE_KINDS = ("original", "paraphrase", "alias", "cloze")


@dataclass(frozen=True)
class FactProbe:
    """One prompt about one fact.  `kind` cloze means `prompt` is the start of the answer."""

    kind: str
    prompt: str
    value: str
    fact: str  # groups the probes of one fact: a record id or a control fact key
    person: str  # a subject index or a control person id, never a name


@dataclass(frozen=True)
class QAFact:
    """A question/answer pair whose answer contains `value`."""

    question: str
    answer: str
    value: str
    fact: str
    person: str


@dataclass(frozen=True)
class ProbeBank:
    forget: tuple[FactProbe, ...]
    control: tuple[FactProbe, ...]
    forget_facts: tuple[QAFact, ...]
    control_facts: tuple[QAFact, ...]
    retain_facts: tuple[QAFact, ...]
    heldout_texts: tuple[str, ...]
    control_source: str


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(obj, Mapping) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    return default


def record_value(record: Record) -> str | None:
    """The fact's value: `meta.value` when the corpus carries it, else derived as set building does.

    Set building derives a probe's value as the longest run of answer words
    not in the question (`unlearning.sets.derive_value`); retained facts get
    the same treatment so the latent probes and the utility check work on
    corpora without `meta`.
    """
    if not record.is_qa:
        return None
    value = derive_value(record, ())
    return value or None


def record_person(record: Record) -> str:
    meta = record.meta or {}
    return str(meta.get("person", meta.get("subject", "")))


def qa_fact(record: Record, value: str | None = None, person: str | None = None) -> QAFact | None:
    value = value or record_value(record)
    if record.question is None or record.answer is None or not value:
        return None
    return QAFact(
        question=record.question,
        answer=record.answer,
        value=value,
        fact=record.id,
        person=person if person is not None else record_person(record),
    )


def forget_probes(sets: Any) -> tuple[FactProbe, ...]:
    """The erasure sets' probes in the verifier's shape."""
    out = []
    for probe in sets.probes:
        out.append(
            FactProbe(
                kind=str(_get(probe, "kind")),
                prompt=str(_get(probe, "prompt")),
                value=str(_get(probe, "expected", "value", "expected_value")),
                fact=str(_get(probe, "record_id", "fact", default="")),
                person=f"subject-{_get(probe, 'subject_index', 'subject', default=0)}",
            )
        )
    return tuple(out)


def forget_facts(sets: Any, probes: Sequence[FactProbe]) -> tuple[QAFact, ...]:
    """The forget records that are Q/A facts, with the value the probes look for."""
    value_of = {p.fact: p.value for p in probes}
    person_of = {p.fact: p.person for p in probes}
    out = []
    for record in sets.forget:
        fact = qa_fact(record, value_of.get(record.id), person_of.get(record.id))
        if fact is not None:
            out.append(fact)
    return tuple(out)


def load_control_people(path: str | Path) -> list[dict[str, Any]]:
    """Control people in the demo corpus's people format (docs/internals.md)."""
    people = []
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                people.append(json.loads(line))
    if not people:
        raise ValueError(f"{path}: no control people")
    return people


def control_from_people(
    people: Sequence[Mapping[str, Any]], *, max_facts: int, seed: int
) -> tuple[tuple[FactProbe, ...], tuple[QAFact, ...]]:
    """Every probe kind for a seeded sample of the control people's facts."""
    facts = [(p, f) for p in people for f in p.get("facts", [])]
    random.Random(seed).shuffle(facts)
    probes: list[FactProbe] = []
    qa: list[QAFact] = []
    for person, fact in facts[:max_facts]:
        pid = f"control-{person.get('person_id', '?')}"
        key = f"{pid}-{fact.get('attribute', len(qa))}"
        value = str(fact["value"])
        probes.append(FactProbe("original", fact["question"], value, key, pid))
        for paraphrase in fact.get("paraphrases", []) or []:
            probes.append(FactProbe("paraphrase", paraphrase, value, key, pid))
        if fact.get("alias_question"):
            probes.append(FactProbe("alias", fact["alias_question"], value, key, pid))
        if fact.get("cloze"):
            probes.append(FactProbe("cloze", fact["cloze"], value, key, pid))
        if fact.get("answer"):
            qa.append(QAFact(fact["question"], fact["answer"], value, key, pid))
    return tuple(probes), tuple(qa)


_SYLLABLES = ("ka", "lo", "vi", "den", "mar", "su", "tor", "el", "qui", "zan", "bro", "fe", "ny")


def stranger_names(count: int, *, seed: int, avoid: str = "") -> list[str]:
    """Generated two-part names that do not occur in `avoid` (normally the corpus text)."""
    rng = random.Random(seed)
    names: list[str] = []
    lowered = avoid.casefold()
    while len(names) < count:
        parts = [
            "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
            for _ in range(2)
        ]
        name = " ".join(parts)
        if name.casefold() not in lowered and name not in names:
            names.append(name)
    return names


def _replace_names(text: str, names: Iterable[str], stranger: str) -> str:
    for name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", stranger, text, flags=re.IGNORECASE)
    return text


def control_from_strangers(
    sets: Any, probes: Sequence[FactProbe], facts: Sequence[QAFact], *, seed: int, avoid: str
) -> tuple[tuple[FactProbe, ...], tuple[QAFact, ...]]:
    """The subject's probes and records about generated strangers instead of the subject."""
    subjects = list(_get(sets, "subjects", default=()) or ())
    if not subjects:
        raise ValueError("no control file and the erasure sets name no subjects to substitute")
    strangers = stranger_names(len(subjects), seed=seed, avoid=avoid)

    def names_of(person: str) -> tuple[list[str], str]:
        index = int(person.rsplit("-", 1)[-1]) if person.rsplit("-", 1)[-1].isdigit() else 0
        subject = subjects[min(index, len(subjects) - 1)]
        names = [str(_get(subject, "name")), *(str(a) for a in _get(subject, "aliases", default=()))]
        return names, strangers[min(index, len(strangers) - 1)]

    out_probes = []
    for p in probes:
        names, stranger = names_of(p.person)
        out_probes.append(
            FactProbe(p.kind, _replace_names(p.prompt, names, stranger), p.value, p.fact, "stranger")
        )
    out_facts = []
    for f in facts:
        names, stranger = names_of(f.person)
        out_facts.append(
            QAFact(
                _replace_names(f.question, names, stranger),
                _replace_names(f.answer, names, stranger),
                f.value,
                f.fact,
                "stranger",
            )
        )
    return tuple(out_probes), tuple(out_facts)


def retain_facts(
    records: Iterable[Record], *, exclude: set[str], max_facts: int, seed: int
) -> tuple[QAFact, ...]:
    """Facts of retained people with a known value, a seeded sample of at most `max_facts`."""
    facts = []
    seen: set[str] = set()
    for record in records:
        if record.id in exclude or record.id in seen:
            continue
        seen.add(record.id)
        fact = qa_fact(record)
        if fact is not None:
            facts.append(fact)
    random.Random(seed).shuffle(facts)
    return tuple(facts[:max_facts])


def load_heldout(path: str | Path, *, max_texts: int) -> tuple[str, ...]:
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    return tuple(line for line in lines if line)[:max_texts]
