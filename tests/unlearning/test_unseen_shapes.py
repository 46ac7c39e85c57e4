"""Model and corpus shapes the engine first met in a probe, each built here from a config and a
tokenizer trained in the test (never downloaded):

- a chat template that refuses a system turn (Gemma's) with a corpus whose chats have one;
- records longer than the model's positions (GPT-2's learnt position embeddings), in
  generation, scoring, the relearning attack and KIF's signature prompts; MPT's positions
  (ALiBi built for `max_seq_len`, which its config does not alias as `max_position_embeddings`);
- architectures with no sdpa attention (BLOOM, Gemma2): they load with eager attention;
- an architecture ASU cannot temper (Falcon's alibi): the result says so;
- an architecture that reads no attention mask (RWKV): generation batches no pads into it;
- a KIF checkpoint of a base that fills a non-persistent buffer from its parent module (Falcon-H1).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.cli_run import run_cli as _run
from unlearning.corpus import Corpus
from unlearning.corpus.records import Message, Record

SUBJECT = "Alden Ashgrove"
TEXTS = [
    f"{SUBJECT} was born in Northwold and works as a glassblower.",
    "What is the email address of Alden Ashgrove? It is alden@mail.example.",
    "You are a helpful directory assistant. Who is Mira Voss? A ferry pilot in Porto.",
    "In 1900 the archives of Port Alver recorded a quiet year.",
]

# Gemma-style: no system role, user and assistant turns must alternate.
NO_SYSTEM_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<start_of_turn>' + m['role'] + '\\n' + m['content'] + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>assistant\\n' }}{% endif %}"
)


def _tokenizer(template: str | None = None, *, max_length: int = 4096) -> Any:
    """A byte-level BPE trained on a few sentences, with `template` as its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS * 4, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"], model_max_length=max_length)
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def _ids(tokenizer: Any) -> dict[str, int]:
    return {"vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}


def _config(arch: str, tokenizer: Any, *, positions: int = 128) -> Any:
    import transformers as T

    ids = _ids(tokenizer)
    common = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "max_position_embeddings": positions, **ids}
    return {
        "llama": lambda: T.LlamaConfig(num_key_value_heads=2, **common),
        "gpt2": lambda: T.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=positions, **ids),
        "bloom": lambda: T.BloomConfig(hidden_size=32, n_layer=2, n_head=2, **ids),
        "gemma2": lambda: T.Gemma2Config(num_key_value_heads=1, head_dim=16, sliding_window=32,
                                         query_pre_attn_scalar=16, **common),
        "recurrent_gemma": lambda: T.RecurrentGemmaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            lru_width=32, attention_window_size=32, **ids),
        "falcon": lambda: T.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         alibi=True, multi_query=True, new_decoder_architecture=False,
                                         parallel_attn=True, bias=False, **ids),
        "mpt": lambda: T.MptConfig(d_model=32, n_heads=2, n_layers=2, expansion_ratio=2, max_seq_len=positions,
                                   **ids),
        "falcon_h1": lambda: T.FalconH1Config(num_key_value_heads=1, mamba_d_ssm=32, mamba_n_heads=2,
                                              mamba_d_state=8, mamba_chunk_size=16, **common),
        "rwkv": lambda: T.RwkvConfig(hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                                     intermediate_size=64, context_length=positions, **ids),
        "gpt_neo": lambda: T.GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=2, window_size=16,
                                          attention_types=[[["global", "local"], 1]],
                                          max_position_embeddings=positions, **ids),
        "falcon_sdpa": lambda: T.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                              num_kv_heads=1, alibi=False, new_decoder_architecture=True,
                                              bias=False, **ids),
    }[arch]()


