"""Strangers as familiar as the subject would be to a model that never saw them.

The records are the free-text fixture of tests/real_shaped.py (unique names of
30 people, not the demo's pools); every assertion is about which class of name
a stranger gets, never a particular name.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
                and not e.startswith(("seen:", "words:"))]


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



def test_a_strangers_alias_is_written_from_the_strangers_name_as_the_subjects_is_from_theirs() -> None:
    names = FreshNames(pool=(), seed="3")
    for alias, spelling in (("D. Ueda", lambda f, s: f"{f[0]}. {s}"), ("Dmitri U.", lambda f, s: f"{f} {s[0]}."),
                            ("Dmi Ueda", lambda f, s: f"{f[:3]} {s}")):
        # Whichever span comes first: the full name is the longer, the alias may be too.
        for spans in ([Span("Dmitri Ueda", "name"), Span(alias, "name")],
                      [Span(alias, "name"), Span("Dmitri Ueda", "name"), Span("Dmi", "name_part")]):
            mapping = fresh_mapping(spans, names)
            first, last = mapping["Dmitri Ueda"].split()
            assert mapping[alias] == spelling(first, last)
            assert "Dmi" not in mapping or mapping["Dmi"] == first[:3]  # the part alone, as in the alias


def test_a_word_beside_a_longer_one_in_the_same_name_is_no_abbreviation_of_it() -> None:
    names = FreshNames(pool=(), seed="3")
    mapping = fresh_mapping([Span("Lindqvist Lin", "name"), Span("Ann Lee", "name")], names)
    first, last = mapping["Lindqvist Lin"].split()
    assert not first.casefold().startswith(last.casefold())  # "Lin" got a fresh part of its own
    # An initial that abbreviates no part of the subject's names stays as it is.
    assert fresh_mapping([Span("John F. Kennedy", "name")], names)["John F. Kennedy"].split()[1] == "F."


def _house_style_records(count: int) -> list[Record]:
    """People whose addresses share a house style (``user<n>.<digits>@mail<n>.example``)."""
    return [Record(id=f"r{k}", question=f"What is the email address of Person{k}?",
                   answer=f"It is user{k:02d}.{7311 + 37 * k}@mail{k}.example.") for k in range(count)]


def test_a_strangers_address_keeps_the_house_style_many_addresses_share() -> None:
    names = FreshNames(pool=name_parts_of(_house_style_records(6)), seed="h")
    subject_address = "user00.7311@mail63.example"
    fresh = fresh_mapping([Span(subject_address, "email")], names)[subject_address]
    local, _, domain = fresh.partition("@")
    word, digits, rest = local.partition(".")[0][:4], local.partition(".")[0][4:], local.partition(".")[2]
    assert word == "user" and len(digits) == 2 and digits.isdigit() and len(rest) == 4 and rest.isdigit()
    assert domain == "mail63.example" and fresh != subject_address
    # Without the house style in the records the word is a fresh one.
    bare = fresh_mapping([Span(subject_address, "email")], FreshNames(pool=(), seed="h"))[subject_address]
    assert not bare.startswith("user")


def test_a_house_style_word_that_is_the_whole_local_part_is_still_replaced() -> None:
    records = [Record(id=f"r{k}", text=f"Write to info@shop{k}.example for Person{k}.") for k in range(5)]
    names = FreshNames(pool=name_parts_of(records), seed="i")
    fresh = fresh_mapping([Span("info@shop9.example", "email")], names)
    assert fresh["info@shop9.example"].partition("@")[0] != "info"


def _word_tokenizer(words: list[str]):
    """A byte-level BPE tokenizer trained until each of `words` is one token, letters otherwise."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    text = [f"about {w} and {w}" for w in words for _ in range(20)]
    bpe.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")


