"""A corpus as the engine reads it: records with their positions, a load report, a digest.

`open_source(path)` resolves a file or directory into shards (`formats`); `iter_positioned`
streams `(position, Record)` pairs; `load_corpus` keeps them in memory; `inspect_corpus`
streams a whole corpus once for its registration (manifest digest, counts, load report,
duplicate ids) holding only 40 bytes per record.

A value that fits no record shape is skipped, counted and named in the `LoadReport`
(by shard and line, row or item, and its id when it has one); a file that cannot be read
at all raises `CorpusError`, as does an id used twice (naming both places).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from unlearning.corpus.formats import Shard, discover_shards, shard_items
from unlearning.corpus.records import (
    CorpusError,
    Record,
    RecordMisfit,
    merkle_root,
    merkle_root_of_leaves,
    parse_record,
    record_digest,
    record_digest_bytes,
)

logger = logging.getLogger(__name__)

NAMED_SKIPS = 1000  # skipped items named one by one in a report; the rest are counted


@dataclass(frozen=True)
class CorpusSource:
    """A corpus file or directory resolved into its shards (nothing is read yet)."""

    root: Path
    shards: tuple[Shard, ...]
    ignored: tuple[str, ...] = ()  # files of a shard directory that are no corpus files
    single: bool = True  # one file (not a directory of shards)

    def default_id(self, shard: Shard, index: int) -> str:
        """The id of a record that has none: as before for one file, prefixed by the shard."""
        own = f"rec-{index:07d}"
        return own if self.single else f"{shard.name}:{own}"

    def place(self, shard: Shard, where: str) -> str:
        return f"{shard.path}:{where}" if self.single else f"{self.root}/{shard.name}:{where}"


def open_source(path: str | Path | CorpusSource) -> CorpusSource:
    if isinstance(path, CorpusSource):
        return path
    root = Path(path)
    shards, ignored = discover_shards(root)
    return CorpusSource(root, shards, ignored, root.is_file())


@dataclass(frozen=True)
class Skipped:
    """An item that is no record: where it is and why (no text of it: it may be personal)."""

    shard: str
    where: str
    record_id: str | None
    field: str | None
    reason: str

    def line(self) -> str:
        named = f" (id {self.record_id!r})" if self.record_id is not None else ""
        at = f": field '{self.field}'" if self.field else ""
        return f"{self.shard}:{self.where}{named}{at}: {self.reason}"


@dataclass
class LoadReport:
    """What reading a corpus found: records per shard and the items that fit no shape."""

    shards: dict[str, int] = field(default_factory=dict)  # shard name -> records
    skipped: list[Skipped] = field(default_factory=list)  # the first NAMED_SKIPS, named
    skipped_count: int = 0
    ignored_files: tuple[str, ...] = ()

    @property
    def records(self) -> int:
        return sum(self.shards.values())

    def skip(self, shard: Shard, where: str, value: Any, misfit: RecordMisfit) -> None:
        self.skipped_count += 1
        if len(self.skipped) < NAMED_SKIPS:
            raw_id = value.get("id") if isinstance(value, dict) else None
            record_id = str(raw_id) if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else None
            self.skipped.append(Skipped(shard.name, where, record_id, misfit.field, misfit.reason))

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "shards": dict(self.shards),
                "skipped": self.skipped_count, "skipped_named": [s.line() for s in self.skipped],
                "ignored_files": list(self.ignored_files)}


@dataclass(frozen=True)
class Corpus:
    """The records of one corpus, in corpus order, with their positions in it."""

    records: tuple[Record, ...]
    path: Path | None = None
    positions: tuple[int, ...] = ()  # position of each record (formats.Shard.position)
    report: LoadReport | None = field(default=None, compare=False)

    @cached_property
    def manifest_digest(self) -> str:
        return merkle_root(record_digest(r) for r in self.records)

    @cached_property
    def by_id(self) -> dict[str, Record]:
        return {r.id: r for r in self.records}

    def position_list(self) -> Sequence[int]:
        """Each record's position; records built in memory are numbered 0, 1, 2 ..."""
        return self.positions if self.positions else range(len(self.records))

    def __len__(self) -> int:
        return len(self.records)

    def without(self, record_ids: Iterable[str]) -> Corpus:
        """The corpus minus some records (a tombstoned version, or a retrain-without baseline)."""
        drop = set(record_ids)
        kept = [(p, r) for p, r in zip(self.position_list(), self.records, strict=True) if r.id not in drop]
        return Corpus(tuple(r for _, r in kept), self.path, tuple(p for p, _ in kept), self.report)


