"""erase(): every method on every architecture, reloadable checkpoints, batches and continual runs."""

from __future__ import annotations

import json

import pytest
import torch

from unlearning import methods
from unlearning.checkpoints import checkpoint_digest, read_metadata, save_checkpoint
from unlearning.corpus import load_corpus
from unlearning.erase import erase, erase_continual, method_input
from unlearning.modeling import load_model
from unlearning.progress import Progress
from unlearning.sets import Subject, build_sets

ONE_STEP = {"steps": 1, "batch_size": 64}
ONE_STEP_KIF = {**ONE_STEP, "min_effect": 0.0, "bootstrap": 20}


def _people(corpus_dir) -> list[dict]:
    return [json.loads(line) for line in (corpus_dir / "people.jsonl").read_text().splitlines()]


def _sets(corpus_dir, indices=(0,)):
    people = _people(corpus_dir)
    subjects = [Subject(people[i]["name"], tuple(people[i]["aliases"])) for i in indices]
    return build_sets(load_corpus(corpus_dir / "corpus.jsonl"), subjects, retain_per_forget=1)


def _logits(model, tokenizer) -> torch.Tensor:
    ids = torch.tensor([tokenizer("Where was Quentin Cardoso born? He was born in", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gpt2", "gpt_neox", "opt"])
@pytest.mark.parametrize("name", ["asu", "kif", "gradascent", "graddiff", "npo", "idk"])
def test_one_step_of_every_method_runs_and_the_checkpoint_reloads_identically(
    tiny_corpus_dir, tiny_arch_model_dir, tmp_path, arch, name
):
    model, tokenizer = load_model(tiny_arch_model_dir(arch), device="cpu")
    tokenizer.padding_side = "right"
    method = methods.get(name)
    hp = methods.hparams_from_json(name, ONE_STEP_KIF if name == "kif" else ONE_STEP)
    outcome = method.unlearn(model, tokenizer, method_input(_sets(tiny_corpus_dir)), hp)
    assert outcome.steps == 1
    assert torch.isfinite(torch.tensor(outcome.final_loss))
    save_checkpoint(outcome.model, tokenizer, tmp_path / name, {"method": name})
    reloaded, _ = load_model(tmp_path / name, device="cpu")
    assert torch.equal(_logits(reloaded, tokenizer), _logits(outcome.model, tokenizer))


def test_erase_writes_a_checkpoint_with_its_provenance_and_reports_progress(
    tiny_corpus_dir, tiny_arch_model_dir, tmp_path
):
    base = tiny_arch_model_dir("llama")
    sets = _sets(tiny_corpus_dir)
    seen: list[Progress] = []
    result = erase(base, sets, method="asu", out_dir=tmp_path / "out", hparams={"steps": 2}, progress=seen.append)
    meta = read_metadata(result.out_dir)
    assert result.digest == checkpoint_digest(result.out_dir)
    assert meta["method"] == "asu" and meta["parent_digest"] == checkpoint_digest(base)
    assert meta["hparams"]["steps"] == 2 and meta["seeds"] == {"seed": 0}
    assert meta["forget_digest"] == sets.forget_digest and meta["retain_digest"] == sets.retain_digest
    assert seen[-1].step == seen[-1].total == result.steps
    assert any(p.eta_seconds is not None for p in seen)


def test_many_subjects_are_erased_in_one_run(tiny_corpus_dir, tiny_arch_model_dir, tmp_path):
    sets = _sets(tiny_corpus_dir, indices=(0, 1, 2))
    data = method_input(sets)
    assert len(data.subjects) == 3
    assert all(data.record_subjects.get(r.id) for r in data.forget)  # every forget record has its subject
    assert {i for r in data.forget for i in data.record_subjects[r.id]} == {0, 1, 2}
    result = erase(tiny_arch_model_dir("llama"), sets, method="graddiff", out_dir=tmp_path / "batch", hparams=ONE_STEP)
    assert read_metadata(result.out_dir)["forget_records"] == len(sets.forget)


def test_continual_runs_chain_each_checkpoint_to_the_previous_one(tiny_corpus_dir, tiny_arch_model_dir, tmp_path):
    base = tiny_arch_model_dir("qwen2")
    results = erase_continual(
        base, [_sets(tiny_corpus_dir, (0,)), _sets(tiny_corpus_dir, (1,))],
        method="npo", out_root=tmp_path / "chain", hparams=ONE_STEP,
    )
    assert read_metadata(results[0].out_dir)["parent_digest"] == checkpoint_digest(base)
    assert read_metadata(results[1].out_dir)["parent_digest"] == results[0].digest


def test_method_input_gives_the_methods_subjects_probes_and_a_pool_of_other_peoples_names(tiny_corpus_dir):
    sets = _sets(tiny_corpus_dir)
    data = method_input(sets)
    subject = sets.subjects[0]
    assert data.subject_of(data.forget[0]) == subject
    assert data.probes and len(data.probes) == len(sets.probes)
    own_parts = set(subject.name.split())
    assert data.name_pool and not own_parts & {p.split(":")[-1] for p in data.name_pool}


def test_a_named_preset_is_accepted_by_every_method_and_thorough_trains_longer(tiny_arch_model_dir):
    from unlearning.erase import resolve_hparams

    model, _ = load_model(tiny_arch_model_dir("llama"), device="cpu")
    for name in methods.METHOD_NAMES:
        standard = resolve_hparams(name, {"preset": "standard"}, model, subjects=1)
        thorough = resolve_hparams(name, {"preset": "thorough"}, model, subjects=1)
        assert thorough.steps > standard.steps, name
    with pytest.raises(ValueError, match="preset"):
        resolve_hparams("kif", {"preset": "heroic"}, model, subjects=1)


def test_erase_rejects_unknown_methods_hyper_parameters_and_empty_sets(tiny_corpus_dir, tiny_arch_model_dir, tmp_path):
    base = tiny_arch_model_dir("llama")
    sets = _sets(tiny_corpus_dir)
    with pytest.raises(methods.UnknownMethod):
        erase(base, sets, method="nope", out_dir=tmp_path / "a")
    with pytest.raises(ValueError, match="unknown hyper-parameters"):
        erase(base, sets, method="asu", out_dir=tmp_path / "b", hparams={"lr_typo": 1})
    empty = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [Subject("Nobody Atall")])
    with pytest.raises(ValueError, match="nothing to erase"):
        erase(base, empty, method="asu", out_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_candidate_is_stored_in_the_dtype_its_parent_was_stored_in(
    tiny_corpus_dir, tiny_arch_model_dir, tmp_path, dtype
):
    import shutil

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from unlearning.checkpoints import stored_dtype

    base = tmp_path / "base"
    shutil.copytree(tiny_arch_model_dir("llama"), base)
    AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype)).save_pretrained(base)
    assert stored_dtype(base) == dtype
    result = erase(base, _sets(tiny_corpus_dir), method="graddiff", out_dir=tmp_path / "out", hparams=ONE_STEP)
    assert stored_dtype(result.out_dir) == dtype and read_metadata(result.out_dir)["stored_dtype"] == dtype
    with safe_open(str(result.out_dir / "model.safetensors"), "pt") as weights:
        assert {str(weights.get_tensor(k).dtype) for k in weights.keys()} == {f"torch.{dtype}"}
    model, _ = load_model(result.out_dir, device="cpu")  # loaded for training and checks in fp32, as any
    assert next(model.parameters()).dtype == torch.float32


def test_a_config_without_a_float_dtype_leaves_the_weights_as_trained(tmp_path):
    from unlearning.checkpoints import stored_dtype

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    assert stored_dtype(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "int8"}), encoding="utf-8")
    assert stored_dtype(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}), encoding="utf-8")
    assert stored_dtype(tmp_path) == "float16"
    assert stored_dtype(tmp_path / "missing") is None
