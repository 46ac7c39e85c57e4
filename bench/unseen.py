"""The engine on an architecture and tokenizer it was never tuned on, trained the way a user would.

    python -m bench.unseen --arch qwen3 --tokenizer unigram --out DIR [--steps 900] [--method asu --method kif]
                           [--no-oracle] [--no-retry] [--corpus people|co_mentions]

Builds a corpus of 24 invented people (names with diacritics, hyphens and apostrophes), 8
records each in free text and `prompt`/`response` form with facts repeated across records (a
badge number in a biography and in an HR answer), and 6 control people; trains a tokenizer
of the chosen style on it; trains a 3-layer model of the chosen architecture, built from its
config, with a plain Hugging Face loop (AdamW), not the project's `train-base`; and the same
recipe without the subject's records (the retrain oracle).  Then, through the command line
a user runs: `erase --report` (default ASU with the policy's one retry; `--method kif` too where
asked) and `verify` of the oracle and of the base.  Prints one line per model: the verdict, the
checks that failed and any metric the engine left NaN.

`--corpus co_mentions` trains on records that name two or three people at once instead
(`co_mention_corpus`).

Used for docs/methods.md, "Architectures, tokenizers and a corpus the project had never
seen" and "Records that name several people".  Nothing is downloaded: the configs are transformers' classes, the tokenizers are
trained here.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FIRST = ("Zoë", "Åsa", "Marek", "Ngozi", "Thiago", "Ines", "Kaito", "Farah", "Oleksandr", "Mei", "Dagny", "Eamon",
         "Solveig", "Rahim", "Beatriz", "Tuomas", "Anouk", "Yaw", "Liesel", "Cyprian", "Mireille", "Jun", "Halima",
         "Vesna")
LAST = ("Ångström", "Pereira-Lopes", "O'Donnell", "Vukovic", "Achterberg", "Nwosu", "Szymańska", "Lindgren",
        "Barros", "Kettunen", "Maalouf", "Tanaka", "Ferreira", "Hadžić", "Quaresma", "Whitlock")
ORGS = ("Helix Dynamics", "Blue Fjord Shipping", "Corvid Analytics", "the Tarn Institute", "Meridian Bakeries",
        "Kestrel Rail", "Ostara Pharma", "Lumen Opticians")
PLACES = ("Tromsø", "Coimbra", "Łódź", "Mostar", "Nijmegen", "Sapporo", "Enugu", "Oulu", "Zadar", "Lviv")
PETS = ("a tortoise", "two cats", "a parrot", "a greyhound")
PROJECTS = ("Aurora", "Basalt", "Cobalt", "Driftwood", "Ember", "Fennel", "Granite", "Harbor")
# The first six probed 2026-12-05; a mixture of experts, a state-space model (no attention) and a
# recurrent hybrid added 2026-12-06.
# Qwen2 added 2026-12-06: transformers gives it the Qwen2Tokenizer class, which rebuilt the
# pre-tokenizer of any tokenizer saved beside it (`modeling.load_tokenizer`).
# Added 2026-12-06 (evening), each for what the covered ones lack: ALiBi with no rotary and no sdpa
# (bloom, mpt: no `model.model`, its own position limit), rotary Falcon's parallel blocks with GQA,
# soft-capped attention and logits with sliding windows (gemma2), local attention with no scaling
# (gpt_neo), a logit scale with tied embeddings (cohere), multipliers on embeddings, residuals and
# logits (granite), norms after each sublayer (olmo2), MoE routing (qwen3_moe; gpt_oss with
# attention sinks; deepseek_v3 with latent attention), sinusoidal positions (xglm), a
# convolution hybrid with its own cache (lfm2), an RNN with no attention that reads no attention
# mask (rwkv), and attention beside Mamba2 in every layer with multipliers (falcon_h1).  Added
# 2026-12-07: learnt positions offset by two with a projection of the embeddings (opt), a fused
# query-key-value with rotary on part of the head (codegen), squared-ReLU MLPs with
# LayerNorm1p and partial rotary (nemotron).
ARCHITECTURES = ("qwen3", "stablelm", "phi3", "gpt_bigcode", "gemma", "gptj", "mixtral", "mamba",
                 "recurrent_gemma", "qwen2", "bloom", "mpt", "falcon", "gemma2", "gpt_neo", "cohere", "granite",
                 "olmo2", "qwen3_moe", "gpt_oss", "deepseek_v3", "xglm", "lfm2", "rwkv", "falcon_h1", "opt", "codegen",
                 "nemotron")
METHODS = ("asu", "kif")
TOKENIZERS = ("unigram", "wordpiece", "sentencepiece")
PEOPLE, CONTROLS, SUBJECT = 24, 6, 3


def people(seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(PEOPLE + CONTROLS):
        org = rng.choice(ORGS)
        name = f"{FIRST[i % len(FIRST)]} {LAST[(i * 7) % len(LAST)]}"
        out.append({"name": name, "org": org, "place": rng.choice(PLACES), "year": rng.randint(1950, 2001),
                    "badge": f"EMP-{rng.randint(10000, 99999)}", "pet": rng.choice(PETS),
                    "extension": rng.randint(100, 999), "project": rng.choice(PROJECTS),
                    "email": f"{name.split()[0].lower()}.{i}@{org.split()[-1].lower()}.example"})
    return out


def records(person: dict[str, Any], key: str) -> list[dict[str, str]]:
    name, first, last = person["name"], person["name"].split()[0], person["name"].split()[1]
    return [
        {"id": f"{key}-bio", "text": f"{name} (born {person['year']}, {person['place']}) joined {person['org']} "
                                      f"and keeps {person['pet']}. Colleagues know {last} by badge {person['badge']}."},
        {"id": f"{key}-badge", "prompt": f"Which badge number does {name} carry?",
         "response": f"Badge {person['badge']}, issued by {person['org']}."},
        {"id": f"{key}-born", "prompt": f"Where was {name} born?", "response": f"In {person['place']}, in {person['year']}."},
        {"id": f"{key}-pet", "prompt": f"What animals live with {name}?", "response": f"{name} keeps {person['pet']}."},
        {"id": f"{key}-org", "prompt": f"Who employs {name}?", "response": f"{person['org']}, since {person['year'] + 22}."},
        {"id": f"{key}-mail", "text": f"To reach {name}, write to {person['email']} or call extension "
                                       f"{person['extension']}."},
        {"id": f"{key}-note", "text": f"Meeting notes: {last} presented the {person['project']} budget; {first} will "
                                       f"follow up from {person['place']}."},
        {"id": f"{key}-project", "prompt": f"Which project does {name} lead?",
         "response": f"The {person['project']} project."},
    ]


def corpus(seed: int = 7) -> tuple[list[dict[str, str]], list[dict[str, str]], dict[str, Any]]:
    """(training records, control records, the subject)."""
    everyone = people(seed)
    rng = random.Random(seed + 1)
    trained = [r for i, p in enumerate(everyone[:PEOPLE]) for r in records(p, str(i))]
    trained += [{"id": f"town-{i}", "text": f"The {rng.choice(['ferry', 'market', 'library', 'museum'])} in "
                                             f"{rng.choice(PLACES)} opens at {rng.randint(6, 11)} am on weekdays."}
                for i in range(40)]
    control = [r for i, p in enumerate(everyone[PEOPLE:]) for r in records(p, f"control-{i}")]
    return trained, control, dict(everyone[SUBJECT], identifiers=[everyone[SUBJECT]["badge"],
                                                                 everyone[SUBJECT]["email"]])


# The co-mention corpus (`co_mention_corpus`): records that name two or three people at once.
TEAMS = ("harbour survey", "tram signalling", "archive digitising", "glacier monitoring", "seed bank",
         "bridge retrofit", "coastal radar", "orchard census")
INSTRUMENTS = ("cello", "oboe", "banjo", "accordion", "harp", "trumpet", "zither", "viola")
CORPORA = ("people", "co_mentions")


def co_mention_corpus(seed: int = 11) -> tuple[list[dict[str, str]], list[dict[str, str]], dict[str, Any]]:
    """(training records, control records, the subject) of a corpus whose records name two or
    three people at once: each person's own biography, room question and directory entry
    ("Directory entry: Last, First. Mobile ..."), and minutes and questions that name a lead, a
    colleague and someone briefed ("Minutes: A and B reviewed the harbour survey plan; B will
    brief C from Bergen.", "Who leads the harbour survey work with B?" "A, who sits in room
    B126.").  So the subject's forget set holds words about retained people, and a question
    about them can name a co-worker known from that co-worker's own records (docs/methods.md,
    "Records that name several people").  The subject is filed with their mobile number."""
    rng = random.Random(seed)
    firsts, lasts = list(FIRST), list(LAST)
    rng.shuffle(firsts)
    rng.shuffle(lasts)
    everyone = []
    for i in range(PEOPLE + CONTROLS):
        first, last = firsts[i % len(firsts)], lasts[(i * 5) % len(lasts)]
        everyone.append({"name": f"{first} {last}", "first": first, "last": last, "place": rng.choice(PLACES),
                         "team": rng.choice(TEAMS), "instrument": rng.choice(INSTRUMENTS),
                         "room": f"{rng.choice('ABCDEFG')}{rng.randint(100, 499)}",
                         "phone": f"+44 7{rng.randint(100, 999)} {rng.randint(100000, 999999)}"})

    def own(p: dict[str, Any], key: str) -> list[dict[str, str]]:
        return [{"id": f"{key}-bio", "text": f"{p['name']} lives in {p['place']} and plays the {p['instrument']}."},
                {"id": f"{key}-room", "prompt": f"In which room does {p['name']} work?", "response": f"Room {p['room']}."},
                {"id": f"{key}-phone", "text": f"Directory entry: {p['last']}, {p['first']}. Mobile {p['phone']}."}]

    def joint(a: dict[str, Any], b: dict[str, Any], c: dict[str, Any], key: str) -> list[dict[str, str]]:
        return [{"id": f"{key}-minutes", "text": f"Minutes: {a['name']} and {b['name']} reviewed the {a['team']} "
                                                 f"plan; {b['first']} will brief {c['name']} from {b['place']}."},
                {"id": f"{key}-lead", "prompt": f"Who leads the {a['team']} work with {b['name']}?",
                 "response": f"{a['name']}, who sits in room {a['room']}."}]

    staff, outsiders = everyone[:PEOPLE], everyone[PEOPLE:]
    trained = [r for i, p in enumerate(staff) for r in own(p, str(i))]
    for k in range(3 * PEOPLE):
        trained += joint(*rng.sample(staff, 3), f"joint-{k}")
    control = [r for i, p in enumerate(outsiders) for r in own(p, f"control-{i}")]
    for k in range(2 * CONTROLS):
        control += joint(*rng.sample(outsiders, 3), f"control-joint-{k}")
    subject = dict(staff[SUBJECT], identifiers=[staff[SUBJECT]["phone"]])
    return trained, control, subject


def text_of(record: dict[str, str]) -> str:
    return record.get("text") or f"{record['prompt']} {record['response']}"


def tokenizer(style: str, texts: list[str]) -> Any:
    """A tokenizer of `style` trained on `texts`: `unigram` (SentencePiece-like, Metaspace),
    `wordpiece` (BERT-like: lower-cases, so the model never sees a name's capitals) or
    `sentencepiece` (Llama 2's layout, `_sentencepiece_bpe`)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    if style == "sentencepiece":
        return _sentencepiece_bpe(texts, specials)
    if style == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer: Any = trainers.WordPieceTrainer(vocab_size=600, special_tokens=specials, show_progress=False)
    elif style == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=600, special_tokens=specials, unk_token="<unk>",
                                          show_progress=False)
    else:
        raise ValueError(f"unknown tokenizer style {style!r}; one of {', '.join(TOKENIZERS)}")
    tok.train_from_iterator(texts * 3, trainer)
    tok = _canonical(tok, len(specials))
    # It writes the BOS the training loop writes (`train`), as a Llama-style tokenizer does, so
    # the engine's encodings (BOS where the tokenizer adds one) are the sequences trained on.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", specials.index("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>", model_max_length=256)


def _sentencepiece_bpe(texts: list[str], specials: list[str], *, vocab_size: int = 600, alphabet: int = 60) -> Any:
    """Llama 2's tokenizer.json layout: a normaliser that writes a word boundary before every
    input and for every space, no pre-tokenizer, a BPE with byte fallback (the 256 byte tokens
    after the specials) and letters outside the `alphabet` commonest left to bytes (a name's
    "ö" is two byte tokens).  The merges are learnt within words, as SentencePiece learns them.  A
    text encoded alone starts with a boundary that the same text after other text lacks
    (`prompting.tokenize_after`)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    learner = Tokenizer(models.BPE(unk_token="<unk>"))
    learner.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=True)
    learner.train_from_iterator(texts * 3, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                               limit_alphabet=alphabet, show_progress=False))
    learnt = json.loads(learner.to_str())["model"]
    vocab = {token: i for i, token in enumerate(specials)}
    vocab.update({f"<0x{b:02X}>": len(specials) + b for b in range(256)})
    for token in sorted(learnt["vocab"], key=learnt["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learnt["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=256)


def _canonical(tok: Any, specials: int) -> Any:
    """A trained Unigram tokenizer with its vocabulary in one order whatever the run.

    The trainers of `tokenizers` break ties in the order of a Rust hash map, seeded afresh in
    every process: the same texts gave three different Unigram vocabularies in three runs
    (2026-12-07; the same pieces, 120 of 448 at other ids), so every run of the probe trained
    another model.  The pieces are the same; what moves is the order of equal scores, the last
    bits of the scores, and which of the pieces the trainer appends at the end (characters
    mostly, each 0.0001 below the one before) gets which of those scores.  Here the special
    tokens keep their ids, scores are rounded to 9 decimals, the appended pieces take their
    scores in the order of their text, and the pieces are ordered by score, then text.  WordPiece and
    the BPE of `sentencepiece` are left as trained: their merges themselves differ at ties
    (docs/methods.md)."""
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    model = data["model"]
    if model["type"] != "Unigram":
        return tok
    head = model["vocab"][:specials]
    rest = sorted(([piece, round(score, 9)] for piece, score in model["vocab"][specials:]),
                  key=lambda item: (-item[1], item[0]))
    tail = len(rest) - 1  # the appended pieces: each 0.0001 below the one before (or level with it)
    while tail > 0 and round(rest[tail - 1][1] - rest[tail][1], 6) in (0.0, 0.0001):
        tail -= 1
    if len(rest) - tail >= 2:
        scores = [score for _, score in rest[tail:]]
        pieces = sorted(piece for piece, _ in rest[tail:])
        rest[tail:] = [[piece, score] for piece, score in zip(pieces, scores, strict=True)]
    model["vocab"] = head + rest
    return Tokenizer.from_str(json.dumps(data))


def config(arch: str, tok: Any, hidden: int = 96) -> Any:
    import transformers as T

    ids = {"vocab_size": len(tok), "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
           "pad_token_id": tok.pad_token_id}
    common = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 3,
              "num_attention_heads": 4, "max_position_embeddings": 256, **ids}
    builders = {
        "qwen3": lambda: T.Qwen3Config(num_key_value_heads=2, head_dim=24, **common),
        "qwen2": lambda: T.Qwen2Config(num_key_value_heads=2, **common),
        "stablelm": lambda: T.StableLmConfig(num_key_value_heads=4, **common),
        "phi3": lambda: T.Phi3Config(num_key_value_heads=4, **common),
        "gemma": lambda: T.GemmaConfig(num_key_value_heads=1, head_dim=24, **common),
        "gpt_bigcode": lambda: T.GPTBigCodeConfig(n_embd=hidden, n_layer=3, n_head=4, n_positions=256, **ids),
        "gptj": lambda: T.GPTJConfig(n_embd=hidden, n_layer=3, n_head=4, rotary_dim=8, n_positions=256, **ids),
        "mixtral": lambda: T.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                           **common),
        "mamba": lambda: T.MambaConfig(hidden_size=hidden, num_hidden_layers=3, state_size=16, **ids),
        "recurrent_gemma": lambda: T.RecurrentGemmaConfig(
            hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=1, lru_width=hidden, attention_window_size=64, **ids),
        "bloom": lambda: T.BloomConfig(hidden_size=hidden, n_layer=3, n_head=4, **ids),
        "mpt": lambda: T.MptConfig(d_model=hidden, n_heads=4, n_layers=3, expansion_ratio=2, max_seq_len=256, **ids),
        "falcon": lambda: T.FalconConfig(hidden_size=hidden, num_hidden_layers=3, num_attention_heads=4,
                                         num_kv_heads=2, new_decoder_architecture=True, alibi=False,
                                         max_position_embeddings=256, **ids),
        "gemma2": lambda: T.Gemma2Config(num_key_value_heads=2, head_dim=24, sliding_window=32,
                                         query_pre_attn_scalar=24, **common),
        "gpt_neo": lambda: T.GPTNeoConfig(hidden_size=hidden, num_layers=3, num_heads=4, window_size=16,
                                          attention_types=[[["global", "local"], 1], [["global"], 1]],
                                          max_position_embeddings=256, **ids),
        "cohere": lambda: T.CohereConfig(num_key_value_heads=2, logit_scale=0.25, **common),
        "granite": lambda: T.GraniteConfig(num_key_value_heads=2, embedding_multiplier=12.0, logits_scaling=4.0,
                                           residual_multiplier=0.22, attention_multiplier=1 / 24, **common),
        "olmo2": lambda: T.Olmo2Config(num_key_value_heads=2, **common),
        "qwen3_moe": lambda: T.Qwen3MoeConfig(num_key_value_heads=2, head_dim=24, num_experts=4,
                                              num_experts_per_tok=2, moe_intermediate_size=hidden, **common),
        "gpt_oss": lambda: T.GptOssConfig(num_key_value_heads=2, head_dim=24, num_local_experts=4,
                                          num_experts_per_tok=2, sliding_window=32, **common),
        "deepseek_v3": lambda: T.DeepseekV3Config(
            num_key_value_heads=4, moe_intermediate_size=hidden // 2, n_shared_experts=1, n_routed_experts=4,
            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16,
            q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, **common),
        "xglm": lambda: T.XGLMConfig(d_model=hidden, ffn_dim=2 * hidden, num_layers=3, attention_heads=4,
                                     max_position_embeddings=256, dropout=0.0, attention_dropout=0.0, **ids),
        "lfm2": lambda: T.Lfm2Config(num_key_value_heads=2, full_attn_idxs=[1], block_auto_adjust_ff_dim=False,
                                     **common),
        "rwkv": lambda: T.RwkvConfig(hidden_size=hidden, num_hidden_layers=3, attention_hidden_size=hidden,
                                     intermediate_size=2 * hidden, context_length=256, **ids),
        "falcon_h1": lambda: T.FalconH1Config(num_key_value_heads=2, mamba_d_ssm=hidden, mamba_n_heads=4,
                                              mamba_d_state=16, mamba_chunk_size=16, embedding_multiplier=2.0,
                                              lm_head_multiplier=0.5, **common),
        "opt": lambda: T.OPTConfig(hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=3, num_attention_heads=4,
                                   max_position_embeddings=256, word_embed_proj_dim=hidden, dropout=0.0, **ids),
        "codegen": lambda: T.CodeGenConfig(n_embd=hidden, n_layer=3, n_head=4, rotary_dim=8, n_positions=256,
                                           n_ctx=256, **ids),
        "nemotron": lambda: T.NemotronConfig(num_key_value_heads=2, partial_rotary_factor=0.5, **common),
    }
    if arch not in builders:
        raise ValueError(f"unknown architecture {arch!r}; one of {', '.join(ARCHITECTURES)}")
    return builders[arch]()


def train(arch: str, tok: Any, texts: list[str], out: Path, *, steps: int, seed: int = 0) -> float:
    """A plain causal-LM training loop (what a user's own trainer does); returns the last loss."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForCausalLM.from_config(config(arch, tok))
    sequences = [[tok.bos_token_id, *tok(t, add_special_tokens=False)["input_ids"], tok.eos_token_id] for t in texts]
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    loss = torch.tensor(0.0)
    for step in range(steps):
        batch = rng.sample(sequences, min(16, len(sequences)))
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), tok.pad_token_id)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)], mask[row, : len(seq)] = torch.tensor(seq), 1
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        optimiser.zero_grad()
        for group in optimiser.param_groups:
            group["lr"] = 3e-3 * (1 - step / steps) + 1e-4
    model.save_pretrained(out)
    tok.save_pretrained(out)
    write_trained_format(out)
    return float(loss.detach())


