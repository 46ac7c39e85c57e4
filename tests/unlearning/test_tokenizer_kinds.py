"""Tokenizers the engine first met in a probe, each trained in the test (never downloaded):

- no end-of-sequence token (and no padding token): the model never learnt to stop, so an
  answer runs to its token budget;
- a chat template that requires a system message (or refuses the user role): a model
  without a stored prompt format is refused, naming the template's error, instead of being
  asked in plain text it was never trained on (where its leakage would go unseen).
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
                    "must start with a system message", "prompt_format.json")
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
