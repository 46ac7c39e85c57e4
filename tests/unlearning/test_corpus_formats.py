"""Every corpus format reads to the same records and the same manifest digest."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from unlearning.corpus import (
    CorpusError,
    Record,
    formats,
    inspect_corpus,
    iter_positioned,
    load_corpus,
    record_digest,
)

RECORDS = [
    {"id": "t1", "doc": "d-1", "text": "Zoë Quist wrote to zoe.quist@example.org from Århus."},
    {"id": "t2", "doc": "d-1", "text": "She moved there in 2019; the author says so."},
    {"id": "q1", "question": "Where was Ana Ruiz born?", "answer": "Ana Ruiz was born in Quito.",
     "perturbed_answer": ["Lima.", "Cali."], "meta": {"attribute": "birthplace"}},
    {"id": "c1", "thread": "th-7", "messages": [
        {"role": "user", "content": "Who is on call?"},
        {"role": "assistant", "content": "Dana Whitlock, +44 20 7946 0123."}]},
    {"id": "p1", "prompt": "Name a river.", "response": "The Tagus.", "meta": {"kind": "general", "n": 2}},
]


def _jsonl(records: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def _arrow_table(records: list[dict[str, object]]) -> pa.Table:
    """One schema over all records (from_pylist alone would take the first row's keys)."""
    return pa.Table.from_struct_array(pa.array(records))


def write_every_format(root: Path, records: list[dict[str, object]]) -> dict[str, Path]:
    """The same records as JSONL, JSON array, {"records"}, gzip, zstd, Parquet, Arrow, HF dir."""
    root.mkdir(parents=True, exist_ok=True)
    out = {
        "jsonl": root / "c.jsonl", "array": root / "c.json", "records_object": root / "o.json",
        "gzip": root / "c.jsonl.gz", "zstd": root / "c.jsonl.zst", "parquet": root / "c.parquet",
        "arrow": root / "c.arrow",
    }
    out["jsonl"].write_bytes(_jsonl(records))
    out["array"].write_text(json.dumps(records, indent=2, ensure_ascii=False), encoding="utf-8")
    out["records_object"].write_text(json.dumps({"version": 1, "info": {"records": "no"}, "records": records}),
                                     encoding="utf-8")
    out["gzip"].write_bytes(gzip.compress(_jsonl(records)))
    out["zstd"].write_bytes(zstandard.ZstdCompressor().compress(_jsonl(records)))
    pq.write_table(_arrow_table(records), out["parquet"], row_group_size=2)
    with pa.OSFile(str(out["arrow"]), "wb") as sink, pa.ipc.new_stream(sink, _arrow_table(records).schema) as writer:
        writer.write_table(_arrow_table(records), max_chunksize=2)
    hf = root / "hf"
    hf.mkdir()
    half = len(records) // 2
    for number, part in enumerate((records[:half], records[half:])):
        with pa.OSFile(str(hf / f"data-0000{number}-of-00002.arrow"), "wb") as sink, \
                pa.ipc.new_stream(sink, _arrow_table(records).schema) as writer:
            writer.write_table(pa.Table.from_pylist(part, schema=_arrow_table(records).schema))
    (hf / "state.json").write_text(json.dumps({"_data_files": [
        {"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}]}))
    (hf / "dataset_info.json").write_text("{}")
    out["hf"] = hf
    shards = root / "shards"
    (shards / "part-b").mkdir(parents=True)
    (shards / "part-a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl(records[:2])))
    pq.write_table(_arrow_table(records[2:4]), shards / "part-b" / "x.parquet")
    (shards / "part-c.json").write_text(json.dumps(records[4:]))
    (shards / "README.md").write_text("not a shard")
    out["shards"] = shards
    return out


def test_every_format_gives_the_same_records_and_manifest_digest(tmp_path: Path) -> None:
    paths = write_every_format(tmp_path, RECORDS)
    reference = load_corpus(paths["jsonl"])
    assert [r.shape for r in reference.records] == ["text", "text", "qa", "chat", "qa"]
    assert (reference.records[0].group, reference.records[3].group_field) == ("d-1", "thread")
    for name, path in paths.items():
        corpus = load_corpus(path)
        assert [record_digest(r) for r in corpus.records] == [record_digest(r) for r in reference.records], name
        assert corpus.manifest_digest == reference.manifest_digest, name
        info = inspect_corpus(path)
        assert (info.manifest_digest, info.records) == (reference.manifest_digest, len(RECORDS)), name
    assert load_corpus(paths["shards"]).report.ignored_files == ("README.md",)


def test_json_arrays_and_jsonl_stream_in_small_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_every_format(tmp_path, RECORDS)
    reference = load_corpus(paths["jsonl"]).manifest_digest
    monkeypatch.setattr(formats, "BLOCK", 7)
    for name in ("array", "records_object"):
        assert load_corpus(paths[name]).manifest_digest == reference
    blocks = list(formats.jsonl_blocks(load_corpus(paths["jsonl"]).report and
                                       formats.discover_shards(paths["jsonl"])[0][0], block=7))
    assert b"".join(b for _, b in blocks) == paths["jsonl"].read_bytes()


def test_positions_number_shards_apart_and_default_ids_name_the_shard(tmp_path: Path) -> None:
    root = tmp_path / "dir"
    root.mkdir()
    (root / "a.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
    (root / "b.jsonl").write_text('{"text": "three"}\n')
    pairs = list(iter_positioned(root))
    assert [p for p, _ in pairs] == [0, 2, 1 << formats.SHARD_BITS]
    assert [r.id for _, r in pairs] == ["a.jsonl:rec-0000000", "a.jsonl:rec-0000001", "b.jsonl:rec-0000000"]


def test_a_duplicate_id_across_shards_names_both_places(tmp_path: Path) -> None:
    root = tmp_path / "dir"
    root.mkdir()
    (root / "a.jsonl").write_text('{"id": "x", "text": "one"}\n')
    pq.write_table(_arrow_table([{"id": "y", "text": "t"}, {"id": "x", "text": "two"}]), root / "b.parquet")
    for read in (load_corpus, inspect_corpus):
        with pytest.raises(CorpusError, match=r"b.parquet:row 1: field 'id': duplicate id 'x' \(first at .*a.jsonl:1\)"):
            read(root)


def test_a_row_that_fits_no_shape_is_named_by_shard_and_row(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(_arrow_table([{"id": "a", "text": "fine"}, {"id": "b", "text": None},
                                 {"id": "c", "text": "fine too"}]), path)
    corpus = load_corpus(path)
    assert [r.id for r in corpus.records] == ["a", "c"]
    assert [s.line() for s in corpus.report.skipped] == [
        "c.parquet:row 1 (id 'b'): field 'text': missing: a record needs 'text', 'question'+'answer' or 'messages'; "
        "its fields: id"]
    assert inspect_corpus(path).report.skipped_count == 1


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("c.jsonl.gz", b"not gzip at all", "not a readable gzip file"),
    ("c.jsonl.zst", b"not zstd at all", "not a readable zstd file"),
    ("c.parquet", b"PAR1 nope", "not a readable Parquet file"),
    ("c.arrow", b"nope", "not a readable Arrow file"),
    ("c.json", b'[{"text": "a"},\n {"text": "b" oops}]', r"c.json:2: invalid JSON"),
    ("c.json", b'{"records": 5}', "field 'records': expected a JSON array"),
    ("c.json", b'[{"text": "a"}', "ends too early"),
    ("c.jsonl", b'{"text": "a"}\n\xff\xfe\n', r"c.jsonl:2: (not UTF-8|invalid JSON)"),
])
def test_an_unreadable_file_is_an_error_naming_it_and_the_reason(
    tmp_path: Path, name: str, content: bytes, reason: str,
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=reason) as caught:
        load_corpus(path)
    assert name in str(caught.value)
    with pytest.raises(CorpusError, match=reason):
        inspect_corpus(path)


def test_a_dataset_folder_naming_a_missing_shard_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-0.arrow"}]}))
    with pytest.raises(CorpusError, match=r"data-0.arrow:0: file not found"):
        load_corpus(tmp_path)
    with pytest.raises(CorpusError, match="no corpus files"):
        load_corpus(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else tmp_path)


def test_records_written_back_keep_their_digest_through_parquet() -> None:
    record = Record(id="x", text="t", meta={"a": 1})
    table = _arrow_table([record.to_json(), {"id": "y", "text": "u", "meta": {"b": "c"}}])
    rows = table.to_pylist()
    assert rows[0]["meta"] == {"a": 1, "b": None}  # why columnar readers drop nulls
    assert formats._drop_nulls(rows[0]) == record.to_json()


@pytest.mark.parametrize("block", [1, 7, 4096, 5000])
@pytest.mark.parametrize("content", [
    b"", b"\n", b'{"a": 1}', b'\xef\xbb\xbf{"a": 1}\n{"b": 2}', b'{"a": 1}\n\n  \t\n{"b": 2}\n',
    b"x" * 9000 + b"\n" + b"y" * 3 + b"\n" + b"z" * 10000,  # lines longer than a window
    b"\r\n".join(b'{"n": %d}' % i for i in range(3000)) + b"\r\n",
])
def test_mapped_windows_hold_the_lines_the_block_reader_reads(tmp_path: Path, content: bytes, block: int) -> None:
    from unlearning.corpus import formats

    path = tmp_path / "c.jsonl"
    path.write_bytes(content)
    shard = formats.discover_shards(path)[0][0]
    windows = [bytes(data[start:stop]) for data, start, stop in formats.jsonl_windows(shard, block=block)]
    blocks = [data for _, data in formats.jsonl_blocks(shard, block=block)]
    assert b"".join(windows) == b"".join(blocks) == content.removeprefix(b"\xef\xbb\xbf")
    assert all(w.endswith(b"\n") for w in windows[:-1])  # whole lines only


FLAT = [
    {"id": "t1", "doc": "d-1", "text": "Zoë Quist wrote to zoe.quist@example.org from Århus, \"quoted\"."},
    {"id": "t2", "doc": "d-1", "text": "She moved there in 2019;\nthe author says so."},
    {"id": "q1", "question": "Where was Ana Ruiz born?", "answer": "Ana Ruiz was born in Quito."},
    {"id": "p1", "prompt": "Name a river.", "response": "The Tagus."},
    {"id": "42", "question": "What is 6 x 7?", "answer": "42"},
]


def _delimited(records: list[dict[str, str]], path: Path, delimiter: str) -> Path:
    import csv

    fields = sorted({k for r in records for k in r})
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, delimiter=delimiter)
        writer.writeheader()
        writer.writerows(records)
    return path


@pytest.mark.parametrize(("name", "delimiter"), [("c.csv", ","), ("c.tsv", "\t")])
def test_csv_and_tsv_read_to_the_records_jsonl_gives(tmp_path: Path, name: str, delimiter: str) -> None:
    reference = load_corpus(_write(tmp_path / "c.jsonl", FLAT))
    corpus = load_corpus(_delimited(FLAT, tmp_path / name, delimiter))
    assert [record_digest(r) for r in corpus.records] == [record_digest(r) for r in reference.records]
    assert corpus.manifest_digest == reference.manifest_digest
    assert corpus.records[4].answer == "42"  # every cell is text: a numeric-looking column stays text
    assert corpus.records[1].text == FLAT[1]["text"]  # a quoted newline inside a cell


def test_sets_built_from_a_csv_are_the_sets_built_from_the_same_jsonl(tmp_path: Path) -> None:
    from unlearning.sets import Subject, build_sets

    records = [*FLAT, *({"id": f"x{i}", "text": f"Filler record {i} about the weather."} for i in range(30))]
    subjects = [Subject("Zoë Quist", identifiers=("zoe.quist@example.org",)), Subject("Ana Ruiz")]
    from_jsonl = build_sets(_write(tmp_path / "c.jsonl", records), subjects, seed=4)
    from_csv = build_sets(_delimited(records, tmp_path / "c.csv", ","), subjects, seed=4)
    assert [r.id for r in from_csv.forget] == [r.id for r in from_jsonl.forget] == ["t1", "t2", "q1"]
    assert from_csv.forget_digest == from_jsonl.forget_digest
    assert from_csv.retain_digest == from_jsonl.retain_digest


def test_a_csv_row_with_another_number_of_fields_is_an_error_that_does_not_quote_it(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("id,text\na,fine\nb,Dana Whitlock,+44 20 7946 0123\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"c.csv.*not a readable CSV file .*Expected 2 columns, got 3\)") as caught:
        load_corpus(path)
    assert "Whitlock" not in str(caught.value) and "7946" not in str(caught.value)
    (tmp_path / "d.csv").write_text("id,text,id\na,b,c\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="names a field twice"):
        load_corpus(tmp_path / "d.csv")


def _write(path: Path, records: list[dict[str, str]]) -> Path:
    path.write_bytes(_jsonl(records))  # type: ignore[arg-type]
    return path


def test_a_corpus_of_no_record_names_the_first_item_and_its_field_names_never_its_text(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "content": "Dana Whitlock lives in Turku.", "Dana Whitlock": 1}\n'
                    '{"id": "b", "content": "Mira Voss lives in Porto."}\n', encoding="utf-8")
    for read in (load_corpus, inspect_corpus):
        with pytest.raises(CorpusError) as caught:
            read(path)
        message = str(caught.value)
        assert "the corpus has no records (2 items fit no record shape; the first: c.jsonl:1 (id 'a')" in message
        assert message.endswith("its fields: content, id)")
        assert "Whitlock" not in message and "Turku" not in message
