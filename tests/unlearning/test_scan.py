"""The fast scan gives byte-identical sets to the reference scan, traps included.

The reference is `build_sets_reference` over a loaded corpus (every record parsed,
normalised and matched); the fast scan streams the file and parses only the lines its
byte-level prefilter cannot rule out.  Both are saved and compared file by file.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.scan_fixtures import SUBJECTS, TRAPS, corpora, saved_bytes, trap_records, write_jsonl
from unlearning import sets as sets_module
from unlearning.corpus import formats, load_corpus, open_source, scan
from unlearning.corpus.sampling import rank
from unlearning.corpus.scan import Prefilter, _Lines, fold, sample_records
from unlearning.sets import Subject, build_sets, build_sets_reference
from unlearning.text import normalise
from unlearning.text_matching import MultiMatcher


@pytest.mark.parametrize(("seed", "needles"), [(0, None), (1, True), (2, False)])
def test_the_fast_scan_gives_byte_identical_sets_to_the_reference(
    tmp_path: Path, seed: int, needles: bool | None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(formats, "BLOCK", 997)  # many block boundaries
    monkeypatch.setattr(scan, "NEEDLES", needles)  # auto, needles always, never
    paths = corpora(tmp_path, seed)
    tombstoned = {"r00003", "r00010", "r00200"}
    for name, path in paths.items():
        corpus = load_corpus(path)
        for per_forget in (0, 2):
            reference = build_sets_reference(corpus, SUBJECTS, retain_per_forget=per_forget, seed=seed,
                                             exclude_ids=tombstoned)
            fast = build_sets(path, SUBJECTS, retain_per_forget=per_forget, seed=seed, exclude_ids=tombstoned,
                              corpus_digest=reference.corpus_digest)
            label = f"{name} per_forget={per_forget}"
            assert saved_bytes(fast, tmp_path / f"f-{name}-{per_forget}") == \
                saved_bytes(reference, tmp_path / f"r-{name}-{per_forget}"), label
            assert fast.counts() == reference.counts(), label
            assert not tombstoned & {r.id for r in fast.forget + fast.retain}, label
        assert reference.counts()["forget_group"] > 0 and len(reference.forget) > 20, name


@pytest.mark.parametrize("needles", [True, False])
def test_the_traps_that_must_match_do_and_the_near_misses_do_not(
    tmp_path: Path, needles: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scan, "NEEDLES", needles)
    lines = [{"id": f"t{i}", "text": f"Note: {trap}."} for i, trap in enumerate(TRAPS)]
    path = tmp_path / "traps.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 2 == 0) + "\n" for i, r in enumerate(lines)),
                    encoding="utf-8")
    sets = build_sets(path, SUBJECTS, retain_per_forget=0)
    found = {TRAPS[int(r.id[1:])] for r in sets.forget}
    must = {"Mara Okafor", "MARA OKAFOR", "mara  okafor", "Mara\nOkafor", "Mara\tOkafor",
            "\uff2d\uff41\uff52\uff41 \uff2f\uff4b\uff41\uff46\uff4f\uff52", "\u200fMara Okafor\u200f",
            "M. Okafor", "MARA.OKAFOR@EXAMPLE.ORG", "+44 20 7946 0123", "+442079460123",
            "+44-20-7946-0123", "Zoë Strauß", "Zoe\u0308 Strauss", "ZOË STRAUSS", "Zoe Strauss",
            "zs@example.net", "Ann Lee", "ann lee's", "555-0199-321", "ليلى حداد",
            "ليلى  حداد", "Layla Haddad", "\u202bLayla Haddad\u202c", "İlkay Kofi", "\u0130LKAY \u212aOFI",
            "ilkay kofi", "ﬁ Mara Okafor ﬂ", "Mara Oka\u0301for", "Mara\u00a0Okafor", "Mara\u3000Okafor",
            "\uff2dara Okafor", "Zoe Strau\u00df", "\u0131lkay Kofi"}
    never = {"Okaforson", "Maraokafor", "Annabel Lee", "Leeann", "Zoë Straußberg", "Ilkay Kofiee",
             "+44 20 7946 01234", "Mara\u200dOkafor"}
    assert must <= found
    assert not never & found


def test_a_key_without_letters_or_digits_makes_every_line_a_candidate(tmp_path: Path) -> None:
    assert Prefilter(["@@", "ann lee"]).scan_all
    path = write_jsonl(tmp_path / "c.jsonl", trap_records(3, 120) + [{"id": "x", "text": "mail @@ me"}], 3)
    subjects = [Subject("Ann Lee", (), ("@@",))]
    reference = build_sets_reference(load_corpus(path), subjects, seed=1)
    fast = build_sets(path, subjects, seed=1, corpus_digest=reference.corpus_digest)
    assert saved_bytes(fast, tmp_path / "f") == saved_bytes(reference, tmp_path / "r")
    assert "x" in {r.id for r in fast.forget}


def test_a_partial_rank_threshold_finds_the_same_pool_as_ranking_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sets_module, "RETAIN_POOL_FACTOR", 1)
    monkeypatch.setattr(sets_module, "RETAIN_POOL_MIN", 0)
    monkeypatch.setattr(sets_module, "RETAIN_MINIMUM", 0)
    records = [{"id": f"g{i}", "text": f"Filler sentence number {i} about the weather."} for i in range(3000)]
    records += [{"id": "f1", "doc": "x", "text": "Mara Okafor lives here."}, {"id": "f2", "doc": "x", "text": "She does."}]
    path = write_jsonl(tmp_path / "big.jsonl", records, 0)
    reference = build_sets_reference(load_corpus(path), SUBJECTS[:1], retain_per_forget=3, seed=9)
    fast = build_sets(path, SUBJECTS[:1], retain_per_forget=3, seed=9, corpus_digest=reference.corpus_digest)
    assert saved_bytes(fast, tmp_path / "f") == saved_bytes(reference, tmp_path / "r")
    assert [r.id for r in fast.forget] == ["f1", "f2"] and fast.group_only == ("f2",)
    assert len(fast.retain) == 6


def test_sample_records_streams_the_lowest_ranked_records(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", trap_records(4, 300), 4)
    corpus = load_corpus(path)
    ranked = sorted(zip(corpus.position_list(), corpus.records, strict=True), key=lambda pr: rank(pr[0], 5))
    excluded = {ranked[0][1].id, ranked[3][1].id}
    expected = [r.id for _, r in ranked if r.id not in excluded][:25]
    assert [r.id for r in sample_records(path, 25, seed=5, exclude_ids=excluded)] == expected
    assert [r.id for r in sample_records(open_source(path), 25, seed=6)] != expected


def test_a_name_split_across_two_fields_is_found_as_the_reference_finds_it(tmp_path: Path) -> None:
    lines = [
        '{"id": "a", "question": "Who wrote to Mara", "answer": "Okafor did, in May."}',
        '{"answer": "Okafor did.", "id": "b", "question": "Who wrote to Mara "}',
        '{"id": "c", "messages": [{"role": "user", "content": "Was it M."}, {"role": "assistant", "content": "Okafor, yes."}]}',
        '{"id": "d", "text": "Nothing about anyone.", "perturbed_answer": ["Ann", "Lee was here"]}',
        '{"id": "e", "question": "Who wrote to Mara", "answer": "Nobody did."}',
    ]
    path = tmp_path / "split.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    reference = build_sets_reference(load_corpus(path), SUBJECTS, retain_per_forget=0)
    fast = build_sets(path, SUBJECTS, retain_per_forget=0, corpus_digest=reference.corpus_digest)
    assert [r.id for r in reference.forget] == ["a", "b", "c", "d"]
    assert saved_bytes(fast, tmp_path / "f") == saved_bytes(reference, tmp_path / "r")


_WORD = re.compile(r"[^\W_]+")


def _runs_lost_by_folding(texts: list[str]) -> list[tuple[str, str]]:
    """(text, run) for each run of word characters of `normalise(text)` that is not a
    substring of the text's fold: what would let the fast scan skip a line that matches."""
    folded = fold("\n".join(texts).encode("utf-8").lower()).decode("utf-8").split("\n")
    return [(text, run) for text, f in zip(texts, folded, strict=True)
            for run in _WORD.findall(normalise(text)) if run not in f]


