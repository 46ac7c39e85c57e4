"""The demo corpus, the base model and the retrain oracles the benchmarks share.

Built once under ``var/bench/<preset>/`` and reused by later runs (the
directory is git-ignored).  The corpus is generated exactly as
``workers.bootstrap`` generates it (same people count and seed), so figures
measured here describe the model the service actually serves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.console import Console

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = REPO_ROOT / "var" / "bench"
SUBJECT_SEED = 1234  # which people are forgotten: fixed, so forget sets nest (1% < 5% < 10%)


@dataclass(frozen=True)
class Assets:
    corpus_dir: Path
    base_dir: Path
    preset: str
    base_training: dict[str, Any]

    @property
    def corpus_file(self) -> Path:
        return self.corpus_dir / "corpus.jsonl"

    @property
    def control_file(self) -> Path:
        return self.corpus_dir / "control.jsonl"

    @property
    def control_records_file(self) -> Path:
        """The control people as corpus records: what the service registers as the control corpus."""
        return self.corpus_dir / "control_records.jsonl"

    @property
    def heldout_file(self) -> Path:
        return self.corpus_dir / "heldout.txt"

    def people(self) -> list[dict[str, Any]]:
        from unlearning.demo.corpus import load_people

        return load_people(self.corpus_dir / "people.jsonl")

    def control_people(self) -> list[dict[str, Any]]:
        from unlearning.demo.corpus import load_people

        return load_people(self.control_file)


def _trained(directory: Path) -> bool:
    return (directory / "config.json").is_file() and (directory / "metadata.json").is_file()


def _training_of(directory: Path) -> dict[str, Any]:
    meta = json.loads((directory / "metadata.json").read_text(encoding="utf-8"))
    return dict(meta.get("training", {}))


def train_into(corpus: Any, out_dir: Path, *, preset: str, seed: int, console: Console,
               label: str, tokenizer: Path | None = None) -> dict[str, Any]:
    """train_base into ``out_dir`` (via a partial directory, so an interrupted run is redone).

    ``tokenizer``: a checkpoint directory whose tokenizer (and prompt format) is reused
    instead of training one on ``corpus`` (the retrain oracle reuses the base's).
    """
    from unlearning.demo.train_base import train_base

    if _trained(out_dir):
        return _training_of(out_dir)
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with console.task(label) as progress:
        result = train_base(corpus, partial, preset=preset, seed=seed, progress=progress, tokenizer=tokenizer)
    shutil.rmtree(out_dir, ignore_errors=True)
    partial.rename(out_dir)
    logger.info("%s: accuracy %.3f, %s steps, %.0f s", label, result.accuracy, result.steps,
                result.seconds)
    return _training_of(out_dir)


def same_tokenizer(a: Path, b: Path) -> bool:
    """Whether two checkpoints tokenize alike, by the check verification itself runs
    (`unlearning.modeling.check_same_tokenizer`: vocabulary, special tokens, tokenisation,
    prompt format and chat template)."""
    from unlearning.modeling import TokenizerMismatch, check_same_tokenizer

    try:
        check_same_tokenizer(a, b)
    except TokenizerMismatch:
        return False
    return True


def assets_ensure(*, preset: str, people: int, cache_root: Path, console: Console) -> Assets:
    """Generate the corpus and train the base model for ``preset`` unless they are cached."""
    from unlearning.demo.corpus import write_demo_corpus

    root = cache_root / preset
    corpus_dir = root / "corpus"
    if not (corpus_dir / "manifest.json").is_file():
        shutil.rmtree(corpus_dir, ignore_errors=True)
        write_demo_corpus(corpus_dir, people=people, seed=0)
    base_dir = root / "base"
    training = train_into(corpus_dir / "corpus.jsonl", base_dir, preset=preset, seed=0,
                          console=console, label=f"train base ({preset})")
    return Assets(corpus_dir=corpus_dir, base_dir=base_dir, preset=preset, base_training=training)


def forget_people(people: Sequence[dict[str, Any]], fraction: float) -> list[dict[str, Any]]:
    """The first ``fraction`` of a fixed shuffle of the people (at least one person).

    The shuffle is the same for every fraction, so the 1% set lies inside the
    5% set, which lies inside the 10% set (as TOFU's forget01/05/10 splits).
    """
    order = sorted(people, key=lambda p: p["person_id"])
    random.Random(SUBJECT_SEED).shuffle(order)
    count = max(1, round(fraction * len(order)))
    return order[:count]


def subject_of(person: dict[str, Any]) -> Any:
    """The request an officer would file: name, aliases and the e-mail address."""
    from unlearning.sets import Subject

    return Subject(name=person["name"], aliases=tuple(person.get("aliases", ())),
                   identifiers=tuple(x for x in (person.get("email"),) if x))


def people_digest(people: Sequence[dict[str, Any]]) -> str:
    """A short reference to a set of people (ids only: no names in logs or reports)."""
    ids = ",".join(sorted(p["person_id"] for p in people))
    return hashlib.sha256(ids.encode()).hexdigest()[:12]


def oracle_ensure(assets: Assets, forgotten: Sequence[dict[str, Any]], *, cache_root: Path,
                  console: Console, seed: int = 0) -> tuple[Path, dict[str, Any]]:
    """The retrain oracle: the base recipe trained again on the corpus without ``forgotten``.

    It reuses the base model's tokenizer (a tokenizer trained on the smaller corpus
    would tokenize the subjects' names differently, which the membership and
    leakage checks would see as a difference of the model).  The directory is
    keyed by the forgotten people and the base checkpoint's digest, so a new base
    gets new oracles; the tokenizer is checked to be the base's.  `seed` is the training
    seed: 0 is the base's own (the oracle every comparison is made with); another gives the
    same recipe from another initialisation and data order.
    """
    from unlearning.checkpoints import checkpoint_digest
    from unlearning.corpus import load_corpus
    from unlearning.sets import build_sets

    corpus = load_corpus(assets.corpus_file)
    gone = {p["person_id"] for p in forgotten}
    # What an erasure of these people removes (every record naming them, and their groups),
    # and every record generated about them.
    forget = build_sets(corpus, [subject_of(p) for p in forgotten], seed=0).forget
    drop = sorted({r.id for r in forget} | {r.id for r in corpus.records if (r.meta or {}).get("person") in gone})
    if not drop:
        raise RuntimeError("the forgotten people have no records in the corpus")
    suffix = f"-t{seed}" if seed else ""
    out = (cache_root / assets.preset
           / f"oracle-{people_digest(forgotten)}-{checkpoint_digest(assets.base_dir)[:12]}{suffix}")
    label = f"retrain oracle without {len(gone)} people" + (f" (training seed {seed})" if seed else "")
    training = train_into(corpus.without(drop), out, preset=assets.preset, seed=seed, console=console,
                          label=label, tokenizer=assets.base_dir)
    if not same_tokenizer(out, assets.base_dir):
        raise RuntimeError(f"the retrain oracle {out} does not use the base model's tokenizer")
    return out, {**training, "records_dropped": len(drop), "tokenizer": "the base model's"}
