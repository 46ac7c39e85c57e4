"""ASU's latent loss read through a tuned lens: which layers it reads, that it is zero at the
stranger's states and grows away from them, and that only the student's states learn from it."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from unlearning.corpus import load_corpus
from unlearning.demo.tokenizer import train_tokenizer
from unlearning.methods.base import encode_all
from unlearning.methods.targets import (
    MAX_LENS_LAYERS,
    Dist,
    LensColumns,
    fit_lens,
    latent_loss,
    lens_readings,
)


def _model_and_examples(tiny_corpus_dir, layers: int):
    records = load_corpus(tiny_corpus_dir / "corpus.jsonl").records[:24]
    tokenizer = train_tokenizer([t for r in records for t in (r.question, r.answer, r.text) if t], vocab_size=300)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config).eval()
    return model, tokenizer, encode_all(tokenizer, records, model=model)


def test_the_lens_reads_at_most_four_intermediate_layers_evenly_spread(tiny_corpus_dir):
    model, tokenizer, examples = _model_and_examples(tiny_corpus_dir, layers=9)
    lens = fit_lens(model, tokenizer, examples)
    assert lens is not None
    chosen = sorted(lens.layers)
    # hidden_states: 0 the embeddings, 1..8 the blocks' outputs, 9 what the head reads.
    assert chosen == [1, 3, 5, 7]
    assert len(chosen) <= MAX_LENS_LAYERS
    assert all(t.shape == (33, 32) for t in lens.layers.values())

    shallow, tok2, examples2 = _model_and_examples(tiny_corpus_dir, layers=1)
    assert fit_lens(shallow, tok2, examples2) is None  # no layer between the embeddings and the head


def test_the_lens_loss_is_zero_at_the_strangers_states_and_only_the_student_learns(tiny_corpus_dir):
    model, tokenizer, examples = _model_and_examples(tiny_corpus_dir, layers=3)
    lens = fit_lens(model, tokenizer, examples)
    assert lens is not None and sorted(lens.layers) == [1, 2]
    ids = torch.tensor([examples[0].ids])
    out = model(input_ids=ids, output_hidden_states=True)
    rows, cols = torch.zeros(5, dtype=torch.long), torch.arange(5)
    teacher = torch.stack([h[rows, cols] for h in out.hidden_states[1:]], dim=1).detach()
    same = latent_loss(out.hidden_states, (rows, cols, teacher), lens)
    assert float(same.detach()) < 1e-5

    moved = [h.detach().clone().requires_grad_(True) for h in out.hidden_states]
    with torch.no_grad():
        moved[1].add_(torch.randn_like(moved[1]))
    loss = latent_loss(moved, (rows, cols, teacher), lens)
    assert float(loss) > 1e-3
    loss.backward()
    assert moved[1].grad is not None and float(moved[1].grad.abs().sum()) > 0
    assert all(p.grad is None and not p.requires_grad for p in lens.head.parameters())
    # The head the lens reads through is a copy: training the model's own head leaves it be.
    assert lens.head is not model.get_output_embeddings()


def test_the_lens_over_a_few_columns_reads_them_exactly_and_pulls_the_subjects_token_like_the_whole(
    tiny_corpus_dir,
):
    model, tokenizer, examples = _model_and_examples(tiny_corpus_dir, layers=3)
    lens = fit_lens(model, tokenizer, examples)
    assert lens is not None and lens.reads_columns
    lens.head.readout.scale = 0.5  # a model's own readout (a logit scale) applies column by column
    ids = torch.tensor([examples[0].ids])
    out = model(input_ids=ids, output_hidden_states=True)
    rows, cols = torch.zeros(6, dtype=torch.long), torch.arange(6)
    follows = ids[0, 1:7]
    teacher = torch.stack([h[rows, cols] for h in out.hidden_states[1:]], dim=1).detach()
    cached = (rows, cols, teacher)
    read = lens_readings(cached, lens, topk=8, next_ids=follows)
    whole = lens_readings(cached, lens)
    for layer, translator in lens.layers.items():
        reading = read[layer]
        assert isinstance(reading, LensColumns) and isinstance(whole[layer], Dist)
        assert reading.columns.shape == (6, 9)
        assert all(len(set(row.tolist())) == 9 for row in reading.columns)  # no token twice
        assert all(int(f) in row.tolist() for f, row in zip(follows, reading.columns, strict=True))
        assert torch.allclose(reading.p.sum(-1), torch.ones(6))
        states = out.hidden_states[layer][rows, cols].detach().float()
        full = lens.read(states, translator)
        assert torch.allclose(lens.read_columns(states, translator, reading.columns),
                              full.gather(-1, reading.columns), atol=1e-5)
    assert float(latent_loss(out.hidden_states, cached, lens, read).detach()) < 1e-5

    # Moved towards the subject's own next tokens, both readings see it, and only the states learn.
    moved = [h.detach().clone().requires_grad_(True) for h in out.hidden_states]
    with torch.no_grad():
        moved[1].add_(torch.randn_like(moved[1]))
    few, every = latent_loss(moved, cached, lens, read), latent_loss(moved, cached, lens, whole)
    assert float(few) > 1e-3 and float(every) > 1e-3
    few.backward()
    assert moved[1].grad is not None and float(moved[1].grad.abs().sum()) > 0
    assert all(p.grad is None for p in lens.head.parameters())
    # A vocabulary no larger than the columns asked for is read whole.
    assert isinstance(lens_readings(cached, lens, topk=10_000)[1], Dist)
