"""Names in scripts written without spaces (Chinese, Japanese, Thai) and in Korean, whose
particles attach to the name: found by set building, by every path alike.

Word-boundary matching found no record of "张伟" in "张伟住在北京" (the name and the
rest of the sentence are one run of letters), nor "김민준" in "김민준은 서울에 산다": an
erasure that silently missed the person's records.  The reference scan, the fast scan and
the index must find the same records.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from tests.scan_fixtures import saved_bytes, write_jsonl
from unlearning.cli import main
from unlearning.corpus import load_corpus
from unlearning.corpus.index import CorpusIndex, build_index, key_tokens, text_tokens
from unlearning.sets import Subject, build_sets, build_sets_reference
from unlearning.text import unspaced
from unlearning.text_matching import MultiMatcher

KEY = b"k" * 32
DIGEST = "d" * 64

SUBJECTS = [Subject("张伟", ("張偉",)), Subject("田中太郎"), Subject("김민준"), Subject("สมชาย ใจดี"),
            Subject("Ann Lee"), Subject("Mara Okafor", (), ("+86 138 0013 8000",))]
TRAPS = ["张伟住在北京，在一家银行工作。", "我昨天见到了张伟。", "張偉的電話", "张伟华是另一个人", "张 伟",
         "田中太郎は東京に住んでいます。", "ﾀﾅｶ", "田中さん", "김민준은 서울에 산다.", "김민준", "김민",
         "สมชาย ใจดีไปตลาด", "สมชายใจดี", "Ann Lee在上海", "Annabel Lee", "ann lee's", "Mara Okafor，+86 138 0013 8000",
         "Okafor田中", "Tanaka田中太郎x"]
FILLER = ["The ferry leaves at dusk.", "今天天气很好。", "서울은 크다.", "ตลาดเปิดแล้ว", "Rain over Århus."]


@pytest.mark.parametrize(("key", "text", "found"), [
    ("张伟", "张伟住在北京", True),
    ("张伟", "我昨天见到了张伟。", True),
    ("김민준", "김민준은 서울에 산다", True),
    ("田中太郎", "Tanaka田中太郎x", True),
    ("สมชาย", "สมชายไปตลาด", True),
    ("Okafor", "Okafor田中", True),  # a Latin name against an unspaced character: no boundary needed
    ("Ann", "Annabel", False),  # spaced scripts keep their word boundaries
    ("Ann", "JoAnn", False),
    ("Lee", "Leeds", False),
])
def test_no_word_boundary_is_asked_for_next_to_an_unspaced_script(key: str, text: str, found: bool) -> None:
    assert bool(MultiMatcher([[key]]).subjects_in(text)) is found


def test_unspaced_scripts_are_those_written_without_spaces_and_hangul() -> None:
    assert all(unspaced(c) for c in "张偉田ひカ김ก𠀋")
    assert not any(unspaced(c) for c in "aÅé1Я Ωش ")


def test_each_unspaced_character_is_a_token_of_its_own_in_the_index() -> None:
    assert key_tokens("张伟") == ["张".encode(), "伟".encode()]
    assert text_tokens("我见到了张伟。Tanaka田中") >= {"张".encode(), "伟".encode(), b"tanaka", "田".encode()}


def _corpus(root: Path, seed: int) -> dict[str, Path]:
    rng = random.Random(seed)
    records: list[dict[str, object]] = []
    for i in range(300):
        text = "".join(rng.choice(TRAPS) if rng.random() < 0.3 else rng.choice(FILLER)
                       for _ in range(rng.randint(1, 3)))
        shape = rng.random()
        record: dict[str, object] = (
            {"text": text} if shape < 0.5 else
            {"question": f"{rng.choice(TRAPS)}？", "answer": text} if shape < 0.8 else
            {"messages": [{"role": "user", "content": rng.choice(FILLER)}, {"role": "assistant", "content": text}]})
        if rng.random() < 0.7:
            record["id"] = f"r{i:04d}"
        if rng.random() < 0.3:
            record["doc"] = rng.choice(["d1", "文档", "d3"])
        records.append(record)
    jsonl = write_jsonl(root / "c.jsonl", records, seed)  # escaped and raw UTF-8 lines, blanks, a misfit
    (root / "c.jsonl.gz").write_bytes(gzip.compress(jsonl.read_bytes()))
    (root / "c.json").write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return {"jsonl": jsonl, "gzip": root / "c.jsonl.gz", "array": root / "c.json"}


@pytest.mark.parametrize("seed", [0, 1])
def test_the_reference_the_scan_and_the_index_find_the_same_records(tmp_path: Path, seed: int) -> None:
    for name, path in _corpus(tmp_path, seed).items():
        reference = build_sets_reference(load_corpus(path), SUBJECTS, retain_per_forget=2, seed=seed)
        assert all(reference.match_counts[:4]), name  # every unspaced-script subject is found
        kwargs = {"retain_per_forget": 2, "seed": seed, "corpus_digest": reference.corpus_digest}
        expected = saved_bytes(reference, tmp_path / f"r-{name}")
        assert saved_bytes(build_sets(path, SUBJECTS, **kwargs), tmp_path / f"s-{name}") == expected, name
        if name != "array":
            build_index(path, tmp_path / f"index-{name}", key=KEY, corpus_digest=DIGEST)
            index = CorpusIndex.open(tmp_path / f"index-{name}", path, key=KEY, corpus_digest=DIGEST)
            looked_up = build_sets(path, SUBJECTS, index=index, **kwargs)
            assert saved_bytes(looked_up, tmp_path / f"i-{name}") == expected, name


def test_a_chinese_name_inside_a_sentence_is_found_by_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [
        {"id": "1", "text": "张伟住在北京，在一家银行工作。"}, {"id": "2", "text": "李娜喜欢打网球。"},
        {"id": "3", "text": "我昨天见到了张伟。"}]), encoding="utf-8")
    assert main(["-q", "build-sets", "--corpus", str(corpus), "--subject", "张伟", "--out", str(tmp_path / "sets"),
                 "--retain-per-forget", "1"]) == 0
    assert [json.loads(line)["id"] for line in (tmp_path / "sets" / "forget.jsonl").read_text().splitlines()] \
        == ["1", "3"]


@pytest.mark.parametrize(("needle", "haystack", "at"), [
    ("张伟", "我昨天见到了张伟。", 6), ("김민준", "김민준은", 0), ("Ann", "Ann在上海", 0),
    ("Ann", "Annabel", -1), ("ann", "Zoë Ann", 4), ("Lee", "Ann Lee", 4),
])
def test_spans_are_found_by_the_same_rule(needle: str, haystack: str, at: int) -> None:
    # Probes and the unlearning targets locate a subject's names with `word_find`: the
    # records set building found must show the name there too.
    from unlearning.identifiers import word_find

    assert word_find(needle, haystack) == at


@pytest.mark.parametrize(("answer", "value", "leaked"), [
    ("他住在北京。", "北京", True), ("电话是13800138000。", "13800138000", True), ("김민준은 서울에 산다", "서울", True),
    ("Ann在上海", "Ann", True), ("他住在南京。", "北京", False),
    ("He lives in Lisbon.", "lisbon", True), ("Lisbonne", "Lisbon", False), ("Annabel在上海", "Ann", False),
])
def test_a_leaked_value_is_seen_in_an_answer_without_spaces(answer: str, value: str, leaked: bool) -> None:
    # The leakage checks look for the value in the model's answer: a check blind to a
    # Chinese answer would pass every model.
    from unlearning.verification.leakage import contains_value

    assert contains_value(answer, value) is leaked


def test_identifiers_written_straight_after_chinese_text_are_found_whole() -> None:
    from unlearning.identifiers import EMAIL, PHONE

    assert [m.group() for m in EMAIL.finditer("联系邮箱kim.lee@mail.example是他的")] == ["kim.lee@mail.example"]
    assert [m.group() for m in EMAIL.finditer("mail kim@example.com.")] == ["kim@example.com"]
    assert [m.group() for m in PHONE.finditer("电话是13800138000。")] == ["13800138000"]
    assert [m.group() for m in PHONE.finditer("ref x1234567y")] == []


def test_a_stranger_copy_replaces_a_chinese_name_inside_a_sentence() -> None:
    # The membership and latent checks compare a subject's records with the same records
    # about strangers: a copy that kept the subject's name made every comparison a tie
    # (Min-K%++ AUC exactly 0.5 for a base that had memorised the person).
    from unlearning.identifiers import replace_spans

    assert replace_spans("我昨天见到了张伟，他住在北京。", {"张伟": "李娜"}) == "我昨天见到了李娜，他住在北京。"
    assert replace_spans("Annabel met Ann.", {"Ann": "Zoë"}) == "Annabel met Zoë."


def test_bounded_asks_for_no_boundary_next_to_an_unspaced_character() -> None:
    import re

    from unlearning.text import bounded

    assert re.search(bounded("张伟"), "见到了张伟。") and re.search(bounded("Ann"), "Ann在上海")
    assert not re.search(bounded("Ann"), "Annabel") and not re.search(bounded("Ann"), "JoAnn")


def test_the_fast_patterns_for_spaced_text_match_what_the_unspaced_aware_ones_match() -> None:
    # Text without an unspaced character takes the plain patterns (faster): the same matches.
    import re

    from tests.scan_fixtures import FILLER as LATIN_FILLER
    from tests.scan_fixtures import TRAPS as LATIN_TRAPS
    from unlearning.identifiers import _SPACED_PATTERNS, PATTERNS
    from unlearning.text import bounded, has_unspaced, word_regex

    rng = random.Random(3)
    extra = ["mail kim.lee+x@mail-1.example.org.", "a@b.c", "call +44 (20) 7946-0123 now", "id 123456789",
             "x1234567y", "born 1998, 12 May 2001", "12 Kiln Close", "2024-01-02", "..k@x.io", "tel:5550199321"]
    texts = [" ".join(rng.choice(LATIN_TRAPS + LATIN_FILLER + extra) for _ in range(rng.randint(1, 5)))
             for _ in range(400)]
    texts = [t for t in texts if not has_unspaced(t)]
    for text in texts:
        for (kind, aware), (_, plain) in zip(PATTERNS, _SPACED_PATTERNS, strict=True):
            assert [m.span() for m in aware.finditer(text)] == [m.span() for m in plain.finditer(text)], (kind, text)
        for key in ("Ann", "Mara Okafor", "Zoë", "kim@example.com", "+44 20 7946 0123"):
            assert [m.span() for m in re.compile(bounded(key), re.IGNORECASE).finditer(text)] == \
                [m.span() for m in word_regex((key,), text).finditer(text)], (key, text)
    assert word_regex(("张伟",), "见到了张伟。").search("见到了张伟。")


def test_word_find_follows_word_patterns_rule_in_unspaced_text() -> None:
    import re

    from unlearning.identifiers import word_find
    from unlearning.text import bounded

    rng = random.Random(9)
    pieces = ["张伟", "张", "伟华", "Ann", "ann", "Lee", "김민준", "은", " ", "。", "x", "_", "AnnAnn", "Zoë", "ß", "SS"]
    for _ in range(500):
        haystack = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
        for key in ("张伟", "Ann", "김민준", "Lee", "Zoë", "ann lee"):
            match = re.compile(bounded(key), re.IGNORECASE).search(haystack)
            assert word_find(key, haystack) == (-1 if match is None else match.start()), (key, haystack)


@pytest.mark.parametrize("text", [
    "Ann Lee met ann lee-smith and ANN at Ann's; Annabel Lee and xAnn Lee_ do not count.",
    "Ørsted, ØRSTED and Ørstedt; ann.lee@mail.example is Ann Lee's; _Ann 1Ann",
    "张伟住在北京，Ann Lee 在东京; 김민준은 Ann이다",
    "",
])
def test_one_whole_word_pattern_matches_as_the_rule_of_bounded_with_or_without_unspaced_text(text: str) -> None:
    import re

    from unlearning.text import bounded, word_regex

    keys = ["Ann", "Ann Lee", "Ørsted", "张伟", "김민준", "Lee"]
    ruled = re.compile("|".join(bounded(k) for k in sorted(keys, key=len, reverse=True)), re.IGNORECASE)
    mine = word_regex(keys, text)
    assert [m.span() for m in mine.finditer(text)] == [m.span() for m in ruled.finditer(text)]
    latin = [k for k in keys if k.isascii() or k == "Ørsted"]
    assert [m.span() for m in word_regex(latin, text).finditer(text)] == \
        [m.span() for m in re.compile("|".join(bounded(k) for k in sorted(latin, key=len, reverse=True)),
                                      re.IGNORECASE).finditer(text)]


def test_the_whole_word_pattern_takes_the_longer_key_and_the_plain_form_where_nothing_is_unspaced() -> None:
    from unlearning.text import UNSPACED_RANGES, word_regex

    assert word_regex(["Ann", "Ann Lee"], "x").search("Ann Lee left").group() == "Ann Lee"
    assert UNSPACED_RANGES not in word_regex(["Ann"], "Ann Lee").pattern
    assert UNSPACED_RANGES in word_regex(["Ann"], "张伟 Ann").pattern
    assert word_regex(["张伟"], "Ann").pattern == "张伟"  # no boundary asked for either side
