from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearning.corpus import (
    CorpusError,
    Record,
    load_corpus,
    merkle_root,
    record_digest,
    write_jsonl,
)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_it_reads_jsonl_with_text_and_question_answer_records(tmp_path: Path) -> None:
    corpus = load_corpus(_write(tmp_path / "c.jsonl", [
        json.dumps({"id": "a", "text": "Some free text."}),
        "",
        json.dumps({"question": "Q?", "answer": "A.", "meta": {"k": 1}}),
    ]))
    assert [r.id for r in corpus.records] == ["a", "rec-0000001"]
    assert corpus.records[0].text == "Some free text." and not corpus.records[0].is_qa
    assert corpus.records[1].is_qa and corpus.records[1].meta == {"k": 1}


def test_it_reads_prompt_response_and_tofu_extras_from_a_json_array(tmp_path: Path) -> None:
    path = tmp_path / "tofu.json"
    path.write_text(json.dumps([{
        "id": 7, "prompt": "Who?", "response": "Her.", "paraphrased_question": "Who again?",
        "paraphrased_answer": "Still her.", "perturbed_answer": ["Him.", "Them."],
    }]), encoding="utf-8")
    record = load_corpus(path).records[0]
    assert (record.id, record.question, record.answer) == ("7", "Who?", "Her.")
    assert record.paraphrased_question == "Who again?"
    assert record.perturbed_answer == ("Him.", "Them.")


@pytest.mark.parametrize(("line", "field", "where"), [
    ('{"question": "Q?"}', "answer", ":2"),
    ('{"answer": "A."}', "question", ":2"),
    ('{"id": "x"}', "text", ":2"),
    ('{"text": 5}', "text", ":2"),
    ('{"text": "t", "meta": [1]}', "meta", ":2"),
    ('{"text": "t", "perturbed_answer": 3}', "perturbed_answer", ":2"),
    ('{"question": "Q?", "answer": "  "}', "answer", ":2"),
])
def test_a_record_that_fits_no_shape_is_named_in_the_report_or_refused_when_strict(
    tmp_path: Path, line: str, field: str, where: str,
) -> None:
    path = _write(tmp_path / "bad.jsonl", ['{"id": "a", "text": "fine"}', line])
    corpus = load_corpus(path)
    assert [r.id for r in corpus.records] == ["a"]
    assert corpus.report is not None and corpus.report.skipped_count == 1
    (skipped,) = corpus.report.skipped
    assert (skipped.shard, skipped.where, skipped.field) == ("bad.jsonl", where[1:], field)
    with pytest.raises(CorpusError) as caught:
        load_corpus(path, strict=True)
    assert f"bad.jsonl{where}" in str(caught.value)
    assert f"field '{field}'" in str(caught.value)


def test_a_duplicate_id_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.jsonl", ['{"id": "a", "text": "fine"}', '{"id": "a", "text": "dup"}'])
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: field 'id': duplicate id 'a' \(first at .*bad.jsonl:1\)"):
        load_corpus(path)


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "broken.jsonl", ['{"text": "ok"}', '{"text": "ok2"}', "{not json"])
    with pytest.raises(CorpusError, match=r"broken.jsonl:3: invalid JSON"):
        load_corpus(path)


def test_a_bad_item_in_a_json_array_is_named_by_position(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"text": "ok"}, "just a string"]), encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad.json:item 1: expected a JSON object"):
        load_corpus(path, strict=True)
    assert load_corpus(path).report.skipped[0].line() == "bad.json:item 1: expected a JSON object, got str"


def test_a_missing_or_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="file not found"):
        load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(CorpusError, match="no records"):
        load_corpus(_write(tmp_path / "empty.jsonl", [""]))


def test_the_manifest_digest_depends_on_content_not_layout(tmp_path: Path) -> None:
    records = [Record(id="a", text="x"), Record(id="b", question="q?", answer="a.")]
    jsonl = write_jsonl(records, tmp_path / "c.jsonl")
    array = tmp_path / "c.json"
    array.write_text(json.dumps([r.to_json() for r in records], indent=4), encoding="utf-8")
    assert load_corpus(jsonl).manifest_digest == load_corpus(array).manifest_digest
    changed = write_jsonl([records[0], Record(id="b", question="q?", answer="b.")], tmp_path / "d.jsonl")
    assert load_corpus(changed).manifest_digest != load_corpus(jsonl).manifest_digest


def test_record_digests_change_with_any_field() -> None:
    base = Record(id="a", question="q?", answer="a.", meta={"value": "a"})
    assert record_digest(base) == record_digest(Record(id="a", question="q?", answer="a.", meta={"value": "a"}))
    assert record_digest(base) != record_digest(Record(id="a", question="q?", answer="a.", meta={"value": "b"}))
    assert record_digest(base) != record_digest(Record(id="b", question="q?", answer="a.", meta={"value": "a"}))