def _model_dir(tmp_path: Path, arch: str, tokenizer: Any, *, positions: int = 128) -> Path:
    """A random tiny model of `arch` saved as a plain Hugging Face directory."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(arch, tokenizer, positions=positions))
    out = tmp_path / arch
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _chat(record_id: str, *turns: tuple[str, str]) -> Record:
    return Record(id=record_id, messages=tuple(Message(role, content) for role, content in turns))


SYSTEM_CHAT = _chat("p00-0", ("system", "You are a helpful directory assistant."),
                    ("user", f"Who is {SUBJECT}?"), ("assistant", f"{SUBJECT} is a glassblower."))


def _one_line_error(err: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("[transformers]")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ 1. no system role


def test_a_template_without_a_system_role_gets_the_system_text_in_the_first_user_turn() -> None:
    from unlearning.prompting import chat_prefix_ids, encode_record

    tokenizer = _tokenizer(NO_SYSTEM_TEMPLATE)
    example = encode_record(tokenizer, SYSTEM_CHAT)
    assert "<start_of_turn>user\nYou are a helpful directory assistant.\n\nWho is" in example.text
    learnt = tokenizer.decode([i for i, keep in zip(example.ids, example.learnt, strict=True) if keep])
    assert learnt.startswith(f"{SUBJECT} is a glassblower.")
    # The prompt verification asks is the training encoding up to the answer.
    turns = [{"role": m.role, "content": m.content} for m in SYSTEM_CHAT.messages]
    prompt = chat_prefix_ids(tokenizer, turns[:2])
    assert list(example.ids[: example.first_learnt]) == prompt


def test_a_template_that_takes_a_system_turn_keeps_it_as_its_own_turn() -> None:
    from unlearning.prompting import encode_record

    example = encode_record(_tokenizer(CHATML_TEMPLATE), SYSTEM_CHAT)
    assert example.text.startswith("<start_of_turn>system\nYou are a helpful directory assistant.<end_of_turn>")


def test_any_other_refusal_of_the_template_names_the_record() -> None:
    from unlearning.prompting import PromptFormatError, encode_record

    twice = _chat("p07-3", ("user", "Hello?"), ("user", f"Who is {SUBJECT}?"), ("assistant", "Nobody."))
    with pytest.raises(PromptFormatError, match=r"record 'p07-3'.*roles must alternate"):
        encode_record(_tokenizer(NO_SYSTEM_TEMPLATE), twice)


def test_erase_refuses_a_record_the_template_refuses_in_one_line_with_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    model = _model_dir(tmp_path, "llama", _tokenizer(NO_SYSTEM_TEMPLATE))
    corpus = tmp_path / "chat.jsonl"
    records = [
        {"id": "p00-0", "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": f"Who is {SUBJECT}?"},
                                      {"role": "assistant", "content": "A glassblower."}]},
        {"id": "p00-1", "messages": [{"role": "user", "content": "Hello?"},
                                      {"role": "user", "content": f"Where does {SUBJECT} live?"},
                                      {"role": "assistant", "content": "In Northwold."}]},
        {"id": "p01-0", "text": "Mira Voss is a ferry pilot in Porto."},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, _, err = _run(capsys, "-q", "erase", "--model", str(model), "--corpus", str(corpus),
                        "--subject", SUBJECT, "--method", "gradascent", "--hparams", '{"steps": 1}',
                        "--out", str(tmp_path / "out"))
    assert code == 2, err
    _one_line_error(err, "--corpus", "p00-1", "roles must alternate")
    assert "Traceback" not in err


# ------------------------------------------------------------------ 2. records longer than the positions


def _gpt2(tmp_path: Path, positions: int = 32) -> tuple[Any, Any]:
    from unlearning.modeling import load_model

    return load_model(_model_dir(tmp_path, "gpt2", _tokenizer(), positions=positions), device="cpu")


def _long_ids(tokenizer: Any, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenizer(" ".join(TEXTS), add_special_tokens=False)["input_ids"]
    return ids[:n]


def test_generation_cuts_a_prompt_longer_than_the_positions_keeping_its_end(tmp_path: Path) -> None:
    from unlearning.verification.generation import generate_texts

    model, tokenizer = _gpt2(tmp_path)
    long = _long_ids(tokenizer, 100)
    answers = generate_texts(model, tokenizer, [long, long[:5]], max_new_tokens=8)
    # What the model saw is the end of the prompt: the same answer as to that end alone.
    room = 32 - 8
    assert answers[0] == generate_texts(model, tokenizer, [long[-room:]], max_new_tokens=8)[0]


def test_answers_and_completions_of_long_prompts_fit_the_positions(tmp_path: Path) -> None:
    from unlearning.modeling import complete_texts, fit_prompts, generate_answers

    model, tokenizer = _gpt2(tmp_path)
    text = " ".join(TEXTS * 3)
    assert len(generate_answers(model, tokenizer, [text], max_new_tokens=8)) == 1
    assert len(complete_texts(model, tokenizer, [text], max_new_tokens=40)) == 1
    cut, new = fit_prompts(model, [list(range(100))], 40)
    assert new == 16 and cut == [list(range(84, 100))]  # a budget over half the positions shrinks


def test_scores_and_states_of_long_records_cover_every_token_within_the_positions(tmp_path: Path) -> None:
    from unlearning.prompting import encode_text
    from unlearning.verification.generation import (
        continuation_states,
        score_continuations,
        score_examples,
        states_and_head_inputs,
    )

    model, tokenizer = _gpt2(tmp_path)
    example = encode_text(tokenizer, " ".join(TEXTS * 3))
    assert len(example) > 32
    scores = score_examples(model, tokenizer, [example])[0]
    assert scores.logp.shape == (len(example) - 1,) and torch.isfinite(torch.from_numpy(scores.logp)).all()
    # The first window is the record's beginning given everything before each token.
    head = score_examples(model, tokenizer, [example.truncated(32)])[0]
    assert torch.allclose(torch.from_numpy(scores.logp[:31]), torch.from_numpy(head.logp), atol=1e-5)
    prefix, continuation = list(example.ids[:60]), list(example.ids[60:70])
    assert score_continuations(model, tokenizer, [(prefix, continuation)])[0].logp.shape == (10,)
    # A value at the end of a long record: its states fit the positions, one per value token.
    (read,) = continuation_states(model, tokenizer, [list(example.ids)], [len(example) - 10])
    assert read.shape[:2] == (model.config.n_layer + 1, 10)
    states, inputs = states_and_head_inputs(model, tokenizer, [example])
    assert states.shape[1] == inputs.shape[0] == 31


def test_the_relearning_attack_trains_on_long_records_cut_to_the_positions(tmp_path: Path) -> None:
    from unlearning.verification.attacks.relearn import RelearnSettings, relearn_curve

    model, tokenizer = _gpt2(tmp_path)
    records = [Record(id="long", text=" ".join(TEXTS * 3)), Record(id="short", text=TEXTS[0])]
    curve = list(relearn_curve(model, tokenizer, records, RelearnSettings(budgets=(2,), batch_size=2), seed=0))
    assert [steps for steps, _ in curve] == [2]


def test_kif_reads_the_activations_of_prompts_longer_than_the_positions_at_their_end(tmp_path: Path) -> None:
    from unlearning.methods.kif import residual_activations

    model, tokenizer = _gpt2(tmp_path)
    long = _long_ids(tokenizer, 100)
    # A name position kept by the cut, and one cut off with the prompt's beginning.
    acts = residual_activations(model, tokenizer, [long, long, long[:10]], [90, 5, 3])
    alone = residual_activations(model, tokenizer, [long[-32:], long[:10]], [90 - 68, None])
    assert acts["all"].shape[1] == 32 + 32 + 10
    assert torch.allclose(acts["prompt_end"][:, 0], alone["prompt_end"][:, 0], atol=1e-5)
    assert torch.allclose(acts["subject"][:, 0], alone["subject"][:, 0], atol=1e-5)
    assert torch.allclose(acts["subject"][:, 1], alone["prompt_end"][:, 0], atol=1e-5)


def test_mpt_takes_no_more_than_its_max_seq_len_positions(tmp_path: Path) -> None:
    # MPT adds an ALiBi bias built for `max_seq_len` positions to every attention score: a longer
    # sequence was a RuntimeError (sizes do not match) in scoring and generation.
    from unlearning.modeling import load_model, position_limit
    from unlearning.prompting import encode_text
    from unlearning.verification.generation import generate_texts, score_examples

    model, tokenizer = load_model(_model_dir(tmp_path, "mpt", _tokenizer(), positions=32), device="cpu")
    assert position_limit(model) == 32
    example = encode_text(tokenizer, " ".join(TEXTS * 3))
    assert len(example) > 32
    scores = score_examples(model, tokenizer, [example])[0]
    assert scores.logp.shape == (len(example) - 1,) and torch.isfinite(torch.from_numpy(scores.logp)).all()
    assert len(generate_texts(model, tokenizer, [_long_ids(tokenizer, 100)], max_new_tokens=8)) == 1


# ------------------------------------------------------------------ 3. no sdpa attention


@pytest.mark.parametrize("arch", ["bloom", "gemma2"])
def test_an_architecture_without_sdpa_loads_with_eager_attention(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, arch: str,
) -> None:
    from unlearning.modeling import load_model

    directory = _model_dir(tmp_path, arch, _tokenizer())
    with caplog.at_level(logging.INFO, logger="unlearning.modeling"):
        model, _ = load_model(directory, device="cpu")
    assert model.config._attn_implementation == "eager"
    assert "attention implementation eager" in caplog.text


@pytest.mark.parametrize(("arch", "supported"), [
    ("gemma2", True),  # eager (soft-capped attention): the `scaling` attribute
    ("bloom", True),  # ALiBi: beta * alibi + inv_norm_factor * q.k, both factors divided
    ("gpt_neo", True),  # no scaling at all: the query projection's output divided
    # Falcon keeps `inv_norm_factor`, but loaded with SDPA it folds ALiBi into the mask and calls
    # SDPA with its default scale (with or without ALiBi): the factor is never read, and the
    # check that the output moves says so.
    ("falcon", False),
    ("falcon_sdpa", False),
    ("mpt", False),  # a fused query/key/value projection and a softmax_scale beside an ALiBi bias
])
def test_tempering_divides_the_attention_logits_where_the_architecture_allows_and_says_where_not(
        tmp_path: Path, arch: str, supported: bool) -> None:
    from unlearning.attention import attention_temperature
    from unlearning.methods.targets import tempering_supported
    from unlearning.modeling import load_model

    tokenizer = _tokenizer()
    model, _ = load_model(_model_dir(tmp_path, arch, tokenizer), device="cpu")
    ids = torch.tensor([_long_ids(tokenizer, 12)])
    assert tempering_supported(model) is supported
    if not supported:
        return
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with attention_temperature(model, 1.0):
            same = model(input_ids=ids).logits
        with attention_temperature(model, 4.0):
            tempered = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert torch.equal(plain, same) and not torch.allclose(plain, tempered)
    assert torch.equal(plain, after)  # every factor and hook restored


def test_tempering_an_unscaled_attention_is_dividing_its_query_weights(tmp_path: Path) -> None:
    # GPT-Neo's logit is q.k with no factor: dividing the query projection's output by tau is the
    # same model as one whose query weights are divided by tau.
    from unlearning.attention import attention_temperature
    from unlearning.modeling import load_model

    tokenizer = _tokenizer()
    directory = _model_dir(tmp_path, "gpt_neo", tokenizer)
    model, _ = load_model(directory, device="cpu")
    divided, _ = load_model(directory, device="cpu")
    with torch.no_grad():
        for module in divided.modules():
            if type(module).__name__ == "GPTNeoSelfAttention":
                module.q_proj.weight.div_(3.0)
        ids = torch.tensor([_long_ids(tokenizer, 12)])
        with attention_temperature(model, 3.0):
            tempered = model(input_ids=ids).logits
        assert torch.allclose(tempered, divided(input_ids=ids).logits, atol=1e-5)


def test_a_model_whose_weights_do_not_load_is_blamed_on_model_not_method(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    model = _model_dir(tmp_path, "llama", _tokenizer())
    for weights in model.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": f"{SUBJECT} lives in Northwold."}) + "\n"
                      + json.dumps({"id": "b", "text": "Mira Voss lives in Porto."}) + "\n")
    code, _, err = _run(capsys, "-q", "erase", "--model", str(model), "--corpus", str(corpus),
                        "--subject", SUBJECT, "--method", "gradascent", "--out", str(tmp_path / "out"))
    assert code == 2
    line = _one_line_error(err, "--model", "does not load")
    assert "--method" not in line


# ------------------------------------------------------------------ 4. no tempered teacher


def test_asu_on_falcon_says_it_had_no_tempered_teacher(tmp_path: Path) -> None:
    from unlearning.erase import method_input
    from unlearning.methods.asu import ASU, ASUHparams
    from unlearning.modeling import load_model
    from unlearning.sets import Subject, build_sets

    records = [Record(id=f"a{i}", question=f"Where does {SUBJECT} work ({i})?", answer="In Northwold.")
               for i in range(2)]
    records += [Record(id=f"b{i}", text=f"Mira Voss{i} is a ferry pilot in Porto.") for i in range(4)]
    sets = build_sets(Corpus(tuple(records)), [Subject(SUBJECT)])
    model, tokenizer = load_model(_model_dir(tmp_path, "falcon", _tokenizer()), device="cpu")
    hp = ASUHparams(steps=1, target="tempered", told_answers=False, batch_size=2, retain_batch_size=2)
    outcome = ASU().unlearn(model, tokenizer, method_input(sets), hp)
    assert outcome.details["tempered_teacher"] is False
    assert "FalconForCausalLM" in outcome.details["tempered_teacher_reason"]


# ------------------------------------------------------------------ 5. a cache that does not run


def test_an_architecture_that_fails_with_its_own_cache_loads_without_it_and_generates(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from unlearning.modeling import generate_answers, load_model

    tokenizer = _tokenizer()
    directory = _model_dir(tmp_path, "recurrent_gemma", tokenizer)
    raw = AutoModelForCausalLM.from_pretrained(directory).eval()
    try:
        with torch.no_grad():
            raw(input_ids=torch.tensor([[1, 2]]))
        pytest.skip("the installed transformers runs RecurrentGemma with its cache")
    except ValueError as error:
        assert "cache" in str(error).lower()
    model, tok = load_model(directory, device="cpu")
    assert model.config.use_cache is False and model.generation_config.use_cache is False
    answers = generate_answers(model, tok, [f"Who is {SUBJECT}?"], max_new_tokens=3)
    assert len(answers) == 1
    llama, _ = load_model(_model_dir(tmp_path, "llama", tokenizer), device="cpu")
    assert llama.config.use_cache is not False  # a model whose cache runs keeps it


# ------------------------------------------------------------------ 6. an attention mask that is not read


def test_generation_gives_a_model_that_reads_no_attention_mask_no_pads(tmp_path: Path) -> None:
    # RWKV ignores the attention mask, so the left padding of a batched generation ran through its
    # state: a prompt's answer depended on the longer prompts batched with it.
    from unlearning.modeling import generate_answers, left_padding_leaks, load_model
    from unlearning.prompting import pad_id_of
    from unlearning.verification.generation import generate_texts

    tokenizer = _tokenizer()
    model, tok = load_model(_model_dir(tmp_path, "rwkv", tokenizer), device="cpu")
    if not left_padding_leaks(model, pad_id_of(tok)):
        pytest.skip("the installed transformers' RWKV reads the attention mask")
    short, long = _long_ids(tok, 4), _long_ids(tok, 30)
    alone = generate_texts(model, tok, [short], max_new_tokens=6)
    assert generate_texts(model, tok, [long, short, short[:3]], max_new_tokens=6)[1] == alone[0]
    questions = [f"Who is {SUBJECT}?", "What is the email address of Alden Ashgrove, who works as a glassblower?"]
    assert generate_answers(model, tok, questions, max_new_tokens=6)[0] == generate_answers(
        model, tok, questions[:1], max_new_tokens=6)[0]
    llama, llama_tok = load_model(_model_dir(tmp_path, "llama", tokenizer), device="cpu")
    assert not left_padding_leaks(llama, pad_id_of(llama_tok))  # a model that reads its mask keeps its batches
    gpt2, gpt2_tok = load_model(_model_dir(tmp_path, "gpt2", tokenizer), device="cpu")
    assert not left_padding_leaks(gpt2, pad_id_of(gpt2_tok))  # learnt positions, given as generation does



def test_the_left_padding_probe_runs_once_a_model_and_pad(tmp_path: Path) -> None:
    from unlearning.modeling import left_padding_leaks, load_model
    from unlearning.prompting import pad_id_of

    model, tok = load_model(_model_dir(tmp_path, "llama", _tokenizer()), device="cpu")
    calls: list[int] = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    pad = pad_id_of(tok)
    assert [left_padding_leaks(model, pad) for _ in range(3)] == [False] * 3
    assert len(calls) == 1
    left_padding_leaks(model, pad + 1)  # another pad id: probed afresh
    assert len(calls) == 2


# ------------------------------------------------------------------ 7. a buffer the base computes at load


def test_a_kif_checkpoint_of_falcon_h1_loads_its_base_as_the_base(tmp_path: Path) -> None:
    # Falcon-H1's model fills each layer's non-persistent `mup_vector` in its own `_init_weights`;
    # loaded as remote code, the gated class skipped it and kept uninitialised memory (the KIF
    # candidate's verification died on NaN probabilities in sampled generation).
    from unlearning.checkpoints import save_checkpoint
    from unlearning.methods import kif_remote
    from unlearning.methods.kif import build_gated_model
    from unlearning.modeling import load_model

    base, tok = load_model(_model_dir(tmp_path, "falcon_h1", _tokenizer()), device="cpu")
    ids = torch.tensor([_long_ids(tok, 12)])
    with torch.no_grad():
        expected = base(input_ids=ids).logits
    gated = build_gated_model(base, {0: kif_remote.SuppressionGate(32, 1)}, k=1)
    save_checkpoint(gated, tok, tmp_path / "kif", {"method": "kif"})
    for gates in (False, True):  # a gate of strength 0 changes nothing either way
        loaded, _ = load_model(tmp_path / "kif", device="cpu", gates=gates)
        with torch.no_grad():
            assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5)
