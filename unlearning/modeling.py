"""Loading checkpoints and asking them questions.

Every question reaches a model in the model's own prompt format
(`unlearning.prompting`: its chat template, or the plain format stored beside
its weights), the way training formatted it and the way any outside tool
using that format queries the checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unlearning.checkpoints import quiet_transformers
from unlearning.prompting import (
    FORMAT_FILE,
    PromptFormat,
    PromptFormatError,
    attach_format,
    chat_prompt_ids,
    continuation_ids,
    default_format,
    pad_id_of,
    read_format,
    template_is_consistent,
    template_refusal,
)
from unlearning.subjects import Subject

logger = logging.getLogger(__name__)

__all__ = [
    "ModelLoadError", "TokenizerMismatch", "chat_prompt_ids", "check_causal_lm", "check_same_tokenizer",
    "complete_texts", "default_device", "fit_prompts", "generate_answers", "load_model", "model_format",
    "position_limit",
]

DEFAULT_ATTENTION = "sdpa"
# What an architecture that refuses the default attention (BLOOM, Gemma2, MPT: no sdpa path
# in transformers) loads with instead: the reference implementation every model has.
FALLBACK_ATTENTION = "eager"


class ModelLoadError(ValueError):
    """A model directory that is missing or does not load; the message names it."""


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _set_gates(model: Any, path: Path, enabled: bool) -> None:
    # KIF checkpoints ship their suppression gates as remote code (auto_map) and expose
    # `set_gates_enabled(bool)`; verification turns them off to see what the weights hold.
    switch = getattr(model, "set_gates_enabled", None)
    if callable(switch):
        switch(enabled)
        return
    if not enabled and _has_remote_code(path):
        raise ModelLoadError(
            f"{path}: checkpoint ships custom code but exposes no set_gates_enabled switch"
        )


def _has_remote_code(path: Path) -> bool:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(config.get("auto_map"))


_LOCAL_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


def _refuse_links(directory: Path) -> None:
    """Refuse a checkpoint holding a symlink or special file (what the digest refuses too):
    nothing outside the directory's own regular files may come along with a load."""
    for current, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(current, name)
            mode = path.lstat().st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise ModelLoadError(
                    f"{directory}: {path.relative_to(directory).as_posix()} is a symlink or "
                    "special file; refused")


def remote_code_allowed(directory: Path) -> bool:
    """True when `auto_map` names code, and only code inside this checkpoint.

    Each `auto_map` entry must be `module.Class` with `module.py` a regular file of the
    directory, which the checkpoint digest covers (KIF ships `kif_remote.py` so).  A
    hub reference (`org/repo--module.Class`), a path, or a missing module raises
    `ModelLoadError`: transformers would otherwise fetch or import code the digest never
    saw.  Without `auto_map`, remote code stays off.
    """
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{directory}: config.json does not read ({exc})") from exc
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if not auto_map:
        return False
    if not isinstance(auto_map, dict):
        raise ModelLoadError(f"{directory}: auto_map is not an object")
    for key, value in auto_map.items():
        references = value if isinstance(value, list | tuple) else [value]
        for reference in references:
            if reference is None:
                continue  # a tokenizer's missing slow/fast class
            if not isinstance(reference, str) or not _LOCAL_MODULE.match(reference):
                raise ModelLoadError(
                    f"{directory}: auto_map {key} = {reference!r} does not name a module of "
                    "this checkpoint; refused")
            module = directory / f"{reference.split('.', 1)[0]}.py"
            if not module.is_file() or module.is_symlink():
                raise ModelLoadError(f"{directory}: auto_map {key} names {module.name}, "
                                     "which is not a file of this checkpoint; refused")
    return True


def _architecture(config: Any) -> str:
    """`model_type (SavedClass, ...)`: how a refusal names the architecture."""
    saved = ", ".join(getattr(config, "architectures", None) or [])
    return f"{getattr(config, 'model_type', '') or type(config).__name__}" + (f" ({saved})" if saved else "")


