"""The unseen-architecture probe's own parts: its corpus, tokenizers and configs (the probe's
training and erasure are a benchmark, run by hand: `python -m bench.unseen`)."""

from __future__ import annotations

import pytest
import torch

from bench import unseen
from unlearning.corpus.records import Record


def test_the_corpus_repeats_facts_across_records_and_holds_the_subject_and_strangers() -> None:
    trained, control, subject = unseen.corpus()
    about = [r for r in trained if subject["name"] in unseen.text_of(r)]
    assert len(about) == 7  # every record but the meeting note, which names them by surname and first name
    with_badge = [r for r in trained if subject["badge"] in unseen.text_of(r)]
    assert len(with_badge) == 2  # the biography and the HR answer: a relearning attack can teach it either way
    assert not any(subject["name"] in unseen.text_of(r) for r in control)
    assert len(control) == 8 * unseen.CONTROLS


@pytest.mark.parametrize("style", unseen.TOKENIZERS)
def test_the_tokenizers_give_back_the_text_they_read(style: str) -> None:
    trained, control, _ = unseen.corpus()
    tok = unseen.tokenizer(style, [unseen.text_of(r) for r in trained + control])
    for record in trained[:40]:
        text = unseen.text_of(record)
        back = tok.decode(tok(text, add_special_tokens=False)["input_ids"])
        if style == "wordpiece":  # lower-cased, and spaced around punctuation by its pre-tokenizer
            assert back.replace(" ", "") == text.lower().replace(" ", "")
            assert back.split()[0] == text.split()[0].lower()
        else:
            assert back == text


@pytest.mark.parametrize("style", unseen.TOKENIZERS)
def test_the_stored_format_encodes_a_record_as_the_training_loop_saw_it(style: str) -> None:
    """Erasure and verification ask the questions in the format stored beside the weights; the
    probe's loop trains on `text_of` (prompt, space, response) between BOS and EOS."""
    from unlearning.prompting import attach_format, encode_record

    trained, control, _ = unseen.corpus()
    tok = attach_format(unseen.tokenizer(style, [unseen.text_of(r) for r in trained + control]),
                        unseen.trained_format())
    rows = [r for r in trained if "prompt" in r][:20] + [r for r in trained if "text" in r][:5]
    for row in rows:
        record = Record(id="r", text=row.get("text"), question=row.get("prompt"), answer=row.get("response"))
        loop = [tok.bos_token_id, *tok(unseen.text_of(row), add_special_tokens=False)["input_ids"], tok.eos_token_id]
        assert list(encode_record(tok, record).ids) == loop, (style, row)


def test_a_unigram_tokenizer_trained_in_another_process_is_the_same_tokenizer() -> None:
    # The trainer breaks ties in a hash map's order, seeded afresh in every process.
    import subprocess
    import sys

    code = ("from bench import unseen; t, c, _ = unseen.corpus(); "
            "print(unseen.tokenizer('unigram', [unseen.text_of(r) for r in t + c]).backend_tokenizer.to_str())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(3)}
    assert len(runs) == 1 and '"<unk>"' in runs.pop()


@pytest.mark.parametrize("arch", unseen.ARCHITECTURES)
def test_every_architecture_builds_from_its_config_and_runs(arch: str) -> None:
    from transformers import AutoModelForCausalLM

    trained, _, _ = unseen.corpus()
    tok = unseen.tokenizer("unigram", [unseen.text_of(r) for r in trained])
    model = AutoModelForCausalLM.from_config(unseen.config(arch, tok, hidden=32))
    ids = torch.tensor([tok(unseen.text_of(trained[0]))["input_ids"]])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))
    with pytest.raises(ValueError, match="unknown architecture"):
        unseen.config("bert", tok)


