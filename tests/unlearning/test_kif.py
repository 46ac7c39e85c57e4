"""KIF: the signature separates the subject, the gates ship as remote code, gates off = base."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from unlearning.checkpoints import save_checkpoint
from unlearning.corpus import load_corpus
from unlearning.erase import method_input
from unlearning.methods import kif_remote
from unlearning.methods.kif import KIF, KIFHparams, mine_signature, set_gates
from unlearning.modeling import load_model
from unlearning.sets import Subject, build_sets


def _sets(corpus_dir, index: int = 0):
    people = [json.loads(line) for line in (corpus_dir / "people.jsonl").read_text().splitlines()]
    person = people[index]
    return build_sets(load_corpus(corpus_dir / "corpus.jsonl"), [Subject(person["name"], tuple(person["aliases"]))],
                      retain_per_forget=2)


def _logits(model, tokenizer) -> torch.Tensor:
    ids = torch.tensor([tokenizer("Where was Quentin Cardoso born? He was born in", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_mining_finds_a_planted_direction_and_nothing_in_noise():
    torch.manual_seed(0)
    hidden, n = 16, 40
    planted = torch.zeros(hidden)
    planted[3] = 1.0
    control = {kind: torch.randn(2, n, hidden) for kind in ("subject", "prompt_end")}
    subject = {kind: torch.randn(2, n, hidden) for kind in ("subject", "prompt_end")}
    subject["subject"][1] += 3.0 * planted  # only layer 1, only at the subject token
    found = mine_signature(subject, control, KIFHparams(k=1, min_effect=1.0, bootstrap=100))
    assert [sig.layer for sig in found] == [1]
    assert abs(float(found[0].directions[0] @ planted)) > 0.9
    assert float(found[0].subject_z[0]) > 1.0


def test_a_gate_removes_the_projection_only_where_it_fires():
    gate = kif_remote.SuppressionGate(4, 1)
    gate.directions[0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    with torch.no_grad():
        gate.strength.fill_(1.0)
        gate.slope.fill_(50.0)
        gate.threshold.fill_(1.0)
    hidden = torch.tensor([[5.0, 1.0, 2.0, 3.0], [0.2, 1.0, 2.0, 3.0]])
    out = gate(hidden)
    assert torch.allclose(out[0], torch.tensor([0.0, 1.0, 2.0, 3.0]), atol=1e-4)
    assert torch.allclose(out[1], hidden[1], atol=1e-4)


def test_a_fresh_lora_changes_nothing_and_acts_only_where_its_switch_is_on():
    torch.manual_seed(0)
    plain, lora = kif_remote.SuppressionGate(4, 1), kif_remote.SuppressionGate(4, 1, rank=2)
    for gate in (plain, lora):
        gate.directions[0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
        with torch.no_grad():
            gate.strength.fill_(0.5)
    hidden = torch.tensor([[5.0, 1.0, 2.0, 3.0], [-5.0, 1.0, 2.0, 3.0]])
    assert torch.equal(lora(hidden), plain(hidden))  # ``up`` starts at zero
    with torch.no_grad():
        lora.lora_up.normal_()
        lora.lora_mix.fill_(20.0)  # switch on for z > 0, off for z < 0
    with torch.no_grad():
        switch = lora.lora_gate(hidden)[:, 0]
    assert float(switch[0]) > 0.99 and float(switch[1]) < 0.01
    with torch.no_grad():
        delta = lora(hidden) - plain(hidden)
    assert float(delta[0].abs().max()) > 1e-3
    assert float(delta[1].abs().max()) < 1e-3


@pytest.mark.parametrize("arch,rank", [("llama", 4), ("mistral", 4), ("qwen2", 4), ("llama", 0),
                                       ("gpt2", 4), ("gpt_neox", 4), ("opt", 0)])
def test_a_kif_checkpoint_loads_its_gates_through_plain_from_pretrained_and_gates_off_is_the_base(
    tiny_corpus_dir, tiny_arch_model_dir, tmp_path, arch, rank
):
    base_dir = tiny_arch_model_dir(arch)
    model, tokenizer = load_model(base_dir, device="cpu")
    base_logits = _logits(model, tokenizer)
    tokenizer.padding_side = "right"
    data = method_input(_sets(tiny_corpus_dir))
    hp = KIFHparams(steps=1, min_effect=0.0, bootstrap=50, lora_rank=rank)
    outcome = KIF().unlearn(model, tokenizer, data, hp)
    assert outcome.steps >= 1 and outcome.final_loss == outcome.final_loss
    save_checkpoint(outcome.model, tokenizer, tmp_path / "kif", {"method": "kif"})
    config = json.loads((tmp_path / "kif" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"].startswith("kif_remote.KIF")
    assert (tmp_path / "kif" / "kif_remote.py").is_file()
    assert config["kif"]["rank"] == rank

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "kif", trust_remote_code=True).eval()
    assert plain.gates_enabled
    gated_logits = _logits(plain, tokenizer)
    assert torch.equal(gated_logits, _logits(outcome.model, tokenizer))  # reloads with identical outputs
    assert not torch.equal(gated_logits, base_logits)  # the gates do something
    plain.set_gates_enabled(False)
    assert torch.equal(_logits(plain, tokenizer), base_logits)

    off, _ = load_model(tmp_path / "kif", device="cpu", gates=False)
    assert torch.equal(_logits(off, tokenizer), base_logits)


def test_set_gates_reports_a_plain_model_as_having_none(tiny_arch_model_dir):
    model, _ = load_model(tiny_arch_model_dir("llama"), device="cpu")
    assert set_gates(model, False) is False


def test_kif_refuses_when_no_layer_separates_the_subject(tiny_corpus_dir, tiny_arch_model_dir):
    model, tokenizer = load_model(tiny_arch_model_dir("llama"), device="cpu")
    data = method_input(_sets(tiny_corpus_dir))
    with pytest.raises(ValueError, match="Cohen's d"):
        KIF().unlearn(model, tokenizer, data, KIFHparams(min_effect=1e9, bootstrap=20))


@pytest.mark.slow
def test_kif_makes_the_tiny_model_forget_one_person_and_keep_the_others(tiny_corpus_dir, tiny_base_model_dir):
    from unlearning.erase import resolve_hparams
    from unlearning.modeling import generate_answers

    people = [json.loads(line) for line in (tiny_corpus_dir / "people.jsonl").read_text().splitlines()]
    controls = [json.loads(line) for line in (tiny_corpus_dir / "control.jsonl").read_text().splitlines()]
    subject, others = people[2], people[3:]
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")

    def accuracy(m, person_list) -> float:
        facts = [f for p in person_list for f in p["facts"]]
        answers = generate_answers(m, tokenizer, [f["question"] for f in facts], max_new_tokens=24)
        return sum(f["value"] in a for f, a in zip(facts, answers, strict=True)) / len(facts)

    before_forget, before_retain, chance = accuracy(model, [subject]), accuracy(model, others), accuracy(model, controls)
    assert before_forget >= 0.8
    torch.manual_seed(0)  # the LoRA's initialisation: the same run whatever ran before
    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [Subject(subject["name"], tuple(subject["aliases"]))])
    tokenizer.padding_side = "right"
    outcome = KIF().unlearn(model, tokenizer, method_input(sets), resolve_hparams("kif", None, model, subjects=1))
    tokenizer.padding_side = "left"
    assert accuracy(outcome.model, [subject]) <= chance + 0.2
    assert accuracy(outcome.model, others) >= 0.95 * before_retain


def test_distillation_ships_a_plain_checkpoint_whose_own_weights_changed(
    tiny_corpus_dir, tiny_arch_model_dir, tmp_path,
):
    model, tokenizer = load_model(tiny_arch_model_dir("qwen2"), device="cpu")
    base_logits = _logits(model, tokenizer)
    tokenizer.padding_side = "right"
    hp = KIFHparams(steps=2, min_effect=0.0, bootstrap=20, lora_rank=4, distill_steps=3)
    outcome = KIF().unlearn(model, tokenizer, method_input(_sets(tiny_corpus_dir)), hp)
    assert outcome.details["distilled"] and outcome.steps == 2 + 3
    assert set_gates(outcome.model, False) is False  # no gates left to switch off
    assert not any("kif" in name for name, _ in outcome.model.named_modules())
    save_checkpoint(outcome.model, tokenizer, tmp_path / "plain", {"method": "kif"})
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert "auto_map" not in config and not (tmp_path / "plain" / "kif_remote.py").exists()
    reloaded, _ = load_model(tmp_path / "plain", device="cpu")
    assert torch.equal(_logits(reloaded, tokenizer), _logits(outcome.model, tokenizer))
    assert not torch.equal(_logits(reloaded, tokenizer), base_logits)  # the weights themselves changed


def test_a_prompt_that_names_no_one_is_no_signature_prompt(tiny_corpus_dir, tiny_arch_model_dir):
    # A cloze of the answer ("Continue the sentence.") reads the same for the subject and for
    # the stranger: as a pair it adds the same activations to both sides and hides the signature.
    import dataclasses

    from unlearning.methods.kif import signature_prompts
    from unlearning.probes import Probe

    _, tokenizer = load_model(tiny_arch_model_dir("llama"), device="cpu")
    data = method_input(_sets(tiny_corpus_dir))
    nameless = Probe(kind="cloze", prompt="Continue the sentence.", expected="Lisbon",
                     record_id=data.forget[0].id, subject=0)
    data = dataclasses.replace(data, probes=(*data.probes, nameless))
    own, _, _, other, _ = signature_prompts(tokenizer, data, seed=0)
    assert own and len(own) == len(other)
    assert all(a != b for a, b in zip(own, other, strict=True))