def test_folding_keeps_every_word_that_normalisation_keeps_next_to_any_ascii_character() -> None:
    # Normalisation works character by character but for canonical composition (and the
    # reordering of marks), so a character can only change an ASCII neighbour's fate if
    # it is a mark or the second part of some canonical decomposition: try every such
    # code point on either side of every printable ASCII character.
    seconds = set()
    for code in range(0x80, 0x110000):
        char = chr(code)
        decomposition = unicodedata.decomposition(char)
        if decomposition and not decomposition.startswith("<"):
            seconds.update(chr(int(part, 16)) for part in decomposition.split()[1:])
        if unicodedata.combining(char):
            seconds.add(char)
    texts = [pair for second in sorted(seconds) for ascii_char in map(chr, range(0x20, 0x7F))
             for pair in (ascii_char + second, second + ascii_char) if "\n" not in pair]
    assert len(seconds) > 900
    assert _runs_lost_by_folding(texts) == []


_TRAP_CHARACTERS = ("abcdefghijklmnopqrstuvwxyzAKIOS0123456789 .@'`-\"\\/"
                    "\u0301\u0308\u0327\u0338\u0345\u0307\u00df\u0130\u0131\u212a\u00e9\u00c5\u00f8\u0153"
                    "\ufb01\ufb02\uff2d\uff41\u2460\u00b2\u00bd\u00a0\u2003\u3000\u200b\u200d\u200f\u202b"
                    "\u00ad\u2019\u2013\u0644\u064a\u0649\u064e\u0915\u093c\u1100\u1161\u00a8\u1e9e")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(alphabet=_TRAP_CHARACTERS, min_size=1, max_size=24), min_size=1, max_size=8))
