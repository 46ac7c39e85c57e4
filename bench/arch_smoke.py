"""Does the engine run on this architecture?  Erase and verify on tiny untrained models of many.

    python -m bench.arch_smoke --out DIR [--arch A ...]

For each architecture: a 2-layer model of hidden size 32 built from its transformers config
(random weights, nothing downloaded) with a byte-level BPE tokenizer trained on a generated
question/answer corpus of 12 people (tests/real_shaped.py); then, through the command line a
user runs, `erase --method asu` (3 steps) and `erase --method kif`, each with `--report` (the
full verification, attacks included).  One line per run: the exit status and the verdict, or
the last lines of the error.

An untrained model knows nobody, so its verdicts mean nothing (latent checks say the base
shows no signal); the run says whether every stage of the engine executes on the
architecture's code: loading, targets, training, generation, hidden states, hooks, the
quantisation and relearning attacks.  Models that fit the engine's quality benches are
trained by `bench.unseen` (a few architectures) and `bench.shapes`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ARCHITECTURES = (
    "phi", "phi3", "stablelm", "gemma", "gemma3", "gptj", "codegen", "gpt_bigcode", "gpt_neo", "starcoder2", "olmo",
    "olmo2", "cohere", "mixtral", "qwen2_moe", "qwen3", "granite", "mpt", "persimmon", "xglm", "biogpt", "mamba",
    "recurrent_gemma", "nemotron", "glm", "helium", "smollm3", "exaone4", "jamba", "olmoe",
)


def config(arch: str, tok: Any) -> Any:
    import transformers as T

    ids = {"vocab_size": len(tok), "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
           "pad_token_id": tok.pad_token_id}
    c = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "max_position_embeddings": 256, **ids}
    kv = {"num_key_value_heads": 2}
    builders = {
        "phi": lambda: T.PhiConfig(**c),
        "phi3": lambda: T.Phi3Config(**kv, **c),
        "stablelm": lambda: T.StableLmConfig(**kv, **c),
        "gemma": lambda: T.GemmaConfig(num_key_value_heads=1, head_dim=16, **c),
        "gemma3": lambda: T.Gemma3TextConfig(num_key_value_heads=1, head_dim=16, sliding_window=32,
                                             query_pre_attn_scalar=16, **c),
        "gptj": lambda: T.GPTJConfig(n_embd=32, n_layer=2, n_head=2, n_positions=256, rotary_dim=8, **ids),
        "codegen": lambda: T.CodeGenConfig(n_embd=32, n_layer=2, n_head=2, n_positions=256, n_ctx=256, rotary_dim=8,
                                           **ids),
        "gpt_bigcode": lambda: T.GPTBigCodeConfig(n_embd=32, n_layer=2, n_head=2, n_positions=256, **ids),
        "gpt_neo": lambda: T.GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=2,
                                          attention_types=[[["global", "local"], 1]], max_position_embeddings=256,
                                          window_size=32, **ids),
        "starcoder2": lambda: T.Starcoder2Config(num_key_value_heads=1, **c),
        "olmo": lambda: T.OlmoConfig(**kv, **c),
        "olmo2": lambda: T.Olmo2Config(**kv, **c),
        "cohere": lambda: T.CohereConfig(**kv, **c),
        "mixtral": lambda: T.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **kv, **c),
        "qwen2_moe": lambda: T.Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                              shared_expert_intermediate_size=32, **kv, **c),
        "qwen3": lambda: T.Qwen3Config(head_dim=16, **kv, **c),
        "granite": lambda: T.GraniteConfig(**kv, **c),
        "mpt": lambda: T.MptConfig(d_model=32, n_heads=2, n_layers=2, max_seq_len=256, vocab_size=len(tok)),
        "persimmon": lambda: T.PersimmonConfig(**c),
        "xglm": lambda: T.XGLMConfig(d_model=32, ffn_dim=64, num_layers=2, attention_heads=2,
                                     max_position_embeddings=256, **ids),
        "biogpt": lambda: T.BioGptConfig(**c),
        "mamba": lambda: T.MambaConfig(hidden_size=32, num_hidden_layers=2, state_size=8, **ids),
        "recurrent_gemma": lambda: T.RecurrentGemmaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                          num_attention_heads=2, num_key_value_heads=1, lru_width=32,
                                                          attention_window_size=32, **ids),
        "nemotron": lambda: T.NemotronConfig(head_dim=16, **kv, **c),
        "glm": lambda: T.GlmConfig(head_dim=16, **kv, **c),
        "helium": lambda: T.HeliumConfig(head_dim=16, **kv, **c),
        "smollm3": lambda: T.SmolLM3Config(**kv, **c),
        "exaone4": lambda: T.Exaone4Config(head_dim=16, **kv, **c),
        "jamba": lambda: T.JambaConfig(num_experts=2, **kv, **c),
        "olmoe": lambda: T.OlmoeConfig(num_experts=4, num_experts_per_tok=2, **kv, **c),
    }
    if arch not in builders:
        raise ValueError(f"unknown architecture {arch!r}; one of {', '.join(ARCHITECTURES)}")
    return builders[arch]()


def _write(records: list[Any], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for r in records:
            row = {"id": r.id, "question": r.question, "answer": r.answer} if r.question else {"id": r.id, "text": r.text}
            handle.write(json.dumps(row) + "\n")


def _run(base: Path, corpus: Path, control: Path, subject: str, method: str, out: Path) -> str:
    hparams = {"steps": 3} if method == "asu" else {}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "unlearning", "-q", "erase", "--model", str(base), "--corpus", str(corpus),
         "--subject", subject, "--method", method, "--hparams", json.dumps(hparams), "--out", str(out / method),
         "--report", str(out / f"{method}.json"), "--no-retry", "--control", str(control)],
        capture_output=True, text=True, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    seconds = time.perf_counter() - started
    report = out / f"{method}.json"
    if done.returncode in (0, 1) and report.exists():
        data = json.loads(report.read_text(encoding="utf-8"))
        return f"runs ({seconds:.0f} s; verdict {'pass' if data['passed'] else 'fail'}, untrained)"
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("[transformers]")]
    return f"FAILS: exit {done.returncode}: {' | '.join(lines[-2:])[:300]}"


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from tests.real_shaped import shaped_corpus
    from tests.unlearning.test_unseen_shapes import _tokenizer

    parser = argparse.ArgumentParser(prog="python -m bench.arch_smoke", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arch", action="append", choices=ARCHITECTURES, help="repeat; default: all")
    args = parser.parse_args(argv)
    root: Path = args.out
    root.mkdir(parents=True, exist_ok=True)
    records, persons, control = shaped_corpus("plain_qa", 12, seed=0)
    corpus, controls = root / "corpus.jsonl", root / "control.jsonl"
    _write(records, corpus)
    _write(control, controls)
    tok = _tokenizer()
    for arch in args.arch or ARCHITECTURES:
        out = root / arch
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config(arch, tok)).save_pretrained(out / "base")
        tok.save_pretrained(out / "base")
        for method in ("asu", "kif"):
            print(f"{arch} {method}: {_run(out / 'base', corpus, controls, persons[0].name, method, out)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
