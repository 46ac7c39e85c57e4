"""KIF - knowledge-signature suppression (arXiv 2601.10566, later renamed ERUF).

1. Signature mining: residual-stream activations after every decoder layer at
   the last subject-name token and the last prompt token of the subjects'
   questions, against the same positions in matched questions about other
   people.  Per layer, subject and position the candidate direction is the
   normalised difference of means; it is kept when the lower end of a
   bootstrap CI of Cohen's d along it exceeds ``min_effect``.  Up to ``k``
   directions per layer (orthonormalised), plus ``pca_directions`` residual
   principal components.
2. A suppression gate per chosen layer (kif_remote.SuppressionGate): a
   per-token gate ``g = sigmoid(a (z - z0))`` on the standardised projection z
   removes ``g * s * (v.h) v``.
   With ``lora_rank > 0`` (the default) each gate also carries the design's
   optional small LoRA, switched per token by a learned linear gate over the
   same standardised projections (kif_remote.SuppressionGate): the gates alone
   remove directions that do not hold the facts of a small model.
3. Loss, base frozen, only the gates (a, z0, s, LoRA switch and LoRA) trained:
   ``forget_weight * NLL(subject question -> no-knowledge answer)
   + retain_weight * KL(original || gated)`` on retain answer tokens (the
   original is the same model with the gates off, computed once).
4. The checkpoint is the base weights plus the gates, saved with
   kif_remote.py and an ``auto_map`` so that
   ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` loads
   the gates; ``model.set_gates_enabled(False)`` gives back the base model
   exactly (verification uses it to tell ``suppression`` from ``weights``).
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from unlearning.methods import kif_remote
from unlearning.methods.asu import TeacherTarget, answer_logprobs, kl_at_answers
from unlearning.methods.base import (
    QA,
    Batch,
    MethodInput,
    MethodOutcome,
    answer_logits,
    answer_nll,
    forget_retain_batches,
    run_training,
)
from unlearning.methods.idk import REFUSALS
from unlearning.progress import ProgressCallback

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KIFHparams:
    k: int = 32  # at most this many directions per layer (two candidates per subject)
    pca_directions: int = 0  # extra residual-PCA directions per layer
    max_layers: int = 4
    min_effect: float = 1.0
    bootstrap: int = 200
    lr: float = 5e-2  # gates (slope, threshold, strength, LoRA switch)
    epochs: int = 30
    batch_size: int = 8
    forget_weight: float = 1.0
    retain_weight: float = 3.0
    weight_decay: float = 0.0
    # The design's optional small LoRA behind each gate (0 = the paper's gates only, which do
    # not forget on the demo model: docs/methods.md).
    lora_rank: int = 16
    lora_lr: float = 1e-2
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LayerSignature:
    layer: int
    directions: torch.Tensor  # (k, hidden), orthonormal rows
    mean: torch.Tensor  # (k,) control projections
    std: torch.Tensor
    subject_z: torch.Tensor  # (k,) mean standardised projection of the subject prompts
    effect: float  # best Cohen's d lower CI bound among the kept candidates


def _positions(tokenizer: Any, question: str, name: str | None) -> tuple[list[int], int | None]:
    """Chat-prompt ids and the index of the last token of ``name`` inside them (None if unknown)."""
    from unlearning.prompting import chat_prompt_ids

    ids = chat_prompt_ids(tokenizer, question)
    if not name or name not in question:
        return ids, None
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    start = rendered.index(question) + question.index(name)
    end = start + len(name)
    encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    if [int(i) for i in encoded["input_ids"]] != ids:
        return ids, None
    inside = [i for i, (s, _) in enumerate(encoded["offset_mapping"]) if start <= s < end]
    return ids, (inside[-1] if inside else None)


@torch.no_grad()
def residual_activations(
    model: nn.Module, tokenizer: Any, questions: list[str], names: list[str | None], *, batch_size: int = 32
) -> dict[str, torch.Tensor]:
    """Per position kind (``subject``, ``prompt_end``): (layers, n, hidden) activations after each layer."""
    layers = kif_remote.decoder_layers(model)
    device = next(model.parameters()).device
    encoded = [_positions(tokenizer, q, n) for q, n in zip(questions, names, strict=True)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    captured: list[torch.Tensor] = []

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        captured.append((output[0] if isinstance(output, tuple) else output).float())

    handles = [layer.register_forward_hook(hook) for layer in layers]
    out: dict[str, list[torch.Tensor]] = {"subject": [], "prompt_end": [], "all": []}
    try:
        model.eval()
        for start in range(0, len(encoded), batch_size):
            chunk = encoded[start : start + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), int(pad), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, (tokens, _) in enumerate(chunk):
                ids[row, : len(tokens)] = torch.tensor(tokens)
                mask[row, : len(tokens)] = 1
            captured.clear()
            model(input_ids=ids.to(device), attention_mask=mask.to(device))
            stacked = torch.stack(captured)  # (layers, batch, width, hidden)
            rows = torch.arange(len(chunk))
            ends = torch.tensor([len(tokens) - 1 for tokens, _ in chunk])
            subject = torch.tensor([pos if pos is not None else len(t) - 1 for t, pos in chunk])
            out["prompt_end"].append(stacked[:, rows, ends].cpu())
            out["subject"].append(stacked[:, rows, subject].cpu())
            out["all"].append(stacked[:, mask.bool()].cpu())  # every real token: what the gate sees
    finally:
        for handle in handles:
            handle.remove()
    return {kind: torch.cat(parts, dim=1) for kind, parts in out.items()}


def cohens_d(a: torch.Tensor, b: torch.Tensor) -> float:
    pooled = ((a.var(unbiased=True) * (len(a) - 1) + b.var(unbiased=True) * (len(b) - 1)) / max(1, len(a) + len(b) - 2)).sqrt()
    return float((a.mean() - b.mean()) / pooled.clamp_min(1e-6))


def bootstrap_d_low(a: torch.Tensor, b: torch.Tensor, *, rounds: int, rng: random.Random) -> float:
    """2.5th percentile of Cohen's d over bootstrap resamples of both groups."""
    values = []
    for _ in range(rounds):
        ia = torch.tensor([rng.randrange(len(a)) for _ in range(len(a))])
        ib = torch.tensor([rng.randrange(len(b)) for _ in range(len(b))])
        values.append(cohens_d(a[ia], b[ib]))
    values.sort()
    return values[int(0.025 * (len(values) - 1))]


