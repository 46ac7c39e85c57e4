"""Forget set, retain set and verification probes for one or many data subjects.

`build_sets(corpus, subjects)` scans the corpus once with one multi-pattern
automaton (`text_matching`): the forget set is every record that mentions a
subject by name, alias or identifier; the retain set takes neighbours first
(records of the same question shape about other people), then other
question/answer records, then free text; probes are derived per forget fact.
Every set is pinned by the Merkle root of its record digests.  Subjects that
match nothing are listed in `unmatched`, and callers must refuse to certify
them.
"""

from __future__ import annotations

import gc
import hashlib
import json
import random
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from unlearning.corpus import Corpus, Record, iter_records, merkle_root, record_digest, write_jsonl
from unlearning.probes import PROBE_KINDS, Probe, build_probes
from unlearning.text_matching import MultiMatcher


class SetsError(ValueError):
    """Sets that cannot be built or loaded (no subjects, a tampered directory ...)."""


@dataclass(frozen=True)
class Subject:
    """A data subject as the request names them; all of these are matched."""

    name: str
    aliases: tuple[str, ...] = ()
    identifiers: tuple[str, ...] = ()  # emails, phone numbers, account names

    def patterns(self) -> tuple[str, ...]:
        return (self.name, *self.aliases, *self.identifiers)


def _question_shape(question: str) -> str:
    """A question with the people in it taken out: "where was _ born?" for everyone.

    Capitalised words after the first are taken for proper nouns (the person,
    not the template); that is enough to pair a question with the same
    template about someone else.
    """
    words = question.split()
    shaped = [words[0].lower()] if words else []
    for word in words[1:]:
        shaped.append("_" if word[:1].isupper() else word.lower())
    return re.sub(r"_( _)+", "_", " ".join(shaped))


