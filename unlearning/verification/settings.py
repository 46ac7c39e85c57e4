"""Sample sizes and knobs of the verification checks (recorded in every report)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .attacks.relearn import RelearnSettings


@dataclass(frozen=True)
class VerifySettings:
    """Sample sizes and knobs of the checks (recorded in the report)."""

    samples: int = 1  # sampled generations per probe (temperature 1)
    max_new_tokens: int | None = None  # None: the longest expected value + 8 tokens (cap 64)
    batch_size: int = 128
    max_forget_records: int = 200
    max_forget_probes: int = 600
    max_control_records: int = 200
    mia_strangers: int = 10  # stranger identities per subject: membership's reference and its null
    mia_records_per_subject: int = 12
    max_retain_records: int = 1500  # the pool retained probes and latent facts come from
    max_retain_eval: int = 200  # retained-accuracy sample
    max_heldout: int = 100
    latent_min_gap: float = 0.2
    lens_positions: int = 3000  # retained-text positions the tuned-lens translators are fitted on
    lens_alpha: float = 1.0
    max_lens_records: int = 300
    bootstrap: int = 200
    mink_k: float = 0.2
    fluency_margin: float = 2.0  # nats above the reference 95th percentile
    # Stranger identities the subject's questions are asked about for the fluency checks (policy
    # v8 judges the subject against all of them; v3-v7 against the first).
    fluency_strangers: int = 3
    relearn: RelearnSettings = field(default_factory=RelearnSettings)
    quant4_group_size: int = 32
    attacks: bool = True