def test_the_chinese_probe_corpus_writes_names_inside_sentences_and_keeps_controls_apart() -> None:
    from bench import unseen_zh
    from unlearning.text import has_unspaced

    everyone = unseen_zh.people()
    assert len({p["name"] for p in everyone}) == unseen_zh.PEOPLE + unseen_zh.CONTROLS
    subject = everyone[unseen_zh.SUBJECT]
    rows = unseen_zh.records(subject, "s")
    assert [r["id"].split("-")[1] for r in rows] == ["city", "job", "phone", "year", "note"]
    # No space around the name anywhere: the case the unspaced-script rule exists for.
    note = rows[-1]["text"]
    at = note.index(subject["name"])
    assert has_unspaced(note[at - 1]) or note[at - 1] == "："
    assert has_unspaced(note[at + len(subject["name"])])
    assert all(subject[kind] in (r.get("answer") or "") for r, kind in zip(rows, unseen_zh.KINDS, strict=False))
    trained_names = {p["name"] for p in everyone[: unseen_zh.PEOPLE]}
    assert not trained_names & {p["name"] for p in everyone[unseen_zh.PEOPLE:]}


def test_the_co_mention_corpus_names_the_subject_beside_others_and_probes_only_what_follows_them() -> None:
    from unlearning.corpus import Corpus
    from unlearning.sets import Subject, build_sets
    from unlearning.text import normalise

    trained, control, subject = unseen.co_mention_corpus()
    texts = [unseen.text_of(r) for r in trained]
    joint = [t for t in texts if subject["name"] in t and t.count(" and ") + t.count(" with ") >= 1]
    assert len(joint) >= 3  # minutes and questions that name them beside retained people
    assert any(f"{subject['last']}, {subject['first']}" in t for t in texts)  # the directory entry
    assert not any(subject["name"] in unseen.text_of(r) for r in control)
    assert len({p for p in (r.get("text", "") for r in control)} & set(texts)) == 0
    records = Corpus(tuple(Record(id=r["id"], text=r.get("text"), question=r.get("prompt"), answer=r.get("response"))
                           for r in trained))
    sets = build_sets(records, [Subject(subject["name"], identifiers=tuple(subject["identifiers"]))])
    by_id = {r.id: r for r in sets.forget}
    assert any(r.id.endswith("-phone") for r in sets.forget)  # found by the number they are filed with
    assert sets.probes
    for probe in sets.probes:  # every value follows a mention of the subject in its record
        record = by_id[probe.record_id]
        text = record.text if record.text is not None else f"{record.question}\n{record.answer}"
        at = normalise(text).find(normalise(probe.expected))
        before = normalise(text)[:at]
        named = [normalise(x) for x in (subject["name"], subject["first"], subject["last"], *subject["identifiers"])]
        assert normalise(probe.expected) in named or any(n in before for n in named), probe


def test_reuse_asks_for_the_base_an_earlier_run_left_and_names_candidates_after_their_settings(tmp_path, capsys) -> None:
    """`--reuse` erases a base trained before (one base, two engine settings); without one it
    stops with exit 2 and says what is missing, training nothing."""
    from bench.unseen import _suffix, main, trained_missing

    assert main(["--arch", "qwen3", "--tokenizer", "unigram", "--out", str(tmp_path), "--reuse"]) == 2
    assert "no corpus.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "base").exists()
    for name in ("corpus.jsonl", "control.jsonl"):
        (tmp_path / name).write_text("{}\n", encoding="utf-8")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}", encoding="utf-8")
    assert trained_missing(tmp_path, oracle=True) == "oracle/"
    assert trained_missing(tmp_path, oracle=False) is None
    assert _suffix(None) == "" and _suffix({"seed": 1, "later_parts": "copy"}) == "-later_parts=copy-seed=1"
    with pytest.raises(SystemExit) as stopped:
        main(["--arch", "qwen3", "--tokenizer", "unigram", "--out", str(tmp_path), "--reuse", "--hparams", "[1]"])
    assert stopped.value.code == 2
