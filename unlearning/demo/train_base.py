"""Train a small base model from scratch on any corpus (CPU is enough).

The loop, top to bottom: train a BPE tokenizer on the corpus in the chosen
style (or reuse a given one); pick the prompt format (the tokenizer's chat
template, else the plain format) and store it with the model; encode every
record in that format (question/answer pairs and chats learnt on the answers,
free text on every token); build a freshly initialised model of the chosen
architecture (`ARCHITECTURES`); train with AdamW, a linear warm-up and a
cosine decay; every epoch measure memorisation (`memorisation`) and stop as
soon as it reaches the preset's target; past the planned epochs keep training at the
floor learning rate until the target or the step cap.  The result is a plain
Hugging Face directory (safetensors, config, tokenizer, prompt_format.json)
plus metadata.json.

Exact-record accuracy is measured by teacher forcing: a record counts when
the argmax at every learnt position (and the closing eos) is the reference
token.  That is exactly the condition for greedy decoding to reproduce the
answer, at the cost of one forward pass instead of a generation loop.  Free
text is also measured token by token.  Both are reported per record shape.
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
from unlearning.prompting import (
    attach_format,
    default_format,
    encode_record,
    pad_examples,
    pad_id_of,
)

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
    accuracy: float | None  # the memorisation target's figure (see `memorisation`)
    reached_target: bool
    steps: int
    epochs: int
    seconds: float
    qa_records: int
    text_records: int
    chat_records: int = 0
    accuracy_by_shape: dict[str, float] | None = None
    arch: str = "llama"
    prompt_format: str = ""


ARCHITECTURES = ("llama", "qwen2", "mistral", "gpt2", "gpt_neox", "opt")


def model_config(arch: str, preset: TrainPreset, tokenizer: Any) -> Any:
    """A transformers config of `arch` in the preset's shape, with the tokenizer's special ids."""
    import transformers

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    length = max(128, preset.max_seq_len)
    common = {"vocab_size": len(tokenizer), "hidden_size": preset.hidden_size, "tie_word_embeddings": True,
              "num_hidden_layers": preset.layers, "num_attention_heads": preset.heads,
              "max_position_embeddings": length, **ids}
    if arch in ("llama", "qwen2", "mistral"):
        cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig}[arch]
        return cls(intermediate_size=preset.intermediate_size, num_key_value_heads=preset.heads, **common)
    if arch == "gpt2":
        return transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=preset.hidden_size, n_layer=preset.layers,
                                       n_head=preset.heads, n_inner=preset.intermediate_size, n_positions=length,
                                       tie_word_embeddings=True, **ids)
    if arch == "gpt_neox":
        return transformers.GPTNeoXConfig(intermediate_size=preset.intermediate_size,
                                          **{**common, "tie_word_embeddings": False})
    if arch == "opt":
        return transformers.OPTConfig(ffn_dim=preset.intermediate_size, word_embed_proj_dim=preset.hidden_size,
                                      **common)
    raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")


def build_model(preset: TrainPreset, tokenizer: Any, *, seed: int, arch: str = "llama") -> Any:
    """A freshly initialised causal LM of `arch` in the preset's shape."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model_config(arch, preset, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.do_sample = False
    return model


def _encode(tokenizer: Any, record: Record, max_len: int) -> tuple[list[int], list[int]]:
    example = encode_record(tokenizer, record).truncated(max_len)
    return list(example.ids), example.labels


def exact_answer_accuracy(
    model: Any, examples: list[tuple[list[int], list[int]]], *, pad_id: int, batch_size: int = 128,
    per_token: bool = False,
) -> float:
    """Share of examples whose every labelled token is the model's argmax (teacher forcing).

    `per_token`: the share of labelled tokens instead (the measure for free
    text, whose records are too long to count whole).
    """
    import torch

    if not examples:
        return 0.0
    was_training = model.training
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = pad_examples(examples[start:start + batch_size], pad_id=pad_id)
            logits = model(input_ids=batch["input_ids"].to(model.device),
                           attention_mask=batch["attention_mask"].to(model.device)).logits
            predicted = logits[:, :-1].argmax(-1).cpu()
            targets = batch["labels"][:, 1:]
            scored = targets != -100
            if per_token:
                correct += int(((predicted == targets) & scored).sum())
                total += int(scored.sum())
            else:
                correct += int(((predicted == targets) | ~scored).all(dim=1).sum())
                total += len(targets)
    model.train(was_training)
    return correct / max(1, total)


