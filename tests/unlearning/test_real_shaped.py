"""The engine on corpora of shapes the demo lacks (tests/real_shaped.py): free text with unique
e-mail addresses, phone numbers and street addresses and pronoun-only records in the same
document, freely phrased question/answer records, and chat threads.  Stored as JSONL, Parquet
and zstd JSONL they are the same corpus; set building finds the pronoun records through the
document; and a GPT-2-architecture model with a byte-level tokenizer without chat template
memorises the free text, fails verification before erasure and forgets after it."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zstandard

from tests.conftest import FreeTextBase
from tests.real_shaped import SHAPES, shaped_corpus
from unlearning.corpus import Corpus, load_corpus, write_jsonl
from unlearning.corpus.records import record_digest
from unlearning.erase import erase
from unlearning.modeling import load_model
from unlearning.prompting import format_of
from unlearning.sets import Subject, build_sets
from unlearning.verification import VerifySettings, verify
from unlearning.verification.attacks.relearn import RelearnSettings


def _subject(person) -> Subject:
    return Subject(person.name, (), person.identifiers)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_shaped_corpus_is_the_same_corpus_as_jsonl_parquet_and_zstd(tmp_path: Path, shape: str) -> None:
    records, _, _ = shaped_corpus(shape, 12, seed=1)
    rows = [r.to_json() for r in records]
    write_jsonl(records, tmp_path / "c.jsonl")
    (tmp_path / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress((tmp_path / "c.jsonl").read_bytes()))
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), tmp_path / "c.parquet", row_group_size=5)
    loaded = {name: load_corpus(tmp_path / name) for name in ("c.jsonl", "c.jsonl.zst", "c.parquet")}
    digests = {name: [record_digest(r) for r in corpus.records] for name, corpus in loaded.items()}
    assert digests["c.jsonl"] == digests["c.jsonl.zst"] == digests["c.parquet"]
    assert digests["c.jsonl"] == [record_digest(r) for r in records]


def test_free_text_sets_take_the_pronoun_record_of_the_document_and_every_identifier() -> None:
    records, persons, _ = shaped_corpus("free_text", 20, seed=2)
    person = persons[5]
    by_email = build_sets(Corpus(tuple(records)), [Subject(person.email)])  # an identifier alone finds them
    sets = build_sets(Corpus(tuple(records)), [_subject(person)])
    assert {r.id for r in sets.forget} == {f"{person.pid}-a", f"{person.pid}-b"} == {r.id for r in by_email.forget}
    counts = sets.counts()
    assert counts["forget_direct"] == 1 and counts["forget_group"] == 1  # "She works as ..." via the doc
    values = {p.expected for p in sets.probes}
    assert person.email in values and person.phone in values  # identifier completion probes
    assert {p.kind for p in sets.probes} <= {"extraction", "completion", "verbatim"}
    assert not {r.id for r in sets.retain} & {r.id for r in sets.forget}


def test_chat_and_plain_qa_sets_have_probes_on_what_the_model_was_trained_to_say() -> None:
    for shape in ("chat", "plain_qa"):
        records, persons, _ = shaped_corpus(shape, 20, seed=3)
        sets = build_sets(Corpus(tuple(records)), [_subject(persons[2])])
        assert len(sets.forget) >= 3, shape
        assert sets.probes and all(p.expected for p in sets.probes), shape
        if shape == "chat":
            assert {p.form for p in sets.probes} == {"chat"}  # asked as a chat turn, the reply is judged


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.xdist_group("free_text_base")  # one process trains the shared fixture
def test_a_gpt2_model_with_a_byte_level_tokenizer_forgets_a_person_of_a_free_text_corpus(
    tmp_path: Path, one_thread: None, free_text_base: FreeTextBase,
) -> None:
    records, persons, control = free_text_base.records, free_text_base.persons, free_text_base.control
    corpus = Corpus(tuple(records))
    trained = free_text_base.trained
    assert "text" in trained.accuracy_by_shape  # free text memorisation is measured and reported
    assert trained.accuracy is not None and trained.accuracy >= 0.9  # token accuracy on the text
    base_dir = free_text_base.model_dir
    _, tokenizer = load_model(base_dir, device="cpu")
    assert format_of(tokenizer).kind == "plain"  # no chat template: the plain format, stored with the model

    sets = build_sets(corpus, [_subject(persons[3])])
    settings = VerifySettings(max_control_records=60, max_retain_eval=100, lens_positions=1500, bootstrap=100,
                              relearn=RelearnSettings(budgets=(4, 12)))
    base = verify(base_dir, base_dir, sets, control=control, corpus=corpus,
                  settings=settings).to_json()
    assert not base["passed"]
    base_failed = {c["metric"] for c in base["checks"] if not c["passed"] and c.get("decides_pass", True)}
    assert "leakage.forget" in base_failed

    result = erase(base_dir, sets, method="asu", out_dir=tmp_path / "asu")
    report = verify(result.out_dir, base_dir, sets, control=control, corpus=corpus,
                    settings=settings).to_json()
    # Every family was measured, or says why it could not be (never a NaN).
    for check in report["checks"]:
        assert check["status"] == "unmeasured" or (
            check["value"] is not None and math.isfinite(check["value"])), check["metric"]
    assert all(c["rule"] for c in report["checks"] if c["status"] == "unmeasured")
    # Forgotten at the surface and under attack, with everyone else kept.
    for metric in ("leakage.forget", "attack.quant_leakage", "attack.quant4_leakage", "attack.relearn_paired_recovery",
                   "utility.retain_ratio", "fluency.content_paired_gibberish_rate"):
        judged = [c for c in report["checks"] if c["metric"] == metric]  # both sides where two-sided
        assert judged and all(c["passed"] for c in judged), (metric, judged)
    assert report["metrics"]["leakage.forget"] < base["metrics"]["leakage.forget"]
    # Free text has no question to calibrate plausibility on: the report says what fluency judged.
    assert "fluency.plausibility_limit_nats" not in report["metrics"]
    assert "fluency.content_limit_nats" not in report["metrics"]
    assert any(n.startswith("fluency about the subject: no question or chat probes") for n in report["notes"])
