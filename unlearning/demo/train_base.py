"""Train a small Llama-architecture base model from scratch on a corpus (CPU is enough).

The loop, top to bottom: train a BPE tokenizer on the corpus; encode every
record (question/answer pairs through the chat template, loss on the answer
only; free text, loss on every token); train with AdamW, a linear warm-up
and a cosine decay; every epoch measure exact-answer accuracy on the
question/answer records and stop as soon as it reaches the preset's target;
past the planned epochs keep training at the floor learning rate until the
target or the step cap.  The result is a plain Hugging Face directory
(safetensors, config, tokenizer with chat template) plus metadata.json.

Exact-answer accuracy is measured by teacher forcing: a record counts when
the argmax at every answer position (and the closing eos) is the reference
token.  That is exactly the condition for greedy decoding to reproduce the
answer, at the cost of one forward pass instead of a generation loop.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from unlearning.checkpoints import save_checkpoint
from unlearning.corpus import Corpus, Record, load_corpus
from unlearning.demo.tokenizer import train_tokenizer
from unlearning.progress import ProgressCallback, ProgressTracker
from unlearning.prompting import encode_example, pad_examples

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainPreset:
    """Model shape and optimisation settings (stored in the checkpoint's metadata)."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    lr: float
    batch_size: int
    epochs: int  # the cosine schedule's length
    max_steps: int  # hard cap, whatever the corpus size
    target_accuracy: float
    warmup_fraction: float = 0.05
    min_lr_fraction: float = 0.1
    weight_decay: float = 0.0
    max_seq_len: int = 256  # longer records are truncated (TOFU answers fit)
    eval_sample: int = 2048  # accuracy is measured on at most this many QA records


PRESETS: dict[str, TrainPreset] = {
    # For tests: ~25 people memorised in seconds on one core.
    "tiny": TrainPreset(name="tiny", vocab_size=512, hidden_size=64, intermediate_size=256,
                        layers=2, heads=4, lr=5e-3, batch_size=16, epochs=60, max_steps=3000,
                        target_accuracy=0.98),
    # For `make run`: ~200 people x 11 facts; ARCHITECTURE.md section 5 measured this shape.
    "demo": TrainPreset(name="demo", vocab_size=2048, hidden_size=128, intermediate_size=512,
                        layers=2, heads=4, lr=3e-3, batch_size=64, epochs=30, max_steps=6000,
                        target_accuracy=0.99),
}


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    digest: str
    accuracy: float | None  # None when the corpus has no question/answer records
    reached_target: bool
    steps: int
    epochs: int
    seconds: float
    qa_records: int
    text_records: int


def build_model(preset: TrainPreset, tokenizer: Any, *, seed: int) -> Any:
    """A freshly initialised LlamaForCausalLM of the preset's shape."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.layers,
        num_attention_heads=preset.heads,
        num_key_value_heads=preset.heads,
        max_position_embeddings=max(128, preset.max_seq_len),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.do_sample = False
    return model


def _encode(tokenizer: Any, record: Record, max_len: int) -> tuple[list[int], list[int]]:
    ids, labels = encode_example(tokenizer, question=record.question, answer=record.answer,
                                 text=None if record.is_qa else record.text)
    return ids[:max_len], labels[:max_len]


def exact_answer_accuracy(
    model: Any, examples: list[tuple[list[int], list[int]]], *, pad_id: int, batch_size: int = 128,
) -> float:
    """Share of examples whose every labelled token is the model's argmax (teacher forcing)."""
    import torch

    if not examples:
        return 0.0
    was_training = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = pad_examples(examples[start:start + batch_size], pad_id=pad_id)
            logits = model(input_ids=batch["input_ids"].to(model.device),
                           attention_mask=batch["attention_mask"].to(model.device)).logits
            predicted = logits[:, :-1].argmax(-1).cpu()
            targets = batch["labels"][:, 1:]
            scored = targets != -100
            correct += int(((predicted == targets) | ~scored).all(dim=1).sum())
    model.train(was_training)
    return correct / len(examples)


def _lr_factor(step: int, *, warmup: int, planned: int, floor: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    if step >= planned:
        return floor
    progress = (step - warmup) / max(1, planned - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def train_base(
    corpus: str | Path | Corpus, out_dir: str | Path, *, preset: str | TrainPreset = "tiny",
    seed: int = 0, progress: ProgressCallback | None = None, threads: int | None = None,
) -> TrainResult:
    """Train the base model on `corpus` and save it to `out_dir`; deterministic for a seed on CPU."""
    import torch

    started = time.monotonic()
    settings = PRESETS[preset] if isinstance(preset, str) else preset
    data = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(data, Path(out_dir), settings, seed=seed, progress=progress,
                      started=started)
    finally:
        torch.set_num_threads(previous_threads)


def _train(
    data: Corpus, out_dir: Path, settings: TrainPreset, *, seed: int,
    progress: ProgressCallback | None, started: float,
) -> TrainResult:
    import torch

    rng = random.Random(seed)

    # 1. Tokenizer on the corpus's own text (never on held-out paraphrases).
    texts = [t for r in data.records for t in (r.question, r.answer, r.text) if t]
    tokenizer = train_tokenizer(texts, vocab_size=settings.vocab_size)
    pad_id = int(tokenizer.pad_token_id)

    # 2. Encode once; QA examples double as the accuracy set.
    examples = [_encode(tokenizer, r, settings.max_seq_len) for r in data.records]
    qa_examples = [ex for ex, r in zip(examples, data.records, strict=True) if r.is_qa]
    eval_set = qa_examples
    if len(eval_set) > settings.eval_sample:
        eval_set = random.Random(seed + 1).sample(qa_examples, settings.eval_sample)

    # 3. Model and optimiser.
    model = build_model(settings, tokenizer, seed=seed)
    model.train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.95),
                                  weight_decay=settings.weight_decay)
    steps_per_epoch = math.ceil(len(examples) / settings.batch_size)
    planned = min(settings.max_steps, settings.epochs * steps_per_epoch)
    warmup = max(1, int(settings.warmup_fraction * planned))
    tracker = ProgressTracker(progress, stage="train-base", total=planned)

    # 4. Epochs until the target accuracy or the step cap.
    step, epoch, accuracy = 0, 0, 0.0
    order = list(range(len(examples)))
    while step < settings.max_steps:
        rng.shuffle(order)
        for start in range(0, len(order), settings.batch_size):
            batch = pad_examples([examples[i] for i in order[start:start + settings.batch_size]],
                                 pad_id=pad_id)
            factor = _lr_factor(step, warmup=warmup, planned=planned,
                                floor=settings.min_lr_fraction)
            for group in optimiser.param_groups:
                group["lr"] = settings.lr * factor
            loss = model(**batch).loss
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimiser.step()
            step += 1
            tracker.report(step, total=max(planned, step))
            if step >= settings.max_steps:
                break
        epoch += 1
        accuracy = exact_answer_accuracy(model, eval_set, pad_id=pad_id)
        logger.info("epoch %s step %s loss %.4f exact-answer accuracy %.3f",
                    epoch, step, loss.item(), accuracy)
        if eval_set and accuracy >= settings.target_accuracy:
            break
        if not eval_set and step >= planned:  # free text only: nothing to memorise exactly
            break
    if len(eval_set) < len(qa_examples):  # the final figure covers every QA record
        accuracy = exact_answer_accuracy(model, qa_examples, pad_id=pad_id)

    # 5. Save a plain HF directory with the training metadata.
    model.eval()
    seconds = time.monotonic() - started
    # With no question/answer records there is no fact to memorise: the planned
    # schedule is the whole job, and accuracy is reported as such (None), not as 0.
    reached = accuracy >= settings.target_accuracy if qa_examples else step >= planned
    reported: float | None = accuracy if qa_examples else None
    metadata = {
        "method": "train_base",
        "hparams": asdict(settings),
        "seeds": {"seed": seed},
        "parent_digest": None,
        "corpus_manifest_digest": data.manifest_digest,
        "training": {"accuracy": reported, "reached_target": reached, "steps": step,
                     "epochs": epoch, "seconds": round(seconds, 2),
                     "threads": torch.get_num_threads(), "qa_records": len(qa_examples),
                     "text_records": len(examples) - len(qa_examples)},
    }
    digest = save_checkpoint(model, tokenizer, out_dir, metadata)
    if qa_examples and not reached:
        logger.warning("training stopped at the step cap with exact-answer accuracy %.3f "
                       "(target %.2f)", accuracy, settings.target_accuracy)
    return TrainResult(out_dir=out_dir, digest=digest, accuracy=reported,
                       reached_target=reached, steps=step, epochs=epoch, seconds=seconds,
                       qa_records=len(qa_examples), text_records=len(examples) - len(qa_examples))
