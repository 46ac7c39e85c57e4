"""ASU's latent loss read through a tuned lens: which layers it reads, that it is zero at the
stranger's states and grows away from them, and that only the student's states learn from it."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from unlearning.corpus import load_corpus
from unlearning.demo.tokenizer import train_tokenizer
from unlearning.methods.base import encode_all
from unlearning.methods.targets import MAX_LENS_LAYERS, fit_lens, latent_loss


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