def test_with_a_tokenizer_that_learnt_the_subjects_name_a_stranger_gets_parts_of_as_many_tokens() -> None:
    # Other people's names recur in the records; the subject's does not (its records are not in
    # the pool), but the tokenizer learnt it as one token, and splits every ordinary name.
    others = [("Brenna", "Fairlie"), ("Osric", "Tallow"), ("Maelis", "Corrib"), ("Dunstan", "Vell"),
              ("Ysolde", "Marrack"), ("Caddoc", "Penhal"), ("Elowen", "Treves"), ("Garvan", "Hollis"),
              ("Idony", "Skerrow"), ("Jory", "Bascombe")]
    records = [Record(id=f"{a}{k}", text=f"{a} {b} wrote to {a} {b} again.") for a, b in others for k in range(2)]
    tokenizer = _word_tokenizer(["Alden", "Ashgrove"] + [w for pair in others for w in pair])
    count = lambda w: len(tokenizer(" " + w, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert count("Alden") == 1 and count("Yuki") > 1  # the premise: ordinary names are split
    names = FreshNames(pool=name_parts_of(records), avoid=avoid_set([Subject("Alden Ashgrove")]), seed="t")
    plain = {names.part("Alden", f"k{k}", "first") for k in range(20)}
    matched = {names.with_tokenizer(tokenizer).part("Alden", f"k{k}", "first") for k in range(20)}
    assert plain <= set(GIVEN_NAMES)  # by letters alone: an ordinary name the records never show
    assert matched <= {a for a, _ in others} and all(count(w) == 1 for w in matched)


def test_a_stranger_for_a_name_no_address_is_written_from_gets_a_name_no_address_is_written_from() -> None:
    # Half of the other people's e-mail addresses are written from their first names
    # ("brenna.4@..."), which a model completes from memory; the subject's name is written in
    # no address, so a stranger named like those would make the subject's own address look
    # as predictable as a memorised one.
    others = [("Brenna", "Fairlie"), ("Osric", "Tallow"), ("Maelis", "Corrib"), ("Dunstan", "Vell"),
              ("Ysolde", "Marrack"), ("Caddoc", "Penhal"), ("Elowen", "Treves"), ("Garvan", "Hollis"),
              ("Idony", "Skerrow"), ("Jory", "Bascombe"), ("Wenna", "Polglase"), ("Tamsin", "Roskilly"),
              ("Locryn", "Tregear"), ("Morwen", "Carne"), ("Peder", "Kitto"), ("Senara", "Jago")]
    mailed = {a for a, _ in others[::2]}
    records = [Record(id=f"{a}{k}", text=f"{a} {b} wrote to {a} {b} again"
                      + (f" from {a.lower()}.{k}@mail.example." if a in mailed else "."))
               for a, b in others for k in range(2)]
    tokenizer = _word_tokenizer(["Alden", "Ashgrove"] + [w for pair in others for w in pair])
    names = FreshNames(pool=name_parts_of(records), avoid=avoid_set([Subject("Alden Ashgrove")]), seed="m")
    matched = {names.with_tokenizer(tokenizer).part("Alden", f"k{k}", "first") for k in range(40)}
    assert matched <= {a for a, _ in others} and len(matched) >= 3
    assert not matched & mailed


def test_a_value_no_one_else_shows_is_an_identity_a_shared_one_a_value() -> None:
    from unlearning.identifiers import identity_spans

    others = [Record(id=f"o{k}", text=f"Person{k} was born on 3 May 1970 and moved in {1990 + k}.")
              for k in range(4)]
    names = FreshNames(pool=name_parts_of(others), seed="v")
    mine = Record(id="s", text="Alden Ashgrove was born on 3 May 1970; call +44 7141 371493.")
    subject = Subject("Alden Ashgrove")
    kinds = {s.kind: s.text for s in identity_spans(mine, subject, names)}
    assert kinds.get("phone") == "+44 7141 371493"  # only the subject's records show it
    assert "date" not in kinds  # other people show the same date: a value, kept
    assert "phone" not in {s.kind for s in identity_spans(mine, subject)}  # without a pool: values kept
    # A unique year becomes another year, never a four-digit number of no kind.
    year = fresh_mapping([Span("1975", "number")], FreshNames(pool=(), seed="y"))["1975"]
    assert year.isdigit() and 1960 <= int(year) <= 1990 and year != "1975"


def test_with_a_tokenizer_that_learnt_the_subjects_number_a_fresh_one_costs_as_many_tokens() -> None:
    # The subject's phone number is frequent in the tokenizer's training text: its digit groups
    # became tokens; other numbers' digits mostly did not.
    tokenizer = _word_tokenizer(["7141", "371493", "24", "35", "68", "90", "13"])
    count = lambda w: len(tokenizer(" " + w, add_special_tokens=False)["input_ids"])  # noqa: E731
    phone = "+44 7141 371493"
    spans = [Span(phone, "phone")]
    wanted = count(phone)
    by_letters = [fresh_mapping(spans, FreshNames(pool=(), seed=f"p{k}"))[phone] for k in range(6)]
    by_tokens = [fresh_mapping(spans, FreshNames(pool=(), seed=f"p{k}").with_tokenizer(tokenizer))[phone]
                 for k in range(6)]
    gap = lambda values: sum(abs(count(v) - wanted) for v in values)  # noqa: E731
    assert gap(by_letters) > 0  # the premise: a random number is spelt in more tokens
    assert gap(by_tokens) < gap(by_letters)
    assert all(v.startswith("+44 ") and len(v) == len(phone) and v != phone for v in by_tokens)


def test_a_stranger_for_a_name_no_record_writes_is_a_one_token_word_no_record_writes() -> None:
    # The tokenizer learnt the subject's name as one token, and so other people's names and
    # words the retained records never write.  A model trained without the subject met the
    # token of its name never: a stranger's name part must be a token met as rarely, not one
    # of other people's names that the records write again and again.
    others = [("Brenna", "Fairlie"), ("Osric", "Tallow"), ("Maelis", "Corrib"), ("Dunstan", "Vell"),
              ("Ysolde", "Marrack"), ("Caddoc", "Penhal"), ("Elowen", "Treves"), ("Garvan", "Hollis")]
    unwritten = ["Corvin", "Tamsin", "Halder", "Mirela", "Quillon", "Dervla", "Oswin", "Perrin", "Sorcha",
                 "Wendric"]
    records = [Record(id=f"{a}{k}", text=f"{a} {b} wrote to {a} {b} again.") for a, b in others for k in range(3)]
    tokenizer = _word_tokenizer(["Alden", "Ashgrove"] + [w for pair in others for w in pair] + unwritten)
    count = lambda w: len(tokenizer(" " + w, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert count("Alden") == 1 and all(count(w) == 1 for w in unwritten)  # the premise
    written = {w for pair in others for w in pair} | {"wrote", "to", "again"}
    names = FreshNames(pool=name_parts_of(records), avoid=avoid_set([Subject("Alden Ashgrove")]), seed="u")
    matched = {names.with_tokenizer(tokenizer).part("Alden", f"k{k}", "first") for k in range(30)}
    assert len(matched) >= 3
    assert all(count(w) == 1 for w in matched)
    assert not matched & written
    assert not any("alden".startswith(w.casefold()) or w.casefold().startswith("ald") for w in matched)



def test_a_question_word_or_a_street_word_the_vocabulary_holds_is_no_strangers_name() -> None:
    # Capitalised vocabulary words that no record writes are name candidates, but not the
    # words that open questions or name streets and firms (`_NOT_NAMES`): "What Rahim" is no name.
    others = [("Brenna", "Fairlie"), ("Osric", "Tallow"), ("Maelis", "Corrib"), ("Dunstan", "Vell")]
    unwritten = ["Corvin", "Tamsin", "Halder"]
    not_names = ["What", "Which", "Street", "Bakery"]
    records = [Record(id=f"{a}{k}", text=f"{a} {b} wrote to {a} {b} again.") for a, b in others for k in range(3)]
    tokenizer = _word_tokenizer(["Alden", "Ashgrove"] + [w for pair in others for w in pair] + unwritten + not_names)
    names = FreshNames(pool=name_parts_of(records), avoid=avoid_set([Subject("Alden Ashgrove")]), seed="q")
    matched = {names.with_tokenizer(tokenizer).part("Alden", f"k{k}", "first") for k in range(40)}
    assert matched & set(unwritten)
    assert not matched & set(not_names)


_WORDISH = st.text(alphabet="aAbB_1 .-'\u212a\u017fkKsS\u00e9\u0130i", max_size=12)


@settings(max_examples=600, deadline=None)
@given(_WORDISH.filter(bool), _WORDISH)
def test_the_word_test_without_a_regex_agrees_with_the_regex(text: str, haystack: str) -> None:
    import re

    from unlearning.identifiers import word_find
    from unlearning.text import bounded

    match = re.compile(bounded(text), re.IGNORECASE).search(haystack)
    assert word_find(text, haystack) == (-1 if match is None else match.start())
    assert match is None or match.end() == match.start() + len(text)


def _whole_value_tokenizer(values: list[str]):
    """A BPE tokenizer that splits on spaces only (Metaspace, as SentencePiece does), trained
    until each of `values` is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.decoder = decoders.Metaspace()
    text = [f"badge {v} and {v}" for v in values for _ in range(30)]
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"],
                                                      show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>", unk_token="<unk>")


def test_a_value_the_vocabulary_holds_whole_gets_another_whole_value_no_record_writes() -> None:
    # The tokenizer was trained on text that writes every badge often (the subject's, other
    # people's and people the model never trained on), so each is one token.  A model trained
    # without the subject met the subject's badge token never: a stranger's badge must be one
    # token met as rarely, not seven tokens of digits, nor a badge other people's records write.
    mine = "EMP-39260"
    written = ["EMP-76510", "EMP-41544", "EMP-82963", "EMP-84830", "EMP-93743", "EMP-91134"]
    unwritten = ["EMP-10536", "EMP-77566", "EMP-23570", "EMP-37363"]
    tokenizer = _whole_value_tokenizer([mine, *written, *unwritten])
    count = lambda w: len(tokenizer(" " + w, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert all(count(v) == 1 for v in [mine, *written, *unwritten])  # the premise
    assert count("EMP-50417") > 1  # ... and a badge it never read is spelt in pieces
    records = [Record(id=f"o{k}", text=f"Person{k} carries badge {b}.") for k, b in enumerate(written)]
    subject = Subject("Alden Ashgrove", (), (mine,))
    spans = [Span(mine, "identifier")]
    names = FreshNames(pool=name_parts_of(records), avoid=avoid_set([subject]), seed="w").with_tokenizer(tokenizer)
    fresh = [fresh_mapping(spans, names.identity(f"s{k}"))[mine] for k in range(12)]
    assert set(fresh) <= set(unwritten) and len(set(fresh)) >= 2
    # Without the tokenizer, or with a vocabulary that holds no unwritten badge, the draws as
    # before: a badge of the same shape that is nobody's.
    plain = [fresh_mapping(spans, FreshNames(pool=(), seed=f"p{k}"))[mine] for k in range(6)]
    assert all(len(v) == len(mine) and v.startswith("EMP-") and v not in (mine, *written, *unwritten) for v in plain)
    only_written = _whole_value_tokenizer([mine, *written])
    drawn = [fresh_mapping(spans, FreshNames(pool=name_parts_of(records), avoid=avoid_set([subject]), seed=f"q{k}")
                           .with_tokenizer(only_written))[mine] for k in range(6)]
    assert not set(drawn) & {mine, *written} and all(v.startswith("EMP-") for v in drawn)
