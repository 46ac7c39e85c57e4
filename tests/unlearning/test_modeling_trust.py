"""What `load_model` runs: code a checkpoint ships only when it is the checkpoint's own.

KIF checkpoints ship `kif_remote.py` and name it in `auto_map` (test_kif.py shows they
keep loading, gates on and off).  Everything here must be refused before transformers
imports or fetches anything: an `auto_map` naming a hub repository, a path, a module the
checkpoint lacks, a module that is a symlink to code the digest never covered, and any
symlink at all (a weights file pointing elsewhere).  The old loader passed
`trust_remote_code=True` for every checkpoint and followed links.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from unlearning.modeling import ModelLoadError, load_model

EVIL = '''from pathlib import Path
Path({marker!r}).write_text("imported")


class EvilForCausalLM:  # never reached: importing the module is the attack
    pass
'''


@pytest.fixture
def checkpoint(tiny_arch_model_dir, tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_arch_model_dir("llama"), copy)
    return copy


def _auto_map(directory: Path, reference: str) -> None:
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoModelForCausalLM": reference}
    config_path.write_text(json.dumps(config))


def test_a_plain_checkpoint_loads_without_remote_code_and_offline(checkpoint: Path) -> None:
    model, tokenizer = load_model(checkpoint, device="cpu")
    assert type(model).__module__.startswith("transformers.")
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_an_auto_map_module_that_links_outside_the_checkpoint_is_never_imported(
    checkpoint: Path, tmp_path: Path,
) -> None:
    marker = tmp_path / "imported.txt"
    outside = tmp_path / "outside.py"
    outside.write_text(EVIL.format(marker=str(marker)))
    (checkpoint / "evil.py").symlink_to(outside)
    _auto_map(checkpoint, "evil.EvilForCausalLM")

    with pytest.raises(ModelLoadError, match="symlink"):
        load_model(checkpoint, device="cpu")
    assert not marker.exists()


@pytest.mark.parametrize("reference", ["someorg/somerepo--evil.EvilForCausalLM",
                                       "../elsewhere/evil.EvilForCausalLM",
                                       "missing.EvilForCausalLM"])
def test_an_auto_map_that_names_code_outside_the_checkpoint_is_refused(
    checkpoint: Path, tmp_path: Path, reference: str,
) -> None:
    marker = tmp_path / "imported.txt"
    (tmp_path / "evil.py").write_text(EVIL.format(marker=str(marker)))
    _auto_map(checkpoint, reference)

    with pytest.raises(ModelLoadError, match="refused"):
        load_model(checkpoint, device="cpu")
    assert not marker.exists()


def test_a_weights_file_that_is_a_symlink_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    weights = next(checkpoint.glob("*.safetensors"))
    moved = tmp_path / "elsewhere.safetensors"
    weights.rename(moved)
    weights.symlink_to(moved)

    with pytest.raises(ModelLoadError, match="symlink"):
        load_model(checkpoint, device="cpu")


def test_train_base_never_runs_code_a_tokenizer_folder_names_outside_itself(
    capsys, checkpoint: Path, tiny_corpus_dir: Path, tmp_path: Path,
) -> None:
    """`train-base --tokenizer DIR` reads DIR's config under the same rule as `load_model`
    (it passed `trust_remote_code=True` for any folder)."""
    from tests.cli_run import run_cli

    marker = tmp_path / "imported.txt"
    (checkpoint / "evil.py").symlink_to(tmp_path / "outside.py")
    (tmp_path / "outside.py").write_text(EVIL.format(marker=str(marker)))
    config_path = checkpoint / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig"}
    config_path.write_text(json.dumps(config))

    code, _, err = run_cli(capsys, "train-base", "--corpus", str(tiny_corpus_dir / "corpus.jsonl"),
                           "--tokenizer", str(checkpoint), "--out", str(tmp_path / "out"), "--preset", "tiny")
    assert code == 2
    assert "--tokenizer" in err and "refused" in err and "Traceback" not in err
    assert not marker.exists()