def check_causal_lm(path: str | Path) -> None:
    """Refuse, naming the architecture, a model directory that holds no decoder-only causal LM.

    Every method and check here reads next-token logits of one causal stack.  An
    encoder-decoder (T5, BART: `is_encoder_decoder`) has none, and transformers refuses
    it with its own message.  An encoder (BERT, RoBERTa) is worse: `AutoModelForCausalLM`
    loads it as a "LM head" model whose attention stays bidirectional unless its config
    says `is_decoder`, so every position sees the tokens it should predict, and erasure
    and verification would run on a model that reads the answer.  `is_decoder` alone does
    not tell (GPT-NeoX's config has it false and is causal): the model is built from its
    config on the meta device (no weights, no memory) and refused when one of its
    attention modules says `is_causal` false.  Remote code loads only where `load_model`
    allows it.  Raises `ModelLoadError` naming the directory."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoConfig

    directory = Path(path)
    if directory.is_symlink() or not (directory / "config.json").is_file():
        raise ModelLoadError(f"{directory}: not a model directory (no config.json)")
    trust_remote_code = remote_code_allowed(directory)
    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code,
                                                local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        reason = (str(exc).splitlines() or [""])[0]
        raise ModelLoadError(f"{directory}: config.json does not load ({type(exc).__name__}: {reason})") from exc
    needs = "the engine erases decoder-only causal language models (GPT-, Llama-like)"
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{directory}: {_architecture(config)} is an encoder-decoder model; {needs}")
    if getattr(config, "is_decoder", None) is False:
        bidirectional = _bidirectional_attention(config, trust_remote_code)
        if bidirectional:
            raise ModelLoadError(f"{directory}: {_architecture(config)} is an encoder-only model ({bidirectional} "
                                 f"attends both ways: its config has is_decoder false); {needs}")


def _bidirectional_attention(config: Any, trust_remote_code: bool) -> str | None:
    """The class name of an attention module of `config`'s causal-LM model that is not causal,
    or None; the model is built on the meta device (nothing allocated).  A model that does not
    build here is left to `from_pretrained`, which names what is wrong."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"), quiet_transformers():
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - whatever the build raised, the load names it
        return None
    for module in model.modules():
        if getattr(module, "is_causal", None) is False:
            return type(module).__name__
    return None


def _refuses_attention(exc: ValueError) -> bool:
    """Is this transformers' refusal of an attention implementation the architecture lacks?"""
    text = str(exc)
    return "does not support" in text and ("scaled_dot_product_attention" in text or "sdpa" in text)


def _from_pretrained(auto: Any, directory: Path, attn_implementation: str, **kwargs: Any) -> Any:
    """`from_pretrained` with `attn_implementation`, or eager where the architecture refuses it.

    The default, sdpa, is faster and what most architectures take; BLOOM, Gemma2
    and MPT have no sdpa path and transformers raises instead of choosing another,
    so they load with the eager implementation.  The implementation used is logged."""
    try:
        model = auto.from_pretrained(directory, attn_implementation=attn_implementation, **kwargs)
    except ValueError as exc:
        if attn_implementation == FALLBACK_ATTENTION or not _refuses_attention(exc):
            raise
        logger.info("%s: the architecture has no %s attention; loading with %s",
                    directory, attn_implementation, FALLBACK_ATTENTION)
        model = auto.from_pretrained(directory, attn_implementation=FALLBACK_ATTENTION, **kwargs)
    used = getattr(getattr(model, "config", None), "_attn_implementation", None)
    logger.info("%s: attention implementation %s", directory, used or "unknown")
    return model


