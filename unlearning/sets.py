"""Forget set, retain set and verification probes for one or many data subjects.

`build_sets(corpus, subjects)` finds, in one pass over the corpus, every record that
names a subject (name, alias, e-mail, phone or another identifier; `text_matching`),
then every other record of the same document or thread (`Record.group`: the text that
says "she" or "the author" about them).  Both are the forget set; the counts keep them
apart (`per_subject` direct, `per_subject_group` through the group).

The retain set (`SET_RULE`) is drawn from the retain *pool*: the `pool_size(...)`
lowest-ranked records outside the forget groups (`corpus.sampling`: a seeded
rank per record position).  It holds `retain_per_forget` records per forget record
but at least `RETAIN_MINIMUM`.  From the pool: first records about people who share a
name part with a subject (at most a quarter), then neighbours (a record of the same
kind about someone else: the same question shape for QA; for free text and chats,
the same shape naming identifiers of the same kinds, e-mail or phone), spread over the
forget records; then records of the forget records' shapes; then any, by rank.

A loaded `Corpus` is handled in memory by the reference implementation
(`build_sets_reference`); a path or `CorpusSource` is streamed by the fast scan
(`corpus.scan`), which gives byte-identical sets.  Probes come from
`unlearning.probes.build_probes`.  Every set is pinned by the Merkle root of its record
digests.  Subjects that match nothing are listed in `unmatched`; callers must refuse to
certify them.

Matching ignores case (a name written "MARA OKAFOR" or "mara okafor" is still hers), so a
subject whose name or alias is one common word ("Will", "May", "Rose") also matches that
word in everyone else's records ("Alice will move to Porto").  The sets keep that recall
but say so: `lower_case_only` counts, per subject, the forget records in which a one-word
name occurs only in a lower-case form unlike the one given, and `warnings` words it (by
subject number and count, never by name or text) for the CLI and the manifest.
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import json
import re
import string
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cached_property
from itertools import accumulate
from pathlib import Path
from typing import Any

from unlearning.corpus import (
    Corpus,
    CorpusSource,
    Record,
    iter_records,
    merkle_root,
    open_source,
    record_digest,
    write_jsonl,
)
from unlearning.corpus.sampling import lowest_ranked
from unlearning.corpus.scan import GroupKey, Hit, PoolEntry, group_key
from unlearning.probes import PROBE_KINDS, Probe, answer_frequencies, build_probes
from unlearning.subjects import Subject as Subject  # re-exported: callers build sets for Subjects
from unlearning.text import BOUNDARY_AFTER, UNSPACED_RANGES, has_unspaced, word_regex
from unlearning.text_matching import MultiMatcher

SET_RULE = "sets-v3"  # the matching, grouping and retain rule above (stated in the manifest)
# The pool that neighbours are looked for in: this many candidates per wanted retain
# record, plus a floor (so a small corpus is searched whole, as it always was).
RETAIN_POOL_FACTOR = 1.5
RETAIN_POOL_MIN = 2048


# At least this many retain records, whatever the forget set's size (fewer only when the
# corpus has fewer): an unlearning run takes a few hundred steps with a retain batch of
# dozens, so it can anchor thousands of other records, and what it does not see it may
# damage.  Measured on the demo model (docs/methods.md): with 110 retain records (ten per
# forget record) one person's erasure kept 92-97 % of everyone else's facts, with 1,100
# it kept 98-100 %.
RETAIN_MINIMUM = 1000


def retain_wanted(retain_per_forget: int, forget_count: int) -> int:
    """How many retain records a forget set of `forget_count` records gets."""
    if not retain_per_forget or not forget_count:
        return 0
    return max(retain_per_forget * forget_count, RETAIN_MINIMUM)


def pool_size(retain_per_forget: int, forget_count: int) -> int:
    """Retain candidates to rank for a forget set of `forget_count` records."""
    want = retain_wanted(retain_per_forget, forget_count)
    return int(RETAIN_POOL_FACTOR * want) + RETAIN_POOL_MIN if want else 0


class SetsError(ValueError):
    """Sets that cannot be built or loaded (no subjects, a tampered directory ...)."""


_BLANKS = re.compile(r"_( _)+")


def _question_shape(question: str) -> str:
    """A question with the people in it taken out: "where was _ born?" for everyone.

    Capitalised words after the first are taken for proper nouns (the person,
    not the template); that is enough to pair a question with the same
    template about someone else.
    """
    words = question.split()
    shaped = [words[0].lower()] if words else []
    shaped += ["_" if word[:1].isupper() else word.lower() for word in words[1:]]
    return _BLANKS.sub("_", " ".join(shaped))


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
    group_counts: tuple[int, ...] = ()  # forget records per subject found only through a group
    group_only: tuple[str, ...] = ()  # ids of the forget records that name nobody themselves

    @property
    def unmatched(self) -> tuple[Subject, ...]:
        """Subjects found nowhere in the corpus: nothing to erase, nothing to certify."""
        return tuple(s for s, n in zip(self.subjects, self.match_counts, strict=True) if n == 0)

    @cached_property
    def lower_case_only(self) -> tuple[int, ...]:
        """Per subject, the forget records in which one of its one-word names occurs only
        in a lower-case form unlike the name as given ("will" for "Will"): records a common
        word may have pulled in, about other people (`lower_case_only_records`)."""
        return tuple(len(lower_case_only_records(subject, index, self.forget, self.record_subjects))
                     for index, subject in enumerate(self.subjects))

    @property
    def warnings(self) -> tuple[str, ...]:
        """What a person should check before erasing: one line per subject whose one-word
        name matched records only in lower case.  Numbers only (1-based, as the CLI names
        subjects): the name and the records' text are personal data."""
        return tuple(
            f"subject #{index + 1}: {count} forget record(s) hold a one-word name of this subject only in "
            "lower case (a common word, matched because matching ignores case); they may be about "
            "someone else: check them before erasing"
            for index, count in enumerate(self.lower_case_only) if count)

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
                "per_subject_group": list(self.group_counts or (0,) * len(self.match_counts)),
                "forget_direct": len(self.forget) - len(self.group_only),
                "forget_group": len(self.group_only),
                "unmatched": [i for i, n in enumerate(self.match_counts) if n == 0],
                "per_subject_lower_case_only": list(self.lower_case_only)}

    def manifest(self) -> dict[str, Any]:
        """Digests and counts only: safe for logs, jobs and certificates (no names)."""
        return {"forget_digest": self.forget_digest, "retain_digest": self.retain_digest,
                "probes_digest": self.probes_digest, "corpus_digest": self.corpus_digest,
                "counts": self.counts(), "params": self.params, "warnings": list(self.warnings)}

    def to_payload(self) -> dict[str, Any]:
        """Everything the sets hold as one JSON-ready dict (names included: keep it private)."""
        return {
            "manifest": self.manifest(),
            "subjects": [asdict(s) for s in self.subjects],
            "match_counts": list(self.match_counts),
            "record_subjects": {k: list(v) for k, v in self.record_subjects.items()},
            "group_counts": list(self.group_counts), "group_only": list(self.group_only),
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
                group_counts=tuple(raw.get("group_counts", ())), group_only=tuple(raw.get("group_only", ())),
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
                    "record_subjects": {k: list(v) for k, v in self.record_subjects.items()},
                    "group_counts": list(self.group_counts), "group_only": list(self.group_only)}
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
            forget = tuple(iter_records(root / "forget.jsonl", strict=True))
            retain = tuple(iter_records(root / "retain.jsonl", strict=True))
        except (OSError, ValueError, TypeError) as exc:
            raise SetsError(f"{root}: not a readable sets directory ({exc})") from exc
        sets = cls(
            subjects=tuple(Subject(s["name"], tuple(s["aliases"]), tuple(s["identifiers"]))
                           for s in raw["subjects"]),
            forget=forget, retain=retain, probes=probes,
            match_counts=tuple(raw["match_counts"]),
            record_subjects={k: tuple(v) for k, v in raw["record_subjects"].items()},
            corpus_digest=manifest.get("corpus_digest", ""), params=manifest.get("params", {}),
            group_counts=tuple(raw.get("group_counts", ())), group_only=tuple(raw.get("group_only", ())),
        )
        sets._check(manifest, str(root))
        return sets


