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


# Subjects whose every key is ASCII once normalised: the needles then fold only the
# non-ASCII lines that hold a needle or a character that may fold to a token's letter.
ASCII_SUBJECTS = [SUBJECTS[0], SUBJECTS[1], SUBJECTS[2], SUBJECTS[4]]
_EXTRA_LINES = ["Zo\u00eb wrote: \u00e9t\u00e9 \u00e0 Ath\u00e8nes", "\u041c\u0430\u0440\u0430 \u041e\u043a\u0430\u0444\u043e\u0440",
                "\uff2d\uff41\uff52\uff41 \uff2f\uff4b\uff41\uff46\uff4f\uff52 \u00fc", "\u00d8ster\u00f8 \u2460\u00b2",
                "\u212a\u00f8fi \u0130lkay", "St\u00e9 \u00e6 \u0153 \u0142\u00f0\u00fe", "Ma\u0301ra O\u0308kafor",
                "\u1e9e\u00df STRAU\u1e9e", "\ufb01\ufb02 \u3380 \u33cf", "\u0131lkay K\u00f6fi", "Ok\u00e0for"]


def _ascii_trap_records(seed: int, count: int) -> list[dict[str, object]]:
    rng = __import__("random").Random(seed)
    records = trap_records(seed, count)
    for i in range(count // 3):
        records.insert(rng.randrange(len(records)), {"id": f"x{i}", "text": " ".join(
            rng.choice(_EXTRA_LINES + TRAPS) for _ in range(rng.randint(1, 3)))})
    return records


@pytest.mark.parametrize(("seed", "subjects"), [(7, ASCII_SUBJECTS), (8, ASCII_SUBJECTS[:1]), (9, ASCII_SUBJECTS[1:2]),
                                                (10, ASCII_SUBJECTS[3:])])
def test_needles_fold_only_the_non_ascii_lines_that_may_hold_a_token_and_find_the_same_lines(
    tmp_path: Path, seed: int, subjects: list[Subject], monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", _ascii_trap_records(seed, 600), seed)
    monkeypatch.setattr(scan, "_DENSE", 1)  # never dense (the trap corpus is denser in non-ASCII bytes than text)
    folded: list[int] = []
    original = scan._lines_holding

    def spy(automaton: object, lines: _Lines, which: list[int], *args: object, **kwargs: object) -> list[int]:
        if kwargs.get("folded"):
            folded.extend(which)
        return original(automaton, lines, which, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scan, "_lines_holding", spy)
    with_needles = _candidates(path, subjects, True, monkeypatch)
    folded_with_needles = len(folded)
    folded.clear()
    # Without needles (a window lower-cased whole) the same restriction of the folding.
    without_needles = _candidates(path, subjects, False, monkeypatch)
    folded_without_needles = len(folded)
    folded.clear()
    monkeypatch.setattr(_Lines, "lines_folding_to", lambda self, alphabet: None)  # fold every non-ASCII line
    every = _candidates(path, subjects, False, monkeypatch)
    assert with_needles == without_needles == every
    assert folded_with_needles < len(folded), "the needles folded every non-ASCII line: the path was not taken"
    assert folded_without_needles < len(folded), "every non-ASCII line was folded without needles"
    assert len(with_needles) > 20


@pytest.mark.parametrize("subjects", [ASCII_SUBJECTS, ASCII_SUBJECTS[:1], ASCII_SUBJECTS[3:]])
def test_the_fast_scan_of_ascii_keys_gives_byte_identical_sets_to_the_reference(
    tmp_path: Path, subjects: list[Subject], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(formats, "BLOCK", 1499)
    monkeypatch.setattr(scan, "NEEDLES", True)
    monkeypatch.setattr(scan, "_DENSE", 1)
    path = write_jsonl(tmp_path / "c.jsonl", _ascii_trap_records(11, 500), 11)
    reference = build_sets_reference(load_corpus(path), subjects, retain_per_forget=2, seed=3)
    fast = build_sets(path, subjects, retain_per_forget=2, seed=3, corpus_digest=reference.corpus_digest)
    assert saved_bytes(fast, tmp_path / "f") == saved_bytes(reference, tmp_path / "r")
    assert fast.forget_digest == reference.forget_digest and fast.retain_digest == reference.retain_digest
    assert len(fast.forget) > 10


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet=_TRAP_CHARACTERS, min_size=1, max_size=24), min_size=1, max_size=12),
       st.sampled_from([0, 1, 2, 3]))
def test_needles_and_folding_every_line_agree_on_lines_full_of_traps(texts: list[str], which: int) -> None:
    keys = MultiMatcher([ASCII_SUBJECTS[which].patterns()]).keys
    block = "".join(json.dumps({"text": t + " mara okafor " * (i % 2)}, ensure_ascii=False) + "\n"
                    for i, t in enumerate(texts)).encode("utf-8")
    found = []
    for needles in (True, False):
        scan.NEEDLES, scan._DENSE = needles, 1  # never dense: the needles read every non-ASCII byte
        try:
            found.append(Prefilter(keys, phrases=True).candidate_lines(_Lines(block)))
        finally:
            scan.NEEDLES, scan._DENSE = None, 64
    assert found[0] == found[1]