def model_format(directory: str | Path, tokenizer: Any) -> PromptFormat:
    """The prompt format of a model directory: the one it stores, else its tokenizer's default.

    A chat template that cannot render one user question (after the stored format's system
    message, where it stores one) is refused (`template_refusal`) instead of silently asking
    in plain text or refusing every record; so is, without a stored format, a template that
    renders but not turn by turn (`template_is_consistent`), which `default_format` would
    replace by the plain layout.  Raises `PromptFormatError`."""
    stored = read_format(directory)
    if stored is not None and stored.kind != "chat":
        return stored
    refusal = template_refusal(tokenizer, stored.system if stored is not None else None)
    if refusal is not None:
        where = (f"the chat format stored in {FORMAT_FILE}" if stored is not None
                 else "the tokenizer's chat template")
        raise PromptFormatError(
            f"{where} refuses a conversation of one user question ({refusal}), so questions cannot be "
            f"asked the way the model was trained; store the format beside the weights ({FORMAT_FILE}: "
            f"{{\"kind\": \"chat\", \"system\": \"...\"}} for a template that requires a system message, "
            f"{{\"kind\": \"plain\"}} for a model trained on plain text)")
    if stored is not None:
        return stored
    if getattr(tokenizer, "chat_template", None) and not template_is_consistent(tokenizer):
        # `default_format` would take the plain layout here; a model trained through the template
        # would then be erased and probed in a layout it never saw (and pass for it).
        raise PromptFormatError(
            "the tokenizer's chat template does not render a conversation turn by turn (a question "
            "with the generation prompt is not the start of the same question answered), so the layout "
            f"the model was trained in cannot be told; store the format beside the weights ({FORMAT_FILE}: "
            "{\"kind\": \"plain\"} for a model trained on plain text)")
    return default_format(tokenizer)


class TokenizerMismatch(ModelLoadError):
    """A candidate and a base whose tokenizers differ; the message names both directories."""

    def __init__(self, candidate: Path, base: Path, difference: str) -> None:
        super().__init__(f"{candidate}: its tokenizer is not the base's ({base}): {difference}; a candidate "
                         "is verified against the base it was erased from, with the same tokenizer")
        self.candidate, self.base, self.difference = candidate, base, difference


# Tokenised by both tokenizers: merges, normalisation and an added BOS show in its ids.
_SAMPLE_TEXT = "Question: Who is Ann Lee-Ørsted? Answer: ann.lee@mail.example, +44 20 7946 0958, 1987."
_SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


# Tokenised both ways by `load_tokenizer`: digit runs, CJK, accents, spaces, tabs and newlines,
# where the pre-tokenizers of the common families part.
_PIPELINE_SAMPLE = ("Ann Lee-Ørsted, born 1987 in Zürich: +44 20 7946 0958 (ext. 123)\n"
                    "王梅明是哪一年出生的？1966年。  Ümlaut\tdouble  space's 3.14 ٣٤٥")

_WARNED_TOKENIZERS: set[Path] = set()  # said once per directory and process


