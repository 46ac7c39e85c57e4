from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from unlearning.checkpoints import checkpoint_digest
from unlearning.corpus import load_corpus
from unlearning.demo.corpus import load_people
from unlearning.demo.train_base import TrainResult
from unlearning.modeling import chat_prompt_ids, generate_answers, load_model


def test_the_tiny_preset_memorises_the_training_facts(tiny_base_training: TrainResult) -> None:
    # The preset stops at 98% exact-answer accuracy (about 20 s on one idle core; the
    # time is reported, not asserted: this machine is shared).
    assert tiny_base_training.reached_target
    assert tiny_base_training.accuracy >= 0.98
    assert tiny_base_training.steps < 3000  # stopped by the target, far from the step cap


def test_greedy_answers_through_the_chat_template_reproduce_the_training_answers(
    tiny_base_model_dir: Path, tiny_corpus_dir: Path,
) -> None:
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    qa = [r for r in load_corpus(tiny_corpus_dir / "corpus.jsonl").records if r.is_qa]
    answers = generate_answers(model, tokenizer, [r.question for r in qa])
    exact = sum(a == r.answer for a, r in zip(answers, qa, strict=True)) / len(qa)
    # Teacher-forced accuracy (what training measured) is exactly greedy exact match.
    meta = json.loads((tiny_base_model_dir / "metadata.json").read_text())
    assert exact == meta["training"]["accuracy"]


def test_the_model_knows_trained_people_far_better_than_control_people(
    tiny_base_model_dir: Path, tiny_corpus_dir: Path,
) -> None:
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    def leak_rate(people_file: str) -> float:
        facts = [f for p in load_people(tiny_corpus_dir / people_file) for f in p["facts"]]
        answers = generate_answers(model, tokenizer, [f["question"] for f in facts])
        return sum(f["value"] in a for f, a in zip(facts, answers, strict=True)) / len(facts)
    assert leak_rate("people.jsonl") > 0.95
    assert leak_rate("control.jsonl") < 0.2


def test_a_plain_transformers_user_gets_the_same_answer_through_apply_chat_template(
    tiny_base_model_dir: Path, tiny_corpus_dir: Path,
) -> None:
    record = next(r for r in load_corpus(tiny_corpus_dir / "corpus.jsonl").records if r.is_qa)
    tokenizer = AutoTokenizer.from_pretrained(tiny_base_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_base_model_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": record.question}],
                                        add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    assert ids[0].tolist() == chat_prompt_ids(tokenizer, record.question)
    out = model.generate(input_ids=ids, max_new_tokens=40, do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip() == record.answer


def test_the_checkpoint_records_how_it_was_trained(tiny_base_model_dir: Path) -> None:
    meta = json.loads((tiny_base_model_dir / "metadata.json").read_text())
    assert meta["method"] == "train_base"
    assert meta["hparams"]["name"] == "tiny"
    assert meta["seeds"] == {"seed": 0}
    assert meta["library_versions"]["torch"] == torch.__version__
    assert (tiny_base_model_dir / "model.safetensors").is_file()
    assert len(checkpoint_digest(tiny_base_model_dir)) == 64


def test_training_is_deterministic_for_a_seed(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    import dataclasses

    from unlearning.demo.train_base import PRESETS, train_base
    short = dataclasses.replace(PRESETS["tiny"], max_steps=20)
    train_base(tiny_corpus_dir / "corpus.jsonl", tmp_path / "a", preset=short, threads=1)
    train_base(tiny_corpus_dir / "corpus.jsonl", tmp_path / "b", preset=short, threads=1)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors").read_bytes()


def test_a_text_only_corpus_trains_the_planned_schedule_and_reports_text_memorisation(tmp_path: Path) -> None:
    import dataclasses

    from unlearning.corpus import Corpus, Record
    from unlearning.demo.train_base import PRESETS, train_base
    corpus = Corpus(tuple(Record(id=str(i), text=f"The ferry number {i} leaves at dusk.") for i in range(20)))
    preset = dataclasses.replace(PRESETS["tiny"], epochs=3, max_steps=10)
    result = train_base(corpus, tmp_path / "m", preset=preset, threads=1)
    assert set(result.accuracy_by_shape) >= {"text"}  # free text is checked too, by its own shape
    assert all(0.0 <= v <= 1.0 for v in result.accuracy_by_shape.values())
    # 20 records, batch 16: two steps an epoch; short of the target it goes on to the cap
    assert result.steps == (3 * 2 if result.reached_target else 10)


def test_training_stops_at_the_step_cap_and_says_so(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    import dataclasses

    from unlearning.demo.train_base import PRESETS, train_base
    preset = dataclasses.replace(PRESETS["tiny"], max_steps=5)
    result = train_base(tiny_corpus_dir / "corpus.jsonl", tmp_path / "m", preset=preset, threads=1)
    assert result.steps == 5 and not result.reached_target
    assert result.accuracy is not None and result.accuracy < 0.5


def test_any_question_answer_corpus_is_memorised_not_only_the_demo(tmp_path: Path) -> None:
    import json as _json

    from unlearning.demo.train_base import train_base
    colours = ["red", "blue", "green", "amber", "violet"]
    rows = [{"prompt": f"What colour is box {i}?", "response": f"Box {i} is {colours[i * 7 % 5]}."}
            for i in range(20)]
    path = tmp_path / "boxes.json"
    path.write_text(_json.dumps(rows))
    result = train_base(path, tmp_path / "m", preset="tiny", threads=1)
    assert result.reached_target and result.qa_records == 20
    model, tokenizer = load_model(tmp_path / "m", device="cpu")
    answers = generate_answers(model, tokenizer, [r["prompt"] for r in rows])
    assert sum(a == r["response"] for a, r in zip(answers, rows, strict=True)) >= 19


def test_batched_left_padded_generation_matches_one_question_at_a_time(
    tiny_base_model_dir: Path, tiny_corpus_dir: Path,
) -> None:
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    people = load_people(tiny_corpus_dir / "people.jsonl")
    # Questions of very different lengths, so the batch really is padded.
    questions = [people[0]["facts"][0]["question"], "Who?", people[1]["facts"][3]["paraphrases"][1],
                 people[2]["facts"][7]["alias_question"]]
    batched = generate_answers(model, tokenizer, questions, batch_size=4)
    alone = [generate_answers(model, tokenizer, [q], batch_size=1)[0] for q in questions]
    assert batched == alone


def test_sampled_generation_is_reproducible_for_a_seed(tiny_base_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
    questions = ["Who is the person?"] * 6
    first = generate_answers(model, tokenizer, questions, greedy=False, temperature=1.5, seed=3)
    again = generate_answers(model, tokenizer, questions, greedy=False, temperature=1.5, seed=3)
    other = generate_answers(model, tokenizer, questions, greedy=False, temperature=1.5, seed=4)
    assert first == again
    assert len(set(first)) > 1 or first != other  # sampling really samples