def one_word_names(subject: Subject) -> tuple[str, ...]:
    """The subject's name and aliases that are one word (no whitespace inside)."""
    names = (name.strip() for name in (subject.name, *subject.aliases))
    return tuple(dict.fromkeys(name for name in names if name and len(name.split()) == 1))


def lower_case_only_records(subject: Subject, index: int, forget: Sequence[Record],
                            record_subjects: dict[str, tuple[int, ...]]) -> tuple[str, ...]:
    """Ids of the forget records of subject `index` in which one of its one-word names
    occurs (on word boundaries, as written up to case) and every occurrence is lower case
    and unlike the name as given.  A name given in lower case never counts (its
    occurrences are the name itself); neither does a record that also writes it as given
    or capitalised ("Will"), which is read as naming the person.  Found in the records'
    text as written: an occurrence that matched only after normalisation (accents, width)
    is not looked for."""
    patterns = [(name, re.compile(r"(?<![^\W_])" + re.escape(name) + r"(?![^\W_])", re.IGNORECASE))
                for name in one_word_names(subject)]
    if not patterns:
        return ()
    found = []
    for record in forget:
        if index not in record_subjects.get(record.id, ()):
            continue
        text = record.searchable_text()
        for name, pattern in patterns:
            seen = [m.group() for m in pattern.finditer(text)]
            if seen and all(word == word.lower() and word != name for word in seen):
                found.append(record.id)
                break
    return tuple(found)


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


