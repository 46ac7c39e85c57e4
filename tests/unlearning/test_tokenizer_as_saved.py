"""A tokenizer loads as it was saved, whatever the model's family.

transformers 5 takes the tokenizer class from the model's type where the saved configuration
names only the generic backend, and a family's class rebuilds its own pre-tokenizer over the
saved vocabulary.  Found on a Chinese corpus (docs/methods.md): `train-base --arch qwen2
--tokenizer-style qwen2` trained on digit runs kept whole ("196" + "6"); loaded back, every
digit was split, so the engine scored and trained the model on sequences it had never seen,
and the retain loss pulled it off its own phone numbers and years (retained accuracy 0.62).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unlearning.test_unseen_shapes import _config

TEXTS = ["王梅明是哪一年出生的？1966年。", "林伟刚的电话号码是多少？13076661934",
         "Born 1987 in Zürich, extension 4411, badge EMP-20931.", "In 1900 the year was quiet."] * 8
SAMPLE = "王梅明，1966年，13076661934; born 1987, badge EMP-20931"


def _saved(tmp_path: Path, arch: str, style: str) -> tuple[Path, Any]:
    """A random tiny `arch` model saved with a tokenizer of the project's `style`; the
    in-memory tokenizer it was saved from."""
    import torch
    from transformers import AutoModelForCausalLM

    from unlearning.demo.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(TEXTS, vocab_size=400, style=style)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(arch, tokenizer))
    out = tmp_path / f"{arch}-{style}"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, tokenizer


def _ids(tokenizer: Any, text: str = SAMPLE) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def test_a_qwen2_model_with_a_tokenizer_of_another_design_tokenises_as_it_was_trained(tmp_path: Path) -> None:
    import transformers as T
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unlearning.demo.tokenizer import train_tokenizer
    from unlearning.modeling import load_model, load_tokenizer

    tokenizer = train_tokenizer(TEXTS, vocab_size=400, style="qwen2")
    ids = {"vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    model = AutoModelForCausalLM.from_config(T.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                           num_attention_heads=2, num_key_value_heads=2, **ids))
    out = tmp_path / "qwen2"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    trained = _ids(tokenizer)
    # What makes the case: the family's class splits what the model learnt whole.
    assert _ids(AutoTokenizer.from_pretrained(out)) != trained
    assert any(len(tokenizer.decode([i]).strip()) > 1 and tokenizer.decode([i]).strip().isdigit() for i in trained)
    for loaded in (load_tokenizer(out), load_model(out, device="cpu")[1]):
        assert _ids(loaded) == trained
        assert loaded.eos_token == "<|im_end|>" and loaded.pad_token == "<|endoftext|>"
        assert loaded.chat_template == tokenizer.chat_template


@pytest.mark.parametrize(("arch", "style"), [("llama", "llama"), ("gpt2", "gpt2"), ("llama", "demo")])
def test_every_family_and_style_loads_the_tokenizer_it_saved(tmp_path: Path, arch: str, style: str) -> None:
    from unlearning.modeling import load_tokenizer

    out, tokenizer = _saved(tmp_path, arch, style)
    loaded = load_tokenizer(out)
    assert _ids(loaded) == _ids(tokenizer)
    assert [int(i) for i in loaded(SAMPLE)["input_ids"]] == [int(i) for i in tokenizer(SAMPLE)["input_ids"]]


def test_a_tokenizer_the_family_class_reads_as_saved_is_kept_as_loaded(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from unlearning.modeling import load_tokenizer

    out, _ = _saved(tmp_path, "gpt2", "gpt2")
    assert type(load_tokenizer(out)) is type(AutoTokenizer.from_pretrained(out))


def test_the_swap_is_said_once_per_directory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import transformers as T
    from transformers import AutoModelForCausalLM

    from unlearning.demo.tokenizer import train_tokenizer
    from unlearning.modeling import load_tokenizer

    tokenizer = train_tokenizer(TEXTS, vocab_size=400, style="qwen2")
    ids = {"vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    out = tmp_path / "once"
    AutoModelForCausalLM.from_config(T.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                   num_attention_heads=2, num_key_value_heads=2, **ids)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    with caplog.at_level("WARNING", logger="unlearning.modeling"):
        load_tokenizer(out)
        load_tokenizer(out)
    said = [r.getMessage() for r in caplog.records if "tokenizer.json as saved" in r.getMessage()]
    assert len(said) == 1 and "Qwen2Tokenizer" in said[0]


def test_a_tokenizer_saved_by_its_family_class_keeps_that_class(tmp_path: Path) -> None:
    # Saved by Qwen2Tokenizer itself (what a model trained through that class ships), the
    # class's rules are the model's, even if the file were edited to other ones.
    import json

    import transformers as T
    from transformers import AutoTokenizer

    from unlearning.demo.tokenizer import train_tokenizer
    from unlearning.modeling import load_tokenizer

    tokenizer = train_tokenizer(TEXTS, vocab_size=400, style="qwen2")
    out = tmp_path / "qwen2-class"
    T.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, vocab_size=len(tokenizer)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["tokenizer_class"] = "Qwen2Tokenizer"
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    by_class = AutoTokenizer.from_pretrained(out)
    assert type(by_class).__name__ == "Qwen2Tokenizer" and _ids(by_class) != _ids(tokenizer)
    assert _ids(load_tokenizer(out)) == _ids(by_class)


def test_a_name_the_tokenizer_learnt_whole_is_counted_per_subject() -> None:
    from unlearning.demo.tokenizer import train_tokenizer
    from unlearning.modeling import whole_tokens
    from unlearning.subjects import Subject

    texts = ["王梅明住在北京。王梅明是一名医生。王梅明的电话号码是13076661934。"] * 20 + TEXTS
    tokenizer = train_tokenizer(texts, vocab_size=400, style="qwen2")
    assert len(tokenizer("王梅明", add_special_tokens=False)["input_ids"]) == 1  # what makes the case
    subjects = [Subject("王梅明", identifiers=("13076661934", "13000000000")),
                Subject("Ann Lee-Ørsted", aliases=("A",)), Subject("李明华")]
    # The learnt name and the learnt phone number (this style keeps digit runs whole) count; a
    # number it never met, a spaced Latin name, a one-letter alias and an unmet name do not.
    assert whole_tokens(tokenizer, subjects) == [2, 0, 0]
