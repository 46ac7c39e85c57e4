"""Writing checkpoints and computing their content digest.

A checkpoint is a plain Hugging Face directory (safetensors, config,
tokenizer) plus `prompt_format.json` (how questions and answers are laid out
for it, `unlearning.prompting`) and `metadata.json` saying how it was made.  `checkpoint_digest` is the recipe pinned in docs/internals.md;
`deletion.domain.registry` implements the same recipe without importing the
engine, and a test checks that both agree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

METADATA_FILE = "metadata.json"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class CheckpointFileRefused(ValueError):
    """A symlink (or another file that is not regular) inside a checkpoint directory."""


def checkpoint_digest(directory: str | Path) -> str:
    """sha256 hex of the lines `<relative posix path>:<sha256 of the file>\\n`, sorted by path.

    Every regular file under the directory counts (metadata included), so a
    one-byte change anywhere changes the digest.  A symlink or any other file that
    is not regular raises `CheckpointFileRefused`: it is refused, never skipped,
    because a skipped link could bring bytes the digest does not cover (code named
    by `auto_map`, weights) into a load.
    """
    root = Path(directory)
    if root.is_symlink() or not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {root}")
    lines = []
    for current, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(current, name)
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                continue  # os.walk descends into real folders; a linked one is S_ISLNK
            if not stat.S_ISREG(mode):
                kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
                raise CheckpointFileRefused(
                    f"{root}: {path.relative_to(root).as_posix()} is {kind}; refused")
            lines.append(f"{path.relative_to(root).as_posix()}:{_file_sha256(path)}\n")
    return hashlib.sha256("".join(sorted(lines)).encode("utf-8")).hexdigest()


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own progress bars: the engine reports through callbacks only."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shape a checkpoint's numbers (recorded in metadata)."""
    import safetensors
    import tokenizers
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
    }


def save_checkpoint(
    model: Any, tokenizer: Any, out_dir: str | Path, metadata: Mapping[str, Any]
) -> str:
    """Save model + tokenizer as a Hugging Face directory with `metadata.json`; return its digest.

    `metadata` should carry `method`, `hparams`, `seeds` and `parent_digest`
    (the digest of the checkpoint this one was derived from, or None);
    library versions are added here.  The model is saved as safetensors.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    from unlearning.prompting import format_of, write_format

    write_format(out, format_of(tokenizer))  # the same prompt layout as the parent
    record: dict[str, Any] = {"method": None, "hparams": {}, "seeds": {}, "parent_digest": None}
    record.update(dict(metadata))
    record["library_versions"] = library_versions()
    (out / METADATA_FILE).write_text(
        json.dumps(record, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8"
    )
    digest = checkpoint_digest(out)
    logger.info("saved checkpoint %s (digest %s)", out, digest[:12])
    return digest


STORED_DTYPES = ("float32", "bfloat16", "float16")


def stored_dtype(directory: str | Path) -> str | None:
    """The floating-point type a checkpoint's weights are stored in, from its config
    (`dtype`, or the older `torch_dtype`): one of `STORED_DTYPES`, else None (not said, or
    a quantised or unusual type, which the caller leaves as it is)."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    return value if value in STORED_DTYPES else None


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """The `metadata.json` of a checkpoint, or {} when it has none (a foreign HF directory)."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data