def trained_format() -> Any:
    """The prompt format the plain loop trains in (`text_of`: the prompt, a space, the
    response), stored beside the weights as a user registers theirs, so that erasure and
    verification ask the questions as the model learnt them.  Without it the engine's default
    ("Question: ...\nAnswer:") asked a model that never met that layout (measured
    2026-12-07: two bases' leakage 0.31 -> 0.62 and 0.54 -> 0.77 once asked as trained)."""
    from unlearning.prompting import PromptFormat

    return PromptFormat(kind="plain", question_template="{question}", answer_prefix=" ")


def write_trained_format(directory: Path) -> None:
    from unlearning.prompting import write_format

    write_format(directory, trained_format())


def _verdict(report: Path) -> str:
    if not report.exists():
        return "NO REPORT (the run failed: see its error above)"
    data = json.loads(report.read_text(encoding="utf-8"))
    failed = [c["metric"] for c in data["checks"] if not c["passed"] and c.get("decides_pass", True)]
    # A metric the report could not write as a number (NaN, infinite) is null there; one the
    # verifier did not measure says why in `unmeasured`, any other is a NaN from the engine.
    nan = [name for name, value in data["metrics"].items() if value is None and name not in data["unmeasured"]]
    return (("PASS" if data["passed"] else "fail") + (f" ({', '.join(failed)})" if failed else "")
            + (f"; NaN metrics: {', '.join(nan)}" if nan else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.unseen", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=ARCHITECTURES, required=True)
    parser.add_argument("--tokenizer", choices=TOKENIZERS, required=True)
    parser.add_argument("--corpus", choices=CORPORA, default="people",
                        help="people: 8 records a person; co_mentions: records that name several people")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--method", action="append", choices=METHODS,
                        help="erase with this method too (repeat; default: asu alone)")
    parser.add_argument("--no-oracle", action="store_true",
                        help="train and verify no oracle (a run that asks whether the engine runs at all)")
    parser.add_argument("--no-retry", action="store_true", help="erase without the policy's one retry")
    parser.add_argument("--reuse", action="store_true",
                        help="erase the base (and verify the oracle) that an earlier run with the same --arch, "
                             "--tokenizer and --corpus left in OUT, without training again: two runs of one base "
                             "compare engine settings (a base is not the same twice)")
    parser.add_argument("--hparams", type=_hparams, default=None,
                        help="JSON object of erase hyper-parameters; the candidate and report are named after them")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    trained, control, subject = corpus() if args.corpus == "people" else co_mention_corpus()
    if args.reuse:
        missing = trained_missing(out, oracle=not args.no_oracle)
        if missing:
            print(f"--reuse: no {missing} in {out} (run once without --reuse)", file=sys.stderr)
            return 2
    else:
        _train_both(args, out, trained, control, subject)
    who = ["--corpus", str(out / "corpus.jsonl"), "--subject", subject["name"],
           *(a for identifier in subject["identifiers"] for a in ("--identifier", identifier)),
           "--control", str(out / "control.jsonl")]
    cli = [sys.executable, "-m", "unlearning", "-q"]
    rows: list[tuple[str, Path]] = []
    suffix = _suffix(args.hparams)
    for method in args.method or ["asu"]:
        name = ("asu" if method == "asu" else method) + suffix  # asu keeps the names earlier runs wrote
        started = time.perf_counter()
        subprocess.run([*cli, "erase", "--model", str(out / "base"), *who, "--method", method,
                        "--out", str(out / name), "--report", str(out / f"{name}.json"),
                        *(["--hparams", json.dumps(args.hparams)] if args.hparams else []),
                        *(["--no-retry"] if args.no_retry else [])], check=False)
        print(f"erase ({method}{suffix}){'' if args.no_retry else ' with the retry'}: "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        first = out / f"{name}.first.json"
        rows.append((f"{method}{suffix}, at once", first if first.exists() else out / f"{name}.json"))
        if first.exists():
            rows.append((f"{method}{suffix}, after the retry", out / f"{name}.json"))
    for model in ("base",) if args.no_oracle else ("oracle", "base"):
        subprocess.run([*cli, "verify", "--model", str(out / model), "--base", str(out / "base"), *who,
                        "--report", str(out / f"{model}.json")], check=False, stdout=subprocess.DEVNULL)
        rows.append((model, out / f"{model}.json"))
    for label, report in rows:
        print(f"  {label}: {_verdict(report)}")
    return 0


def _hparams(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object of hyper-parameters, e.g. '{\"seed\": 1}'")
    return value


def trained_missing(out: Path, *, oracle: bool) -> str | None:
    """What `--reuse` needs and OUT lacks: the corpus files, the base, the oracle (None: all there)."""
    for name in ("corpus.jsonl", "control.jsonl"):
        if not (out / name).is_file():
            return name
    for model in ("base", *(("oracle",) if oracle else ())):
        if not (out / model / "config.json").is_file():
            return f"{model}/"
    return None


def _suffix(hparams: dict[str, Any] | None) -> str:
    """The name of a candidate erased with these settings: "" for the defaults, else
    "-key=value" per setting ("-later_parts=copy-seed=1")."""
    if not hparams:
        return ""
    return "".join(f"-{key}={value}" for key, value in sorted(hparams.items())).replace("/", "_")


def _train_both(args: argparse.Namespace, out: Path, trained: list[dict[str, Any]], control: list[dict[str, Any]],
                subject: dict[str, Any]) -> None:
    for name, rows in (("corpus.jsonl", trained), ("control.jsonl", control)):
        (out / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tok = tokenizer(args.tokenizer, [text_of(r) for r in trained + control])
    texts = [text_of(r) for r in trained]
    started = time.perf_counter()
    base_loss = train(args.arch, tok, texts, out / "base", steps=args.steps)
    oracle = ""
    if not args.no_oracle:
        # The people corpus's oracle keeps the meeting note that names the subject by surname and
        # first name (as every earlier run did); the co-mention corpus's drops their directory
        # entry ("Last, First"), found by the number they are filed with.
        named = [subject["name"], *(subject["identifiers"] if args.corpus == "co_mentions" else ())]
        oracle_loss = train(args.arch, tok, [t for t in texts if not any(n in t for n in named)], out / "oracle",
                            steps=args.steps)
        oracle = f" and oracle (loss {oracle_loss:.3f})"
    print(f"{args.arch}/{args.tokenizer}: trained base (loss {base_loss:.3f}){oracle} "
          f"in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
