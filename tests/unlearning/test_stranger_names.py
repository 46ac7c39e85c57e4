"""Strangers as familiar as the subject would be to a model that never saw them.

The records are the free-text fixture of tests/real_shaped.py (unique names of
30 people, not the demo's pools); every assertion is about which class of name
a stranger gets, never a particular name.
"""

from __future__ import annotations

import pytest

from tests.real_shaped import free_text_corpus, people
from unlearning.corpus import Record
from unlearning.identifiers import FreshNames, avoid_set, counterfactual, find_spans, name_parts_of
from unlearning.sets import Subject
from unlearning.stranger_names import FAMILY_NAMES, GIVEN_NAMES


def _shown(records) -> set[str]:
    return {entry.split(":")[-1] for entry in name_parts_of(records) if entry.startswith("seen:")}


@pytest.fixture(scope="module")
def corpus():
    crowd = people(30, seed=3)
    return crowd, free_text_corpus(crowd, seed=3)


def test_a_name_part_the_rest_of_the_corpus_shows_becomes_another_shown_part(corpus) -> None:
    crowd, records = corpus
    surnames = [p.name.split()[1] for p in crowd]
    subject = next(p for p in crowd if surnames.count(p.name.split()[1]) == 1)
    first, last = subject.name.split()
    others = [r for r in records if subject.name not in str(r)]
    # Someone else shares the subject's first name; the surname is the subject's alone.
    twin = next(s for s in surnames if s != last)
    others.append(Record(id="twin", text=f"{first} {twin} signed the visitors' book twice."))
    shown = _shown(others)
    assert first in shown and last not in shown
    names = FreshNames(pool=name_parts_of(others), avoid=avoid_set([Subject(subject.name)]))
    fresh_first = {names.part(first, f"{first}:{k}", "first") for k in range(40)}
    fresh_last = {names.part(last, f"{last}:{k}", "last") for k in range(40)}
    assert fresh_first <= shown and first not in fresh_first and len(fresh_first) > 5
    assert fresh_last <= set(FAMILY_NAMES) - shown and len(fresh_last) > 5


def test_strangers_are_consistent_and_never_share_a_part_of_the_subjects_identifiers(corpus) -> None:
    crowd, records = corpus
    subject = Subject(crowd[4].name, (), (crowd[4].email, crowd[4].phone))
    own = [r for r in records if crowd[4].name in str(r)]
    names = FreshNames(pool=name_parts_of([r for r in records if r not in own]), avoid=avoid_set([subject]),
                       seed="t")
    maps = [counterfactual(r, find_spans(r, subject), names=names, seed="one").mapping for r in own]
    fresh = {m[crowd[4].name] for m in maps if crowd[4].name in m}
    assert len(fresh) == 1  # one stranger, one name, in every record
    stranger = fresh.pop()
    assert not set(stranger.casefold().split()) & avoid_set([subject])
    emails = {m[crowd[4].email] for m in maps if crowd[4].email in m}
    assert len(emails) == 1 and emails.pop() != crowd[4].email


def test_without_any_names_in_the_records_strangers_get_ordinary_names_not_pseudo_words() -> None:
    names = FreshNames(pool=(), avoid=frozenset({"ilse", "varga"}), seed="s")
    firsts = {names.part("Ilse", f"k{k}", "first") for k in range(30)}
    lasts = {names.part("Varga", f"k{k}", "last") for k in range(30)}
    assert firsts <= set(GIVEN_NAMES) and lasts <= set(FAMILY_NAMES)


def test_organisation_names_are_no_name_parts() -> None:
    records = [Record(id=f"r{k}", text=f"She joined Lodestar Insurance in {2000 + k}, then Meadowlark Studios.")
               for k in range(4)]
    assert not [e for e in name_parts_of(records) if e.split(":")[-1] in {"Lodestar", "Meadowlark"}
                and not e.startswith("seen:")]
