"""`convert`: a corpus whose fields have other names, rewritten as the engine's records.

The output must be the corpus the engine would have read had the fields had its names:
the same records, ids (default ones included) and manifest digest, so that set building
on it gives byte-identical sets; misfits are named and not written; a refused conversion
leaves nothing behind.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.scan_fixtures import FILLER, SUBJECTS, TRAPS, saved_bytes
from unlearning.cli import main
from unlearning.corpus import inspect_corpus, load_corpus
from unlearning.corpus.convert import FieldMap, FieldMapError, convert_corpus
from unlearning.sets import build_sets

# ------------------------------------------------------------------ the field map


@pytest.mark.parametrize(("entries", "named"), [
    (["text"], "expected ENGINE_FIELD=SOURCE_FIELD"),
    (["=content"], "expected ENGINE_FIELD=SOURCE_FIELD"),
    (["text="], "expected ENGINE_FIELD=SOURCE_FIELD"),
    (["txt=content"], "'txt' is not a record field"),
    (["text=content", "text=body"], "'text' is mapped twice"),
    (["text=content", "answer=content"], "source field 'content' is mapped twice"),
    (["text=text"], "mapped to itself"),
])
def test_a_bad_field_map_is_refused_naming_the_entry(entries: list[str], named: str) -> None:
    with pytest.raises(FieldMapError, match=named):
        FieldMap.parse(entries)


def test_the_map_moves_values_replaces_same_named_fields_and_can_swap() -> None:
    fields = FieldMap.parse(["text=content", "id=doc_id"])
    assert fields.apply({"content": "a", "doc_id": 7, "text": "old", "lang": "en"}) == \
        {"text": "a", "id": 7, "lang": "en"}
    assert fields.apply({"doc_id": 7}) == {"id": 7}  # no source: no field (a misfit later)
    assert fields.apply(["not", "an", "object"]) == ["not", "an", "object"]
    swap = FieldMap.parse(["question=answer", "answer=question"])
    assert swap.apply({"question": "Leeds.", "answer": "Where?"}) == {"question": "Where?", "answer": "Leeds."}


# ------------------------------------------------------------------ conversion


def _items(rng: random.Random, count: int, *, native: bool, prefix: str = "") -> list[dict[str, object]]:
    """Free text and Dolly-style items (instruction/context/response) with the scan's traps,
    under the source's names, or (`native`) under the engine's."""
    def text() -> str:
        return " ".join(rng.choice(TRAPS) if rng.random() < 0.3 else rng.choice(FILLER) for _ in range(3))
    items: list[dict[str, object]] = []
    for i in range(count):
        if rng.random() < 0.5:
            item: dict[str, object] = {"body": text()}
        else:
            item = {"instruction": text(), "response": text(), "category": "open_qa"}
            if rng.random() < 0.6:
                item["context"] = text()
        if rng.random() < 0.5:
            item["uid"] = f"{prefix}u{i:04d}"
        items.append(item)
    if native:
        names = {"body": "text", "context": "input", "response": "output", "uid": "id"}
        items = [{names.get(k, k): v for k, v in item.items()} for item in items]
    return items


MAP = ["text=body", "input=context", "output=response", "id=uid"]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_a_converted_corpus_is_the_natively_named_one(tmp_path: Path, suffix: str) -> None:
    # Two Parquet shards (ids partly missing: the default ids carry the shard's name).
    for kind, native in (("source", False), ("native", True)):
        folder = tmp_path / kind
        folder.mkdir()
        for shard in range(2):
            rows = _items(random.Random(shard), 150, native=native, prefix=f"s{shard}-")
            columns = sorted({k for row in rows for k in row})  # absent fields as nulls (skipped on reading)
            pq.write_table(pa.Table.from_pylist([{k: row.get(k) for k in columns} for row in rows]),
                           folder / f"part-{shard}.parquet", row_group_size=41)
    out = tmp_path / f"converted{suffix}"
    done = convert_corpus(tmp_path / "source", out, fields=FieldMap.parse(MAP))
    native = load_corpus(tmp_path / "native")
    assert done.records == len(native) == 300 and done.report.skipped_count == 0
    assert [r.to_json() for r in load_corpus(out).records] == [r.to_json() for r in native.records]
    assert done.manifest_digest == inspect_corpus(out).manifest_digest == native.manifest_digest
    # Set building on it finds the forget set the natively named corpus gives, byte for byte,
    # with the same probes; the retain sample is drawn by position in the files, which one
    # file of 300 lines and two shards of 150 rows number differently.
    ours = saved_bytes(build_sets(out, SUBJECTS, retain_per_forget=2, seed=1), tmp_path / "ours")
    theirs = saved_bytes(build_sets(tmp_path / "native", SUBJECTS, retain_per_forget=2, seed=1), tmp_path / "theirs")
    assert ours["forget.jsonl"].count(b"\n") > 20
    for name in ("forget.jsonl", "probes.jsonl", "subjects.json"):
        assert ours[name] == theirs[name], name


def _write(path: Path, items: list[object]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


def test_the_command_names_what_it_skipped_and_writes_the_rest(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "in.jsonl", [{"uid": "a", "body": "Mara Okafor lives in Leeds."},
                                            {"uid": "b", "title": "Mara Okafor's diary"},
                                            {"uid": "c", "body": "Ann Lee writes."}])
    out = tmp_path / "out.jsonl.zst"
    assert main(["-q", "convert", "--corpus", str(source), "--out", str(out), "--field", "text=body",
                 "--field", "id=uid"]) == 0
    captured = capsys.readouterr()
    assert "wrote 2 records" in captured.out and inspect_corpus(out).manifest_digest in captured.out
    assert "1 item(s) fit no record shape" in captured.err and "in.jsonl:2 (id 'b')" in captured.err
    assert "diary" not in captured.err  # named by place and id, never by text
    assert [r.id for r in load_corpus(out).records] == ["a", "c"]


@pytest.mark.parametrize(("items", "argv", "argument", "says"), [
    ([{"body": "x"}], ["--field", "text=content"], "--corpus", "no records"),
    ([{"uid": "a", "body": "x"}, {"uid": "a", "body": "y"}], ["--field", "text=body", "--field", "id=uid"],
     "--corpus", "duplicate id 'a'"),
    ([{"body": "x"}], ["--field", "text"], "--field", "ENGINE_FIELD=SOURCE_FIELD"),
])
def test_a_refused_conversion_exits_2_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         items: list[object], argv: list[str], argument: str,
                                                         says: str) -> None:
    source = _write(tmp_path / "in.jsonl", items)
    out = tmp_path / "out.jsonl.gz"
    assert main(["-q", "convert", "--corpus", str(source), "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert f"error: {argument}: " in err and says in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no output, no partial file


@pytest.mark.parametrize(("out", "says"), [("out.parquet", "must end in"), ("in.jsonl", "exists"),
                                           ("missing/out.jsonl", "no such directory")])
def test_a_bad_output_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str,
                                        says: str) -> None:
    source = _write(tmp_path / "in.jsonl", [{"text": "x"}])
    assert main(["-q", "convert", "--corpus", str(source), "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert "error: --out: " in err and says in err
    assert source.read_text(encoding="utf-8") == '{"text": "x"}\n'


def test_a_corpus_under_other_names_points_to_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "in.jsonl", [{"content": "Mara Okafor lives in Leeds."}])
    assert main(["-q", "build-sets", "--corpus", str(source), "--subject", "Mara Okafor",
                 "--out", str(tmp_path / "sets")]) == 2
    err = capsys.readouterr().err
    assert "its fields: content" in err and "python -m unlearning convert --field text=FIELD" in err


def test_a_dolly_corpus_is_read_as_question_and_answer_as_its_conversion_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [{"instruction": "Summarise the note.", "context": "Mara Okafor moved to Leeds.",
             "response": "She moved.", "category": "summarization"},
            {"instruction": "Who runs the ferry?", "context": "", "response": "Mara Okafor.", "category": "open_qa"}]
    source = tmp_path / "dolly.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    # Read as it is: the name only in the first row's context is found by the fast Parquet scan.
    assert main(["-q", "build-sets", "--corpus", str(source), "--subject", "Mara Okafor",
                 "--out", str(tmp_path / "sets"), "--retain-per-forget", "0"]) == 0
    forget = [json.loads(line) for line in (tmp_path / "sets" / "forget.jsonl").read_text().splitlines()]
    assert [(r["question"], r["answer"]) for r in forget] == [
        ("Summarise the note.\n\nMara Okafor moved to Leeds.", "She moved."), ("Who runs the ferry?", "Mara Okafor.")]
    # Converted under Alpaca's names (as before Dolly was read) or as it is: the same records, the same digest.
    mapped, plain = tmp_path / "mapped.jsonl", tmp_path / "plain.jsonl"
    assert main(["-q", "convert", "--corpus", str(source), "--out", str(mapped),
                 "--field", "input=context", "--field", "output=response"]) == 0
    assert main(["-q", "convert", "--corpus", str(source), "--out", str(plain)]) == 0
    capsys.readouterr()
    records = load_corpus(mapped).records
    assert [(r.question, r.answer) for r in records] == [(r["question"], r["answer"]) for r in forget]
    assert [r.to_json() for r in load_corpus(plain).records] == [r.to_json() for r in records]
    assert inspect_corpus(mapped).manifest_digest == inspect_corpus(plain).manifest_digest \
        == inspect_corpus(source).manifest_digest


def test_inspect_counts_shapes_names_misfits_and_previews_a_conversion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    source = _write(tmp_path / "in.jsonl", [{"uid": "a", "body": "Mara Okafor lives in Leeds."},
                                            {"uid": "b", "title": "Mara Okafor's diary"},
                                            {"uid": "c", "prompt": "Who?", "completion": "Ann Lee."}])
    assert main(["inspect", "--corpus", str(source), "--field", "text=body", "--field", "id=uid"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 records (qa 1, text 1) in 1 shard(s) of jsonl; manifest digest ")
    assert "1 item(s) fit no record shape" in out and "in.jsonl:2 (id 'b')" in out and "diary" not in out
    # The preview's digest is the converted file's.
    assert main(["inspect", "--corpus", str(source), "--field", "text=body", "--field", "id=uid", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    converted = convert_corpus(source, tmp_path / "out.jsonl", fields=FieldMap.parse(["text=body", "id=uid"]))
    assert shown["manifest_digest"] == converted.manifest_digest
    assert (shown["records"], shown["shapes"], shown["field_map"]) == (2, {"qa": 1, "text": 1},
                                                                       {"text": "body", "id": "uid"})
    # Without the map nothing is a record but the completion: said, with the way out.
    assert main(["inspect", "--corpus", str(source)]) == 0
    assert capsys.readouterr().out.startswith("1 records (qa 1)")
    bare = _write(tmp_path / "bare.jsonl", [{"body": "x"}])
    assert main(["inspect", "--corpus", str(bare)]) == 2
    assert "python -m unlearning convert --field" in capsys.readouterr().err


def test_an_output_that_cannot_be_written_exits_2_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from unlearning.corpus import convert

    source = _write(tmp_path / "in.jsonl", [{"text": "x"}])

    def refused(path: Path, name: str) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(convert, "_writer", refused)
    assert main(["-q", "convert", "--corpus", str(source), "--out", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "error: --out: " in err and "Permission denied" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_a_meta_integer_beyond_64_bits_is_written_and_read_back(tmp_path: Path) -> None:
    source = _write(tmp_path / "in.jsonl", [{"body": "x", "meta": {"n": 2 ** 70}}])
    out = tmp_path / "out.jsonl"
    done = convert_corpus(source, out, fields=FieldMap.parse(["text=body"]))
    assert load_corpus(out).records[0].meta == {"n": 2 ** 70}
    assert done.manifest_digest == inspect_corpus(out).manifest_digest