def iter_positioned(
    source: str | Path | CorpusSource, *, strict: bool = False, report: LoadReport | None = None,
    check_duplicates: bool = True, transform: Callable[[Any], Any] | None = None,
) -> Iterator[tuple[int, Record]]:
    """(position, record) of every record of every shard, in corpus order.

    `strict` raises on the first item that fits no shape (engine-written files such as
    saved sets); otherwise it is skipped and named in `report`.  `transform` is applied to
    each item before it is read as a record (`convert.FieldMap.apply`).
    """
    corpus = open_source(source)
    if report is not None:
        report.ignored_files = corpus.ignored
    seen: dict[str, str] = {}
    for shard in corpus.shards:
        count = 0
        for ordinal, (index, where, value) in enumerate(shard_items(shard)):
            if transform is not None:
                value = transform(value)
            try:
                record = parse_record(shard.path, where, value, corpus.default_id(shard, ordinal))
            except RecordMisfit as misfit:
                if strict or report is None:
                    if strict:
                        raise
                    logger.warning("%s: skipped an item that fits no record shape", shard.name)
                else:
                    report.skip(shard, where, value, misfit)
                continue
            if check_duplicates:
                place = corpus.place(shard, where)
                first = seen.setdefault(record.id, place)
                if first != place:
                    raise CorpusError(shard.path, where, "id",
                                      f"duplicate id {record.id!r} (first at {first})")
            count += 1
            yield shard.position(index), record
        if report is not None:
            report.shards[shard.name] = count


def iter_records(path: str | Path | CorpusSource, *, strict: bool = False,
                 report: LoadReport | None = None) -> Iterator[Record]:
    """Stream the records of a corpus file or directory (any supported format)."""
    for _, record in iter_positioned(path, strict=strict, report=report):
        yield record


def no_records(report: LoadReport) -> str:
    """Why a corpus has no records, with the first item that fit no shape (where and which
    field, never its text)."""
    if not report.skipped_count:
        return "the corpus has no records"
    first = f"; the first: {report.skipped[0].line()}" if report.skipped else ""
    return f"the corpus has no records ({report.skipped_count} items fit no record shape{first})"


def load_corpus(path: str | Path | CorpusSource, *, strict: bool = False) -> Corpus:
    """Read a whole corpus into memory; its `report` names the items that fit no shape."""
    source = open_source(path)
    report = LoadReport()
    pairs = list(iter_positioned(source, strict=strict, report=report))
    if not pairs:
        raise CorpusError(source.root, "0", None, no_records(report))
    if report.skipped_count:
        logger.warning("%s: %s items fit no record shape and were skipped", source.root, report.skipped_count)
    return Corpus(tuple(r for _, r in pairs), source.root, tuple(p for p, _ in pairs), report)


def finish_digest(leaves: bytes | bytearray, id_hashes: Sequence[int],
                  recheck: Callable[[], Iterable[Any]]) -> str:
    """The manifest digest of records whose 32-byte digests are `leaves` (in any order),
    after checking their ids' 8-byte hashes for a repeat: where two agree, `recheck` (a
    second pass that checks ids one by one) raises the `CorpusError` naming the duplicate,
    or finds that two ids only share a hash."""
    import numpy as np

    ordered = np.sort(np.array(id_hashes, dtype=np.uint64))
    if bool(np.any(ordered[1:] == ordered[:-1])):
        for _ in recheck():
            pass
    sorted_leaves = np.sort(np.frombuffer(bytes(leaves), dtype="S32"))
    return merkle_root_of_leaves([bytes(leaf).ljust(32, b"\x00") for leaf in sorted_leaves])


@dataclass(frozen=True)
class CorpusInfo:
    """What registration stores about a corpus: digest, counts, formats and the load report."""

    path: Path
    manifest_digest: str
    records: int
    formats: tuple[str, ...]
    report: LoadReport
    shapes: dict[str, int] = field(default_factory=dict)  # records per shape (`Record.shape`)

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "manifest_digest": self.manifest_digest, "records": self.records,
                "formats": list(self.formats), "shapes": dict(self.shapes), "report": self.report.to_json()}


def inspect_corpus(path: str | Path | CorpusSource, *, transform: Callable[[Any], Any] | None = None) -> CorpusInfo:
    """Read a corpus once, streaming: its manifest digest (the same as `load_corpus(...)
    .manifest_digest`), record count and load report; raises `CorpusError` for an
    unreadable file, a corpus without records or an id used twice (naming both places).

    Memory: 32 bytes of digest and 8 bytes of id hash per record, not the records.
    `transform` is applied to each item first (`convert.FieldMap.apply`: what a conversion
    would give, without writing it).
    """
    source = open_source(path)
    report = LoadReport()
    leaves = bytearray()
    id_hashes: list[int] = []
    shapes: dict[str, int] = {}
    for _, record in iter_positioned(source, report=report, check_duplicates=False, transform=transform):
        leaves += record_digest_bytes(record)
        id_hashes.append(int.from_bytes(hashlib.blake2b(record.id.encode("utf-8"), digest_size=8).digest()))
        shapes[record.shape] = shapes.get(record.shape, 0) + 1
    if not id_hashes:
        raise CorpusError(source.root, "0", None, no_records(report))
    digest = finish_digest(leaves, id_hashes,
                           lambda: iter_positioned(source, check_duplicates=True, transform=transform))
    formats = tuple(sorted({s.format + (f"+{s.compression}" if s.compression else "") for s in source.shards}))
    return CorpusInfo(source.root, digest, report.records, formats, report, dict(sorted(shapes.items())))