_EMAIL = re.compile(r"[^\s@<>()\[\],;:\"']+@[^\s@<>()\[\],;:\"']+\.[^\s@<>()\[\],;:\"'.]+")
_DIGIT = re.compile(r"\d")
_PHONE = re.compile(f"(?:(?<![\\w+])|(?<=[{UNSPACED_RANGES}]))" r"\+?\(?\d[\d ().-]{5,}\d" + BOUNDARY_AFTER)
_PHONE_SPACED = re.compile(r"(?<![\w+])\+?\(?\d[\d ().-]{5,}\d(?!\w)")  # the same where no unspaced character is


def identifier_kinds(text: str) -> tuple[str, ...]:
    """The kinds of identifier a text visibly holds (`email`, `phone`), whoever's they are."""
    kinds = []
    if "@" in text and _EMAIL.search(text):
        kinds.append("email")
    phone = _PHONE if has_unspaced(text) else _PHONE_SPACED
    if any(len(_DIGIT.findall(m.group())) >= 7 for m in phone.finditer(text)):
        kinds.append("phone")
    return tuple(kinds)


def neighbour_key(record: Record) -> str | None:
    """What makes another record a neighbour of this one, or None when it cannot be told.

    QA: the question with the people taken out.  Free text and chats: the shape and the
    kinds of identifier it names (a record with an e-mail address is neighbour to other
    records with e-mail addresses); without one, only "the same shape" is left (tier 2).
    """
    if record.is_qa and record.question:
        return "qa|" + _question_shape(record.question)
    kinds = identifier_kinds(record.searchable_text())
    return f"{record.shape}|{','.join(kinds)}" if kinds else None


def _name_sharers(subjects: Sequence[Subject], pool: Sequence[Record]) -> list[Record]:
    """Pool records naming someone who shares a name part with a subject ("Dmitri Kaminski"
    beside the subject Dmitri Ueda): the people an erasure most easily damages."""
    parts = {w for s in subjects for n in (s.name, *s.aliases) for w in re.findall(r"[^\W\d_]{3,}", n)}
    if not parts:
        return []
    texts = [r.searchable_text() for r in pool]
    found = _names_in_ascii(parts, texts)
    rest = [i for i, hit in enumerate(found) if hit is None]
    if rest:
        keys = tuple(sorted(parts))
        for i in rest:
            found[i] = word_regex(keys, texts[i]).search(texts[i]) is not None
    return [r for r, hit in zip(pool, found, strict=True) if hit]


_ASCII_WORD = frozenset((string.ascii_letters + string.digits + "_").encode("ascii"))


def _names_in_ascii(parts: set[str], texts: Sequence[str]) -> list[bool | None]:
    r"""For each ASCII text, whether it holds one of `parts` as a whole word, case-insensitively,
    exactly as the pattern `(?<!\w)(?:part|...)(?!\w)` under IGNORECASE decides; None for a
    non-ASCII text (left to that pattern, which reads about 10 MB/s).

    In ASCII text a part matches where the lower-cased text holds the part's ASCII image
    (each character replaced by the lower-case ASCII letter `re` takes it to equal: "k" for
    the Kelvin sign, "s" for "ſ"; a part with a character equal to none cannot match ASCII
    at all) with no ASCII word character on either side.  Every occurrence of every part is
    looked at (overlapping matches), as the pattern's backtracking would."""
    import ahocorasick_rs

    found: list[bool | None] = [False if text.isascii() else None for text in texts]
    images = {image for part in parts if (image := _ascii_image(part))}
    plain = [i for i, text in enumerate(texts) if text.isascii()]
    if not images or not plain:
        return found
    joined = "\n".join(texts[i] for i in plain).lower().encode("ascii")
    ends = list(accumulate(len(texts[i]) + 1 for i in plain))
    automaton = ahocorasick_rs.BytesAhoCorasick(sorted(image.encode("ascii") for image in images))
    size = len(joined)
    for _, start, end in automaton.find_matches_as_indexes(joined, overlapping=True):
        if (start and joined[start - 1] in _ASCII_WORD) or (end < size and joined[end] in _ASCII_WORD):
            continue
        found[plain[bisect.bisect_right(ends, start)]] = True
    return found


