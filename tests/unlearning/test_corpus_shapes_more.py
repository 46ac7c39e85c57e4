"""Alpaca, Dolly, ShareGPT and OpenAI prompt/completion records and chat turns of content parts: read as
question/answer and chat records, and found by set building alike by the reference scan, the fast scan and the index.

The fast scan matches `searchable_text_of` on raw JSON values and parses only the lines
that hit; the index tokenises raw lines (or that same text for lines it parses).  A shape
whose fields either of them missed would drop a subject's records from the forget set
without a sound, so the new fields are checked through all three paths.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.scan_fixtures import FILLER, SUBJECTS, TRAPS, saved_bytes
from unlearning.cli import main
from unlearning.corpus import (
    Message,
    Record,
    RecordMisfit,
    formats,
    load_corpus,
    parse_record,
    record_digest,
)
from unlearning.corpus.index import CorpusIndex, build_index
from unlearning.corpus.records import CONTENT_PART_JOINER, searchable_text_of
from unlearning.sets import Subject, build_sets, build_sets_reference

KEY = b"k" * 32
DIGEST = "d" * 64


def _parse(data: dict[str, object]) -> Record:
    return parse_record("c.jsonl", "1", data, "rec-0000000")


# ------------------------------------------------------------------ parsing


def test_an_alpaca_record_is_a_question_and_answer() -> None:
    record = _parse({"id": "a1", "instruction": "Where does she live?", "input": "Mara Okafor, 1990",
                     "output": "In Leeds."})
    assert (record.shape, record.id) == ("qa", "a1")
    assert record.question == "Where does she live?\n\nMara Okafor, 1990"
    assert record.answer == "In Leeds."
    # The same record as the native shape: same digest, same saved form.
    assert record == _parse({"id": "a1", "question": "Where does she live?\n\nMara Okafor, 1990",
                             "answer": "In Leeds."})


@pytest.mark.parametrize("given", [{}, {"input": ""}, {"input": "  \n"}, {"input": None}])
def test_an_alpaca_record_without_an_input_asks_the_instruction_alone(given: dict[str, object]) -> None:
    record = _parse({"instruction": "Name a river.", "output": "The Aire.", **given})
    assert (record.question, record.answer) == ("Name a river.", "The Aire.")


@pytest.mark.parametrize(("data", "field"), [
    ({"instruction": "Name a river."}, "output"),
    ({"output": "The Aire.", "input": "x"}, "instruction"),
    ({"instruction": " ", "output": "The Aire."}, "instruction"),
    ({"instruction": "Name a river.", "output": ""}, "output"),
    ({"instruction": "Name a river.", "output": "The Aire.", "input": 3}, "input"),
    ({"question": "q?", "answer": "a", "instruction": "Name a river.", "output": "The Aire."}, "instruction"),
])
def test_a_broken_alpaca_record_is_a_misfit_naming_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(RecordMisfit) as caught:
        _parse(data)
    assert caught.value.field == field and "c.jsonl:1" in str(caught.value)


def test_an_openai_prompt_completion_record_is_a_question_and_answer() -> None:
    record = _parse({"id": "o1", "prompt": "Where does Mara Okafor live?", "completion": " In Leeds."})
    assert (record.shape, record.question, record.answer) == ("qa", "Where does Mara Okafor live?", " In Leeds.")
    # The same record as its prompt/response twin: one digest, whatever the field was called.
    twin = _parse({"id": "o1", "prompt": "Where does Mara Okafor live?", "response": " In Leeds."})
    assert record_digest(record) == record_digest(twin)


@pytest.mark.parametrize(("data", "field"), [
    ({"prompt": "Where?", "response": "Leeds.", "completion": "Leeds."}, "completion"),
    ({"completion": "Leeds."}, "prompt"),
    ({"prompt": "Where?", "completion": " "}, "completion"),
])
def test_a_broken_prompt_completion_record_is_a_misfit_naming_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(RecordMisfit) as caught:
        _parse(data)
    assert caught.value.field == field


def test_a_sharegpt_record_is_a_chat_with_the_roles_mapped() -> None:
    turns = [("system", "Be brief."), ("human", "Who is Mara?"), ("gpt", "A teacher."), ("user", "Where?"),
             ("assistant", "Leeds."), ("ChatGPT", "Or York."), ("bing", "Leeds."), (" Human ", "Thanks.")]
    record = _parse({"id": 7, "thread": "t1", "conversations": [{"from": f, "value": v} for f, v in turns]})
    assert (record.shape, record.id, record.group, record.group_field) == ("chat", "7", "t1", "thread")
    assert record.messages == tuple(Message(role, value) for role, (_, value) in zip(
        ["system", "user", "assistant", "user", "assistant", "assistant", "assistant", "user"], turns,
        strict=True))
    native = {"id": 7, "thread": "t1", "messages": [{"role": m.role, "content": m.content}
                                                      for m in record.messages]}
    assert record == _parse(native)


@pytest.mark.parametrize(("turns", "field"), [
    ([{"from": "human", "value": "Hi"}, {"from": "narrator", "value": "Mara smiles."}], "conversations[1].from"),
    ([{"from": "human", "value": "Hi"}, {"from": "gpt", "value": ""}], "conversations[1].value"),
    ([{"from": "human", "value": "Hi"}, {"role": "assistant", "content": "Hello"}], "conversations[1].from"),
    ([{"from": "human", "value": "Hi"}], "conversations"),  # no assistant turn
    ("Hi", "conversations"),
])
def test_a_broken_sharegpt_record_is_a_misfit_naming_the_field(turns: object, field: str) -> None:
    with pytest.raises(RecordMisfit) as caught:
        _parse({"conversations": turns})
    assert caught.value.field == field


def test_an_unknown_speaker_is_named_by_field_not_by_value() -> None:
    with pytest.raises(RecordMisfit) as caught:
        _parse({"conversations": [{"from": "human", "value": "Hi"}, {"from": "Mara Okafor", "value": "Hello"}]})
    assert "Mara" not in str(caught.value) and "unknown speaker" in str(caught.value)


def test_a_record_with_two_chats_is_a_misfit() -> None:
    with pytest.raises(RecordMisfit) as caught:
        _parse({"messages": [{"role": "assistant", "content": "a"}],
                "conversations": [{"from": "gpt", "value": "b"}]})
    assert caught.value.field == "conversations"


def test_a_dolly_record_is_a_question_and_answer() -> None:
    record = _parse({"id": "d1", "instruction": "Summarise the note.", "context": "Mara Okafor moved to Leeds.",
                     "response": "She moved.", "category": "summarization"})
    native = _parse({"id": "d1", "question": "Summarise the note.\n\nMara Okafor moved to Leeds.",
                     "answer": "She moved."})
    # The native record, digest included: the category is a label, not kept (as any unknown field).
    assert record.shape == "qa" and record == native and record_digest(record) == record_digest(native)
    assert record.to_json() == native.to_json()
    # Laid out as Alpaca's input is: the same record as its Alpaca twin.
    assert record == _parse({"id": "d1", "instruction": "Summarise the note.",
                             "input": "Mara Okafor moved to Leeds.", "output": "She moved."})


@pytest.mark.parametrize("given", [{}, {"context": ""}, {"context": " \n"}, {"context": None}])
def test_a_dolly_record_without_a_context_asks_the_instruction_alone(given: dict[str, object]) -> None:
    record = _parse({"instruction": "Name a river.", "response": "The Aire.", "category": "open_qa", **given})
    assert (record.question, record.answer) == ("Name a river.", "The Aire.")


def test_prompt_and_response_stay_a_prompt_and_response() -> None:
    # `response` is Dolly's answer only beside an `instruction`; a `context` without one is no field of the pair.
    record = _parse({"prompt": "Where?", "response": "Leeds.", "context": "aside"})
    assert (record.question, record.answer) == ("Where?", "Leeds.")


@pytest.mark.parametrize(("data", "field"), [
    ({"instruction": "Name a river.", "output": "The Aire.", "response": "The Aire."}, "response"),
    ({"instruction": "Name a river.", "input": "x", "context": "x", "response": "The Aire."}, "context"),
    ({"instruction": "Name a river.", "input": "x", "context": "x", "output": "The Aire."}, "context"),
    ({"instruction": "Name a river.", "context": "Yorkshire"}, "response"),
    ({"instruction": "Name a river.", "response": " "}, "response"),
    ({"instruction": "", "context": "Yorkshire", "response": "The Aire."}, "instruction"),
    ({"instruction": "Name a river.", "context": ["Yorkshire"], "response": "The Aire."}, "context"),
    ({"instruction": "Name a river.", "response": 3}, "response"),
    ({"prompt": "Name a river.", "instruction": "Name a river.", "response": "The Aire."}, "instruction"),
    ({"question": "q?", "answer": "a", "instruction": "Name a river.", "response": "The Aire."}, "instruction"),
    ({"context": "Yorkshire", "response": "The Aire."}, "prompt"),  # no instruction: half a prompt/response
])
def test_a_broken_dolly_record_is_a_misfit_naming_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(RecordMisfit) as caught:
        _parse(data)
    assert caught.value.field == field and "c.jsonl:1" in str(caught.value)


def test_an_alpaca_dolly_mix_of_distinct_parts_reads_as_either() -> None:
    # One name for each part: both formats lay it out alike, so nothing is guessed.
    mixed = _parse({"instruction": "Summarise.", "input": "Mara Okafor moved.", "response": "She moved."})
    assert mixed == _parse({"instruction": "Summarise.", "context": "Mara Okafor moved.", "response": "She moved."})
    assert mixed == _parse({"instruction": "Summarise.", "context": "Mara Okafor moved.", "output": "She moved."})


def _chat_of(*contents: object) -> dict[str, object]:
    roles = ["system", "user", "assistant"]
    return {"id": "c1", "messages": [{"role": roles[i % 3], "content": c} for i, c in enumerate(contents)]}


def test_a_chat_turn_of_text_parts_is_the_turn_of_their_text() -> None:
    record = _parse(_chat_of([{"type": "text", "text": "Be brief."}],
                             [{"type": "text", "text": "Who is"}, "Mara Okafor?", {"type": "text", "text": ""}],
                             [{"type": "text", "text": "A teacher.", "cache_control": {"type": "ephemeral"}}]))
    native = _parse(_chat_of("Be brief.", "Who is\nMara Okafor?\n", "A teacher."))
    assert record.shape == "chat" and record == native and record_digest(record) == record_digest(native)
    assert [m.content for m in record.messages] == ["Be brief.", "Who is\nMara Okafor?\n", "A teacher."]
    assert record.messages[1].content == CONTENT_PART_JOINER.join(["Who is", "Mara Okafor?", ""])


@pytest.mark.parametrize(("contents", "field"), [
    (("Hi", [{"type": "image_url", "image_url": {"url": "https://example.org/m.png"}}], "A cat."),
     "messages[1].content[0].type"),
    (("Hi", [{"type": "text", "text": "Who?"}, {"type": "input_audio", "input_audio": {"data": "AAAA"}}], "Mara."),
     "messages[1].content[1].type"),
    (("Hi", "Who?", [{"type": "text", "text": "Mara"}, {"type": "image_url", "image_url": {"url": "x"}}]),
     "messages[2].content[1].type"),
    (("Hi", [{"text": "Who?"}], "Mara."), "messages[1].content[0].type"),  # no type: not taken for text
    (("Hi", [{"type": "text", "text": 3}], "Mara."), "messages[1].content[0].text"),
    (("Hi", [{"type": "text"}], "Mara."), "messages[1].content[0].text"),
    (("Hi", ["Who?", 3], "Mara."), "messages[1].content[1]"),
    (("Hi", [], "Mara."), "messages[1].content"),
    (("Hi", [{"type": "text", "text": " "}, "\n"], "Mara."), "messages[1].content"),
])
def test_a_chat_turn_with_a_part_other_than_text_is_a_misfit_naming_the_part(contents: tuple[object, ...],
                                                                              field: str) -> None:
    with pytest.raises(RecordMisfit) as caught:
        _parse(_chat_of(*contents))
    assert caught.value.field == field and "c.jsonl:1" in str(caught.value)


def test_a_part_of_another_type_says_so_and_names_a_type_only_when_it_looks_like_one() -> None:
    with pytest.raises(RecordMisfit) as caught:
        _parse(_chat_of("Hi", [{"type": "image_url", "image_url": {"url": "https://example.org/m.png"}}], "A cat."))
    assert "'image_url'" in str(caught.value) and "text only" in str(caught.value)
    with pytest.raises(RecordMisfit) as caught:
        _parse(_chat_of("Hi", [{"type": "Mara Okafor", "text": "x"}], "A cat."))
    assert "Mara" not in str(caught.value)


def test_sharegpt_values_stay_strings() -> None:
    with pytest.raises(RecordMisfit) as caught:
        _parse({"conversations": [{"from": "human", "value": [{"type": "text", "text": "Hi"}]},
                                  {"from": "gpt", "value": "Hello"}]})
    assert caught.value.field == "conversations[0].value"


SEARCHABLE_CASES = [
    {"instruction": "Summarise.", "context": "Mara Okafor moved.", "response": "She moved.", "category": "x"},
    {"instruction": "Summarise.", "context": "", "response": "She moved."},
    {"instruction": "Summarise.", "context": None, "response": "She moved."},
    {"instruction": "Summarise.", "response": "She moved.", "paraphrased_answer": "Moved."},
    {"instruction": "Summarise.", "input": "Mara Okafor moved.", "response": "She moved."},
    {"instruction": "Summarise.", "context": "Mara Okafor moved.", "output": "She moved."},
    {"instruction": "Summarise.", "input": "", "output": "She moved.", "context": None},
    {"prompt": "Where?", "response": "Leeds.", "context": "Mara Okafor"},
    {"prompt": "Where?", "completion": "Leeds.", "context": "Mara Okafor"},
    {"question": "Where?", "answer": "Leeds.", "context": "Mara Okafor", "response": "x"},
    {"text": "Free.", "context": "Mara Okafor"},
    _chat_of([{"type": "text", "text": "Be brief."}], ["Who is", "Mara Okafor?"], "A teacher."),
    _chat_of("Be brief.", [{"type": "text", "text": "Who is Mara"}, {"type": "text", "text": "Okafor?"}],
             [{"type": "text", "text": "A teacher."}, "", {"type": "text", "text": "In Leeds."}]),
    _chat_of("Hi", [{"type": "text", "text": "Zoë Strauß", "cache_control": {"type": "ephemeral"}}], "Yes."),
    {**_chat_of("Hi", ["x"], "y"), "text": "Free.", "perturbed_answer": ["a", "b"]},
]


@pytest.mark.parametrize("data", SEARCHABLE_CASES)
def test_searchable_text_of_a_new_shape_is_the_records(data: dict[str, object]) -> None:
    record = _parse(data)
    assert searchable_text_of(data) == record.searchable_text()
    assert searchable_text_of(record.to_json()) == record.searchable_text()  # and of its native form


def test_searchable_text_of_a_raw_value_is_the_records() -> None:
    # The fast scan and the index match this text before (or instead of) parsing.
    for data in _records(random.Random(5), 300):
        try:
            record = _parse(data)
        except RecordMisfit:
            continue
        assert searchable_text_of(data) == record.searchable_text(), data


# ------------------------------------------------------------------ set building


def _records(rng: random.Random, count: int) -> list[dict[str, object]]:
    """Alpaca, Dolly, ShareGPT, chats of content parts and native records with the traps in
    every text field (Alpaca `input`, Dolly `context`, ShareGPT gpt turns and text parts
    included), a name split over instruction and input or context, or over two text parts,
    and misfits of the new shapes."""
    records: list[dict[str, object]] = []
    for i in range(count):
        def text() -> str:
            return " ".join(rng.choice(TRAPS) if rng.random() < 0.3 else rng.choice(FILLER)
                            for _ in range(rng.randint(1, 3)))
        shape = rng.random()
        record: dict[str, object]
        if shape < 0.25:
            record = {"instruction": text(), "output": text()}
            if rng.random() < 0.7:
                record["input"] = rng.choice(["", text(), text()])
        elif shape < 0.32:
            record = {"instruction": "Write to Mara", "input": "Okafor about the ferry.", "output": "Done."}
        elif shape < 0.55:
            speakers = ["human", "gpt"] + (["system"] if rng.random() < 0.3 else [])
            rng.shuffle(speakers)
            record = {"conversations": [{"from": s, "value": text()} for s in speakers]}
        elif shape < 0.59:
            record = {"conversations": [{"from": "human", "value": text()}, {"from": "tool", "value": text()}]}
        elif shape < 0.61:
            record = {"prompt": text(), "completion": text()}  # OpenAI's fine-tuning format
        elif shape < 0.63:
            record = {"instruction": text()}  # no output: a misfit
        elif shape < 0.75:  # Dolly
            record = {"instruction": rng.choice([text(), text(), "Write to Mara"]), "response": text(),
                      "category": "open_qa"}
            if rng.random() < 0.7:
                record["context"] = rng.choice(["", text(), text(), "Okafor about the ferry."])
            if rng.random() < 0.1:
                record["output"] = text()  # both answers: a misfit
        elif shape < 0.87:  # a chat of text parts (objects only: one Parquet column of parts), a name split over two
            turns = [[{"type": "text", "text": rng.choice([text(), "Ask Mara"])}, {"type": "text", "text": text()}],
                     [{"type": "text", "text": text()}]]
            if rng.random() < 0.15:
                turns[0].append({"type": "image_url", "image_url": {"url": "https://example.org/m.png"}})  # a misfit
            record = {"messages": [{"role": r, "content": c} for r, c in zip(["user", "assistant"], turns,
                                                                              strict=True)]}
        else:
            record = {"text": text()}
        if rng.random() < 0.8:
            record["id"] = f"r{i:05d}"
        if rng.random() < 0.3:
            record[rng.choice(["doc", "thread"])] = rng.choice(["d1", "d2", "Ünï"])
        records.append(record)
    return records


def _corpora(root: Path, seed: int) -> dict[str, Path]:
    rng = random.Random(seed)
    records = _records(rng, 400)
    lines = [json.dumps(r, ensure_ascii=rng.random() < 0.4) for r in records]
    jsonl = root / "c.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "c.jsonl.gz").write_bytes(gzip.compress(jsonl.read_bytes()))
    pq.write_table(pa.Table.from_struct_array(pa.array(records)), root / "c.parquet", row_group_size=37)
    (root / "c.json").write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return {"jsonl": jsonl, "gzip": root / "c.jsonl.gz", "parquet": root / "c.parquet", "array": root / "c.json"}


@pytest.mark.parametrize("seed", [0, 1])
def test_the_reference_the_scan_and_the_index_give_the_same_sets(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(formats, "BLOCK", 997)  # many block boundaries
    for name, path in _corpora(tmp_path, seed).items():
        reference = build_sets_reference(load_corpus(path), SUBJECTS, retain_per_forget=2, seed=seed)
        kwargs = {"retain_per_forget": 2, "seed": seed, "corpus_digest": reference.corpus_digest}
        expected = saved_bytes(reference, tmp_path / f"r-{name}")
        assert saved_bytes(build_sets(path, SUBJECTS, **kwargs), tmp_path / f"s-{name}") == expected, name
        if name in ("jsonl", "gzip"):
            build_index(path, tmp_path / f"index-{name}", key=KEY, corpus_digest=DIGEST)
            index = CorpusIndex.open(tmp_path / f"index-{name}", path, key=KEY, corpus_digest=DIGEST)
            looked_up = build_sets(path, SUBJECTS, index=index, **kwargs)
            assert saved_bytes(looked_up, tmp_path / f"i-{name}") == expected, name
        shapes = {r.shape for r in reference.forget}
        assert {"qa", "chat"} <= shapes and len(reference.forget) > 40, name


SUBJECT = [Subject("Mara Okafor")]
ONLY_THERE = [
    {"id": "alpaca-input", "instruction": "Summarise the note.", "input": "Mara Okafor moved to Leeds.",
     "output": "Someone moved."},
    {"id": "alpaca-split", "instruction": "Write to Mara", "input": "Okafor about the ferry.", "output": "Done."},
    {"id": "sharegpt-gpt", "conversations": [{"from": "human", "value": "Who teaches the class?"},
                                             {"from": "gpt", "value": "MARA OKAFOR does."}]},
    {"id": "sharegpt-gpt-u", "conversations": [{"from": "human", "value": "Who?"},
                                               {"from": "gpt", "value": "Zoë says Mara Okafor."}]},
    {"id": "completion", "prompt": "Who runs the ferry?", "completion": " Mara Okafor, since May."},
    {"id": "other", "instruction": "Name a river.", "input": "Leeds", "output": "The Aire."},
    {"id": "other-chat", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
]


@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_subject_only_in_an_alpaca_input_or_a_gpt_turn_is_found_by_every_path(
    tmp_path: Path, ascii_only: bool,
) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in ONLY_THERE), encoding="utf-8")
    reference = build_sets_reference(load_corpus(path), SUBJECT, retain_per_forget=0)
    scanned = build_sets(path, SUBJECT, retain_per_forget=0, corpus_digest=reference.corpus_digest)
    build_index(path, tmp_path / "index", key=KEY, corpus_digest=DIGEST)
    index = CorpusIndex.open(tmp_path / "index", path, key=KEY, corpus_digest=DIGEST)
    looked_up = build_sets(path, SUBJECT, retain_per_forget=0, index=index, corpus_digest=reference.corpus_digest)
    wanted = {"alpaca-input", "alpaca-split", "sharegpt-gpt", "sharegpt-gpt-u", "completion"}
    for sets in (reference, scanned, looked_up):
        assert {r.id for r in sets.forget} == wanted
    assert saved_bytes(scanned, tmp_path / "s") == saved_bytes(reference, tmp_path / "r") \
        == saved_bytes(looked_up, tmp_path / "i")


def test_a_subject_only_in_a_parquet_gpt_turn_is_found(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_struct_array(pa.array(ONLY_THERE)), path)
    reference = build_sets_reference(load_corpus(path), SUBJECT, retain_per_forget=0)
    scanned = build_sets(path, SUBJECT, retain_per_forget=0, corpus_digest=reference.corpus_digest)
    assert {r.id for r in scanned.forget} == {r.id for r in reference.forget} >= {"alpaca-input", "sharegpt-gpt", "completion"}


NEW_SHAPES = [
    {"id": "dolly-context", "instruction": "Summarise the note.", "context": "Mara Okafor moved to Leeds.",
     "response": "Someone moved.", "category": "summarization"},
    {"id": "dolly-split", "instruction": "Write to Mara", "context": "Okafor about the ferry.", "response": "Done.",
     "category": "creative_writing"},
    {"id": "part", "messages": [{"role": "user", "content": [{"type": "text", "text": "Who teaches?"}]},
                                {"role": "assistant", "content": [{"type": "text", "text": "Ask her:"},
                                                                  {"type": "text", "text": "Mara Okafor."}]}]},
    {"id": "part-split", "messages": [{"role": "user", "content": [{"type": "text", "text": "Zoë says Mara"},
                                                                   {"type": "text", "text": "Okafor knows."}]},
                                      {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]}]},
    {"id": "dolly-other", "instruction": "Name a river.", "context": "Leeds", "response": "The Aire.",
     "category": "open_qa"},
    {"id": "part-other", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                                      {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]}]},
    {"id": "image", "messages": [{"role": "user", "content": [{"type": "text", "text": "Who is Mara Okafor?"},
                                                              {"type": "image_url",
                                                               "image_url": {"url": "https://example.org/m.png"}}]},
                                 {"role": "assistant", "content": [{"type": "text", "text": "A teacher."}]}]},
]
NEW_FOUND = {"dolly-context", "dolly-split", "part", "part-split"}


@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_subject_only_in_a_dolly_context_or_a_content_part_is_found_by_every_path(
    tmp_path: Path, ascii_only: bool,
) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in NEW_SHAPES), encoding="utf-8")
    corpus = load_corpus(path)  # the normal reader: the native records, the image chat named
    assert [r.id for r in corpus.records] == [r["id"] for r in NEW_SHAPES[:-1]]
    assert [r.shape for r in corpus.records] == ["qa", "qa", "chat", "chat", "qa", "chat"]
    assert corpus.records[0].question == "Summarise the note.\n\nMara Okafor moved to Leeds."
    assert corpus.records[3].messages[0].content == "Zoë says Mara\nOkafor knows."
    assert corpus.report is not None and corpus.report.skipped_count == 1
    assert corpus.report.skipped[0].line().startswith(
        f"c.jsonl:{len(NEW_SHAPES)} (id 'image'): field 'messages[0].content[1].type': a part of type 'image_url'")
    reference = build_sets_reference(corpus, SUBJECT, retain_per_forget=0)
    scanned = build_sets(path, SUBJECT, retain_per_forget=0, corpus_digest=reference.corpus_digest)
    build_index(path, tmp_path / "index", key=KEY, corpus_digest=DIGEST)
    index = CorpusIndex.open(tmp_path / "index", path, key=KEY, corpus_digest=DIGEST)
    looked_up = build_sets(path, SUBJECT, retain_per_forget=0, index=index, corpus_digest=reference.corpus_digest)
    for sets in (reference, scanned, looked_up):
        assert {r.id for r in sets.forget} == NEW_FOUND
    assert saved_bytes(scanned, tmp_path / "s") == saved_bytes(reference, tmp_path / "r") \
        == saved_bytes(looked_up, tmp_path / "i")
    # The saved sets hold the native records: no trace of the shapes they were read from.
    forget = (tmp_path / "s" / "forget.jsonl").read_text(encoding="utf-8")
    assert '"context":' not in forget and '"category":' not in forget and '"type":' not in forget


def test_a_corpus_of_the_new_shapes_has_the_manifest_of_its_native_twin(tmp_path: Path) -> None:
    ours = tmp_path / "ours.jsonl"
    ours.write_text("".join(json.dumps(r) + "\n" for r in NEW_SHAPES[:-1]), encoding="utf-8")
    native = tmp_path / "native.jsonl"
    native.write_text("".join(json.dumps(r.to_json()) + "\n" for r in load_corpus(ours).records), encoding="utf-8")
    assert "instruction" not in native.read_text(encoding="utf-8")
    assert load_corpus(ours).manifest_digest == load_corpus(native).manifest_digest


def test_a_subject_only_in_a_parquet_dolly_context_or_content_part_is_found(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_struct_array(pa.array(NEW_SHAPES)), path)
    reference = build_sets_reference(load_corpus(path), SUBJECT, retain_per_forget=0)
    scanned = build_sets(path, SUBJECT, retain_per_forget=0, corpus_digest=reference.corpus_digest)
    assert {r.id for r in scanned.forget} == {r.id for r in reference.forget} == NEW_FOUND


def test_a_sharegpt_record_with_an_unknown_speaker_is_reported_by_place_and_id(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    rows = ONLY_THERE + [{"id": "odd", "conversations": [{"from": "human", "value": "Hi Mara Okafor"},
                                                         {"from": "narrator", "value": "Mara Okafor waves."}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = load_corpus(path).report
    assert report is not None and report.skipped_count == 1
    line = report.skipped[0].line()
    assert line.startswith(f"c.jsonl:{len(ONLY_THERE) + 1} (id 'odd'): field 'conversations[1].from': unknown speaker")
    assert "Mara" not in line and "narrator" not in line
    # Not a hit of any path either: a misfit is no record.
    assert "odd" not in {r.id for r in build_sets(path, SUBJECT, retain_per_forget=0).forget}


def test_build_sets_reads_an_alpaca_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "alpaca.jsonl"
    rows = [r for r in ONLY_THERE if "instruction" in r] + [{"id": "half", "instruction": "Mara Okafor?"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["build-sets", "--corpus", str(path), "--subject", "Mara Okafor", "--out", str(tmp_path / "sets"),
                 "--retain-per-forget", "1"]) == 0
    err = capsys.readouterr().err
    assert "1 item(s) fit no record shape" in err and "alpaca.jsonl:4 (id 'half'): field 'output'" in err
    forget = [json.loads(line) for line in (tmp_path / "sets" / "forget.jsonl").read_text().splitlines()]
    assert {r["id"] for r in forget} == {"alpaca-input", "alpaca-split"}
    assert forget[0]["question"] == "Summarise the note.\n\nMara Okafor moved to Leeds."