def load_tokenizer(directory: str | Path) -> Any:
    """The directory's tokenizer, tokenising as its `tokenizer.json` was saved.

    transformers 5 takes the tokenizer class from the model's type where the saved
    configuration names only the generic backend, and a family's class (Qwen2Tokenizer,
    GPT2Tokenizer, LlamaTokenizer ...) rebuilds its own pre-tokenizer over the saved
    vocabulary.  A tokenizer of another design saved beside such a model then loads as a
    different one: a byte-level BPE that keeps digit runs whole, saved beside a Qwen2
    config, came back splitting every digit, so each year and phone number the model had
    learnt as "196" + "6" was read as "1" "9" "6" "6" (tokens it had never been trained on:
    11 nats on a memorised digit), and every loss on them pulled the model off its own
    answers (docs/methods.md, "A Chinese corpus").  Where a tokenizer saved by a generic
    object (`_saved_as_generic`) loads as a family's class that tokenises `_PIPELINE_SAMPLE`
    differently from the file, the file is what the model was trained with: it is loaded
    as saved (`PreTrainedTokenizerFast`, with the directory's special tokens and chat
    template), and a warning says so.  No `tokenizer.json` (a slow tokenizer), a family
    class named by the saved configuration, or the same ids: the loaded one, unchanged.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    directory = Path(directory)
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    saved = directory / "tokenizer.json"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not saved.is_file() or not _saved_as_generic(directory):
        return tokenizer
    from tokenizers import Tokenizer

    try:
        as_saved = Tokenizer.from_file(str(saved))
    except Exception:  # noqa: BLE001 - a file the tokenizers library cannot read: the class decides
        return tokenizer
    if (backend.encode(_PIPELINE_SAMPLE, add_special_tokens=False).ids
            == as_saved.encode(_PIPELINE_SAMPLE, add_special_tokens=False).ids):
        return tokenizer
    if directory.resolve() not in _WARNED_TOKENIZERS:
        _WARNED_TOKENIZERS.add(directory.resolve())
        logger.warning("%s: transformers' %s tokenises differently from the saved tokenizer.json; "
                       "using tokenizer.json as saved", directory.name, type(tokenizer).__name__)
    with quiet_transformers():
        return PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)


# The classes of a tokenizer saved as its `tokenizer.json` alone, with no family's rules.
_GENERIC_TOKENIZERS = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def _saved_as_generic(directory: Path) -> bool:
    """Whether the directory's tokenizer was saved by a generic tokenizer object (its
    `tokenizer_config.json` names no family class): then its `tokenizer.json` is all there is
    to how it tokenised.  A family's class that saved itself wrote its own rules into that
    file, and a model trained through it was trained on what the class does."""
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    named = config.get("tokenizer_class") if isinstance(config, dict) else None
    return named is None or named in _GENERIC_TOKENIZERS


def whole_tokens(tokenizer: Any, subjects: Sequence[Subject]) -> list[int]:
    """Per subject, how many of its names, aliases and identifiers the tokenizer holds as one
    vocabulary token (written alone or after a space).

    A tokenizer trained on the corpus learns a string that recurs in it as a token of its
    own: a person's name written without spaces ("马娜伟", measured on a Chinese corpus) or
    a recurring handle.  The vocabulary, saved in the checkpoint's `tokenizer.json`, then
    holds the person's identifier in plain text, which no change to the weights removes, and
    to a model retrained without the person their records read as more familiar than a
    stranger's (one token to pay for where a stranger's name takes several).  The verifier
    notes it; nothing here decides a check."""
    out = []
    for subject in subjects:
        strings = [p for p in subject.patterns() if len(p.strip()) >= 2]
        held = 0
        for text in strings:
            for written in (text, " " + text):
                if len(tokenizer(written, add_special_tokens=False)["input_ids"]) == 1:
                    held += 1
                    break
        out.append(held)
    return out


def _tokenizer_and_format(directory: Path) -> tuple[Any, PromptFormat] | None:
    """The directory's tokenizer (its pad fallback as `load_model` sets it) and prompt format,
    or None where the tokenizer does not load (loading the model then names why)."""
    try:
        tokenizer = load_tokenizer(directory)
    except (OSError, ValueError, KeyError):
        return None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        return tokenizer, model_format(directory, tokenizer)
    except PromptFormatError as exc:
        raise ModelLoadError(f"{directory}: {exc}") from exc


def _tokenizer_difference(a: Any, a_format: PromptFormat, b: Any, b_format: PromptFormat) -> str | None:
    """What differs between two tokenizers as the engine uses them (vocabulary, special tokens,
    tokenisation, prompt format, chat template), in a few words, or None."""
    vocab_a, vocab_b = a.get_vocab(), b.get_vocab()
    if vocab_a != vocab_b:
        extra = len(set(vocab_a) - set(vocab_b)) + len(set(vocab_b) - set(vocab_a))
        return (f"vocabulary of {len(vocab_a)} tokens vs {len(vocab_b)}" if len(vocab_a) != len(vocab_b)
                else f"vocabulary of {len(vocab_a)} tokens each, {extra} tokens or ids differ" if extra
                else f"vocabulary of {len(vocab_a)} tokens each, with other ids")
    for name in _SPECIAL:
        mine, theirs = getattr(a, name, None), getattr(b, name, None)
        if str(mine) != str(theirs):
            return f"{name} {str(mine)!r} vs {str(theirs)!r}"
    if sorted(map(str, a.all_special_tokens)) != sorted(map(str, b.all_special_tokens)):
        return "special tokens differ"
    if [int(i) for i in a(_SAMPLE_TEXT)["input_ids"]] != [int(i) for i in b(_SAMPLE_TEXT)["input_ids"]]:
        return "the same text tokenises differently"
    if a_format != b_format:
        return f"prompt format {a_format.describe()} vs {b_format.describe()}"
    if a_format.kind == "chat" and getattr(a, "chat_template", None) != getattr(b, "chat_template", None):
        return "chat template differs"
    return None


def check_same_tokenizer(candidate: str | Path, base: str | Path) -> None:
    """Refuse a candidate whose tokenizer or prompt format is not its base's (`TokenizerMismatch`).

    Verification reads the candidate and the base on the same token ids (the probe bank is
    built with the base's tokenizer; fluency scores the candidate's answers under the base):
    with two tokenizers its numbers would be silently wrong, or an index error deep in a
    scorer.  Tokenizers only (nothing heavy is loaded); a directory whose tokenizer does not
    load is left to `load_model`, which names it.  Raises `ModelLoadError`."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    candidate, base = Path(candidate), Path(base)
    mine, theirs = _tokenizer_and_format(candidate), _tokenizer_and_format(base)
    if mine is None or theirs is None:
        return
    difference = _tokenizer_difference(mine[0], mine[1], theirs[0], theirs[1])
    if difference is not None:
        raise TokenizerMismatch(candidate, base, difference)


