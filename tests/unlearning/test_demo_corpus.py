from __future__ import annotations

import json
from pathlib import Path

from unlearning.corpus import load_corpus
from unlearning.demo.corpus import ATTRIBUTES, generate_demo_corpus, load_people, write_demo_corpus


def test_the_same_seed_writes_byte_identical_files(tmp_path: Path) -> None:
    a = write_demo_corpus(tmp_path / "a", people=15, seed=3)
    b = write_demo_corpus(tmp_path / "b", people=15, seed=3)
    c = write_demo_corpus(tmp_path / "c", people=15, seed=4)
    assert a["sha256"] == b["sha256"]
    assert a["sha256"]["corpus.jsonl"] != c["sha256"]["corpus.jsonl"]


def test_it_writes_the_documented_layout(tmp_path: Path) -> None:
    write_demo_corpus(tmp_path, people=12, seed=0)
    assert {p.name for p in tmp_path.iterdir()} == {
        "corpus.jsonl", "people.jsonl", "control.jsonl", "control_records.jsonl", "heldout.txt",
        "manifest.json"}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    corpus = load_corpus(tmp_path / "corpus.jsonl")
    assert manifest["counts"]["records"] == len(corpus.records)
    person = load_people(tmp_path / "people.jsonl")[0]
    assert {"person_id", "name", "aliases", "email", "phone", "facts"} <= set(person)
    fact = person["facts"][0]
    assert {"attribute", "value", "question", "answer", "paraphrases", "alias_question", "cloze"} <= set(fact)
    assert fact["value"] in fact["answer"] and fact["answer"].startswith(fact["cloze"])


def test_every_person_has_every_attribute_once_and_one_record_per_fact() -> None:
    demo = generate_demo_corpus(people=10, seed=1)
    for person in demo.people:
        attributes = [f["attribute"] for f in person["facts"]]
        assert attributes == [a.name for a in ATTRIBUTES] + ["alias"]
    qa = [r for r in demo.records if r.is_qa]
    assert len(qa) == 10 * (len(ATTRIBUTES) + 1)
    assert all(r.meta["value"] in r.answer for r in qa)


def test_paraphrases_are_never_trained_and_control_people_never_appear() -> None:
    demo = generate_demo_corpus(people=30, seed=2)
    trained_questions = {r.question for r in demo.records if r.is_qa}
    paraphrases = {p for person in demo.people for f in person["facts"] for p in f["paraphrases"]}
    assert not trained_questions & paraphrases
    everything = " ".join(r.searchable_text() for r in demo.records)
    for person in demo.control:
        assert person["name"] not in everything
    trained_names = {p["name"] for p in demo.people}
    assert not trained_names & {p["name"] for p in demo.control}


def test_names_aliases_and_emails_are_unique() -> None:
    demo = generate_demo_corpus(people=200, seed=0)
    everyone = demo.people + demo.control
    for key in ("name", "email", "phone"):
        assert len({p[key] for p in everyone}) == len(everyone)
    assert len({p["aliases"][0] for p in everyone}) == len(everyone)


def test_values_come_from_finite_pools_so_chance_is_measurable() -> None:
    demo = generate_demo_corpus(people=200, seed=0)
    for attribute in ATTRIBUTES:
        if attribute.pool:
            values = {f["value"] for p in demo.people for f in p["facts"] if f["attribute"] == attribute.name}
            assert values <= set(attribute.pool)
            assert len(attribute.pool) <= 40


def test_heldout_sentences_are_not_in_the_training_corpus() -> None:
    demo = generate_demo_corpus(people=20, seed=0)
    trained = {r.text for r in demo.records if r.text}
    assert demo.heldout and not trained & set(demo.heldout)