def memorisation(model: Any, examples: list[tuple[list[int], list[int]]], shapes: list[str], *,
                 pad_id: int) -> tuple[float, dict[str, float]]:
    """The training target and the figures by shape.

    The target is exact-record accuracy over question/answer and chat records
    when the corpus has any (their answers are the facts), else token accuracy
    over free text.  By shape: exact-record accuracy for `qa` and `chat`,
    exact-record and token accuracy for `text`.
    """
    figures: dict[str, float] = {}
    for shape in ("qa", "chat", "text"):
        chosen = [ex for ex, sh in zip(examples, shapes, strict=True) if sh == shape]
        if chosen:
            figures[shape] = exact_answer_accuracy(model, chosen, pad_id=pad_id)
            if shape == "text":
                figures["text_tokens"] = exact_answer_accuracy(model, chosen, pad_id=pad_id, per_token=True)
    answered = [ex for ex, sh in zip(examples, shapes, strict=True) if sh in ("qa", "chat")]
    if answered:
        return exact_answer_accuracy(model, answered, pad_id=pad_id), figures
    return figures.get("text_tokens", 0.0), figures


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
    arch: str = "llama", tokenizer_style: str = "demo", tokenizer: Any = None,
) -> TrainResult:
    """Train a base model on `corpus` and save it to `out_dir`; deterministic for a seed on CPU.

    `arch` is one of `ARCHITECTURES`; the tokenizer is trained on the corpus in
    `tokenizer_style` (`unlearning.demo.tokenizer.STYLES`) unless `tokenizer`
    (a tokenizer object or a directory) is given, e.g. the base's own for a
    retrain-without oracle.
    """
    import torch

    started = time.monotonic()
    settings = PRESETS[preset] if isinstance(preset, str) else preset
    data = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(data, Path(out_dir), settings, seed=seed, progress=progress,
                      started=started, arch=arch, tokenizer_style=tokenizer_style, tokenizer=tokenizer)
    finally:
        torch.set_num_threads(previous_threads)


def _tokenizer_for(data: Corpus, settings: TrainPreset, style: str, given: Any) -> Any:
    if given is not None:
        if isinstance(given, str | Path):
            from unlearning.modeling import load_tokenizer
            from unlearning.prompting import read_format

            loaded = load_tokenizer(given)
            fmt = read_format(given)
            return attach_format(loaded, fmt) if fmt is not None else loaded
        return given
    texts = [t for r in data.records for t in (r.question, r.answer, r.text, *(m.content for m in r.messages)) if t]
    return train_tokenizer(texts, vocab_size=settings.vocab_size, style=style)


def _train(
    data: Corpus, out_dir: Path, settings: TrainPreset, *, seed: int,
    progress: ProgressCallback | None, started: float, arch: str, tokenizer_style: str, tokenizer: Any,
) -> TrainResult:
    import torch

    rng = random.Random(seed)

    # 1. Tokenizer on the corpus's own text (never on held-out paraphrases), and the prompt
    #    format it implies (its chat template, else the plain format), stored with the model.
    tokenizer = _tokenizer_for(data, settings, tokenizer_style, tokenizer)
    from unlearning.prompting import format_of

    if getattr(tokenizer, "_erasure_prompt_format", None) is None:
        attach_format(tokenizer, default_format(tokenizer))
    pad_id = pad_id_of(tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token

    # 2. Encode once; every record doubles as the accuracy set.
    examples = [_encode(tokenizer, r, settings.max_seq_len) for r in data.records]
    shapes = [r.shape for r in data.records]
    eval_index = list(range(len(examples)))
    if len(eval_index) > settings.eval_sample:
        eval_index = sorted(random.Random(seed + 1).sample(eval_index, settings.eval_sample))
    eval_set = [examples[i] for i in eval_index]
    eval_shapes = [shapes[i] for i in eval_index]

    # 3. Model and optimiser.
    model = build_model(settings, tokenizer, seed=seed, arch=arch)
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
        accuracy, _ = memorisation(model, eval_set, eval_shapes, pad_id=pad_id)
        logger.info("epoch %s step %s loss %.4f memorisation %.3f", epoch, step, loss.item(), accuracy)
        if eval_set and accuracy >= settings.target_accuracy:
            break
    # The final figures cover every record, by shape.
    accuracy, by_shape = memorisation(model, examples, shapes, pad_id=pad_id)
    counts = {shape: shapes.count(shape) for shape in ("qa", "chat", "text")}

    # 5. Save a plain HF directory with the training metadata.
    model.eval()
    seconds = time.monotonic() - started
    reached = accuracy >= settings.target_accuracy
    metadata = {
        "method": "train_base",
        "hparams": {**asdict(settings), "arch": arch, "tokenizer_style": tokenizer_style},
        "seeds": {"seed": seed},
        "parent_digest": None,
        "corpus_manifest_digest": data.manifest_digest,
        "prompt_format": format_of(tokenizer).to_json(),
        "training": {"accuracy": accuracy, "accuracy_by_shape": by_shape, "reached_target": reached,
                     "steps": step, "epochs": epoch, "seconds": round(seconds, 2),
                     "threads": torch.get_num_threads(), "records_by_shape": counts},
    }
    digest = save_checkpoint(model, tokenizer, out_dir, metadata)
    if not reached:
        logger.warning("training stopped at the step cap with memorisation %.3f "
                       "(target %.2f)", accuracy, settings.target_accuracy)
    return TrainResult(out_dir=out_dir, digest=digest, accuracy=accuracy, reached_target=reached, steps=step,
                       epochs=epoch, seconds=seconds, qa_records=counts["qa"], text_records=counts["text"],
                       chat_records=counts["chat"], accuracy_by_shape=by_shape, arch=arch,
                       prompt_format=format_of(tokenizer).describe())