def load_model(
    path: str | Path, *, device: str | None = None, gates: bool = True,
    attn_implementation: str = DEFAULT_ATTENTION,
) -> tuple[Any, Any]:
    """Load `(model, tokenizer)` from a local Hugging Face directory, in eval mode.

    bf16 on CUDA, fp32 on CPU.  Checkpoints that ship code through `auto_map`
    (KIF) load it, with their gates, only when every entry names a module file of the
    directory itself (`remote_code_allowed`); a checkpoint holding a symlink is refused.
    Nothing is fetched: `local_files_only` on every call and `HF_HUB_OFFLINE=1`.  An
    encoder or encoder-decoder model is refused, naming its architecture (`check_causal_lm`).
    `gates=False` switches KIF gates off.  The attention implementation is always
    passed explicitly because `from_pretrained` otherwise picks its own default; an
    architecture that refuses it loads with eager attention (`_from_pretrained`).
    Raises `ModelLoadError` naming the directory when it does not load.
    """
    # Before transformers is first imported: huggingface_hub reads it once, at import.
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    directory = Path(path)
    if directory.is_symlink() or not (directory / "config.json").is_file():
        raise ModelLoadError(f"{directory}: not a model directory (no config.json)")
    _refuse_links(directory)
    check_causal_lm(directory)
    trust_remote_code = remote_code_allowed(directory)
    device = device or default_device()
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        with quiet_transformers():
            model: Any = _from_pretrained(
                AutoModelForCausalLM, directory, attn_implementation,
                trust_remote_code=trust_remote_code, local_files_only=True, dtype=dtype,
            )
            tokenizer = load_tokenizer(directory)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        # SafetensorError (a damaged weights file) is no OSError: named here, or it is a traceback.
        reason = (str(exc).splitlines() or [""])[0]
        raise ModelLoadError(f"{directory}: does not load ({type(exc).__name__}: {reason})") from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # The prompt format stored with the model (or the tokenizer's default): the same layout
    # in training, erasure and verification.
    try:
        attach_format(tokenizer, model_format(directory, tokenizer))
    except PromptFormatError as exc:
        raise ModelLoadError(f"{directory}: {exc}") from exc
    tokenizer.padding_side = "left"
    model.to(device)
    model.eval()
    _set_gates(model, directory, gates)
    _switch_off_a_broken_cache(model, tokenizer)
    return model, tokenizer


