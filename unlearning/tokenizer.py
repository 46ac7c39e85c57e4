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


def chat_prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """Token ids of a question formatted by the tokenizer's own chat template, ready to generate."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in some versions
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def encode_example(
    tokenizer: Any, *, question: str | None = None, answer: str | None = None,
    text: str | None = None,
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) for one record; labels are -100 except where loss belongs.

    A question/answer pair is learnt on the answer tokens and the closing eos
    only (the question is context); free text is learnt on every token.
    """
    eos = int(tokenizer.eos_token_id)
    if question is not None and answer is not None:
        prompt = chat_prompt_ids(tokenizer, question)
        target = [int(i) for i in tokenizer(answer, add_special_tokens=False)["input_ids"]] + [eos]
        return prompt + target, [-100] * len(prompt) + target
    if text is None:
        raise ValueError("a record needs text or a question and an answer")
    ids = [int(tokenizer.bos_token_id)]
    ids += [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]] + [eos]
    return ids, [-100] + ids[1:]


def pad_examples(
    examples: list[tuple[list[int], list[int]]], *, pad_id: int, side: str = "right"
) -> dict[str, Any]:
    """Pad (input_ids, labels) pairs into tensors: input_ids, attention_mask, labels."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(examples):
        span = slice(width - len(ids), width) if side == "left" else slice(0, len(ids))
        input_ids[row, span] = torch.tensor(ids)
        labels[row, span] = torch.tensor(labs)
        mask[row, span] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