def test_folding_keeps_every_word_that_normalisation_keeps_in_text_full_of_traps(texts: list[str]) -> None:
    assert _runs_lost_by_folding([t.replace("\n", " ") for t in texts]) == []


def test_non_ascii_lines_are_parsed_only_when_their_folded_text_holds_a_token(tmp_path: Path) -> None:
    records = trap_records(5, 400)
    path = write_jsonl(tmp_path / "c.jsonl", records, 5)
    block = path.read_bytes()
    lines = _Lines(block)
    escaped, _ = lines.escapes()
    non_ascii = set(lines.non_ascii()) - set(escaped)
    candidates = set(Prefilter(MultiMatcher([s.patterns() for s in SUBJECTS]).keys, phrases=True)
                     .candidate_lines(lines))
    assert non_ascii - candidates, "the fold ruled out no line: the test proves nothing"
    assert non_ascii & candidates
    reference = build_sets_reference(load_corpus(path), SUBJECTS, seed=5)
    fast = build_sets(path, SUBJECTS, seed=5, corpus_digest=reference.corpus_digest)
    assert saved_bytes(fast, tmp_path / "f") == saved_bytes(reference, tmp_path / "r")


def _candidates(path: Path, subjects: list[Subject], needles: bool, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    monkeypatch.setattr(scan, "NEEDLES", needles)
    prefilter = Prefilter(MultiMatcher([s.patterns() for s in subjects]).keys, phrases=True)
    found, first = [], 0
    for data, start, stop in formats.jsonl_windows(formats.discover_shards(path)[0][0], block=4096):
        lines = _Lines(data, start, stop)
        found += [first + k for k in prefilter.candidate_lines(lines)]
        first += lines.count
    return found


@pytest.mark.parametrize("seed", [3, 4, 5, 6])
def test_needles_find_the_same_candidate_lines_as_lower_casing_every_window(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", trap_records(seed, 600), seed)
    with_needles = _candidates(path, SUBJECTS, True, monkeypatch)
    assert with_needles == _candidates(path, SUBJECTS, False, monkeypatch)
    assert len(with_needles) > 50, "too few candidates: the comparison proves little"


def test_the_needles_are_used_where_they_pay_and_not_where_a_token_is_common(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = __import__("random").Random(0)
    words = ["river", "stone", "market", "window", "garden", "letter", "silver", "morning"]
    lines = [{"id": f"g{i}", "text": " ".join(rng.choice(words) for _ in range(12))} for i in range(3000)]
    lines[1500]["text"] += " Mara Okafor"
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    window = next(formats.jsonl_windows(formats.discover_shards(path)[0][0]))
    rare = Prefilter(MultiMatcher([SUBJECTS[0].patterns()]).keys, phrases=True)
    common = Prefilter(MultiMatcher([["Ann Stone"]]).keys, phrases=True)  # every token common
    assert rare.candidate_lines(_Lines(*window)) == [1500]
    assert {i for i, r in enumerate(lines) if "ann stone" in r["text"]} <= set(common.candidate_lines(_Lines(*window)))
    lowered = []
    monkeypatch.setattr(_Lines, "lower", lambda self: lowered.append(1) or bytes(self.view).lower())
    rare.candidate_lines(_Lines(*window))
    assert not lowered, "the rare name's needles should have spared lower-casing the window"
    common.candidate_lines(_Lines(*window))
    assert lowered, "the common name's needles hit too often to pay"
