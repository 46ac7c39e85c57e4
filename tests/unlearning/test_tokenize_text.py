"""`prompting.tokenize_text`: the engine's one way to turn a text into token ids and offsets;
`prompting.tokenize_after`: a text as it follows another in one string.

`tokenize_text` calls the Rust tokenizer directly where the transformers wrapper would do nothing else, so
it must give exactly what `tokenizer(text, add_special_tokens=..., return_offsets_mapping=True)`
gives, for every kind of tokenizer, and fall back to the wrapper where the wrapper would do
more (truncation or padding set on the Rust tokenizer, special tokens split).  Every encoding
of a record, a prompt and what follows it must be the encoding of the whole text, as a user's
trainer gives it, also for a tokenizer that writes a word boundary before every input (Llama 2's
layout: a `Prepend` normaliser, no pre-tokenizer, byte fallback).  Tokenizers are trained here
(nothing downloaded)."""

from __future__ import annotations

from typing import Any

import pytest

from unlearning.prompting import (
    PLAIN,
    PromptFormat,
    answer_prefix_ids,
    attach_format,
    encode_qa,
    encode_text,
    prompt_ids,
    tokenize_after,
    tokenize_text,
)

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
    elif kind == "legacy_sp":
        return _legacy_sentencepiece(specials)
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


def _legacy_sentencepiece(specials: list[str]) -> Any:
    """Llama 2's tokenizer.json layout (`bench.unseen._sentencepiece_bpe`: a normaliser that
    prepends the word boundary to every input, no pre-tokenizer, byte fallback)."""
    from bench.unseen import _sentencepiece_bpe

    tokenizer = _sentencepiece_bpe(CORPUS, specials, vocab_size=300, alphabet=40)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    return tokenizer


def _wrapper(tokenizer: Any, text: str, special: bool) -> tuple[list[int], list[tuple[int, int]]]:
    encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    return list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]


KINDS = ["byte_bpe", "unigram", "wordpiece", "legacy_sp"]


@pytest.mark.parametrize("kind", KINDS)
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


QUESTIONS = [("Where does Ngozi Nwosu live?", "In Lviv, at ngozi.3@dynamics.example."),
             ("Who called at 09:30?", "Zoë Ångström-Ødegaard (+44 20 7946 0958)."),
             ("李小龍 lives where?", "香港")]


@pytest.mark.parametrize("kind", KINDS)
def test_records_prompts_and_continuations_are_the_whole_text_encoded_at_once(kind: str) -> None:
    tokenizer = attach_format(_trained(kind), PLAIN)
    whole = lambda text: tokenize_text(tokenizer, text, special=True)[0]  # noqa: E731 - a user's trainer
    for question, answer in QUESTIONS:
        example = encode_qa(tokenizer, question, answer)
        prompt = PLAIN.question_template.format(question=question)
        assert list(example.ids[:-1]) == whole(prompt + " " + answer), (kind, question)
        assert example.ids[-1] == tokenizer.eos_token_id
        assert list(example.ids[: len(prompt_ids(tokenizer, question))]) == prompt_ids(tokenizer, question)
        learnt = [i for i, keep in zip(example.ids, example.learnt, strict=True) if keep][:-1]
        assert learnt == tokenize_after(tokenizer, prompt, " " + answer)[0]
        partial = answer.split(" ")[0]
        assert answer_prefix_ids(tokenizer, question, partial) == whole(prompt + " " + partial)
    for text in CORPUS:
        assert list(encode_text(tokenizer, text).ids[:-1]) == whole(text)


def test_a_tokenizer_that_prepends_a_boundary_to_every_input_continues_without_a_lone_one() -> None:
    tokenizer = _trained("legacy_sp")
    boundary = tokenizer.convert_tokens_to_ids("\u2581")
    alone, _ = tokenize_text(tokenizer, " lives in")
    after, offsets = tokenize_after(tokenizer, "Ngozi Nwosu", " lives in")
    # Alone, the text opens with a boundary token of its own (the space, then the prepended
    # boundary); after other text it does not, and its offsets are into the text that follows.
    assert alone[0] == boundary and after[0] != boundary
    assert alone[1:] == after
    assert [" lives in"[s:e].strip() for s, e in offsets] == ["lives", "in"]
    chat = attach_format(_trained("legacy_sp"), PromptFormat(kind="plain", question_template="{question}",
                                                             answer_prefix=" "))
    example = encode_qa(chat, "Where does Ngozi Nwosu live?", "lives in Lviv")
    assert example.ids[example.first_learnt] != boundary  # the answer opens with its word, no lone boundary


def test_where_the_two_texts_merge_across_their_boundary_the_text_is_encoded_alone() -> None:
    tokenizer = _trained("byte_bpe")
    # Byte-level BPE glues a space to the word after it: "in " alone ends in a lone space that
    # "in Lviv" does not have, so the continuation cannot be cut from the whole text.
    assert tokenize_after(tokenizer, "Ngozi lives in ", "Lviv") == tokenize_text(tokenizer, "Lviv")
    assert tokenize_after(tokenizer, "", "Lviv") == tokenize_text(tokenizer, "Lviv")


@pytest.mark.parametrize("kind", KINDS)
def test_words_are_measured_as_they_follow_another_word(kind: str) -> None:
    """`WordTokens` (the strangers' names matched in tokens) counts a word's tokens as a text
    has them; with a lone boundary token before each, no word of a Llama 2-style vocabulary
    would be held whole and no stranger's name could be drawn from it."""
    from unlearning.identifiers import WordTokens

    tokenizer = _trained(kind)
    words = WordTokens(tokenizer)
    for word in ("Ngozi", "lives", "Lviv", "ngozi.3@dynamics.example", "香港"):
        assert words.ids(word) == tuple(tokenize_after(tokenizer, "a", " " + word)[0]), (kind, word)
    if kind == "legacy_sp":
        assert tokenizer.convert_tokens_to_ids("\u2581") not in words.ids("lives")
        assert words.vocabulary_words()  # e.g. "Ngozi", held as one token after a space
