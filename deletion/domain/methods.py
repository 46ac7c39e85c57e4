"""The erasure methods and named presets an officer may choose for a retry.

The domain names them; the engine implements them (``unlearning.methods``), and a
job stores the choice as ``method`` and ``hparams = {"preset": name}``.  Kept here so
that neither the web nor the domain imports the engine to list them.
"""

from __future__ import annotations

DEFAULT_METHOD = "asu"

# method -> what an officer reads on the retry form
METHODS: dict[str, str] = {
    "asu": "ASU: attention-smoothing self-distillation (changes the weights)",
    "kif": "KIF: knowledge-signature suppression (gates shipped inside the checkpoint)",
}

# preset -> what it means; "thorough" trains longer and harder than "standard".
PRESETS: dict[str, str] = {
    "standard": "the method's measured defaults",
    "thorough": "a stronger setting: longer, harder training (slower, more change to the model)",
}
DEFAULT_PRESET = "standard"


def preset_hparams(preset: str) -> dict[str, str]:
    """The job's hyper-parameters for a named preset (the engine resolves the name)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; one of {sorted(PRESETS)}")
    return {"preset": preset}
