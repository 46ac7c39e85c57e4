"""The domain's legal codes as form choices (labels as officers read them)."""
from __future__ import annotations

from deletion.domain.gdpr import DENIAL_REASONS, GROUNDS

GROUND_CHOICES = tuple((code, f"Art. {code}: {label}") for code, label in GROUNDS.items())
DENY_CHOICES = tuple(
    (code, f"Art. {code}: {label}" if code.startswith("17(") else label[0].upper() + label[1:])
    for code, label in DENIAL_REASONS.items()
)
PRIORITY_CHOICES = (
    ("batch", "Batch: merged with other requests in the model's next window"),
    ("immediate", "Immediate: starts as soon as it is approved"),
)