def _probe_digest(probe: Probe) -> str:
    return hashlib.sha256(json.dumps(asdict(probe), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ErasureSets:
    subjects: tuple[Subject, ...]
    forget: tuple[Record, ...]
    retain: tuple[Record, ...]
    probes: tuple[Probe, ...]
    match_counts: tuple[int, ...]  # forget records per subject, by subject index
    record_subjects: dict[str, tuple[int, ...]] = field(hash=False)  # forget record id -> subjects
    corpus_digest: str = ""
    params: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def unmatched(self) -> tuple[Subject, ...]:
        """Subjects found nowhere in the corpus: nothing to erase, nothing to certify."""
        return tuple(s for s, n in zip(self.subjects, self.match_counts, strict=True) if n == 0)

    @cached_property
    def forget_digest(self) -> str:
        return merkle_root(record_digest(r) for r in self.forget)

    @cached_property
    def retain_digest(self) -> str:
        return merkle_root(record_digest(r) for r in self.retain)

    @cached_property
    def probes_digest(self) -> str:
        return merkle_root(_probe_digest(p) for p in self.probes)

    def counts(self) -> dict[str, Any]:
        per_kind = {kind: sum(p.kind == kind for p in self.probes) for kind in PROBE_KINDS}
        return {"forget": len(self.forget), "retain": len(self.retain),
                "probes": len(self.probes), "probes_by_kind": per_kind,
                "per_subject": list(self.match_counts),
                "unmatched": [i for i, n in enumerate(self.match_counts) if n == 0]}

    def manifest(self) -> dict[str, Any]:
        """Digests and counts only: safe for logs, jobs and certificates (no names)."""
        return {"forget_digest": self.forget_digest, "retain_digest": self.retain_digest,
                "probes_digest": self.probes_digest, "corpus_digest": self.corpus_digest,
                "counts": self.counts(), "params": self.params}

    def to_payload(self) -> dict[str, Any]:
        """Everything the sets hold as one JSON-ready dict (names included: keep it private)."""
        return {
            "manifest": self.manifest(),
            "subjects": [asdict(s) for s in self.subjects],
            "match_counts": list(self.match_counts),
            "record_subjects": {k: list(v) for k, v in self.record_subjects.items()},
            "forget": [r.to_json() for r in self.forget],
            "retain": [r.to_json() for r in self.retain],
            "probes": [asdict(p) for p in self.probes],
        }

    def dumps(self) -> bytes:
        """The sets as one UTF-8 JSON blob, for callers that encrypt it before it touches a disk."""
        return json.dumps(self.to_payload(), ensure_ascii=False, sort_keys=True).encode("utf-8")

    @classmethod
    def loads(cls, data: bytes) -> ErasureSets:
        """The inverse of `dumps`; raises SetsError when a digest no longer matches."""
        from unlearning.corpus import record_from_json

        try:
            raw = json.loads(data.decode("utf-8"))
            manifest = raw["manifest"]
            sets = cls(
                subjects=tuple(Subject(s["name"], tuple(s["aliases"]), tuple(s["identifiers"]))
                               for s in raw["subjects"]),
                forget=tuple(record_from_json(r) for r in raw["forget"]),
                retain=tuple(record_from_json(r) for r in raw["retain"]),
                probes=tuple(Probe(**p) for p in raw["probes"]),
                match_counts=tuple(raw["match_counts"]),
                record_subjects={k: tuple(v) for k, v in raw["record_subjects"].items()},
                corpus_digest=manifest.get("corpus_digest", ""), params=manifest.get("params", {}),
            )
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise SetsError(f"not a readable sets blob ({type(exc).__name__})") from exc
        sets._check(manifest, "sets blob")
        return sets

    def _check(self, manifest: dict[str, Any], where: str) -> None:
        for name in ("forget_digest", "retain_digest", "probes_digest"):
            if getattr(self, name) != manifest.get(name):
                raise SetsError(f"{where}: {name} does not match the manifest")

    def save(self, directory: str | Path) -> Path:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(self.forget, out / "forget.jsonl")
        write_jsonl(self.retain, out / "retain.jsonl")
        with (out / "probes.jsonl").open("w", encoding="utf-8") as handle:
            for probe in self.probes:
                handle.write(json.dumps(asdict(probe), ensure_ascii=False, sort_keys=True) + "\n")
        subjects = {"subjects": [asdict(s) for s in self.subjects],
                    "match_counts": list(self.match_counts),
                    "record_subjects": {k: list(v) for k, v in self.record_subjects.items()}}
        (out / "subjects.json").write_text(json.dumps(subjects, ensure_ascii=False, indent=1),
                                           encoding="utf-8")
        (out / "manifest.json").write_text(json.dumps(self.manifest(), indent=2, sort_keys=True),
                                           encoding="utf-8")
        return out

    @classmethod
    def load(cls, directory: str | Path) -> ErasureSets:
        """Read saved sets back; raises SetsError when a file no longer matches its digest."""
        root = Path(directory)
        try:
            manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
            raw = json.loads((root / "subjects.json").read_text(encoding="utf-8"))
            with (root / "probes.jsonl").open(encoding="utf-8") as handle:
                probes = tuple(Probe(**json.loads(line)) for line in handle if line.strip())
            forget = tuple(iter_records(root / "forget.jsonl"))
            retain = tuple(iter_records(root / "retain.jsonl"))
        except (OSError, ValueError, TypeError) as exc:
            raise SetsError(f"{root}: not a readable sets directory ({exc})") from exc
        sets = cls(
            subjects=tuple(Subject(s["name"], tuple(s["aliases"]), tuple(s["identifiers"]))
                           for s in raw["subjects"]),
            forget=forget, retain=retain, probes=probes,
            match_counts=tuple(raw["match_counts"]),
            record_subjects={k: tuple(v) for k, v in raw["record_subjects"].items()},
            corpus_digest=manifest.get("corpus_digest", ""), params=manifest.get("params", {}),
        )
        sets._check(manifest, str(root))
        return sets


def match_records(
    records: Sequence[Record], subjects: Sequence[Subject],
) -> tuple[list[tuple[Record, tuple[int, ...]]], list[Record]]:
    """One pass: (records mentioning subjects with their indices, every other record)."""
    matcher = MultiMatcher([s.patterns() for s in subjects])
    found = matcher.scan([record.searchable_text() for record in records])
    hits = [(records[i], tuple(sorted(found[i]))) for i in sorted(found)]
    rest = [record for i, record in enumerate(records) if i not in found]
    return hits, rest


@contextmanager
def _gc_paused() -> Iterator[None]:
    # Set building allocates many small objects next to a large, long-lived corpus;
    # the cyclic collector would rescan that corpus again and again (it doubled the
    # time of a 100 MB run) although nothing here makes reference cycles.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _retain(forget: Sequence[Record], others: Sequence[Record], *, per_forget: int, seed: int) -> tuple[Record, ...]:
    rng = random.Random(seed)
    by_shape: dict[str, list[Record]] = {}
    for record in others:
        if record.is_qa and record.question:
            by_shape.setdefault(_question_shape(record.question), []).append(record)
    for pool in by_shape.values():
        rng.shuffle(pool)
    chosen: dict[str, Record] = {}
    want = per_forget * len(forget)
    # 1. Neighbours: the same question shape about someone else, spread over the forget facts.
    for _ in range(per_forget):
        for record in forget:
            pool = by_shape.get(_question_shape(record.question or ""), [])
            while pool and pool[-1].id in chosen:
                pool.pop()
            if pool:
                neighbour = pool.pop()
                chosen[neighbour.id] = neighbour
    # 2. Other question/answer records, then 3. free text, to fill up.
    for tier in ([r for r in others if r.is_qa], [r for r in others if not r.is_qa]):
        rest = [r for r in tier if r.id not in chosen]
        for record in rng.sample(rest, min(len(rest), max(0, want - len(chosen)))):
            chosen[record.id] = record
    return tuple(chosen.values())


# Retain records sampled per forget record.  Ten is what keeps everyone else's facts
# through an erasure: with one, retained accuracy on the demo model fell to 89 % of
# the base; with ten it stays at 97.5 % (docs/methods.md, "Measurements").
DEFAULT_RETAIN_PER_FORGET = 10


def build_sets(
    corpus: Corpus,
    subjects: Sequence[Subject],
    *,
    retain_per_forget: int = DEFAULT_RETAIN_PER_FORGET,
    seed: int = 0,
) -> ErasureSets:
    """Forget, retain and probes for all `subjects` in one pass over `corpus`."""
    if not subjects:
        raise SetsError("no subjects given")
    if retain_per_forget < 0:
        raise SetsError("retain_per_forget must be >= 0")
    with _gc_paused():
        return _build(corpus, subjects, retain_per_forget=retain_per_forget, seed=seed)


def _build(
    corpus: Corpus, subjects: Sequence[Subject], *, retain_per_forget: int, seed: int,
) -> ErasureSets:
    hits, others = match_records(corpus.records, subjects)
    counts = [0] * len(subjects)
    for _, found in hits:
        for index in found:
            counts[index] += 1
    forget = tuple(record for record, _ in hits)
    probes = build_probes(forget, subjects, {record.id: found for record, found in hits})
    return ErasureSets(
        subjects=tuple(subjects), forget=forget,
        retain=_retain(forget, others, per_forget=retain_per_forget, seed=seed),
        probes=tuple(probes), match_counts=tuple(counts),
        record_subjects={record.id: found for record, found in hits},
        corpus_digest=corpus.manifest_digest,
        params={"retain_per_forget": retain_per_forget, "seed": seed},
    )
