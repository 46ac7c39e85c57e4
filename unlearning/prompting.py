"""How records become token ids: one encoding for training, erasure and verification.

A question reaches a model through the tokenizer's own chat template
(`chat_prompt_ids`); a question/answer pair is learnt on the answer tokens and
the closing eos only, free text on every token.  `pad_examples` is the one
padding/collation of (input_ids, labels) pairs.
"""

from __future__ import annotations

from typing import Any


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
