"""A byte-level BPE tokenizer trained on a corpus, with the chat template training uses.

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


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 2048) -> Any:
    """Train a byte-level BPE on `texts`; return a PreTrainedTokenizerFast with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        additional_special_tokens=[USER, ASSISTANT],
        padding_side="left",
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