def mine_signature(
    subject: dict[str, torch.Tensor],
    control: dict[str, torch.Tensor],
    hp: KIFHparams,
    groups: Sequence[int] | None = None,
) -> list[LayerSignature]:
    """Directions per layer that separate each subject's prompts from the controls' (module doc).

    ``groups[i]`` says which subject prompt i is about; each subject gets its
    own candidate direction per position kind, so that a gate fires on that
    subject rather than on "somebody we know" (a difference of means pooled
    over several subjects is nearly the same for everyone).
    """
    rng = random.Random(hp.seed)
    n_layers, n_rows = subject["prompt_end"].shape[:2]
    labels = torch.tensor(list(groups) if groups is not None else [0] * n_rows)
    found: list[LayerSignature] = []
    for layer in range(n_layers):
        kept: list[tuple[float, torch.Tensor]] = []
        for group in sorted(set(labels.tolist())):
            rows = labels == group
            for kind in ("subject", "prompt_end"):
                s, c = subject[kind][layer][rows], control[kind][layer]
                diff = s.mean(0) - c.mean(0)
                if len(s) < 2 or float(diff.norm()) == 0.0:
                    continue
                v = diff / diff.norm()
                low = bootstrap_d_low(s @ v, c @ v, rounds=hp.bootstrap, rng=rng)
                if low > hp.min_effect:
                    kept.append((low, v))
        if not kept:
            continue
        kept.sort(key=lambda item: -item[0])
        basis = torch.linalg.qr(torch.stack([v for _, v in kept][: hp.k]).T).Q.T
        s_all = torch.cat([subject["subject"][layer], subject["prompt_end"][layer]])
        if hp.pca_directions > 0:
            # Residual PCA: what still separates the subjects once the kept directions are removed.
            c_mean = torch.cat([control["subject"][layer], control["prompt_end"][layer]]).mean(0)
            residual = s_all - c_mean
            residual = residual - (residual @ basis.T) @ basis
            _, _, vh = torch.linalg.svd(residual, full_matrices=False)
            basis = torch.linalg.qr(torch.cat([basis, vh[: hp.pca_directions]]).T).Q.T
        # The gate runs at every token, so it is standardised on every token of
        # the control prompts: it then fires where the subject is, not everywhere.
        c_all = control["all"][layer] if "all" in control else torch.cat([control["subject"][layer], control["prompt_end"][layer]])
        mean, std = (c_all @ basis.T).mean(0), (c_all @ basis.T).std(0).clamp_min(1e-4)
        z = (s_all @ basis.T - mean) / std
        row_groups = torch.cat([labels, labels])
        per_group = torch.stack([z[row_groups == g].mean(0) for g in sorted(set(row_groups.tolist()))])
        # A direction is a line, not an arrow: orient it so its subject sits at positive z.
        best = per_group.gather(0, per_group.abs().argmax(0, keepdim=True))[0]
        sign = torch.where(best < 0, -1.0, 1.0)
        basis, mean, subject_z = basis * sign[:, None], mean * sign, best * sign
        found.append(LayerSignature(layer, basis, mean, std, subject_z, kept[0][0]))
    found.sort(key=lambda sig: -sig.effect)
    return sorted(found[: hp.max_layers], key=lambda sig: sig.layer)