def forward_error(model: Any, token: int = 0) -> Exception | None:
    """The error a forward pass of two tokens raises on `model`, or None where it runs: how
    the engine asks whether an architecture's own code runs as it is set up (its cache, a
    quantised copy's swapped modules)."""
    import torch

    ids = torch.full((1, 2), int(token), dtype=torch.long, device=next(model.parameters()).device)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    except (ValueError, TypeError, AttributeError, RuntimeError, NotImplementedError) as error:
        return error
    return None


def left_padding_leaks(model: Any, pad: int) -> bool:
    """Whether masked left padding changes what `model` predicts after it.

    Generation pads a batch's prompts on the left and masks the pads.  An architecture that
    reads no attention mask (RWKV: "`attention_mask` was passed, but it is unused") runs the
    pads through its recurrent state instead, so a prompt's answer depended on the longer
    prompts batched with it (a trained RWKV answered one badge question differently alone and
    beside a longer question).  One forward pass of two rows: the log-probabilities after three
    tokens behind three masked pads and before three (which a causal model never reads), with
    the position ids generation gives (where the model takes them).  A probe that does not run
    says no: generation then names its own error.  The verdict is the architecture's: it is
    remembered on the model (per pad id and weight type), so the probe runs once a model."""
    parameter = next(model.parameters())
    key = (pad, parameter.dtype)
    known = getattr(model, _LEFT_PADDING, None)
    if isinstance(known, tuple) and known[0] == key:
        return bool(known[1])
    verdict = _left_padding_probe(model, pad, parameter.device, parameter.dtype)
    setattr(model, _LEFT_PADDING, (key, verdict))
    return verdict


_LEFT_PADDING = "_erasure_left_padding_leaks"  # on a model: ((pad id, dtype), verdict)


def _left_padding_probe(model: Any, pad: int, device: Any, dtype: Any) -> bool:
    import inspect

    import torch

    real = [t for t in range(1, 8) if t != pad][:3]
    ids = torch.tensor([[pad] * 3 + real, [*real, pad, pad, pad]], device=device)
    mask = torch.tensor([[0] * 3 + [1] * 3, [1] * 3 + [0] * 3], device=device)
    extra: dict[str, Any] = {}
    if "position_ids" in inspect.signature(model.forward).parameters:
        extra["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0)
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **extra).logits.float()
    except (ValueError, TypeError, AttributeError, RuntimeError, NotImplementedError):
        return False
    padded, alone = logits[0, -1].log_softmax(-1), logits[1, 2].log_softmax(-1)
    tolerance = 1e-3 if dtype == torch.float32 else 1e-1
    return bool((padded - alone).abs().max() > tolerance)


