"""The inverted index gives byte-identical sets to the reference and to the fast scan.

The reference is `build_sets_reference` over a loaded corpus; the index finds candidate
records by keyed-hash look-up and matches only those.  The traps (`tests.scan_fixtures`:
NFKC compatibility forms, case folding such as ß/ẞ and İ, accents and combining marks,
RTL marks, zero-width characters, names split across fields and JSON escapes) must be
found by the index exactly as by the scan, groups and retain pool included.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.scan_fixtures import SUBJECTS, TRAPS, corpora, saved_bytes, trap_records, write_jsonl
from unlearning.corpus import formats, load_corpus, open_source
from unlearning.corpus import index as index_module
from unlearning.corpus.index import (
    TOKEN,
    CorpusIndex,
    IndexUnusable,
    build_index,
    key_tokens,
    text_tokens,
)
from unlearning.sets import Subject, build_sets, build_sets_reference
from unlearning.text import normalise, unspaced
from unlearning.text_matching import MultiMatcher

KEY = b"k" * 32
DIGEST = "d" * 64


def _index(path: Path, out: Path, *, key: bytes = KEY) -> CorpusIndex:
    build_index(path, out, key=key, corpus_digest=DIGEST)
    return CorpusIndex.open(out, path, key=key, corpus_digest=DIGEST)


def _keys_hit(matcher: MultiMatcher, text: str) -> set[str]:
    """The matcher's keys that hit `text` (the reference's own word-boundary rule)."""
    return {key for _, key in matcher._hits(normalise(text))}


def test_the_token_pattern_is_exactly_str_isalnum() -> None:
    # The superset argument rests on the index's tokens being runs of what the matcher's
    # word boundaries test: `str.isalnum`, for every code point; a character of an unspaced
    # script (where the matcher asks for no boundary) is a token of its own.
    chars = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)
    tokens = TOKEN.findall(chars)
    assert set("".join(tokens)) == {c for c in chars if c.isalnum()}
    assert all(len(t) == 1 for t in tokens if any(unspaced(c) for c in t))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_index_gives_byte_identical_sets_to_the_reference_and_the_scan(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(formats, "BLOCK", 997)  # many block boundaries, in the build and the re-reads
    monkeypatch.setattr(index_module, "FLUSH_POSTINGS", 500)  # many spills
    monkeypatch.setattr(index_module, "BUCKET_POSTINGS", 200)  # several buckets
    monkeypatch.setattr(index_module, "RANK_CHUNK", 37)  # the pool ranked in many chunks
    paths = corpora(tmp_path, seed)
    tombstoned = {"r00003", "r00010", "r00200"}
    for name, path in paths.items():
        index = _index(path, tmp_path / f"index-{name}")
        corpus = load_corpus(path)
        for per_forget in (0, 2):
            reference = build_sets_reference(corpus, SUBJECTS, retain_per_forget=per_forget, seed=seed,
                                             exclude_ids=tombstoned)
            kwargs = dict(retain_per_forget=per_forget, seed=seed, exclude_ids=tombstoned,
                          corpus_digest=reference.corpus_digest)
            scanned = build_sets(path, SUBJECTS, **kwargs)  # type: ignore[arg-type]
            looked_up = build_sets(path, SUBJECTS, index=index, **kwargs)  # type: ignore[arg-type]
            label = f"{name} per_forget={per_forget}"
            expected = saved_bytes(reference, tmp_path / f"r-{name}-{per_forget}")
            assert saved_bytes(looked_up, tmp_path / f"i-{name}-{per_forget}") == expected, label
            assert saved_bytes(scanned, tmp_path / f"s-{name}-{per_forget}") == expected, label
            assert looked_up.counts() == reference.counts(), label
        assert reference.counts()["forget_group"] > 0, name


def test_every_trap_is_a_candidate_of_its_key(tmp_path: Path) -> None:
    # Per record and per key: whenever the reference matcher finds a key in a record, the
    # index's look-up of that key alone lists the record (the superset, key by key).
    records = [{"id": f"t{i}", "text": f"Note: {trap}."} for i, trap in enumerate(TRAPS)]
    records += [{"id": f"q{i}", "question": f"Who is {trap[:len(trap) // 2]}", "answer": f"{trap[len(trap) // 2:]}!"}
                for i, trap in enumerate(TRAPS)]
    path = tmp_path / "traps.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 2 == 0) + "\n" for i, r in enumerate(records)),
                    encoding="utf-8")
    index = _index(path, tmp_path / "index")
    loaded = load_corpus(path)
    checked = 0
    for subject in SUBJECTS:
        matcher = MultiMatcher([subject.patterns()])
        for key in matcher.keys:
            listed = set(index.candidates([key]).tolist())  # type: ignore[union-attr]
            for number, record in enumerate(loaded.records):
                if key in _keys_hit(matcher, record.searchable_text()):
                    assert number in listed, (key, record.id)
                    checked += 1
    assert checked > 40


@pytest.mark.parametrize("text", [
    "\u200bMara Okafor\u200b", "Mara Okafor\u00ad", "\u200fMara Okafor\u200f", "\u202bLayla Haddad\u202c",
    "ZOË STRAUSS", "Zoe\u0308 Strauß", "ZOË STRAU\u1e9e", "\uff2d\uff41\uff52\uff41 \uff2f\uff4b\uff41\uff46\uff4f\uff52",
    "\u0130LKAY \u212aOFI", "ﬁ Mara Okafor ﬂ", "Mara Oka\u0301for", "ليلى  حداد", "mara.okafor@EXAMPLE.org\u200e",
])
def test_normalised_tokens_of_a_trap_hold_the_tokens_of_the_key_that_hits_it(text: str) -> None:
    hits = 0
    for subject in SUBJECTS:
        matcher = MultiMatcher([subject.patterns()])
        for key in _keys_hit(matcher, text):
            assert set(key_tokens(key)) <= text_tokens(text), (key, text)
            hits += 1
    assert hits


def test_an_ascii_line_with_an_escape_is_tokenised_from_its_parsed_text(tmp_path: Path) -> None:
    # `Mara\nOkafor` in the raw bytes is the run "nokafor"; the text's token is "okafor".
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "Mara\nOkafor"}) + "\n"
                    + json.dumps({"id": "b", "text": "plain"}) + "\n", encoding="utf-8")
    sets = build_sets(path, [SUBJECTS[0]], retain_per_forget=0, index=_index(path, tmp_path / "i"))
    assert [r.id for r in sets.forget] == ["a"]


def test_a_group_pulled_in_by_the_index_is_the_scans(tmp_path: Path) -> None:
    lines = [{"id": "1", "text": "Mara Okafor wrote this.", "doc": "Ünï"},
             {"id": "2", "text": "She said so.", "doc": "Ünï"},
             {"id": "3", "text": "She said so.", "doc": "\u00dcn\u00ef"},  # the same value, escaped
             {"id": "4", "text": "He said so.", "thread": "Ünï"},  # another field: another group
             {"id": "5", "text": "Nothing.", "doc": 7},
             {"id": "6", "text": "Ann Lee.", "source": 7},
             {"id": "7", "text": "x", "source": "7", "meta": {"doc": "Ünï"}}]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 2 == 1) + "\n" for i, r in enumerate(lines)),
                    encoding="utf-8")
    index = _index(path, tmp_path / "i")
    for subjects in ([SUBJECTS[0]], [SUBJECTS[2]], SUBJECTS):
        scanned = build_sets(path, subjects, retain_per_forget=0)
        looked_up = build_sets(path, subjects, retain_per_forget=0, index=index)
        assert saved_bytes(looked_up, tmp_path / "a") == saved_bytes(scanned, tmp_path / "b")
    assert sorted(r.id for r in build_sets(path, [SUBJECTS[2]], retain_per_forget=0, index=index).forget) == \
        ["6", "7"]


def test_tombstoned_records_are_left_out_as_the_scan_leaves_them(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", trap_records(5), 5)
    index = _index(path, tmp_path / "i")
    first = build_sets(path, SUBJECTS, retain_per_forget=2, index=index)
    drop = {r.id for r in first.forget[:5]} | {r.id for r in first.retain[:5]}
    scanned = build_sets(path, SUBJECTS, retain_per_forget=2, exclude_ids=drop)
    looked_up = build_sets(path, SUBJECTS, retain_per_forget=2, exclude_ids=drop, index=index)
    assert saved_bytes(looked_up, tmp_path / "a") == saved_bytes(scanned, tmp_path / "b")
    assert not drop & {r.id for r in looked_up.forget + looked_up.retain}


def test_a_key_without_letters_or_digits_falls_back_to_the_scan(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "call -- now"}, {"id": "b", "text": "x"}], 0)
    index = _index(path, tmp_path / "i")
    found = index.scan(path, [["--"]], seed=0, pool_size=lambda n: 0)
    assert found.method.startswith("scan") and [r.id for _, r, _ in found.hits] == ["a"]


def test_the_index_holds_no_token_in_plaintext_and_is_private(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", trap_records(3), 3)
    out = tmp_path / "i"
    _index(path, out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for file in out.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file.name
        data = file.read_bytes().lower()
        for word in (b"okafor", b"mara", b"strau", b"example", "حداد".encode()):
            assert word not in data, (file.name, word)


def test_a_stale_index_is_refused_saying_why(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", trap_records(4), 4)
    out = tmp_path / "i"
    build_index(path, out, key=KEY, corpus_digest=DIGEST)
    with pytest.raises(IndexUnusable, match="another key"):
        CorpusIndex.open(out, path, key=b"x" * 32, corpus_digest=DIGEST)
    with pytest.raises(IndexUnusable, match="another corpus digest"):
        CorpusIndex.open(out, path, key=KEY, corpus_digest="e" * 64)
    with pytest.raises(IndexUnusable, match="no index"):
        CorpusIndex.open(tmp_path / "nowhere", path, key=KEY, corpus_digest=DIGEST)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": "new", "text": "Mara Okafor"}) + "\n")
    with pytest.raises(IndexUnusable, match="changed"):
        CorpusIndex.open(out, path, key=KEY, corpus_digest=DIGEST)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["format"] = "corpus-index/0"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexUnusable, match="format"):
        CorpusIndex.open(out, path, key=KEY, corpus_digest=DIGEST)


def test_a_rebuild_replaces_the_index_atomically(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", trap_records(6), 6)
    out = tmp_path / "i"
    build_index(path, out, key=KEY, corpus_digest=DIGEST)
    manifest = build_index(path, out, key=KEY, corpus_digest=DIGEST)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "i"]
    assert manifest["records"] == len(load_corpus(path)) + sum(
        1 for line in path.read_text().splitlines() if '"misfit"' in line)
    keys = np.fromfile(out / "keys.bin", dtype="<u8")
    starts = np.fromfile(out / "starts.bin", dtype="<u8").astype(np.int64)
    postings = np.fromfile(out / "postings.bin", dtype="<u4").astype(np.int64)
    assert np.all(keys[1:] > keys[:-1]) and starts[-1] == len(postings) == manifest["postings"]
    rises = np.diff(postings) > 0  # strictly increasing within each key's list (look-ups rely on it)
    rises[starts[1:-1] - 1] = True
    assert rises.all()


def test_a_line_with_a_bom_and_crlf_ends_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "text": "Mara Okafor"}\r\n\r\n{"text": "Ann Lee"}\r\n')
    index = _index(path, tmp_path / "i")
    looked_up = build_sets(path, SUBJECTS[:3], retain_per_forget=1, index=index)
    scanned = build_sets(path, SUBJECTS[:3], retain_per_forget=1)
    assert saved_bytes(looked_up, tmp_path / "a") == saved_bytes(scanned, tmp_path / "b")
    assert sorted(r.id for r in looked_up.forget) == ["a", "rec-0000001"]


def test_a_directory_of_mixed_shards_scans_the_ones_it_does_not_index(tmp_path: Path) -> None:
    paths = corpora(tmp_path, 9)
    index = _index(paths["shards"], tmp_path / "i")
    assert {s["name"]: s["indexed"] for s in index.manifest["shards"]} == \
        {"a.jsonl": True, "b.parquet": False, "c.jsonl.zst": True}
    found = index.scan(open_source(paths["shards"]), [s.patterns() for s in SUBJECTS], seed=0, pool_size=lambda n: 5)
    assert "1 shard(s) not indexed" in found.method
    subjects = [Subject("Mara Okafor")]
    assert saved_bytes(build_sets(paths["shards"], subjects, index=index), tmp_path / "a") == \
        saved_bytes(build_sets(paths["shards"], subjects), tmp_path / "b")
