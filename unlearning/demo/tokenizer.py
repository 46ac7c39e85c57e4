"""BPE tokenizers trained on a corpus, in the styles of real model families (`STYLES`).

The demo style is the project's own: a byte-level BPE with this chat template.

Training formats a question exactly as `apply_chat_template` does, so any
tool that queries a checkpoint through the tokenizer's chat template gets
the answers the model learnt:

    <s><|user|>{question}<|assistant|>{answer}</s>

Free-text records are `<s>{text}</s>`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
USER, ASSISTANT = "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, USER, ASSISTANT)

# Jinja, as transformers renders it.  System messages are not part of training; their text
# is put in front of the next user turn so that a caller who sends one still gets a
# well-formed prompt.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + ' ' %}"
    "{% elif message['role'] == 'user' %}{{ '" + USER + "' + ns.system + message['content'] }}"
    "{% set ns.system = '' %}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '" + ASSISTANT + "' + message['content'] + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + ASSISTANT + "' }}{% endif %}"
)


QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Tokenizer styles, as real model families ship them (the engine must work with each):
#   demo   byte-level BPE, <s> ... </s>, the project's own chat template (BOS from the template)
#   gpt2   byte-level BPE, one <|endoftext|> for bos/eos, no BOS added, no chat template
#   llama  SentencePiece-style (metaspace) BPE that adds <s> itself, eos </s>, no chat template
#   qwen2  byte-level BPE, no BOS at all, <|im_end|> ends a turn, ChatML template
STYLES = ("demo", "gpt2", "llama", "qwen2")


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 2048, style: str = "demo") -> Any:
    """Train a BPE tokenizer on `texts` in one of the `STYLES`; a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if style not in STYLES:
        raise ValueError(f"unknown tokenizer style {style!r}; choose one of {', '.join(STYLES)}")
    backend = Tokenizer(models.BPE(unk_token=None))
    if style == "llama":
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
        alphabet: list[str] = []
    else:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = {
        "demo": list(SPECIAL_TOKENS),
        "gpt2": ["<|endoftext|>"],
        "llama": ["<unk>", "<s>", "</s>"],
        "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    }[style]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet,
                                  show_progress=False)
    backend.train_from_iterator(texts, trainer=trainer)
    if style == "llama":
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", backend.token_to_id("<s>"))])
    common = {"padding_side": "left", "model_max_length": 512}
    if style == "gpt2":
        tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
            unk_token="<|endoftext|>", **common)
    elif style == "llama":
        tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", **common)
    elif style == "qwen2":
        tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
            additional_special_tokens=["<|im_start|>", "<|im_end|>"], **common)
        tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    else:
        tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
            additional_special_tokens=[USER, ASSISTANT], **common)
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