def _ascii_image(part: str) -> str | None:
    image = []
    for char in part:
        if char.isascii():
            image.append(char.lower())
            continue
        same = [a for a in string.ascii_lowercase if re.fullmatch(re.escape(char), a, re.IGNORECASE)]
        if not same:
            return None
        image.append(same[0])
    return "".join(image)


def _choose_retain(forget: Sequence[Record], pool: Sequence[Record], *, per_forget: int,
                   subjects: Sequence[Subject] = ()) -> tuple[Record, ...]:
    """People sharing a name part with a subject, then neighbours (round robin over the
    forget records), then the forget records' shapes, then anything: each tier in the
    pool's (rank) order, up to `retain_wanted`."""
    want = retain_wanted(per_forget, len(forget))
    chosen: dict[str, Record] = {}
    for record in _name_sharers(subjects, pool)[: want // 4]:
        chosen[record.id] = record
    keys = [neighbour_key(record) for record in forget]
    # A record's key starts with its shape: only the shapes of the forget records' keys
    # can lead to a neighbour, so the (regex) keys of other pool records are never needed.
    shapes_wanted = {key.split("|", 1)[0] for key in keys if key is not None}
    pool_shapes = [record.shape for record in pool]
    by_key: dict[str, list[Record]] = {}
    for record, shape in zip(pool, pool_shapes, strict=True):
        key = neighbour_key(record) if shape in shapes_wanted else None
        if key is not None:
            by_key.setdefault(key, []).append(record)
    cursor = dict.fromkeys(by_key, 0)
    for _ in range(per_forget):
        for key in keys:
            if key is None or key not in by_key:
                continue
            candidates, at = by_key[key], cursor[key]
            while at < len(candidates) and candidates[at].id in chosen:
                at += 1
            if at < len(candidates):
                chosen[candidates[at].id] = candidates[at]
                at += 1
            cursor[key] = at
    shapes = {record.shape for record in forget}
    for tier in ([r for r, shape in zip(pool, pool_shapes, strict=True) if shape in shapes], pool):
        for record in tier:
            if len(chosen) >= want:
                break
            chosen.setdefault(record.id, record)
    return tuple(chosen.values())


# Retain records sampled per forget record.  Ten is what keeps everyone else's facts
# through an erasure: with one, retained accuracy on the demo model fell to 89 % of
# the base; with ten it stays at 97.5 % (docs/methods.md, "Measurements").
DEFAULT_RETAIN_PER_FORGET = 10


def build_sets(
    corpus: Corpus | CorpusSource | str | Path,
    subjects: Sequence[Subject],
    *,
    retain_per_forget: int = DEFAULT_RETAIN_PER_FORGET,
    seed: int = 0,
    exclude_ids: Iterable[str] = (),
    corpus_digest: str | None = None,
    index: Any = None,
) -> ErasureSets:
    """Forget, retain and probes for all `subjects` in one pass over `corpus`.

    `corpus` is a loaded `Corpus` (matched in memory) or a file, directory or
    `CorpusSource` (streamed by the fast scan, never loaded whole).  `exclude_ids`
    are tombstoned records: never in any set.  `corpus_digest` is what the manifest
    names (a loaded corpus's own manifest digest by default; the registered digest
    of the corpus version for a stream, where computing it would mean parsing it all).
    `index` (an opened `corpus.index.CorpusIndex` of this corpus) finds the same records
    by look-up instead of a pass over the corpus.
    """
    if not subjects:
        raise SetsError("no subjects given")
    if retain_per_forget < 0:
        raise SetsError("retain_per_forget must be >= 0")
    with _gc_paused():
        if isinstance(corpus, Corpus):
            return build_sets_reference(corpus, subjects, retain_per_forget=retain_per_forget, seed=seed,
                                        exclude_ids=exclude_ids, corpus_digest=corpus_digest)
        from unlearning.corpus.scan import scan_corpus

        scan = scan_corpus if index is None else index.scan
        found = scan(open_source(corpus), [s.patterns() for s in subjects], seed=seed,
                     pool_size=lambda forget: pool_size(retain_per_forget, forget),
                     exclude_ids=frozenset(exclude_ids))
        return assemble_sets(subjects, found.hits, found.group_members, found.pool,
                             retain_per_forget=retain_per_forget, seed=seed, corpus_digest=corpus_digest or "")


def build_sets_reference(
    corpus: Corpus, subjects: Sequence[Subject], *, retain_per_forget: int = DEFAULT_RETAIN_PER_FORGET,
    seed: int = 0, exclude_ids: Iterable[str] = (), corpus_digest: str | None = None,
) -> ErasureSets:
    """The straightforward implementation, kept as the reference the fast scan must equal:
    every record normalised and matched (`match_records`), groups by a look at every
    record, the pool by ranking every record."""
    drop = frozenset(exclude_ids)
    if drop:
        corpus = corpus.without(drop)
    positions = dict(zip((r.id for r in corpus.records), corpus.position_list(), strict=True))
    matched, _ = match_records(corpus.records, subjects)
    hits = [(positions[r.id], r, found) for r, found in matched]
    groups = {key for _, r, _ in hits if (key := group_key(r)) is not None}
    direct = {r.id for _, r, _ in hits}
    members = [(positions[r.id], r) for r in corpus.records
               if r.id not in direct and group_key(r) in groups]
    excluded = direct | {r.id for _, r in members}
    wanted = pool_size(retain_per_forget, len(hits) + len(members))
    pool = lowest_ranked(zip(corpus.position_list(), corpus.records, strict=True), wanted, seed=seed,
                         exclude_ids=excluded)
    return assemble_sets(subjects, hits, members, pool, retain_per_forget=retain_per_forget, seed=seed,
                         corpus_digest=corpus.manifest_digest if corpus_digest is None else corpus_digest)


def assemble_sets(
    subjects: Sequence[Subject], hits: Sequence[Hit], members: Sequence[tuple[int, Record]],
    pool: Sequence[PoolEntry], *, retain_per_forget: int, seed: int, corpus_digest: str,
) -> ErasureSets:
    """The sets from what a scan found: hits (records naming subjects), the other records
    of their groups, and the rank-ordered pool (forget records may still be in it)."""
    by_group: dict[GroupKey, set[int]] = {}
    for _, record, found in hits:
        key = group_key(record)
        if key is not None:
            by_group.setdefault(key, set()).update(found)
    direct = {record.id: found for _, record, found in hits}
    entries = sorted([(p, r) for p, r, _ in hits] + [(p, r) for p, r in members if r.id not in direct],
                     key=lambda pair: pair[0])
    counts, group_counts = [0] * len(subjects), [0] * len(subjects)
    record_subjects: dict[str, tuple[int, ...]] = {}
    for _, record in entries:
        own = direct.get(record.id, ())
        key = group_key(record)
        through_group = sorted(by_group.get(key, set()) - set(own)) if key is not None else []
        for index in own:
            counts[index] += 1
        for index in through_group:
            group_counts[index] += 1
        record_subjects[record.id] = (*own, *through_group)
    forget = tuple(record for _, record in entries)
    forget_ids = {record.id for record in forget}
    wanted = pool_size(retain_per_forget, len(forget))
    candidates = [record for _, _, record in pool if record.id not in forget_ids][:wanted]
    retain = _choose_retain(forget, candidates, per_forget=retain_per_forget, subjects=subjects)
    probes = build_probes(forget, subjects, record_subjects, answer_frequencies([*forget, *retain]))
    return ErasureSets(
        subjects=tuple(subjects), forget=forget, retain=retain, probes=tuple(probes), match_counts=tuple(counts), record_subjects=record_subjects,
        corpus_digest=corpus_digest,
        params={"retain_per_forget": retain_per_forget, "seed": seed, "rule": SET_RULE,
                "retain_pool": [RETAIN_POOL_FACTOR, RETAIN_POOL_MIN], "retain_minimum": RETAIN_MINIMUM},
        group_counts=tuple(group_counts),
        group_only=tuple(record.id for _, record in entries if record.id not in direct),
    )