def test_what_a_character_may_fold_to_covers_every_canonical_composition() -> None:
    # `_folds_to` is read character by character; normalisation composes a starter with
    # the marks after it.  Every non-ASCII starter of a canonical decomposition, next to
    # every mark or second part of one, gives no ASCII letter or digit that the two
    # characters' `_folds_to` lack, and vanishes only where one of them may (`_vanishes`);
    # nor does any character alone.
    from unlearning.corpus.scan import _folds_to, _vanishes

    def ascii_of(text: str) -> set[str]:
        return {c for c in normalise(text) if c.isascii() and c.isalnum()}

    starters, seconds = set(), set()
    for code in range(0x80, 0x110000):
        char = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue
        decomposition = unicodedata.decomposition(char)
        if decomposition and not decomposition.startswith("<"):
            parts = [chr(int(part, 16)) for part in decomposition.split()]
            if not parts[0].isascii():
                starters.add(parts[0])
            seconds.update(parts[1:])
        if unicodedata.combining(char):
            seconds.add(char)
        if decomposition or char.casefold() != char or char in "\u00f8\u00e6\u0153\u0142\u0111\u00f0\u00fe\u0131":
            assert ascii_of(char) <= _folds_to(code), hex(code)
        if not normalise(char):
            assert _vanishes(code), hex(code)
    assert len(starters) > 300 and len(seconds) > 900
    for first in sorted(starters):
        for second in sorted(seconds):
            pair = first + second
            assert ascii_of(pair) <= _folds_to(ord(first)) | _folds_to(ord(second)), (hex(ord(first)), hex(ord(second)))
            assert normalise(pair) or _vanishes(ord(first)) or _vanishes(ord(second)), (hex(ord(first)), hex(ord(second)))


def test_a_line_that_is_not_utf8_fails_the_needle_scan_as_it_fails_the_reference(tmp_path: Path) -> None:
    good = [json.dumps({"id": f"g{i}", "text": f"Filler {i} \u00fc"}, ensure_ascii=False).encode() for i in range(50)]
    bad = b'{"id": "bad", "text": "Filler \xff\xfe here"}'
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join([*good[:20], bad, *good[20:]]) + b"\n")
    with pytest.raises(Exception) as reference:  # noqa: PT011 (the reference's own error, whatever it is)
        build_sets_reference(load_corpus(path, strict=True), ASCII_SUBJECTS[:1])
    for needles in (True, False, None):
        scan.NEEDLES = needles
        try:
            with pytest.raises(type(reference.value)):
                build_sets(path, ASCII_SUBJECTS[:1])
        finally:
            scan.NEEDLES = None


def test_a_pending_line_built_by_of_is_the_one_the_constructor_builds() -> None:
    from unlearning.corpus.scan import Pending

    fast, built = Pending.of("c.jsonl", "3", b'{"text": "x"}', "a:", 2), Pending("c.jsonl", "3", b'{"text": "x"}', "a:", 2)
    assert fast == built and hash(fast) == hash(built) and list(vars(fast).items()) == list(vars(built).items())
    assert fast.record() == built.record() and fast.default_id == "a:rec-0000002"


@pytest.mark.parametrize("dense", [1, 64, 1 << 20])
def test_a_window_dense_with_non_ascii_bytes_finds_the_same_lines_and_sets(
    tmp_path: Path, dense: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Greek and Cyrillic filler between the traps: about one byte in three over 0x7f, so
    # every window is dense (its non-ASCII lines all folded) at 64 and 1 << 20, none at 1.
    rng = __import__("random").Random(dense)
    filler = ["\u0397 \u03b2\u03c1\u03bf\u03c7\u03ae \u03c3\u03c4\u03b1\u03bc\u03ac\u03c4\u03b7\u03c3\u03b5.",
              "\u0414\u043e\u0436\u0434\u044c \u0448\u0451\u043b \u0432\u0435\u0441\u044c \u0434\u0435\u043d\u044c."]
    records = _ascii_trap_records(dense, 300)
    for record in records:
        if "text" in record:
            record["text"] = f"{rng.choice(filler)} {record['text']} {rng.choice(filler)}"
    path = write_jsonl(tmp_path / "c.jsonl", records, dense)
    monkeypatch.setattr(scan, "_DENSE", dense)
    assert _candidates(path, ASCII_SUBJECTS, True, monkeypatch) == _candidates(path, ASCII_SUBJECTS, False, monkeypatch)
    monkeypatch.setattr(scan, "NEEDLES", True)
    reference = build_sets_reference(load_corpus(path), ASCII_SUBJECTS[:1], seed=2)
    fast = build_sets(path, ASCII_SUBJECTS[:1], seed=2, corpus_digest=reference.corpus_digest)
    assert saved_bytes(fast, tmp_path / "f") == saved_bytes(reference, tmp_path / "r")
