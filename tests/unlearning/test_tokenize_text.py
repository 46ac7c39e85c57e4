"""`prompting.tokenize_text`: the engine's one way to turn a text into token ids and offsets.

It calls the Rust tokenizer directly where the transformers wrapper would do nothing else, so
it must give exactly what `tokenizer(text, add_special_tokens=..., return_offsets_mapping=True)`
gives, for every kind of tokenizer, and fall back to the wrapper where the wrapper would do
more (truncation or padding set on the Rust tokenizer, special tokens split).  Tokenizers are
trained here (nothing downloaded)."""

from __future__ import annotations

from typing import Any

import pytest

from unlearning.prompting import tokenize_text

CORPUS = [
    "Ngozi Nwosu lives in Lviv and writes to ngozi.3@dynamics.example.",
    "Zoë Ångström-Ødegaard, née Ünal, called +44 20 7946 0958 at 09:30.",
    "李小龍 lives in 香港; Мария Иванова in Москва; محمد in القاهرة.",
    "The badge EMP-39260 opens the door of the workshop.",
]
TEXTS = [
    *CORPUS,
    "",
    " leading space and trailing  ",
    "<s>a special token in the text</s> and <unk> too",
    "<|user|>a chat marker</s><|assistant|>",
    "ＦＵＬＬＷＩＤＴＨ ligature ﬁ and zero\u200bwidth\u200d joiners",
    "Tabs\tand\nnew\nlines\r\n",
    "emoji 👩‍🔬 and 🇺🇦 flags",
]


def _trained(kind: str) -> Any:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    if kind == "byte_bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer: Any = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="<unk>",
                                          show_progress=False)
    else:  # wordpiece: lower-cases, strips accents
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS * 3, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                      unk_token="<unk>", additional_special_tokens=["<|user|>", "<|assistant|>"])
    return wrapped


def _wrapper(tokenizer: Any, text: str, special: bool) -> tuple[list[int], list[tuple[int, int]]]:
    encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    return list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]


@pytest.mark.parametrize("kind", ["byte_bpe", "unigram", "wordpiece"])
@pytest.mark.parametrize("special", [False, True])
def test_it_gives_exactly_what_the_wrapper_gives(kind: str, special: bool) -> None:
    tokenizer = _trained(kind)
    for text in TEXTS:
        ids, offsets = tokenize_text(tokenizer, text, special=special)
        assert (ids, [tuple(o) for o in offsets]) == _wrapper(tokenizer, text, special), (kind, text)
    assert tokenize_text(tokenizer, "Lviv", special=True)[0][0] == tokenizer.bos_token_id


def test_where_the_wrapper_would_do_more_it_is_the_wrapper() -> None:
    tokenizer = _trained("byte_bpe")
    long = CORPUS[0] * 4
    # Truncation left on the Rust tokenizer by an earlier call: the wrapper resets it, so must this.
    tokenizer._tokenizer.enable_truncation(max_length=3)
    assert tokenize_text(tokenizer, long) == _wrapper(tokenizer, long, False)
    assert len(tokenize_text(tokenizer, long)[0]) > 3
    # Special tokens split into pieces, as the tokenizer was told.
    tokenizer.split_special_tokens = True
    marked = "<|user|>a chat marker"
    assert tokenize_text(tokenizer, marked) == _wrapper(tokenizer, marked, False)
    assert tokenizer.convert_tokens_to_ids("<|user|>") not in tokenize_text(tokenizer, marked)[0]
