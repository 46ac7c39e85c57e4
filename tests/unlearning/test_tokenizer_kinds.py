"""Tokenizers the engine first met in a probe, each trained in the test (never downloaded):

- no end-of-sequence token (and no padding token): the model never learnt to stop, so an
  answer runs to its token budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.unlearning.test_unseen_shapes import SUBJECT, _model_dir, _tokenizer


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
