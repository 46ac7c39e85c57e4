"""Strangers as familiar as the subject would be to a model that never saw them.

The records are the free-text fixture of tests/real_shaped.py (unique names of
30 people, not the demo's pools); every assertion is about which class of name
a stranger gets, never a particular name.
"""

from __future__ import annotations

import pytest

from tests.real_shaped import free_text_corpus, people
from unlearning.corpus import Record
from unlearning.identifiers import (
    FreshNames,
    Span,
    avoid_set,
    counterfactual,
    find_spans,
    fresh_mapping,
    name_parts_of,
)
from unlearning.sets import Subject
from unlearning.stranger_names import FAMILY_NAMES, GIVEN_NAMES
from unlearning.text import normalise


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


def _crowd_records(lines: list[str]) -> list[Record]:
    return [Record(id=f"r{i}", text=line) for i, line in enumerate(lines)]


def test_a_date_other_people_share_becomes_another_shared_date_and_an_own_one_a_fresh_one() -> None:
    # Dates drawn from a small pool (as in a generated corpus): a model that never saw the
    # subject predicts a shared date from the population, so the stranger's must be shared too.
    shared = ["22 November 1979", "3 May 1960", "17 August 1985"]
    others = _crowd_records([f"{n} was born on {d}." for n, d in zip(
        ["Dana Whitlock", "Eve Moss", "Ann Moss", "Bo Whitlock", "Cy Moss", "Di Whitlock"], shared * 2, strict=False)])
    names = FreshNames(pool=name_parts_of(others), avoid=avoid_set([Subject("Ola Brandt")]), seed="7")
    for seed in range(12):
        swapped = counterfactual(Record(id="s", text="Ola Brandt was born on 22 November 1979."),
                                 [Span("Ola Brandt", "name"), Span("22 November 1979", "date")],
                                 names=names, seed=seed).mapping["22 November 1979"]
        assert swapped in shared and swapped != "22 November 1979"
        own = counterfactual(Record(id="s", text="Ola Brandt was born on 9 June 1961."),
                             [Span("Ola Brandt", "name"), Span("9 June 1961", "date")],
                             names=names, seed=seed).mapping["9 June 1961"]
        day, month, year = own.split()
        # Written as the corpus writes dates: no zero-padded day, a year the records show.
        assert not day.startswith("0") and 1 <= int(day) <= 28
        assert int(year) in {1979, 1960, 1985} and own not in shared


def test_a_strangers_address_is_spelt_from_the_strangers_name_as_the_subjects_is_from_theirs() -> None:
    names = FreshNames(pool=(), seed="3")
    for name, address, spelling in (
        ("Tove Mendoza", "tovem@example.net", lambda f, s: f"{f}{s[0]}"),
        ("Chiara Grünewald", "chiara_grunewald@inbox.example.com", lambda f, s: f"{f}_{s}"),
        ("Jakub Delacroix", "jdelacroix@example.org", lambda f, s: f"{f[0]}{s}"),
    ):
        mapping = fresh_mapping([Span(name, "name"), Span(address, "email")], names)
        first, last = (normalise(w) for w in mapping[name].split())
        local, _, domain = mapping[address].partition("@")
        assert local == spelling(first, last) and domain == address.partition("@")[2]

