"""The project's own demo material: a synthetic corpus of fictitious people, the small
byte-level BPE tokenizer trained on it, and `train_base`, which trains a small model from
scratch on any corpus.  Nothing outside this package (and the benchmarks and tests) may
depend on the demo's templates, pools or tokenizer: the engine works on any corpus and any
Hugging Face causal LM."""
