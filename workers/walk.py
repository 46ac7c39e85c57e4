"""The walk's one fixed sample of retained questions, asked of every model that serves.

`python -m workers.embedded demo --requests N` files N demo people one after another.  Each
job's verifier compares its candidate with the parent on a retained sample of its own, so a
product of those ratios compounds ten samples' noise.  The walk instead draws one sample of
retained questions before the first request (seeded; about people it will not file, and
never erased), scores the model serving then on it, and scores the model serving after each
request on the same questions: "since v1" is a ratio of two accuracies on one sample.

The questions are built, asked and scored as the verifier's retained accuracy is
(`unlearning.verification.suite._retain_accuracy`: the retained records' question probes,
greedy, batched, an answer counts when it contains the value).  A checkpoint is loaded only
after its files match their registered digest, scored, and freed before the next request.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deletion.domain import registry
from deletion.domain.db import session_scope
from deletion.domain.models import Checkpoint
from unlearning.corpus import Record
from unlearning.identifiers import record_texts
from unlearning.probes import Probe, answer_frequencies, probes_for
from unlearning.text import normalise
from unlearning.verification.bank import UTILITY_KINDS, _sample, _usable
from unlearning.verification.settings import VerifySettings
from workers.bootstrap import DEMO_MODEL
from workers.runtime import engine

log = logging.getLogger(__name__)

SAMPLE_SEED = 0  # one sample for every walk on the same corpus and the same people
SETTINGS = VerifySettings()  # the verifier's sizes: a pool of 1,500 records, 200 questions, batches of 128


def belongs_to(record: Record, person_ids: Collection[str], names: Collection[str]) -> bool:
    """A record of one of these demo people (by id, as `workers.demo._pick_subject` reads an
    erasure), or one naming them (a name, alias, e-mail address or phone in any of its texts)."""
    if any(record.id.startswith(pid + "-") for pid in person_ids):
        return True
    text = normalise(" ".join(record_texts(record)))
    return any(name in text for name in names)


def sample_questions(records: Iterable[Record], people: Sequence[Mapping[str, Any]], *,
                     size: int = SETTINGS.max_retain_eval, seed: int | str = SAMPLE_SEED) -> tuple[Probe, ...]:
    """`size` retained questions from `records`, none about (or naming) `people`: the
    verifier's utility probes (`bank.build_bank`: the question kinds it scores, none whose
    value is in its prompt), drawn with a fixed seed."""
    ids = {str(p["person_id"]) for p in people}
    names = {normalise(str(n)) for p in people
             for n in (p.get("name"), *(p.get("aliases") or ()), p.get("email"), p.get("phone")) if n}
    pool = [r for r in records if not belongs_to(r, ids, names)]
    frequencies = answer_frequencies(pool)
    probes = _usable(p for r in pool for p in probes_for(r, None, -1, frequencies) if p.kind in UTILITY_KINDS)
    return tuple(_sample(probes, size, f"walk:{seed}"))


@dataclass(frozen=True)
class RetainedSample:
    probes: tuple[Probe, ...]
    people: frozenset[str]  # the demo people left out: those the walk is to file

    @property
    def size(self) -> int:
        return len(self.probes)


def draw_sample(people: Sequence[Mapping[str, Any]]) -> RetainedSample:
    """The walk's sample: from a seeded sample of the demo corpus's retained records (never
    an erased one), as the worker draws the verifier's (`workers.stages._verify`)."""
    from unlearning.corpus.scan import sample_records

    with session_scope(engine()) as session:
        model = registry.model_get(session, name=DEMO_MODEL)
        if model.corpus is None:
            raise RuntimeError("the demo model has no corpus; run the bootstrap")
        path = Path(registry.corpus_current(session, name=model.corpus.name).path)
        erased = registry.corpus_tombstoned_ids(session, name=model.corpus.name)
    records = sample_records(path, SETTINGS.max_retain_records, seed=SAMPLE_SEED, exclude_ids=erased)
    return RetainedSample(sample_questions(records, people),
                          frozenset(str(p["person_id"]) for p in people))


