"""Tokenizers the engine first met in a probe, each trained in the test (never downloaded):

- no end-of-sequence token (and no padding token): the model never learnt to stop, so an
  answer runs to its token budget;
- a chat template that requires a system message (or refuses the user role): a model
  without a stored prompt format is refused, naming the template's error, instead of being
  asked in plain text it was never trained on (where its leakage would go unseen);
- a chat template that renders, but not turn by turn: refused the same way unless the
  directory stores its format, instead of silently falling back to the plain layout;
- a candidate verified against a base with another tokenizer (vocabulary, special tokens,
  prompt format): refused naming both before anything is scored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import run_cli as _run
from tests.unlearning.test_unseen_shapes import (
    NO_SYSTEM_TEMPLATE,
    SUBJECT,
    _model_dir,
    _one_line_error,
    _tokenizer,
)

NEEDS_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ raise_exception('Conversations must start with a system message') }}{% endif %}"
    "{% for m in messages %}{{ '<start_of_turn>' + m['role'] + '\\n' + m['content'] + '<end_of_turn>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>assistant\\n' }}{% endif %}"
)


def _without(tokenizer: Any, *names: str) -> Any:
    for name in names:
        setattr(tokenizer, name, None)
        assert getattr(tokenizer, f"{name}_id") is None
    return tokenizer


def test_answers_and_completions_without_an_eos_token_run_to_their_budget(tmp_path: Path) -> None:
    from unlearning.modeling import complete_texts, generate_answers, load_model

    model, tokenizer = load_model(_model_dir(tmp_path, "llama", _without(_tokenizer(), "eos_token", "pad_token")),
                                  device="cpu")
    assert tokenizer.eos_token_id is None
    (answer,) = generate_answers(model, tokenizer, [f"Who is {SUBJECT}?"], max_new_tokens=6)
    (completion,) = complete_texts(model, tokenizer, [f"{SUBJECT} was born in"], max_new_tokens=6)
    for text in (answer, completion):
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= 3, text


def test_a_template_that_renders_one_user_question_is_not_refused() -> None:
    from unlearning.prompting import template_refusal

    assert template_refusal(_tokenizer(NO_SYSTEM_TEMPLATE)) is None  # refuses a system turn only: folded
    assert template_refusal(_tokenizer()) is None  # no template: the plain format
    assert "system message" in (template_refusal(_tokenizer(NEEDS_SYSTEM_TEMPLATE)) or "")


def test_erase_refuses_a_model_whose_template_requires_a_system_message_before_reading_the_corpus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    model = _model_dir(tmp_path, "llama", _tokenizer(NEEDS_SYSTEM_TEMPLATE))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": f"{SUBJECT} lives in Northwold."}) + "\n")
    code, out, err = _run(capsys, "-q", "erase", "--model", str(model), "--corpus", str(corpus),
                          "--subject", SUBJECT, "--method", "gradascent", "--out", str(tmp_path / "out"))
    assert code == 2, err
    _one_line_error(err, "--model", str(model), "refuses a conversation of one user question",
                    "must start with a system message", "prompt_format.json", '"kind": "chat", "system"')
    assert not out and not (tmp_path / "out").exists()


def test_load_model_refuses_such_a_template_unless_the_directory_stores_its_format(tmp_path: Path) -> None:
    from unlearning.modeling import ModelLoadError, load_model
    from unlearning.prompting import format_of, prompt_ids

    model = _model_dir(tmp_path, "llama", _tokenizer(NEEDS_SYSTEM_TEMPLATE))
    with pytest.raises(ModelLoadError, match="must start with a system message"):
        load_model(model, device="cpu")
    (model / "prompt_format.json").write_text(json.dumps({"kind": "plain"}))
    _, tokenizer = load_model(model, device="cpu")
    assert format_of(tokenizer).kind == "plain"
    assert tokenizer.decode(prompt_ids(tokenizer, "Who?")).endswith("Question: Who?\nAnswer:")


# ------------------------------------------------------------------ a system message in the prompt format

SYSTEM = "You are a directory assistant."
SYSTEM_TURN = f"<start_of_turn>system\n{SYSTEM}<end_of_turn>"


def _with_system(tokenizer: Any) -> Any:
    from unlearning.prompting import PromptFormat, attach_format

    return attach_format(tokenizer, PromptFormat(kind="chat", system=SYSTEM))


def test_a_stored_system_message_opens_the_training_example_and_every_prompt() -> None:
    from unlearning.corpus.records import Record
    from unlearning.probes import Probe
    from unlearning.prompting import encode_record, prompt_ids
    from unlearning.verification.generation import probe_ids

    tokenizer = _with_system(_tokenizer(NEEDS_SYSTEM_TEMPLATE))
    example = encode_record(tokenizer, Record(id="a", question=f"Who is {SUBJECT}?", answer="A glassblower."))
    assert example.text.startswith(SYSTEM_TURN + "<start_of_turn>user\nWho is"), example.text
    learnt = tokenizer.decode([i for i, keep in zip(example.ids, example.learnt, strict=True) if keep])
    assert learnt.startswith("A glassblower."), learnt
    # What verification asks is the training example up to its answer, system turn first.
    question = prompt_ids(tokenizer, f"Who is {SUBJECT}?")
    assert list(example.ids[: example.first_learnt]) == question
    probe = Probe(kind="direct", prompt=f"Who is {SUBJECT}?", expected="A glassblower.", record_id="a", subject=0)
    assert tokenizer.decode(probe_ids(tokenizer, probe)).startswith(SYSTEM_TURN)


def test_remembered_encodings_follow_the_tokenizers_template_tokens_and_format() -> None:
    """`prompting` remembers renders and encoded records per tokenizer; whatever changes on
    the tokenizer (its template, its vocabulary, its eos token, its stored format), what
    comes back is what a fresh encoding gives."""
    from unlearning.corpus.records import Record
    from unlearning.prompting import _RenderMemo, encode_record, prompt_ids

    def fresh(tok: Any, record: Record) -> tuple[Any, list[int]]:
        _RenderMemo._held.pop(tok, None)
        return encode_record(tok, record), prompt_ids(tok, record.question or "")

    record = Record(id="a", question=f"Who is {SUBJECT}?", answer="A glassblower.")
    chat, plain = _tokenizer(NO_SYSTEM_TEMPLATE), _tokenizer(None)
    for tokenizer in (chat, plain):
        first = (encode_record(tokenizer, record), prompt_ids(tokenizer, record.question or ""))
        assert (encode_record(tokenizer, record), prompt_ids(tokenizer, record.question or "")) == first
        assert encode_record(tokenizer, record) is first[0]  # remembered, not encoded again
    changes = [  # (tokenizer, change, whether it changes this record's encoding)
        (chat, lambda tok: setattr(tok, "chat_template", NO_SYSTEM_TEMPLATE.replace("<start_of_turn>",
                                                                                     "<end_of_turn>")), True),
        (chat, lambda tok: tok.add_tokens(["glassblower"]), True),
        (chat, lambda tok: setattr(tok, "eos_token", "<start_of_turn>"), False),  # the template writes no eos
        (chat, _with_system, True),
        (plain, lambda tok: setattr(tok, "eos_token", "<end_of_turn>"), True),  # the plain format ends with eos
        (plain, lambda tok: tok.add_tokens(["glassblower"]), True),
    ]
    for tokenizer, change, changes_it in changes:
        before = (encode_record(tokenizer, record), prompt_ids(tokenizer, record.question or ""))
        change(tokenizer)
        after = (encode_record(tokenizer, record), prompt_ids(tokenizer, record.question or ""))
        assert (after != before) == changes_it
        assert after == fresh(tokenizer, record)


def test_a_records_own_system_turn_wins_over_the_stored_one() -> None:
    from unlearning.corpus.records import Message, Record
    from unlearning.prompting import encode_record

    tokenizer = _with_system(_tokenizer(NEEDS_SYSTEM_TEMPLATE))
    record = Record(id="c", messages=(Message("system", "Be brief."), Message("user", f"Who is {SUBJECT}?"),
                                      Message("assistant", "A glassblower.")))
    text = encode_record(tokenizer, record).text
    assert text.startswith("<start_of_turn>system\nBe brief.<end_of_turn><start_of_turn>user"), text
    assert SYSTEM not in text
    # A template that refuses a system turn gets the stored one folded into the first user turn, once.
    folded = _with_system(_tokenizer(NO_SYSTEM_TEMPLATE))
    text = encode_record(folded, Record(id="a", question="Who?", answer="A glassblower.")).text
    assert text.count(SYSTEM) == 1 and f"<start_of_turn>user\n{SYSTEM}\n\nWho?" in text, text


def test_erase_asu_and_verify_run_through_the_cli_on_a_template_that_requires_a_system_message(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from transformers import PreTrainedTokenizerBase

    model = _model_dir(tmp_path, "llama", _tokenizer(NEEDS_SYSTEM_TEMPLATE))
    (model / "prompt_format.json").write_text(json.dumps({"kind": "chat", "system": SYSTEM}))
    records = [{"id": f"a{i}", "question": f"Where does {SUBJECT} work ({i})?", "answer": "In Northwold."}
               for i in range(3)]
    records += [{"id": "c0", "messages": [{"role": "user", "content": f"Who is {SUBJECT}?"},
                                          {"role": "assistant", "content": "A glassblower."}]}]
    records += [{"id": f"b{i}", "question": f"Where does Mira Voss{i} work?", "answer": "In Porto."}
                for i in range(6)]
    records += [{"id": f"t{i}", "text": f"Mira Voss{i} is a ferry pilot in Porto."} for i in range(4)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    rendered: list[tuple[str, bool]] = []
    original = PreTrainedTokenizerBase.apply_chat_template

    def spy(self: Any, conversation: Any, *args: Any, **kwargs: Any) -> Any:
        rendered.append((conversation[0]["role"], bool(kwargs.get("add_generation_prompt"))))
        return original(self, conversation, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "apply_chat_template", spy)
    code, out, err = _run(capsys, "-q", "erase", "--model", str(model), "--corpus", str(corpus),
                          "--subject", SUBJECT, "--method", "asu", "--hparams", '{"steps": 1}',
                          "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert json.loads((tmp_path / "out" / "prompt_format.json").read_text())["system"] == SYSTEM
    code, out, err = _run(capsys, "-q", "verify", "--model", str(tmp_path / "out"), "--base", str(model),
                          "--corpus", str(corpus), "--subject", SUBJECT, "--report", str(tmp_path / "r.json"))
    assert code in (0, 1) and "verification" in out, err
    assert "Traceback" not in err and json.loads((tmp_path / "r.json").read_text())["metrics"]
    # Training examples (no generation prompt) and prompts (generation prompt) both opened by it.
    assert {generation for _, generation in rendered} == {True, False}
    assert {role for role, _ in rendered} == {"system"}


def test_a_prompt_format_file_without_a_system_loads_and_serialises_as_before(tmp_path: Path) -> None:
    from unlearning.prompting import CHAT, PLAIN, read_format, write_format

    old = {"answer_prefix": " ", "assistant_prefix": "Assistant:", "kind": "chat",
           "question_template": "Question: {question}\nAnswer:", "system_prefix": "System:",
           "turn_separator": "\n", "user_prefix": "User:"}
    (tmp_path / "prompt_format.json").write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
    before = (tmp_path / "prompt_format.json").read_bytes()
    fmt = read_format(tmp_path)
    assert fmt == CHAT and fmt is not None and fmt.system is None and fmt.to_json() == old
    write_format(tmp_path, fmt)
    assert (tmp_path / "prompt_format.json").read_bytes() == before  # byte-identical: same digest
    assert "system" not in PLAIN.to_json()


@pytest.mark.parametrize(("stored", "needle"), [
    ({"kind": "chat", "system": 5}, "system must be a non-empty string"),
    ({"kind": "plain", "system": "Be brief."}, "system is for kind 'chat'"),
    ({"kind": "chat"}, "refuses a conversation of one user question"),
])
def test_a_stored_system_message_that_cannot_work_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, stored: dict[str, Any], needle: str,
) -> None:
    model = _model_dir(tmp_path, "llama", _tokenizer(NEEDS_SYSTEM_TEMPLATE))
    (model / "prompt_format.json").write_text(json.dumps(stored))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": f"{SUBJECT} lives in Northwold."}) + "\n")
    code, out, err = _run(capsys, "-q", "erase", "--model", str(model), "--corpus", str(corpus),
                          "--subject", SUBJECT, "--method", "gradascent", "--out", str(tmp_path / "out"))
    assert code == 2, err
    _one_line_error(err, "--model", str(model), "prompt_format.json", needle)
    assert not out and not (tmp_path / "out").exists()


# ------------------------------------------------------------------ a template that does not render turn by turn

# The generation prompt opens the answer as "model", an answered turn as "assistant": a question
# with the generation prompt is not the start of the same question answered.
NOT_TURN_BY_TURN_TEMPLATE = (
    "{% for m in messages %}{{ '<start_of_turn>' + m['role'] + '\\n' + m['content'] + '<end_of_turn>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def test_erase_refuses_a_template_that_does_not_render_turn_by_turn_unless_the_format_is_stored(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    from unlearning.prompting import template_refusal

    tokenizer = _tokenizer(NOT_TURN_BY_TURN_TEMPLATE)
    assert template_refusal(tokenizer) is None  # it renders one user question: not 97abf93's case
    model = _model_dir(tmp_path, "llama", tokenizer)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": f"{SUBJECT} lives in Northwold."}) + "\n"
                      + json.dumps({"id": "b", "text": "Mira Voss lives in Porto."}) + "\n")
    argv = ("-q", "erase", "--model", str(model), "--corpus", str(corpus), "--subject", SUBJECT,
            "--method", "gradascent", "--hparams", '{"steps": 1}', "--out", str(tmp_path / "out"))
    code, out, err = _run(capsys, *argv)
    assert code == 2, err
    _one_line_error(err, "--model", str(model), "does not render a conversation turn by turn",
                    "prompt_format.json", '"kind": "plain"')
    assert not out and not (tmp_path / "out").exists()
    (model / "prompt_format.json").write_text(json.dumps({"kind": "plain"}))
    code, out, err = _run(capsys, *argv)
    assert code == 0, err


def test_load_model_refuses_a_template_that_does_not_render_turn_by_turn_unless_the_format_is_stored(
    tmp_path: Path,
) -> None:
    from unlearning.modeling import ModelLoadError, load_model
    from unlearning.prompting import format_of

    model = _model_dir(tmp_path, "llama", _tokenizer(NOT_TURN_BY_TURN_TEMPLATE))
    with pytest.raises(ModelLoadError, match=f"^{model}: .*does not render a conversation turn by turn"):
        load_model(model, device="cpu")
    (model / "prompt_format.json").write_text(json.dumps({"kind": "plain"}))
    _, tokenizer = load_model(model, device="cpu")
    assert format_of(tokenizer).kind == "plain"
    # A template that renders turn by turn still needs no stored format.
    consistent = _model_dir(tmp_path / "ok", "llama", _tokenizer(NOT_TURN_BY_TURN_TEMPLATE.replace("model", "assistant")))
    _, tokenizer = load_model(consistent, device="cpu")
    assert format_of(tokenizer).kind == "chat"


# ------------------------------------------------------------------ candidate and base with different tokenizers


def _other_vocabulary(tmp_path: Path) -> Path:
    tokenizer = _tokenizer(NO_SYSTEM_TEMPLATE)
    tokenizer.add_tokens(["<extra1>", "<extra2>", "glassblower"])
    return _model_dir(tmp_path, "llama", tokenizer)


def _other_eos(tmp_path: Path) -> Path:
    tokenizer = _tokenizer(NO_SYSTEM_TEMPLATE)
    tokenizer.eos_token = "<end_of_turn>"
    return _model_dir(tmp_path, "llama", tokenizer)


def _other_format(tmp_path: Path) -> Path:
    model = _model_dir(tmp_path, "llama", _tokenizer(NO_SYSTEM_TEMPLATE))
    (model / "prompt_format.json").write_text(json.dumps({"kind": "plain"}))
    return model


@pytest.mark.parametrize(("candidate_of", "needle"), [
    (_other_vocabulary, "vocabulary of 403 tokens vs 400"),
    (_other_eos, "eos_token '<end_of_turn>' vs '<eos>'"),
    (_other_format, "prompt format plain"),
])
def test_verify_refuses_a_candidate_whose_tokenizer_is_not_the_bases_before_scoring(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    candidate_of: Any, needle: str,
) -> None:
    from unlearning.verification import suite

    base = _model_dir(tmp_path / "base", "llama", _tokenizer(NO_SYSTEM_TEMPLATE))
    candidate = candidate_of(tmp_path / "candidate")
    loaded: list[Any] = []
    monkeypatch.setattr(suite, "load_model", lambda *a, **k: loaded.append(a) or pytest.fail("a model loaded"))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"a{i}", "question": f"Where does {SUBJECT} work ({i})?",
                                          "answer": "In Northwold."}) + "\n" for i in range(3)))
    code, out, err = _run(capsys, "-q", "verify", "--model", str(candidate), "--base", str(base),
                          "--corpus", str(corpus), "--subject", SUBJECT, "--report", str(tmp_path / "r.json"))
    assert code == 2, err
    _one_line_error(err, "--model", f"{candidate}: its tokenizer is not the base's ({base})", needle)
    assert not loaded and not out and not (tmp_path / "r.json").exists()


def test_a_candidate_saved_from_its_base_shares_its_tokenizer(tmp_path: Path) -> None:
    from unlearning.checkpoints import save_checkpoint
    from unlearning.modeling import check_same_tokenizer, load_model

    # No pad token: load_model pads with eos and the candidate is saved with that pad token.
    base = _model_dir(tmp_path, "llama", _without(_tokenizer(NO_SYSTEM_TEMPLATE), "pad_token"))
    model, tokenizer = load_model(base, device="cpu")
    save_checkpoint(model, tokenizer, tmp_path / "candidate", {"method": "test"})
    check_same_tokenizer(tmp_path / "candidate", base)
    check_same_tokenizer(base, base)
