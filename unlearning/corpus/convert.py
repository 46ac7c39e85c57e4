"""A corpus under other field names, rewritten as the engine's own records.

Datasets name their fields as they like: `content` or `body` for free text, `query`/`reply`
for a question and its answer, `doc_id` for an id.  (Alpaca, Dolly and ShareGPT records and
chat turns of OpenAI content parts need no map: `records` reads them as they are, and
converting them writes their native form.)  `FieldMap` says which of the engine's fields
(`records.KNOWN_FIELDS`) each one is (`--field text=content`), and `convert_corpus`
streams any supported corpus through it into one canonical JSONL file (plain, gzip or
zstd): every record as `Record.to_json` writes it, ids included (an item without an id
keeps the one the engine would have given it in the source), so the output's manifest
digest is the one the source's records have under the engine's names, and every later
step (registration, the scan, the index, training, verification) reads a corpus it knows.

An item that fits no shape after the renaming is counted and named in the report (by
place and id, never by text), not written; a corpus with no record, or with an id used
twice, is refused and nothing is left behind (the output is written under a temporary
name and renamed when complete).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from unlearning.corpus.records import KNOWN_FIELDS, CorpusError, record_digest_bytes
from unlearning.corpus.source import (
    LoadReport,
    finish_digest,
    iter_positioned,
    no_records,
    open_source,
)

OUTPUT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")


class FieldMapError(ValueError):
    """A field map that cannot be used; the message names the entry."""


@dataclass(frozen=True)
class FieldMap:
    """The engine's field each source field is: `(engine field, source field)` pairs.

    Applied to each JSON object before it is read as a record: a mapped source field's
    value moves to its engine field (replacing a field of that name the object may also
    hold: the map says where that field's value comes from), and the source field is
    dropped.  Built from the original object, so two fields can swap names."""

    pairs: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, entries: Iterable[str]) -> FieldMap:
        """From `ENGINE=SOURCE` strings; `FieldMapError` names the first bad one."""
        pairs: list[tuple[str, str]] = []
        for entry in entries:
            engine, sep, source = (part.strip() for part in entry.partition("="))
            if not sep or not engine or not source:
                raise FieldMapError(f"{entry!r}: expected ENGINE_FIELD=SOURCE_FIELD, e.g. text=content")
            if engine not in KNOWN_FIELDS:
                raise FieldMapError(f"{entry!r}: {engine!r} is not a record field "
                                    f"(one of: {', '.join(sorted(KNOWN_FIELDS))})")
            if any(engine == e for e, _ in pairs):
                raise FieldMapError(f"{entry!r}: {engine!r} is mapped twice")
            if any(source == s for _, s in pairs):
                raise FieldMapError(f"{entry!r}: source field {source!r} is mapped twice")
            if engine == source:
                raise FieldMapError(f"{entry!r}: a field mapped to itself")
            pairs.append((engine, source))
        return cls(tuple(pairs))

    def apply(self, value: Any) -> Any:
        if not self.pairs or not isinstance(value, dict):
            return value
        out = {k: v for k, v in value.items() if not any(k in pair for pair in self.pairs)}
        for engine, source in self.pairs:
            if source in value:
                out[engine] = value[source]
        return out

    def to_json(self) -> dict[str, str]:
        return dict(self.pairs)


@dataclass(frozen=True)
class Converted:
    """What `convert_corpus` wrote: where, how many records, their digest, what it skipped."""

    path: Path
    records: int
    manifest_digest: str
    report: LoadReport

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "records": self.records, "manifest_digest": self.manifest_digest,
                "report": self.report.to_json()}


def _writer(path: Path, name: str) -> IO[bytes]:
    """`path` opened for writing in the compression `name` (the final file's) asks for."""
    if name.endswith(".jsonl.zst"):
        import zstandard

        raw = path.open("wb")
        return zstandard.ZstdCompressor(level=10).stream_writer(raw, closefd=True)
    if name.endswith(".jsonl.gz"):
        return gzip.open(path, "wb", compresslevel=6)  # type: ignore[return-value]
    return path.open("wb")


def convert_corpus(source: str | Path, out: str | Path, *, fields: FieldMap | None = None,
                   progress: Callable[[int], None] | None = None) -> Converted:
    """Stream `source` (any supported corpus) through `fields` into the JSONL file `out`.

    `out` must not exist and must end in one of `OUTPUT_SUFFIXES`; `progress` is called with
    the number of records written so far, every 10,000.  Raises `CorpusError` for an
    unreadable source, a corpus without records or an id used twice (nothing written)."""
    import orjson

    target = Path(out)
    if not target.name.endswith(OUTPUT_SUFFIXES):
        raise ValueError(f"{target}: the output must end in {', '.join(OUTPUT_SUFFIXES)}")
    if target.exists():
        raise FileExistsError(f"{target}: exists")
    opened = open_source(source)
    report = LoadReport()
    leaves = bytearray()
    id_hashes: list[int] = []
    partial = target.with_name(f".{target.name}.partial")
    mapping: Mapping[str, str] | None = None if fields is None else dict(fields.pairs)
    try:
        with _writer(partial, target.name) as handle:
            for _, record in iter_positioned(opened, report=report, check_duplicates=False,
                                             transform=None if fields is None else fields.apply):
                handle.write(_line(record.to_json(), orjson) + b"\n")
                leaves += record_digest_bytes(record)
                id_hashes.append(int.from_bytes(hashlib.blake2b(record.id.encode("utf-8"), digest_size=8).digest()))
                if progress is not None and len(id_hashes) % 10_000 == 0:
                    progress(len(id_hashes))
        if not id_hashes:
            raise CorpusError(opened.root, "0", None, no_records(report) + _hint(mapping))
        digest = finish_digest(leaves, id_hashes, lambda: iter_positioned(
            opened, check_duplicates=True, transform=None if fields is None else fields.apply))
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return Converted(target, len(id_hashes), digest, report)


def _line(data: dict[str, Any], orjson: Any) -> bytes:
    try:
        return bytes(orjson.dumps(data, option=orjson.OPT_SORT_KEYS))
    except TypeError:  # an integer beyond 64 bits in some record's `meta`
        return json.dumps(data, ensure_ascii=False, sort_keys=True).encode("utf-8")


def _hint(mapping: Mapping[str, str] | None) -> str:
    if mapping:
        return f" under the field map {', '.join(f'{k}={v}' for k, v in mapping.items())}"
    return ""


def convert_hint(message: str) -> str:
    """What to add to the message of a corpus none of whose items is a record (`no_records`):
    how to read one whose fields have other names; "" for any other error."""
    if "fit no record shape" not in message:
        return ""
    return " (records under other field names: rewrite them first with " \
           "`python -m unlearning convert --field text=FIELD ...`)"