def test_the_merkle_root_pins_a_set_whatever_its_order() -> None:
    digests = [record_digest(Record(id=str(i), text=f"t{i}")) for i in range(7)]
    assert merkle_root(digests) == merkle_root(list(reversed(digests)))
    assert merkle_root(digests) != merkle_root(digests[:-1])
    assert merkle_root([]) != merkle_root(digests[:1])
    # A single leaf is hashed with its prefix, so the root never equals the raw digest.
    assert merkle_root(digests[:1]) != digests[0]


def test_without_drops_records_by_id() -> None:
    from unlearning.corpus import Corpus
    corpus = Corpus((Record(id="a", text="x"), Record(id="b", text="y")))
    assert [r.id for r in corpus.without(["a"]).records] == ["b"]


def test_it_reads_chat_records_and_grouping_fields_and_writes_them_back(tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "c1", "thread": "t-9", "messages": [
            {"role": "user", "content": "Hi, who is on duty?"},
            {"role": "assistant", "content": "Dana Whitlock is on duty today."}]}),
        json.dumps({"id": "d1", "doc": 17, "text": "She moved to Leeds."}),
    ]
    corpus = load_corpus(_write(tmp_path / "c.jsonl", lines))
    chat, text = corpus.records
    assert chat.shape == "chat" and [m.learnt for m in chat.messages] == [False, True]
    assert (chat.group, chat.group_field) == ("t-9", "thread")
    assert "Dana Whitlock" in chat.searchable_text()
    assert (text.shape, text.group) == ("text", "17")
    again = load_corpus(write_jsonl(corpus.records, tmp_path / "again.jsonl"))
    assert [record_digest(r) for r in again.records] == [record_digest(r) for r in corpus.records]


@pytest.mark.parametrize(("messages", "field"), [
    ("not a list", "messages"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": "only a question"}], "messages"),
])
def test_a_bad_chat_names_the_turn(tmp_path: Path, messages: object, field: str) -> None:
    path = _write(tmp_path / "bad.jsonl", [json.dumps({"id": "x", "messages": messages})])
    with pytest.raises(CorpusError, match="no records"):
        load_corpus(path)
    with pytest.raises(CorpusError) as caught:
        load_corpus(path, strict=True)
    assert f"field '{field}'" in str(caught.value)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["id", "text"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=6),
                                 st.lists(st.text(max_size=2), max_size=2))))
def test_the_plain_text_shortcut_gives_the_general_parsers_record_or_error(data: dict[str, object]) -> None:
    from unlearning.corpus.records import RecordMisfit, _parse_record, parse_record

    def outcome(parse: object) -> object:
        try:
            return parse("c.jsonl", "1", data, "rec-0000001")  # type: ignore[operator]
        except RecordMisfit as exc:
            return ("misfit", str(exc))

    assert outcome(parse_record) == outcome(_parse_record)
    fast, general = outcome(parse_record), outcome(_parse_record)
    if not isinstance(fast, tuple):  # the same record, attribute for attribute, in the same order
        assert list(vars(fast).items()) == list(vars(general).items())
        assert fast.meta is not parse_record("c.jsonl", "1", data, "rec-0000001").meta


def test_the_plain_text_shortcut_builds_what_the_constructor_builds() -> None:
    from unlearning.corpus.records import Record, parse_record

    fast = parse_record("c.jsonl", "1", {"id": 7, "text": "Mara"}, "rec-0000001")
    built = Record(id="7", text="Mara")
    assert fast == built and hash(fast) == hash(built) and repr(fast) == repr(built)
    assert list(vars(fast).items()) == list(vars(built).items())
    assert fast.shape == "text" and fast.searchable_text() == "Mara"
    with pytest.raises(AttributeError):
        fast.text = "changed"  # type: ignore[misc]


def test_the_general_parser_builds_what_the_constructor_builds() -> None:
    from dataclasses import fields

    from tests.scan_fixtures import trap_records
    from unlearning.corpus.records import Record, parse_record

    for number, data in enumerate(trap_records(3, 200)):
        try:
            parsed = parse_record("c.jsonl", str(number), data, f"rec-{number:07d}")
        except CorpusError:
            continue
        built = Record(**{f.name: getattr(parsed, f.name) for f in fields(Record)})
        assert parsed == built and hash(parsed) == hash(built) and repr(parsed) == repr(built)
        assert list(vars(parsed).items()) == list(vars(built).items())
