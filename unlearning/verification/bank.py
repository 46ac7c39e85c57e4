"""The probe bank of one verification: forget, control, retained and held-out material.

Built once per `verify` call from the erasure sets, the control people file
(or generated strangers), the corpus and the held-out text; its digest is
part of the base-model cache key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from unlearning.corpus import Corpus, Record, load_corpus

from . import probes as pb
from .leakage import contains_value
from .settings import VerifySettings


def _as_records(corpus: str | Path | Corpus | None) -> Sequence[Record]:
    if corpus is None:
        return ()
    return (corpus if isinstance(corpus, Corpus) else load_corpus(corpus)).records


def _usable(probes: Sequence[pb.FactProbe]) -> tuple[pb.FactProbe, ...]:
    """Drop probes whose value is in the prompt: echoing the prompt is not a leak."""
    return tuple(p for p in probes if not contains_value(p.prompt, p.value))


def build_bank(
    sets: Any,
    *,
    control: str | Path | None,
    corpus: str | Path | Corpus | None,
    heldout: str | Path | None,
    settings: VerifySettings,
    seed: int,
) -> tuple[pb.ProbeBank, list[str]]:
    notes: list[str] = []
    records = _as_records(corpus)
    forget = pb.forget_probes(sets)
    forget_facts = pb.forget_facts(sets, forget)
    if control is not None:
        people = pb.load_control_people(control)
        control_probes, control_facts = pb.control_from_people(
            people, max_facts=settings.max_control_facts, seed=seed
        )
        source = f"control people file ({len(people)} people, {len(control_facts)} facts sampled)"
    else:
        avoid = "\n".join(r.searchable_text() for r in (*records, *sets.forget, *sets.retain))
        control_probes, control_facts = pb.control_from_strangers(
            sets, forget, forget_facts, seed=seed, avoid=avoid
        )
        source = "generated strangers: the subject's probes with generated names the model never saw"
        notes.append("no control file: control probes are the subject's own probes about generated strangers")
    forget_ids = {r.id for r in sets.forget}
    retain = pb.retain_facts(
        (*sets.retain, *records), exclude=forget_ids, max_facts=settings.max_retain_facts, seed=seed
    )
    heldout_path = Path(heldout) if heldout else (Path(control).parent / "heldout.txt" if control else None)
    if heldout_path is not None and heldout_path.is_file():
        texts = pb.load_heldout(heldout_path, max_texts=settings.max_heldout)
    else:
        texts = tuple(f.answer for f in control_facts)[: settings.max_heldout]
        notes.append("no held-out text file: perplexity is measured on control people's answers")
    bank = pb.ProbeBank(
        forget=_usable(forget),
        control=_usable(control_probes),
        forget_facts=forget_facts,
        control_facts=control_facts,
        retain_facts=retain,
        heldout_texts=texts,
        control_source=source,
    )
    return bank, notes


def bank_digest(bank: pb.ProbeBank) -> str:
    blob = json.dumps(asdict(bank), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
