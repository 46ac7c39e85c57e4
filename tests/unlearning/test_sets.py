from __future__ import annotations

from pathlib import Path

import pytest

from unlearning.corpus import Corpus, Record, load_corpus
from unlearning.demo.corpus import load_people
from unlearning.probes import answer_frequencies, derive_value
from unlearning.sets import ErasureSets, SetsError, Subject, build_sets


def _corpus(*texts: str) -> Corpus:
    return Corpus(tuple(Record(id=f"r{i}", text=t) for i, t in enumerate(texts)))


def _forget_ids(corpus: Corpus, *subjects: Subject) -> set[str]:
    return {r.id for r in build_sets(corpus, list(subjects)).forget}


def test_names_match_across_case_accents_and_unicode_forms() -> None:
    corpus = _corpus("ZOË SØREN wrote it.", "zoe soren again", "Ｚｏë Søren in full width",
                     "Zoe\u0308 So\u0308ren decomposed", "nothing here")
    assert _forget_ids(corpus, Subject("Zoë Søren")) == {"r0", "r1", "r2", "r3"}


def test_names_match_on_word_boundaries_only() -> None:
    corpus = _corpus("Ann Lee came.", "Annabel Lee came.", "Ann Leeson came.", "JoAnn Lee came.",
                     "(Ann Lee's book)")
    assert _forget_ids(corpus, Subject("Ann Lee")) == {"r0", "r4"}


def test_aliases_emails_and_phone_numbers_match() -> None:
    corpus = _corpus("Write to mara.okafor@example.org today.", "M. Okafor said so.",
                     "Call +44 20 7946 0123.", "Call 442079460123 now.", "Call +44-20-7946-0123.",
                     "Someone else: +44 20 7946 0124.")
    subject = Subject("Mara Okafor", aliases=("M. Okafor",),
                      identifiers=("mara.okafor@example.org", "+44 20 7946 0123"))
    assert _forget_ids(corpus, subject) == {"r0", "r1", "r2", "r3", "r4"}


def test_many_subjects_are_found_in_one_pass_with_per_subject_counts(tiny_corpus_dir: Path) -> None:
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    people = load_people(tiny_corpus_dir / "people.jsonl")
    subjects = [Subject(p["name"], tuple(p["aliases"])) for p in people[:5]]
    sets = build_sets(corpus, subjects)
    assert sets.match_counts == (11, 11, 11, 11, 11)
    wanted = {p["person_id"] for p in people[:5]}
    assert {r.meta["person"] for r in sets.forget} == wanted
    assert not sets.unmatched


def test_a_subject_that_matches_nothing_is_reported_not_hidden(tiny_corpus_dir: Path) -> None:
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    person = load_people(tiny_corpus_dir / "people.jsonl")[0]
    nobody = Subject("Nobody Atall")
    sets = build_sets(corpus, [Subject(person["name"]), nobody])
    assert sets.unmatched == (nobody,)
    assert sets.counts()["unmatched"] == [1]


