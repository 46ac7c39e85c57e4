"""Sample sizes and knobs of the verification checks (recorded in every report)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .attacks.relearn import RelearnSettings


@dataclass(frozen=True)
class VerifySettings:
    """Sample sizes and knobs of the checks (recorded in the report)."""

    samples: int = 1  # sampled generations per probe (temperature 1)
    max_new_tokens: int | None = None  # None: the longest reference answer + 4 tokens (cap 64)
    batch_size: int = 128
    max_control_facts: int = 80
    max_retain_facts: int = 1500  # latent-probe training set and retained-accuracy sample
    max_retain_eval: int = 200
    max_heldout: int = 100
    latent_min_gap: float = 0.2
    bootstrap: int = 200
    mink_k: float = 0.2
    fluency_margin: float = 2.0  # nats above the reference 95th percentile
    relearn: RelearnSettings = field(default_factory=RelearnSettings)
    attacks: bool = True