def score(directory: str | Path, probes: Sequence[Probe], *, device: str | None = None) -> float:
    """The share of `probes` a checkpoint answers with the value, as the verifier scores its
    retained accuracy (greedy, its batch size and token budget); the model is freed after."""
    from unlearning.modeling import default_device
    from unlearning.verification.bank import ProbeBank, Side
    from unlearning.verification.suite import _load, _retain_accuracy

    empty = Side((), (), (), ())
    bank = ProbeBank(forget=empty, control=empty, strangers=empty, retain=tuple(probes), retain_records=(),
                     heldout_texts=(), control_source="", control_kind="")
    loaded = _load(directory, device or default_device(), bank, SETTINGS)
    try:
        return _retain_accuracy(loaded, bank, SETTINGS, SAMPLE_SEED)
    finally:
        del loaded
        _free()


def _free() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class Reading:
    version: int  # of the checkpoint serving when it was read
    accuracy: float | None  # None where it could not be scored (`error` says why)
    seconds: float = 0.0
    error: str = ""
    cached: bool = False  # the checkpoint was scored before (a rejected request changes nothing)


class ServingMeter:
    """Scores the demo model's serving checkpoint on one sample; a checkpoint scored once
    (a rejected request leaves the same one serving) is not loaded again."""

    def __init__(self, sample: RetainedSample) -> None:
        self.sample = sample
        self._read: dict[tuple[int, str], Reading] = {}

    def read(self) -> Reading:
        with session_scope(engine()) as session:
            model = registry.model_get(session, name=DEMO_MODEL)
            if model.serving_checkpoint_id is None:
                raise RuntimeError("the demo model has no serving checkpoint")
            checkpoint = session.get_one(Checkpoint, model.serving_checkpoint_id)
            key, version, directory = (checkpoint.id, checkpoint.digest), checkpoint.version, checkpoint.directory
            if key not in self._read:
                # Loading runs code a checkpoint ships (KIF's gates): only bytes that were registered.
                registry.checkpoint_check_files(checkpoint)
        if key in self._read:
            return replace(self._read[key], seconds=0.0, cached=True)
        started = time.monotonic()
        accuracy = score(directory, self.sample.probes)
        self._read[key] = Reading(version, accuracy, time.monotonic() - started)
        return self._read[key]

    def read_or_say_why(self) -> Reading:
        """`read`, or a reading without an accuracy naming the error: the walk goes on."""
        try:
            return self.read()
        except Exception as exc:  # noqa: BLE001 - the walk reports it and goes on
            log.warning("the serving model was not scored on the walk's sample: %s", exc)
            return Reading(version=0, accuracy=None, error=f"{type(exc).__name__}: {exc}"[:300])


def row_fields(reading: Reading | None, start: Reading | None, sample: RetainedSample | None) -> dict[str, Any]:
    """A walk row's fixed-sample fields (`workers.demo.render_walk` reads them): the model
    serving after the request and the one serving before the first, on the same sample."""
    errors = [r.error for r in (start, reading) if r is not None and r.error]
    return {
        "serving_version": (reading.version or None) if reading else None,
        "retained_accuracy_fixed": reading.accuracy if reading else None,
        "retained_accuracy_fixed_v1": start.accuracy if start else None,
        "start_version": (start.version or None) if start else None,
        "retained_questions": sample.size if sample else None,
        "retained_fixed_s": round(reading.seconds, 1) if reading else None,
        "retained_fixed_error": "; ".join(dict.fromkeys(errors)) or None,
    }


def start(count: int) -> tuple[ServingMeter | None, Reading]:
    """Before a walk of `count` requests: its sample, and the serving model scored on it.
    Where the sample cannot be drawn the walk goes on unmeasured (the reading says why)."""
    from workers.demo import walk_people

    try:
        sample = draw_sample(walk_people(count))
    except Exception as exc:  # noqa: BLE001 - the walk reports it and goes on
        log.warning("the walk's retained sample was not drawn: %s", exc)
        return None, Reading(version=0, accuracy=None, error=f"no sample: {type(exc).__name__}: {exc}"[:300])
    meter = ServingMeter(sample)
    return meter, meter.read_or_say_why()