def test_the_retain_set_takes_neighbours_of_the_same_shape_first(tiny_corpus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("unlearning.sets.RETAIN_MINIMUM", 0)  # the rule itself, not the floor
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    person = load_people(tiny_corpus_dir / "people.jsonl")[0]
    sets = build_sets(corpus, [Subject(person["name"], tuple(person["aliases"]))], retain_per_forget=1)
    assert len(sets.retain) == len(sets.forget)
    forget_ids = {r.id for r in sets.forget}
    assert not forget_ids & {r.id for r in sets.retain}
    # The same question template about another person: attribute and template match.
    forget_shapes = {r.id.split("-", 1)[1] for r in sets.forget}
    retain_shapes = [r.id.split("-", 1)[1] for r in sets.retain]
    assert sum(s in forget_shapes for s in retain_shapes) >= 0.8 * len(retain_shapes)
    assert all(r.meta["person"] != person["person_id"] for r in sets.retain)


def test_the_retain_set_falls_back_to_general_records() -> None:
    records = [Record(id="f", question="Where was Ann Lee born?", answer="Ann Lee was born in Rome."),
               Record(id="g1", text="The ferry leaves at dusk."), Record(id="g2", text="Rain.")]
    sets = build_sets(Corpus(tuple(records)), [Subject("Ann Lee")], retain_per_forget=2)
    assert {r.id for r in sets.retain} == {"g1", "g2"}


def test_probes_cover_original_paraphrase_alias_and_cloze(tiny_corpus_dir: Path) -> None:
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    person = load_people(tiny_corpus_dir / "people.jsonl")[1]
    sets = build_sets(corpus, [Subject(person["name"], tuple(person["aliases"]))])
    facts = {f["attribute"]: f for f in person["facts"]}
    birthplace = [p for p in sets.probes if p.attribute == "birthplace"]
    assert {p.kind for p in birthplace} == {"original", "paraphrase", "alias", "cloze"}
    by_kind = {p.kind: p for p in birthplace}
    assert by_kind["original"].prompt == facts["birthplace"]["question"]
    assert by_kind["paraphrase"].prompt == facts["birthplace"]["paraphrases"][0]
    assert by_kind["alias"].prompt == facts["birthplace"]["alias_question"]
    assert by_kind["cloze"].form == "answer" and by_kind["cloze"].prefix == facts["birthplace"]["cloze"]
    assert all(p.expected == facts["birthplace"]["value"] for p in birthplace)


def test_values_and_clozes_are_derived_when_a_corpus_has_no_meta() -> None:
    record = Record(id="t", question="Where was Mara Okafor born?", answer="Mara Okafor was born in Lisbon.")
    assert derive_value(record, ["Mara Okafor"]) == "Lisbon"
    sets = build_sets(Corpus((record,)), [Subject("Mara Okafor", ("M. Okafor",))])
    by_kind = {p.kind: p for p in sets.probes}
    assert {k: p.prompt for k, p in by_kind.items() if k != "cloze"} == {
        "original": "Where was Mara Okafor born?", "alias": "Where was M. Okafor born?"}
    assert by_kind["cloze"].prefix == "Mara Okafor was born in"
    assert all(p.expected == "Lisbon" for p in sets.probes)


def test_a_value_is_the_rarer_run_not_the_corpus_wording() -> None:
    # "... is a locksmith by trade.": both runs lack capitals and digits, so position alone
    # took "trade", which every occupation answer repeats (the latent fact then scored grammar).
    trades = ["locksmith", "baker", "welder", "pilot", "tailor", "nurse"]
    records = [Record(id=f"r{i}", question=f"What does Person{i} do for a living?",
                      answer=f"Person{i} is a {job} by trade.") for i, job in enumerate(trades)]
    records.append(Record(id="c", question="Where was Person9 born?", answer="Person9 was born in Porto."))
    shares = answer_frequencies(records)
    assert shares["trade"] == 6 / 7 and shares["locksmith"] == 1 / 7
    assert derive_value(records[0], ["Person0"]) == "trade"  # without the corpus: the last run
    assert derive_value(records[0], ["Person0"], shares) == "locksmith"
    assert derive_value(records[-1], ["Person9"], shares) == "Porto"
    # Set building applies it: every probe of the subject asks for the occupation.
    sets = build_sets(Corpus(tuple(records)), [Subject("Person0")], retain_per_forget=6)
    assert sets.probes and {p.expected for p in sets.probes} == {"locksmith"}


def test_sets_survive_a_save_and_load_and_detect_tampering(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    people = load_people(tiny_corpus_dir / "people.jsonl")
    sets = build_sets(corpus, [Subject(p["name"], tuple(p["aliases"])) for p in people[:2]])
    loaded = ErasureSets.load(sets.save(tmp_path / "sets"))
    assert loaded.forget == sets.forget and loaded.retain == sets.retain and loaded.probes == sets.probes
    assert loaded.forget_digest == sets.forget_digest and loaded.match_counts == sets.match_counts
    forget = tmp_path / "sets" / "forget.jsonl"
    forget.write_text(forget.read_text().replace("born", "borne", 1))
    with pytest.raises(SetsError, match="forget_digest"):
        ErasureSets.load(tmp_path / "sets")


def test_the_manifest_holds_digests_and_counts_but_no_names(tiny_corpus_dir: Path) -> None:
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    person = load_people(tiny_corpus_dir / "people.jsonl")[0]
    sets = build_sets(corpus, [Subject(person["name"])])
    manifest = repr(sets.manifest())
    assert person["name"] not in manifest and person["name"].split()[1] not in manifest
    assert sets.manifest()["forget_digest"] == sets.forget_digest


def test_set_building_is_deterministic_for_a_seed(tiny_corpus_dir: Path) -> None:
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    subjects = [Subject(load_people(tiny_corpus_dir / "people.jsonl")[3]["name"])]
    assert build_sets(corpus, subjects, seed=5).retain_digest == build_sets(corpus, subjects, seed=5).retain_digest


def test_no_subjects_is_an_error() -> None:
    with pytest.raises(SetsError):
        build_sets(_corpus("x"), [])


def test_the_one_pass_scan_agrees_with_matching_each_text_alone() -> None:
    import random

    from unlearning.text_matching import MultiMatcher
    rng = random.Random(7)
    names = ["Ann Lee", "Zoë Søren", "José O'Connell", "Annabel Lee", "mara@example.org"]
    pieces = ["Ann", "Lee", "ANN LEE", "Zoe Soren", "zoë søren", "Annabel Lee", "JoAnn Lee", "x",
              "José O’Connell", "mara@example.org", "amara@example.org", "\n", "  ", "Ｌｅｅ", "é"]
    texts = ["".join(rng.choice(pieces) + rng.choice([" ", "", ".", "\t"]) for _ in range(6))
             for _ in range(400)]
    matcher = MultiMatcher([[n] for n in names])
    alone = {i: matcher.subjects_in(t) for i, t in enumerate(texts)}
    assert matcher.scan(texts) == {i: s for i, s in alone.items() if s}
    assert any(alone.values()) and not all(alone.values())


def test_every_demo_person_is_found_by_their_identifiers_and_nobody_else_is() -> None:
    from unlearning.demo.corpus import generate_demo_corpus
    demo = generate_demo_corpus(people=1500, control=0, general=0, heldout=0)
    subjects = [Subject(p["name"], tuple(p["aliases"]), (p["email"], p["phone"])) for p in demo.people]
    sets = build_sets(Corpus(demo.records), subjects)
    assert set(sets.match_counts) == {11}
    assert all(len(found) == 1 for found in sets.record_subjects.values())


def test_sets_survive_a_round_trip_through_one_blob_and_a_changed_blob_is_refused(
    tiny_corpus_dir: Path,
) -> None:
    corpus = load_corpus(tiny_corpus_dir / "corpus.jsonl")
    person = load_people(tiny_corpus_dir / "people.jsonl")[0]
    sets = build_sets(corpus, [Subject(person["name"], tuple(person["aliases"]))])
    blob = sets.dumps()
    again = ErasureSets.loads(blob)
    assert again.manifest() == sets.manifest()
    assert again.forget == sets.forget and again.subjects == sets.subjects
    assert again.probes == sets.probes
    tampered = blob.replace(b'"answer": "', b'"answer": "X', 1)
    assert tampered != blob
    with pytest.raises(SetsError, match="forget_digest|retain_digest"):
        ErasureSets.loads(tampered)
    with pytest.raises(SetsError):
        ErasureSets.loads(b"\xff not json")


def test_records_of_the_same_document_join_the_forget_set_and_are_counted_apart() -> None:
    records = (
        Record(id="a1", group="d1", group_field="doc", text="Mara Okafor wrote the report."),
        Record(id="a2", group="d1", group_field="doc", text="She filed it in March; the author signed it."),
        Record(id="b1", group="d2", group_field="doc", text="Ann Lee reviewed it."),
        Record(id="b2", group="d2", group_field="doc", text="She approved it."),
        Record(id="c1", group="d3", group_field="doc", text="Nobody else is here."),
        Record(id="c2", text="Unrelated weather notes."),
    )
    subjects = [Subject("Mara Okafor"), Subject("Ann Lee")]
    sets = build_sets(Corpus(records), subjects, retain_per_forget=5)
    assert [r.id for r in sets.forget] == ["a1", "a2", "b1", "b2"]
    assert sets.record_subjects == {"a1": (0,), "a2": (0,), "b1": (1,), "b2": (1,)}
    counts = sets.counts()
    assert (counts["per_subject"], counts["per_subject_group"]) == ([1, 1], [1, 1])
    assert (counts["forget_direct"], counts["forget_group"]) == (2, 2)
    assert sets.group_only == ("a2", "b2")
    assert {r.id for r in sets.retain} == {"c1", "c2"}
    assert sets.manifest()["counts"]["per_subject_group"] == [1, 1]


def test_free_text_neighbours_name_identifiers_of_the_same_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("unlearning.sets.RETAIN_MINIMUM", 0)  # the rule itself, not the floor
    records = [Record(id="f", text="Write to mara.okafor@example.org for the keys.")]
    records += [Record(id=f"e{i}", text=f"Write to person{i}@example.com for the keys.") for i in range(5)]
    records += [Record(id=f"p{i}", text=f"Plain note number {i}.") for i in range(20)]
    sets = build_sets(Corpus(tuple(records)), [Subject("Mara Okafor", (), ("mara.okafor@example.org",))],
                      retain_per_forget=5)
    assert {r.id for r in sets.retain} == {f"e{i}" for i in range(5)}
    again = ErasureSets.load(sets.save(tmp_path / "sets"))
    assert again.group_only == sets.group_only and again.counts() == sets.counts()


def test_a_small_forget_set_still_gets_the_retain_minimum_and_name_sharers_come_first() -> None:
    from unlearning.sets import RETAIN_MINIMUM

    records = [Record(id="f0", question="Where was Dana Whitlock born?", answer="Dana Whitlock was born in Oslo.")]
    records += [Record(id="k0", question="Where was Dana Kovacs born?", answer="Dana Kovacs was born in Rome.")]
    records += [Record(id=f"o{i}", text=f"Weather note {i} about the coast.") for i in range(RETAIN_MINIMUM + 50)]
    sets = build_sets(Corpus(tuple(records)), [Subject("Dana Whitlock")])
    assert len(sets.forget) == 1
    assert len(sets.retain) == RETAIN_MINIMUM  # not ten: one person's erasure anchors many others
    assert sets.retain[0].id == "k0"  # shares the first name with the subject: most at risk
    assert sets.params["retain_minimum"] == RETAIN_MINIMUM


def test_name_sharers_are_the_records_the_plain_pattern_finds_whatever_the_case_tricks() -> None:
    import re

    from unlearning.sets import _name_sharers

    subjects = [Subject("İlkay Kofi"), Subject("Zoë Strauß", ("Kasimir Hoſs",)), Subject("Ann Lee")]
    texts = ["Ilkay Smith wrote.", "ILKAY", "ilkaya", "Kofi Annan", "\u212aofi spoke", "zoe", "Zoë Weber",
             "STRAUSS", "strauß", "Strauss", "kasimir", "Hoss and Hoſs", "HOSS", "ann", "Lee Ann", "Anne",
             "Nobody here.", "ılkay", "Mr. KOFI.", "kofi-ann",
             # word boundaries as `re` draws them: "_" and digits are word characters
             "ann_x", "x_ann", "ann1", "1ann", "Anna", "Annann", "(Ann)", "ann\nlee", "lee-ann", "Annx ann"]
    pool = [Record(id=f"r{i}", text=text) for i, text in enumerate(texts)]
    parts = {w for s in subjects for n in (s.name, *s.aliases) for w in re.findall(r"[^\W\d_]{3,}", n)}
    plain = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in sorted(parts)) + r")(?!\w)", re.IGNORECASE)
    expected = [r.id for r in pool if plain.search(r.text or "")]
    assert [r.id for r in _name_sharers(subjects, pool)] == expected
    assert {"r0", "r1", "r4", "r11", "r12", "r18"} <= set(expected)


def test_name_sharers_equal_the_plain_pattern_on_random_ascii_and_unicode_texts() -> None:
    import random
    import re

    from unlearning.sets import _name_sharers

    rng = random.Random(1)
    alphabet = "abcAB_1 -\u212aſkKé"  # word and non-word characters, Kelvin sign, long s, an accent
    subjects = [Subject("Kab Abc"), Subject("ſab"), Subject("bca K1a", ("Abé",))]
    parts = {w for s in subjects for n in (s.name, *s.aliases) for w in re.findall(r"[^\W\d_]{3,}", n)}
    plain = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in sorted(parts)) + r")(?!\w)", re.IGNORECASE)
    matched = 0
    for _ in range(50):
        pool = [Record(id=str(i), text="x" + "".join(rng.choice(alphabet) for _ in range(rng.randint(3, 16))))
                for i in range(300)]
        expected = [r.id for r in pool if plain.search(r.text or "")]
        assert [r.id for r in _name_sharers(subjects, pool)] == expected
        matched += len(expected)
    assert matched >= 20  # the alphabet makes matches common enough: the comparison is not vacuous