def no_knowledge_answers(data: MethodInput, seed: int) -> list[QA]:
    """Each forget question paired with its plausible alternative, or a refusal when none."""
    draw = random.Random(seed)
    alternatives = list(data.alternatives) or [None] * len(data.forget)
    return [
        QA(pair.question, alt if alt else draw.choice(REFUSALS))
        for pair, alt in zip(data.forget, alternatives, strict=True)
    ]


class KIF:
    name: ClassVar[str] = "kif"
    hparams_type: ClassVar[type] = KIFHparams

    def unlearn(
        self, model: nn.Module, tokenizer: Any, data: MethodInput, hparams: KIFHparams,
        *, progress: ProgressCallback | None = None,
    ) -> MethodOutcome:
        hp = hparams
        base_class = type(model).__name__
        if base_class not in kif_remote.KIF_CLASSES:
            raise ValueError(f"KIF supports {', '.join(kif_remote.KIF_CLASSES)}, not {base_class}")
        questions = [p.question for p in data.forget if p.question is not None]
        control = [p.question for p in data.control if p.question is not None]
        if not questions or len(control) < 2:
            raise ValueError("KIF needs the subjects' questions and at least two control questions")
        forget_names = list(data.forget_names) or [None] * len(data.forget)
        control_names = list(data.control_names) or [None] * len(data.control)
        subject_acts = residual_activations(model, tokenizer, questions, [n for p, n in zip(data.forget, forget_names, strict=True) if p.question is not None])
        control_acts = residual_activations(model, tokenizer, control, [n for p, n in zip(data.control, control_names, strict=True) if p.question is not None])
        asked = [n for p, n in zip(data.forget, forget_names, strict=True) if p.question is not None]
        group_of = {name: i for i, name in enumerate(dict.fromkeys(asked))}
        signature = mine_signature(subject_acts, control_acts, hp, [group_of[n] for n in asked])
        if not signature:
            raise ValueError(f"no layer separates the subjects from the controls with Cohen's d above {hp.min_effect}")

        for p in model.parameters():
            p.requires_grad_(False)
        device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
        hidden = int(signature[0].directions.shape[1])
        width = max(int(sig.directions.shape[0]) for sig in signature)
        gates: dict[int, kif_remote.SuppressionGate] = {}
        for sig in signature:
            gate = kif_remote.SuppressionGate(hidden, width, hp.lora_rank)
            k = sig.directions.shape[0]
            with torch.no_grad():
                gate.directions[:k] = sig.directions
                gate.mean[:k] = sig.mean
                gate.std[:k] = sig.std
                gate.threshold[:k] = sig.subject_z / 2  # half-way between controls (0) and subjects
                gate.strength[:k] = 1.0
                if hp.lora_rank > 0:
                    # The LoRA switch starts as "some direction sits near its subject's level":
                    # each direction adds about 2 at its subject's mean z, the bias takes 2 off.
                    gate.lora_mix[:k] = 2.0 / sig.subject_z.clamp_min(1.0)
                    gate.lora_bias.fill_(-2.0)
            gates[sig.layer] = gate.to(device=device, dtype=dtype)
        enabled = [True]
        handles = kif_remote.attach_gates(model, gates, enabled)

        forget, retain = forget_retain_batches(
            tokenizer, no_knowledge_answers(data, hp.seed), data.retain, batch_size=hp.batch_size, seed=hp.seed, device=device,
        )
        enabled[0] = False  # the original model is the same weights with the gates off
        original = {id(b): TeacherTarget(answer_logprobs(model, b, 1.0)) for b in retain}
        enabled[0] = True

        def step_loss(epoch: int, forget_batch: Batch, retain_batch: Batch) -> torch.Tensor:
            loss_forget = answer_nll(model, forget_batch)
            loss_retain = kl_at_answers(original[id(retain_batch)], answer_logits(model, retain_batch), retain_batch)
            return hp.forget_weight * loss_forget + hp.retain_weight * loss_retain

        lora = [p for gate in gates.values() for n, p in gate.named_parameters() if n in ("lora_down", "lora_up")]
        switches = [p for gate in gates.values() for n, p in gate.named_parameters() if n not in ("lora_down", "lora_up")]
        groups = [{"params": switches, "lr": hp.lr}] + ([{"params": lora, "lr": hp.lora_lr}] if lora else [])
        try:
            steps, loss = run_training(
                model, forget, retain, step_loss, lr=hp.lr, epochs=hp.epochs,
                weight_decay=hp.weight_decay, stage="unlearn:kif", progress=progress, param_groups=groups,
            )
        finally:
            for handle in handles:
                handle.remove()
        gated = build_gated_model(model, gates, k=width, rank=hp.lora_rank)
        details = {"layers": [s.layer for s in signature], "effects": [round(s.effect, 3) for s in signature]}
        logger.info("kif: gates on layers %s", details["layers"])
        return MethodOutcome(gated, steps, loss, details)


