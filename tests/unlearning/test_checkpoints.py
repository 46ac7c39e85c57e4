from __future__ import annotations

import hashlib
import json
from pathlib import Path

from unlearning.checkpoints import checkpoint_digest, read_metadata, save_checkpoint


def test_the_digest_follows_the_documented_recipe(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_bytes(b"bee")
    (tmp_path / "sub" / "a.bin").write_bytes(b"\x00\x01")
    lines = sorted([
        f"b.txt:{hashlib.sha256(b'bee').hexdigest()}\n",
        f"sub/a.bin:{hashlib.sha256(bytes([0, 1])).hexdigest()}\n",
    ])
    assert checkpoint_digest(tmp_path) == hashlib.sha256("".join(lines).encode()).hexdigest()


def test_the_digest_is_stable_and_sensitive_to_a_one_byte_change(tiny_arch_model_dir, tmp_path: Path) -> None:
    source = tiny_arch_model_dir("llama")
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in source.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert checkpoint_digest(source) == checkpoint_digest(copy)
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(weights))
    assert checkpoint_digest(source) != checkpoint_digest(copy)


def test_a_renamed_file_changes_the_digest(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    before = checkpoint_digest(tmp_path)
    (tmp_path / "a").rename(tmp_path / "b")
    assert checkpoint_digest(tmp_path) != before


def test_save_checkpoint_writes_metadata_with_library_versions(tiny_arch_model_dir, tmp_path: Path) -> None:
    from unlearning.modeling import load_model
    model, tokenizer = load_model(tiny_arch_model_dir("qwen2"), device="cpu")
    digest = save_checkpoint(model, tokenizer, tmp_path / "out", {
        "method": "asu", "hparams": {"tau": 2.0}, "seeds": {"seed": 1}, "parent_digest": "ab" * 32})
    meta = read_metadata(tmp_path / "out")
    assert meta["method"] == "asu" and meta["parent_digest"] == "ab" * 32
    assert {"torch", "transformers", "python"} <= set(meta["library_versions"])
    assert digest == checkpoint_digest(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "qwen2"


def test_every_test_architecture_reloads_with_identical_outputs(tiny_arch_model_dir) -> None:
    import torch

    from unlearning.modeling import generate_answers, load_model
    for arch in ("llama", "mistral", "qwen2", "gpt2"):
        model, tokenizer = load_model(tiny_arch_model_dir(arch), device="cpu")
        again, _ = load_model(tiny_arch_model_dir(arch), device="cpu")
        ids = torch.tensor([[tokenizer.bos_token_id, 7, 8, 9]])
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits), arch
        answers = generate_answers(model, tokenizer, ["Who?", "Where was it?"], max_new_tokens=4)
        assert len(answers) == 2, arch


def test_a_symlink_inside_a_checkpoint_is_refused_not_skipped(tmp_path: Path) -> None:
    """The old digest skipped links, so a linked module or weights file loaded with a
    checkpoint whose digest still matched (issue 14, item 8)."""
    import pytest

    from unlearning.checkpoints import CheckpointFileRefused

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (tmp_path / "elsewhere.py").write_text("print('not registered')\n")
    (checkpoint / "kif_remote.py").symlink_to(tmp_path / "elsewhere.py")
    with pytest.raises(CheckpointFileRefused, match="kif_remote.py is a symlink"):
        checkpoint_digest(checkpoint)
