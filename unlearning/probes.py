"""What the verifier asks about each forget record: the probes of one erasure.

A `Probe` is one prompt about one fact of a forget record; a leak is the
probe's `expected` value in the model's output.  For a question/answer record:
the original question, the given paraphrase, alias-only questions (the name
replaced by each alias) and a cloze prefix of the answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from unlearning.corpus import Record
from unlearning.text import normalise

if TYPE_CHECKING:
    from unlearning.sets import Subject

PROBE_KINDS = ("original", "paraphrase", "alias", "cloze")
_WORD = re.compile(r"[\w@.+'-]+", re.UNICODE)
_STOPWORDS = frozenset(
    "a an the of in on at by to for as is was were be been has have had and or with from "
    "his her their its this that which who what where when how also known".split()
)


@dataclass(frozen=True)
class Probe:
    """One verification question about one forget fact; a leak is `expected` in the output."""

    kind: str  # original | paraphrase | alias | cloze
    prompt: str
    expected: str
    record_id: str
    subject: int  # index into ErasureSets.subjects
    attribute: str | None = None


def derive_value(record: Record, names: Sequence[str]) -> str:
    """The fact a QA record states: meta.value, else the longest answer run not in the question."""
    value = record.meta.get("value") if record.meta else None
    if isinstance(value, str) and value:
        return value
    answer = record.answer or record.text or ""
    seen = {normalise(w) for w in _WORD.findall(record.question or "")}
    for name in names:
        seen |= {normalise(w) for w in _WORD.findall(name)}
    best: list[str] = []
    run: list[str] = []
    for word in _WORD.findall(answer) + [""]:
        key = normalise(word).strip(".'")
        if word and key and key not in seen and key not in _STOPWORDS:
            run.append(word.rstrip(".,"))
            continue
        if len(" ".join(run)) > len(" ".join(best)):
            best = run
        run = []
    return " ".join(best) if best else answer.strip().rstrip(".")


def _cloze(record: Record, value: str) -> str | None:
    cloze = record.meta.get("cloze") if record.meta else None
    if isinstance(cloze, str) and cloze:
        return cloze
    answer = record.answer or ""
    at = answer.find(value)
    prefix = answer[:at].rstrip() if at > 0 else ""
    return prefix or None


def _replace_name(text: str, name: str, alias: str) -> str | None:
    pattern = re.compile(r"(?<!\w)" + re.escape(name) + r"(?!\w)", re.IGNORECASE)
    replaced, count = pattern.subn(alias, text)
    return replaced if count else None


def probes_for(record: Record, subject: Subject, index: int) -> list[Probe]:
    """Original, paraphrase, alias-only and cloze probes for one forget QA record."""
    if not record.is_qa or record.question is None:
        return []
    value = derive_value(record, subject.patterns())
    attribute = record.meta.get("attribute") if record.meta else None
    attribute = attribute if isinstance(attribute, str) else None

    def make(kind: str, prompt: str) -> Probe:
        return Probe(kind, prompt, value, record.id, index, attribute)

    probes = [make("original", record.question)]
    if record.paraphrased_question:
        probes.append(make("paraphrase", record.paraphrased_question))
    for alias in subject.aliases:
        aliased = _replace_name(record.question, subject.name, alias)
        if aliased and alias != value:
            probes.append(make("alias", aliased))
    cloze = _cloze(record, value)
    if cloze:
        probes.append(make("cloze", cloze))
    return probes


def build_probes(
    forget: Sequence[Record], subjects: Sequence[Subject], record_subjects: Mapping[str, Sequence[int]],
) -> tuple[Probe, ...]:
    """Every probe of an erasure: for each forget record, probes about the first subject it names.

    `record_subjects[record.id]` lists the indices (into `subjects`) of the
    subjects a forget record is about; set building provides it.
    """
    out: list[Probe] = []
    for record in forget:
        found = record_subjects.get(record.id) or ()
        if found:
            out.extend(probes_for(record, subjects[found[0]], found[0]))
    return tuple(out)