def build_gated_model(
    model: nn.Module, gates: dict[int, kif_remote.SuppressionGate], *, k: int, rank: int = 0
) -> nn.Module:
    """The base weights plus the gates, as the remote-code class that saves with its own code."""
    cls: Any = kif_remote.KIF_CLASSES[type(model).__name__]
    config: Any = copy.deepcopy(model.config)
    config.kif = {"layers": sorted(gates), "k": k, "rank": rank}
    config.architectures = [cls.__name__]
    param = next(model.parameters())
    gated: nn.Module = cls(config).to(device=param.device, dtype=param.dtype)
    state = dict(model.state_dict())
    state.update({f"kif_gates.{layer}.{name}": t for layer, gate in gates.items() for name, t in gate.state_dict().items()})
    missing, unexpected = gated.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"KIF gated model does not match its base: missing {missing}, unexpected {unexpected}")
    gated.eval()
    for p in gated.parameters():
        p.requires_grad_(False)
    cls.register_for_auto_class("AutoModelForCausalLM")
    return gated


def set_gates(model: nn.Module, enabled: bool) -> bool:
    """Switch a KIF model's gates; False when ``model`` has none (a plain checkpoint)."""
    switch = getattr(model, "set_gates_enabled", None)
    if not callable(switch):
        return False
    switch(enabled)
    return True
