"""Model directories that hold no decoder-only causal language model (an encoder-decoder like
T5, an encoder like BERT), each built here from a config and a tokenizer trained in the test
(never downloaded): refused with one line naming the architecture, exit 2, before the corpus
is read; a BERT configured as a decoder (causal attention) is a causal LM and loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import run_cli as _run
from tests.unlearning.test_unseen_shapes import SUBJECT, _one_line_error, _tokenizer


def _save(tmp_path: Path, name: str, model: Any, tokenizer: Any) -> Path:
    out = tmp_path / name
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _t5(tmp_path: Path) -> Path:
    import transformers as T

    tokenizer = _tokenizer()
    config = T.T5Config(d_model=32, d_ff=64, d_kv=16, num_layers=2, num_heads=2, vocab_size=len(tokenizer),
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        decoder_start_token_id=tokenizer.pad_token_id)
    return _save(tmp_path, "t5", T.T5ForConditionalGeneration(config), tokenizer)


def _bert(tmp_path: Path, *, is_decoder: bool = False) -> Path:
    import transformers as T

    tokenizer = _tokenizer()
    config = T.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, is_decoder=is_decoder)
    model = (T.BertLMHeadModel if is_decoder else T.BertForMaskedLM)(config)
    return _save(tmp_path, "bert-decoder" if is_decoder else "bert", model, tokenizer)


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": f"{SUBJECT} lives in Northwold."}) + "\n"
                      + json.dumps({"id": "b", "text": "Mira Voss lives in Porto."}) + "\n")
    return corpus


@pytest.mark.parametrize(("build", "words"), [
    (_t5, ("t5 (T5ForConditionalGeneration)", "encoder-decoder")),
    (_bert, ("bert (BertForMaskedLM)", "encoder-only", "BertSelfAttention attends both ways")),
])
def test_erase_refuses_a_model_that_is_no_causal_lm_naming_its_architecture(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, build: Any, words: tuple[str, ...],
) -> None:
    model = build(tmp_path)
    code, out, err = _run(capsys, "-q", "erase", "--model", str(model), "--corpus", str(_corpus(tmp_path)),
                          "--subject", SUBJECT, "--method", "gradascent", "--hparams", '{"steps": 1}',
                          "--out", str(tmp_path / "out"))
    assert code == 2, err
    line = _one_line_error(err, "--model", str(model), *words, "decoder-only causal")
    assert "Traceback" not in err and SUBJECT not in line
    assert not (tmp_path / "out").exists() and not out


def test_verify_names_the_base_when_the_base_is_an_encoder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    from tests.unlearning.test_unseen_shapes import _model_dir

    candidate = _model_dir(tmp_path, "llama", _tokenizer())
    code, _, err = _run(capsys, "-q", "verify", "--model", str(candidate), "--base", str(_bert(tmp_path)),
                        "--corpus", str(_corpus(tmp_path)), "--subject", SUBJECT,
                        "--report", str(tmp_path / "r.json"))
    assert code == 2, err
    _one_line_error(err, "--base", "encoder-only")


def test_load_model_refuses_an_encoder_and_loads_a_bert_configured_as_a_decoder(tmp_path: Path) -> None:
    import torch

    from unlearning.modeling import ModelLoadError, load_model

    with pytest.raises(ModelLoadError, match=r"bert \(BertForMaskedLM\) is an encoder-only model"):
        load_model(_bert(tmp_path), device="cpu")
    model, _ = load_model(_bert(tmp_path, is_decoder=True), device="cpu")
    # What the refusal guards: causal attention, so a later token never changes an earlier logit.
    ids = torch.tensor([[5, 6, 7, 8]])
    changed = ids.clone()
    changed[0, -1] = 9
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits[0, :3], model(input_ids=changed).logits[0, :3])


def test_a_causal_model_whose_config_says_is_decoder_false_is_not_refused(tmp_path: Path) -> None:
    import transformers as T

    from unlearning.modeling import check_causal_lm

    tokenizer = _tokenizer()
    config = T.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             vocab_size=len(tokenizer))
    assert config.is_decoder is False
    check_causal_lm(_save(tmp_path, "neox", T.AutoModelForCausalLM.from_config(config), tokenizer))