def equal_length_batches(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
    """Each batch of prompt indices split into runs of prompts of one length (no padding at all)."""
    out: list[list[int]] = []
    for batch in batches:
        runs: dict[int, list[int]] = {}
        for i in batch:
            runs.setdefault(lengths[i], []).append(i)
        out.extend(runs.values())
    return out


def _switch_off_a_broken_cache(model: Any, tokenizer: Any) -> None:
    """Switch `model`'s key/value cache off where a forward pass with it fails.

    Some architectures do not run with their own cache in the installed transformers
    (RecurrentGemma in 5.x: "`get_seq_length` can only be called on Attention layers"),
    and an evaluation forward pass builds one by default.  Without it the outputs are the
    same; generation recomputes the prefix at each step.  Two tokens, once per load; any
    other failure is reported where the model is used."""
    token = next((t for t in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
                  if t is not None), 0)
    error = forward_error(model, token)
    if error is None or "cache" not in str(error).lower():
        return
    logger.warning("%s does not run with its cache here (%s); running without it",
                   type(model).__name__, str(error)[:160])
    model.config.use_cache = False
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = False


def position_limit(model: Any) -> int | None:
    """The longest sequence `model` takes (its config's positions), or None when it says none.

    Past it GPT-2 and OPT index beyond their learnt position embeddings (an
    IndexError) and a RoPE model runs past its trained context silently."""
    from unlearning.methods.base import max_positions

    return max_positions(model)


def fit_prompts(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                ) -> tuple[list[list[int]], int]:
    """Prompts cut so that prompt + new tokens fit the model's positions, and the new-token budget.

    A prompt keeps its END: the question (or the text to continue) is at the end,
    the record's beginning is what goes.  Training and targets cut records to the
    same limit.  The budget itself shrinks only for a model whose positions are
    fewer than twice it, so a prompt keeps at least half of them."""
    limit = position_limit(model)
    if limit is None:
        return [list(p) for p in prompts], max_new_tokens
    new = max(1, min(max_new_tokens, limit // 2))
    room = limit - new
    cut = sum(len(p) > room for p in prompts)
    if cut:
        logger.info("%d of %d prompts cut to their last %d tokens (%d positions, %d new tokens)",
                    cut, len(prompts), room, limit, new)
    return [list(p[-room:]) if len(p) > room else list(p) for p in prompts], new


def _generate(
    model: Any, tokenizer: Any, prompts: Sequence[list[int]], *, greedy: bool,
    max_new_tokens: int, batch_size: int, temperature: float, top_p: float, seed: int,
) -> list[str]:
    import torch

    device = next(model.parameters()).device
    pad_id = pad_id_of(tokenizer)
    # A tokenizer with no end-of-sequence token (the model never learnt to stop): every
    # answer runs to `max_new_tokens`, as the scorers' generation does (`verification.generation`).
    eos_id = tokenizer.eos_token_id
    prompts, max_new_tokens = fit_prompts(model, prompts, max_new_tokens)
    batches = [list(range(start, min(start + batch_size, len(prompts))))
               for start in range(0, len(prompts), batch_size)]
    if left_padding_leaks(model, pad_id):  # pads would run through the model: one length a batch
        batches = equal_length_batches(batches, [len(p) for p in prompts])
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # sampled generations are reproducible for a given seed
    outputs = [""] * len(prompts)
    try:
        for batch in batches:
            chunk = [prompts[i] for i in batch]
            width = max(len(p) for p in chunk)
            # Left padding: every prompt ends at the same column, so generation continues
            # each one from its own last token.
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, prompt in enumerate(chunk):
                ids[row, width - len(prompt):] = torch.tensor(prompt)
                mask[row, width - len(prompt):] = 1
            options: dict[str, Any] = {"do_sample": not greedy}
            if not greedy:
                options.update(temperature=temperature, top_p=top_p, top_k=0)
            with torch.no_grad():
                generated = model.generate(
                    input_ids=ids.to(device), attention_mask=mask.to(device),
                    max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_id,
                    **options,
                )
            for i, row in zip(batch, generated[:, width:].tolist(), strict=True):
                if eos_id is not None and eos_id in row:
                    row = row[: row.index(eos_id)]
                outputs[i] = tokenizer.decode(row, skip_special_tokens=True).strip()
    finally:
        torch.random.set_rng_state(generator_state)
    return outputs


def generate_answers(
    model: Any, tokenizer: Any, questions: Sequence[str], *, greedy: bool = True,
    max_new_tokens: int = 48, batch_size: int = 64, temperature: float = 1.0,
    top_p: float = 1.0, seed: int = 0,
) -> list[str]:
    """Answer each question (in the model's prompt format); batched, left padded, stops at eos."""
    prompts = [chat_prompt_ids(tokenizer, q) for q in questions]
    return _generate(model, tokenizer, prompts, greedy=greedy, max_new_tokens=max_new_tokens,
                     batch_size=batch_size, temperature=temperature, top_p=top_p, seed=seed)


def complete_texts(
    model: Any, tokenizer: Any, prefixes: Sequence[str], *, greedy: bool = True,
    max_new_tokens: int = 24, batch_size: int = 64, temperature: float = 1.0,
    top_p: float = 1.0, seed: int = 0,
) -> list[str]:
    """Continue raw text prefixes (free text as it was trained: no prompt format around it)."""
    prompts = [continuation_ids(tokenizer, p) for p in prefixes]
    return _generate(model, tokenizer, prompts, greedy=greedy, max_new_tokens=max_new_tokens,
                     batch_size=batch_size, temperature=temperature, top_p=top_p, seed=seed)
