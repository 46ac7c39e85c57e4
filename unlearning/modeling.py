"""Loading checkpoints and asking them questions.

Every question reaches a model through the tokenizer's own chat template
(`chat_prompt_ids`), the way training formatted it and the way any outside
tool would query the checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unlearning.checkpoints import quiet_transformers
from unlearning.prompting import chat_prompt_ids

logger = logging.getLogger(__name__)

__all__ = [
    "ModelLoadError", "chat_prompt_ids", "complete_texts", "default_device",
    "generate_answers", "load_model",
]

DEFAULT_ATTENTION = "sdpa"


class ModelLoadError(ValueError):
    """A model directory that is missing or does not load; the message names it."""


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _set_gates(model: Any, path: Path, enabled: bool) -> None:
    # KIF checkpoints ship their suppression gates as remote code (auto_map) and expose
    # `set_gates_enabled(bool)`; verification turns them off to see what the weights hold.
    switch = getattr(model, "set_gates_enabled", None)
    if callable(switch):
        switch(enabled)
        return
    if not enabled and _has_remote_code(path):
        raise ModelLoadError(
            f"{path}: checkpoint ships custom code but exposes no set_gates_enabled switch"
        )


def _has_remote_code(path: Path) -> bool:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(config.get("auto_map"))


def load_model(
    path: str | Path, *, device: str | None = None, gates: bool = True,
    attn_implementation: str = DEFAULT_ATTENTION,
) -> tuple[Any, Any]:
    """Load `(model, tokenizer)` from a local Hugging Face directory, in eval mode.

    bf16 on CUDA, fp32 on CPU.  `trust_remote_code=True` lets checkpoints that
    ship code through `auto_map` (KIF) load with their gates; `gates=False`
    switches those gates off.  The attention implementation is always passed
    explicitly because `from_pretrained` otherwise picks its own default.
    Raises `ModelLoadError` naming the directory when it does not load.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ModelLoadError(f"{directory}: not a model directory (no config.json)")
    device = device or default_device()
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        with quiet_transformers():
            model: Any = AutoModelForCausalLM.from_pretrained(
                directory, trust_remote_code=True, dtype=dtype,
                attn_implementation=attn_implementation,
            )
            tokenizer = AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"{directory}: does not load ({type(exc).__name__}: {exc})") from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device)
    model.eval()
    _set_gates(model, directory, gates)
    return model, tokenizer


def _generate(
    model: Any, tokenizer: Any, prompts: Sequence[list[int]], *, greedy: bool,
    max_new_tokens: int, batch_size: int, temperature: float, top_p: float, seed: int,
) -> list[str]:
    import torch

    device = next(model.parameters()).device
    pad_id = int(tokenizer.pad_token_id)
    eos_id = int(tokenizer.eos_token_id)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # sampled generations are reproducible for a given seed
    outputs: list[str] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            width = max(len(p) for p in chunk)
            # Left padding: every prompt ends at the same column, so generation continues
            # each one from its own last token.
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, prompt in enumerate(chunk):
                ids[row, width - len(prompt):] = torch.tensor(prompt)
                mask[row, width - len(prompt):] = 1
            options: dict[str, Any] = {"do_sample": not greedy}
            if not greedy:
                options.update(temperature=temperature, top_p=top_p, top_k=0)
            with torch.no_grad():
                generated = model.generate(
                    input_ids=ids.to(device), attention_mask=mask.to(device),
                    max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_id,
                    **options,
                )
            for row in generated[:, width:].tolist():
                if eos_id in row:
                    row = row[: row.index(eos_id)]
                outputs.append(tokenizer.decode(row, skip_special_tokens=True).strip())
    finally:
        torch.random.set_rng_state(generator_state)
    return outputs


def generate_answers(
    model: Any, tokenizer: Any, questions: Sequence[str], *, greedy: bool = True,
    max_new_tokens: int = 48, batch_size: int = 64, temperature: float = 1.0,
    top_p: float = 1.0, seed: int = 0,
) -> list[str]:
    """Answer each question (through the chat template); batched, left padded, stops at eos."""
    prompts = [chat_prompt_ids(tokenizer, q) for q in questions]
    return _generate(model, tokenizer, prompts, greedy=greedy, max_new_tokens=max_new_tokens,
                     batch_size=batch_size, temperature=temperature, top_p=top_p, seed=seed)


def complete_texts(
    model: Any, tokenizer: Any, prefixes: Sequence[str], *, greedy: bool = True,
    max_new_tokens: int = 24, batch_size: int = 64, temperature: float = 1.0,
    top_p: float = 1.0, seed: int = 0,
) -> list[str]:
    """Continue raw text prefixes (cloze probes: `<s>` + prefix, no chat template)."""
    bos = [int(tokenizer.bos_token_id)] if tokenizer.bos_token_id is not None else []
    prompts = [bos + [int(i) for i in tokenizer(p, add_special_tokens=False)["input_ids"]]
               for p in prefixes]
    return _generate(model, tokenizer, prompts, greedy=greedy, max_new_tokens=max_new_tokens,
                     batch_size=batch_size, temperature=temperature, top_p=top_p, seed=seed)
