"""An inverted index of a corpus: a request's forget set by look-up, not by a pass over every byte.

What it holds, per record (one non-blank JSONL line): where the record is (shard, line,
byte offset, length, ordinal), and the *keyed hashes* of the record's tokens, never a
token itself.  A token is a maximal run of characters for which `str.isalnum` holds, or
one character of a script written without spaces (`text.UNSPACED_RANGES`: Han, kana,
Hangul, Thai ...), in the record's normalised searchable text (`unlearning.text.normalise` of
`Record.searchable_text`, exactly what the reference matcher sees).  The hash is
BLAKE2b-64 keyed with a per-deployment, per-corpus secret (`workers.scan` derives it from
the service's blind-index key and the corpus digest), so the index is no plaintext store of
anyone's name: without the key a guessed name cannot be tested against it.

Why a look-up finds every record the full scan finds (the candidates are a superset):
the reference (`text_matching.MultiMatcher`) counts a key's hit only on word boundaries
(no alphanumeric character before a key that starts with one, none after a key that ends
with one, unless one of the two is of an unspaced script), so each token of a key lands on
a *whole* token of the normalised text: an unspaced character is a token wherever it
stands, and a run of other alphanumeric characters ends, in key and text alike, at the
key's own non-alphanumeric or unspaced characters or at the checked boundaries.  A record naming a subject therefore holds every run of the key as a token,
and the intersection of the runs' postings holds the record.  The candidates are then
re-read (by byte offset) and matched by the reference matcher, hit for hit as the scan
does, so the sets are the scan's by construction.  A key with no alphanumeric character
falls back to the scan.

Which tokens a record gets: a line that is ASCII with no backslash holds its strings
verbatim, so its tokens are the lower-cased line's `[a-z0-9]+` runs (a superset: field
names and other fields add tokens, never remove one); any other line is parsed and its
searchable text normalised.  Records of a forget group (`doc`/`source`/`thread`) are found
through one more posting per record, the hash of (field, value) as `parse_record` reads
it; a line that does not parse is a candidate of every look-up.

Tombstones: the index is of the corpus *file* (its content digest, the digest of the
corpus's first version); tombstoned record ids are dropped at look-up exactly where the
scan drops them, so a tombstone needs no rebuild.  The retain pool comes from the records
table (ranks of positions, `corpus.sampling`), the same records the scan samples.

Layout (one folder, 0700; files 0600): `manifest.json` (format, corpus digest, key id,
shard fingerprints, counts), `records.bin` (a fixed-width row per record), `positions.bin`
(each record's position, all the retain pool reads), `keys.bin`
(sorted uint64 hashes), `starts.bin` (uint64 offsets into `postings.bin`), `postings.bin`
(uint32 record numbers, sorted per key).  All read by memory map: a look-up touches the
pages it needs.  Built streaming: one 8 MB block at a time, postings spilled into hash
buckets on disk and each bucket sorted alone (memory: a bucket, sized to stay under
~300 MB).  JSONL shards are indexed (plain, gzip, zstd: a compressed shard is re-read by
streaming it); Parquet, Arrow and JSON-array shards are scanned at look-up as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unlearning.corpus.formats import (
    Shard,
    jsonl_blocks_counted,
    looks_like_array,
    open_bytes,
    parse_json,
)
from unlearning.corpus.records import (
    GROUP_FIELDS,
    CorpusError,
    Record,
    RecordMisfit,
    parse_record,
    searchable_text_of,
)
from unlearning.corpus.sampling import RANK_SPACE, ranks
from unlearning.corpus.scan import (
    CorpusScan,
    GroupKey,
    Hit,
    Pending,
    Prefilter,
    Sampled,
    _blank_lines,
    first_threshold,
    forget_groups,
    group_key,
    group_shard,
    resolve_pool,
    sample_shard,
    scan_shard,
)
from unlearning.corpus.source import CorpusSource, open_source
from unlearning.text import UNSPACED_RANGES, normalise
from unlearning.text_matching import SEPARATOR, MultiMatcher

log = logging.getLogger(__name__)

FORMAT = "corpus-index/2"  # 2: each character of an unspaced script is a token of its own
# An alphanumeric character of a script written without spaces (`text.UNSPACED_RANGES`), or
# a maximal run of the other str.isalnum characters (re's alnum is isalnum's).
TOKEN = re.compile(f"[{UNSPACED_RANGES}](?<=[^\\W_])|(?:(?![{UNSPACED_RANGES}])[^\\W_])+")
_RAW_TOKEN = re.compile(rb"[a-z0-9]+|\n")  # the runs of a lower-cased block, and its line ends
_COMPLEX = re.compile(rb"[\x80-\xff\\]")  # a line whose bytes are not its text verbatim
_GROUP_HINT = re.compile(b"|".join(re.escape(f'"{name}"'.encode()) for name in GROUP_FIELDS))
_ALWAYS = b"\x02always"  # the posting of lines that did not parse: candidates of every look-up
RECORD_DTYPE = np.dtype([("shard", "<u4"), ("length", "<u4"), ("line", "<u8"), ("offset", "<u8"),
                         ("ordinal", "<u8")])
POSTING_DTYPE = np.dtype([("key", "<u8"), ("record", "<u4")])
BUCKET_POSTINGS = 4_000_000  # postings per bucket the build aims for (12 bytes each, sorted in memory)
FLUSH_POSTINGS = 1_000_000  # postings held before they are spilled into the buckets (12 MB)
RANK_CHUNK = 1 << 22  # record positions ranked at a time for the retain pool (32 MB)
CACHE_TOKENS = 250_000  # tokens whose hashes a build keeps between blocks (in memory only; ids never repeat)


class IndexUnusable(RuntimeError):
    """An index that is missing, stale (another corpus, another key, changed files) or not ours."""


def key_id(key: bytes) -> str:
    """A public fingerprint of the index key (the keyring's own rule)."""
    return hashlib.sha256(b"key-id:" + key).hexdigest()[:16]


class _Hasher:
    """Keyed 64-bit hashes of tokens, cached per build (the cache is memory, never written)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("an index key needs at least 16 bytes")
        self.key = key[:64]
        self.cache: dict[bytes, int] = {}

    def one(self, token: bytes) -> int:
        found = self.cache.get(token)
        if found is None:
            found = int.from_bytes(hashlib.blake2b(token, key=self.key, digest_size=8).digest(), "little") or 1
            self.cache[token] = found
        return found

    def group(self, key: GroupKey) -> int:
        return self.one(b"\x01group\x00" + key[0].encode("utf-8") + b"\x00" + key[1].encode("utf-8", "surrogatepass"))


def text_tokens(text: str) -> set[bytes]:
    """The tokens of a record's searchable text (what the reference matcher normalises)."""
    return {t.encode("utf-8", "surrogatepass") for t in TOKEN.findall(normalise(text.replace(SEPARATOR, " ")))}


def key_tokens(key: str) -> list[bytes]:
    """The runs of a normalised matcher key (each one a whole token of any text it hits)."""
    return [t.encode("utf-8", "surrogatepass") for t in TOKEN.findall(key)]


def _record_group(value: Any) -> GroupKey | None:
    """(field, value) of a JSON value's group as `parse_record` reads it; None without one."""
    if not isinstance(value, dict):
        return None
    for name in GROUP_FIELDS:
        raw = value.get(name)
        if raw is None:
            continue
        if not isinstance(raw, str | int) or isinstance(raw, bool):
            return None  # the record is a misfit: no record, no group
        return name, str(raw)
    return None


def _lines_matching(pattern: re.Pattern[bytes], block: bytes, starts: np.ndarray) -> list[int]:
    """Indexes (in the block) of the lines where `pattern` occurs, one search per line."""
    found: list[int] = []
    at = 0
    while (hit := pattern.search(block, at)) is not None:
        line = int(np.searchsorted(starts, hit.start(), side="right")) - 1
        found.append(line)
        if line + 1 >= len(starts):
            break
        at = int(starts[line + 1])
    return found


def _fingerprint(shard: Shard) -> dict[str, Any]:
    stat = shard.path.stat()
    return {"name": shard.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "format": shard.format,
            "compression": shard.compression}


def indexable(shard: Shard) -> bool:
    return shard.format == "jsonl" and not looks_like_array(shard)


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _open_private(path: Path) -> Any:
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")


# ------------------------------------------------------------------------- build


@dataclass
class _Spill:
    """Postings spilled into hash buckets (files), each sorted alone at the end."""

    folder: Path
    bits: int
    held: list[np.ndarray]
    count: int = 0
    total: int = 0

    def add(self, keys: np.ndarray, records: np.ndarray) -> None:
        part = np.empty(len(keys), dtype=POSTING_DTYPE)
        part["key"], part["record"] = keys, records
        self.held.append(part)
        self.count += len(part)
        if self.count >= FLUSH_POSTINGS:
            self.flush()

    def flush(self) -> None:
        if not self.held:
            return
        joined = np.concatenate(self.held)
        self.held, self.count = [], 0
        self.total += len(joined)
        buckets = (joined["key"] >> np.uint64(64 - self.bits)).astype(np.int64) if self.bits else \
            np.zeros(len(joined), dtype=np.int64)
        order = np.argsort(buckets, kind="stable")
        joined, buckets = joined[order], buckets[order]
        edges = np.searchsorted(buckets, np.arange((1 << self.bits) + 1))
        for bucket in range(1 << self.bits):
            if edges[bucket] < edges[bucket + 1]:
                with open(self.folder / f"bucket-{bucket:04d}", "ab") as handle:  # noqa: PTH123
                    handle.write(joined[edges[bucket]:edges[bucket + 1]].tobytes())

    def finish(self, out: Path) -> tuple[int, int]:
        """Sort each bucket and write keys, starts and postings; (keys, postings)."""
        self.flush()
        n_keys = n_postings = 0
        with _open_private(out / "keys.bin") as keys_f, _open_private(out / "starts.bin") as starts_f, \
                _open_private(out / "postings.bin") as post_f:
            starts_f.write(np.zeros(1, dtype="<u8").tobytes())
            for bucket in range(1 << self.bits):
                path = self.folder / f"bucket-{bucket:04d}"
                if not path.exists():
                    continue
                part = np.fromfile(path, dtype=POSTING_DTYPE)
                path.unlink()
                # Records arrive in increasing order: a stable sort by key leaves them sorted per key.
                part = part[np.argsort(part["key"], kind="stable")]
                keep = np.ones(len(part), dtype=bool)
                keep[1:] = (part["key"][1:] != part["key"][:-1]) | (part["record"][1:] != part["record"][:-1])
                part = part[keep]
                firsts = np.flatnonzero(np.r_[True, part["key"][1:] != part["key"][:-1]])
                keys_f.write(part["key"][firsts].astype("<u8").tobytes())
                ends = np.r_[firsts[1:], len(part)].astype(np.uint64) + np.uint64(n_postings)
                starts_f.write(ends.astype("<u8").tobytes())
                post_f.write(part["record"].astype("<u4").tobytes())
                n_keys += len(firsts)
                n_postings += len(part)
        return n_keys, n_postings


def _bucket_bits(total_bytes: int) -> int:
    # About 12 postings per 100 bytes of English text: buckets of ~BUCKET_POSTINGS postings.
    wanted = max(1, total_bytes * 12 // 100 // BUCKET_POSTINGS)
    return min(10, max(0, (wanted - 1).bit_length()))


def build_index(corpus: str | Path | CorpusSource, directory: str | Path, *, key: bytes, corpus_digest: str,
                progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Build the index of a corpus into `directory` (created; replaced atomically when it
    exists) and return its manifest.  `corpus_digest` is what the index is valid for (the
    registered content digest); `key` keys the token hashes."""
    source = open_source(corpus)
    target = Path(directory)
    _private_dir(target.parent)
    work = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
    _private_dir(work)
    started = time.perf_counter()
    try:
        hasher = _Hasher(key)
        total_bytes = sum(s.path.stat().st_size * (4 if s.compression else 1) for s in source.shards)
        spill = _Spill(work, _bucket_bits(total_bytes), [])
        shards: list[dict[str, Any]] = []
        records = 0
        read = 0
        with _open_private(work / "records.bin") as table, _open_private(work / "positions.bin") as positions:
            for shard in source.shards:
                entry = _fingerprint(shard)
                entry["indexed"] = indexable(shard)
                if entry["indexed"]:
                    entry["bom"], entry["records"], entry["lines"], shard_bytes = _index_shard(
                        shard, hasher, spill, (table, positions), records)
                    records += entry["records"]
                    read += shard_bytes
                    if progress is not None:
                        progress(read)
                shards.append(entry)
        n_keys, n_postings = spill.finish(work)
        for path in work.iterdir():
            os.chmod(path, 0o600)
        manifest = {"format": FORMAT, "corpus_digest": corpus_digest, "key_id": key_id(key),
                    "root": str(source.root), "single": source.single, "shards": shards, "records": records,
                    "keys": n_keys, "postings": n_postings, "bytes_indexed": read,
                    "build_seconds": round(time.perf_counter() - started, 3),
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with _open_private(work / "manifest.json") as handle:
            handle.write(json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"))
        if target.exists():
            old = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.old"
            target.rename(old)
            work.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            work.rename(target)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _has_bom(shard: Shard) -> bool:
    with open_bytes(shard) as handle:
        return handle.read(3) == b"\xef\xbb\xbf"


def _index_shard(shard: Shard, hasher: _Hasher, spill: _Spill, tables: tuple[Any, Any], first_record: int
                 ) -> tuple[bool, int, int, int]:
    """Index one JSONL shard: (BOM, records, lines, bytes).

    Per block: the runs of the lower-cased block in one regex pass (line ends included, so
    each run's line is the count of line ends before it), their keyed hashes by look-up in
    the block's vocabulary; lines that are not ASCII without backslash are parsed and get
    the tokens of their normalised searchable text too (their raw runs are harmless extras);
    lines naming a group field are parsed for their group.
    """
    bom = _has_bom(shard)
    record = first_record
    offset = 0  # of the block, in the shard's (decompressed, BOM-less) bytes
    lines_seen = 0
    always = hasher.one(_ALWAYS)
    cache = hasher.cache
    for first, block, count in jsonl_blocks_counted(shard):
        if len(cache) > CACHE_TOKENS:
            cache.clear()
        ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
        starts = np.r_[0, ends + 1][:count].astype(np.int64)
        stops = np.r_[ends, len(block)][:count].astype(np.int64)
        blank = np.zeros(count, dtype=bool)
        blanks = _blank_lines(block, first)
        if blanks:
            blank[np.asarray(blanks, dtype=np.int64) - first] = True
        kept = np.flatnonzero(~blank)
        record_of_line = np.full(count + 1, -1, dtype=np.int64)
        record_of_line[kept] = np.arange(record, record + len(kept))
        rows = np.empty(len(kept), dtype=RECORD_DTYPE)
        rows["shard"] = shard.number
        rows["length"] = stops[kept] - starts[kept]
        rows["line"] = first + kept
        rows["offset"] = offset + starts[kept]
        rows["ordinal"] = record_of_line[kept] - first_record
        tables[0].write(rows.tobytes())
        tables[1].write((rows["line"] | np.uint64(shard.position(0))).astype("<u8").tobytes())

        tokens = _RAW_TOKEN.findall(block.lower())
        for token in set(tokens).difference(cache):
            hasher.one(token)
        cache[b"\n"] = 0  # a line end (no token hashes to 0: `_Hasher.one` maps 0 to 1)
        hashes = np.fromiter(map(cache.__getitem__, tokens), dtype=np.uint64, count=len(tokens))
        ends_mask = hashes == 0
        line_of = np.cumsum(ends_mask)[~ends_mask]
        keys = [hashes[~ends_mask]]
        owners = [record_of_line[line_of]]
        extra_keys: list[int] = []
        extra_owners: list[int] = []
        parse = set(_lines_matching(_COMPLEX, block, starts)) | set(_lines_matching(_GROUP_HINT, block, starts))
        for index in sorted(parse):
            number = int(record_of_line[index])
            if number < 0:
                continue
            raw = block[int(starts[index]):int(stops[index])]
            try:
                value = parse_json(raw, shard, str(first + index + 1))
            except CorpusError:
                extra_keys.append(always)
                extra_owners.append(number)
                continue
            if not (raw.isascii() and b"\\" not in raw):
                own = [hasher.one(t) for t in text_tokens(searchable_text_of(value))]
                extra_keys += own
                extra_owners += [number] * len(own)
            group = _record_group(value)
            if group is not None:
                extra_keys.append(hasher.group(group))
                extra_owners.append(number)
        if extra_keys:
            keys.append(np.array(extra_keys, dtype=np.uint64))
            owners.append(np.array(extra_owners, dtype=np.int64))
        all_keys, all_owners = np.concatenate(keys), np.concatenate(owners)
        if extra_keys:  # record order (the buckets' per-key sort relies on it): two sorted runs
            order = np.argsort(all_owners, kind="stable")
            all_keys, all_owners = all_keys[order], all_owners[order]
        spill.add(all_keys, all_owners.astype(np.uint32))
        record += len(kept)
        offset += len(block)
        lines_seen = first + count
    cache.pop(b"\n", None)
    if record >= 1 << 32:
        raise ValueError("an index holds at most 2**32 records")
    return bom, record - first_record, lines_seen, offset


# ------------------------------------------------------------------------ look-up


class CorpusIndex:
    """An opened index: postings by memory map, checked against the corpus and the key."""

    def __init__(self, directory: Path, manifest: dict[str, Any], key: bytes) -> None:
        self.directory = directory
        self.manifest = manifest
        self.hasher = _Hasher(key)
        self.records = self._map("records.bin", RECORD_DTYPE)
        self.positions = self._map("positions.bin", np.dtype("<u8"))  # the pool ranks these alone
        self.keys = self._map("keys.bin", np.dtype("<u8"))
        self.starts = self._map("starts.bin", np.dtype("<u8"))
        self.postings = self._map("postings.bin", np.dtype("<u4"))
        self.indexed = {s["name"] for s in manifest["shards"] if s["indexed"]}

    def _map(self, name: str, dtype: np.dtype) -> np.ndarray:
        path = self.directory / name
        if path.stat().st_size == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r")

    @classmethod
    def open(cls, directory: str | Path, source: str | Path | CorpusSource, *, key: bytes,
             corpus_digest: str | None) -> CorpusIndex:
        """The index in `directory` if it is of this corpus, this digest (None: whichever it
        names; the files' sizes and times are checked all the same) and this key;
        `IndexUnusable` (saying why) otherwise."""
        folder = Path(directory)
        try:
            manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise IndexUnusable(f"no index at {folder}") from None
        except (OSError, ValueError) as exc:
            raise IndexUnusable(f"unreadable index manifest ({exc})") from exc
        if manifest.get("format") != FORMAT:
            raise IndexUnusable(f"index format {manifest.get('format')!r}, not {FORMAT}")
        if corpus_digest is not None and manifest.get("corpus_digest") != corpus_digest:
            raise IndexUnusable("index of another corpus digest")
        if manifest.get("key_id") != key_id(key):
            raise IndexUnusable("index built with another key")
        corpus = open_source(source)
        now = [_fingerprint(shard) for shard in corpus.shards]
        then = [{k: s[k] for k in ("name", "size", "mtime_ns", "format", "compression")} for s in manifest["shards"]]
        if now != then:
            raise IndexUnusable("the corpus files changed since the index was built")
        try:
            return cls(folder, manifest, key)
        except (OSError, ValueError) as exc:
            raise IndexUnusable(f"unreadable index files ({exc})") from exc

    # -- postings

    def _posting(self, hashed: int) -> np.ndarray:
        at = int(np.searchsorted(self.keys, np.uint64(hashed)))
        if at >= len(self.keys) or int(self.keys[at]) != hashed:
            return np.zeros(0, dtype=np.uint32)
        return np.asarray(self.postings[int(self.starts[at]):int(self.starts[at + 1])])

    def _all_of(self, tokens: Sequence[bytes]) -> np.ndarray:
        """Records holding every one of `tokens` (sorted record numbers)."""
        spans = []
        for token in set(tokens):
            hashed = self.hasher.one(token)
            at = int(np.searchsorted(self.keys, np.uint64(hashed)))
            if at >= len(self.keys) or int(self.keys[at]) != hashed:
                return np.zeros(0, dtype=np.uint32)
            spans.append((int(self.starts[at + 1]) - int(self.starts[at]), int(self.starts[at])))
        spans.sort()
        found: np.ndarray | None = None
        for size, start in spans:
            posting = self.postings[start:start + size]
            if found is None:
                found = np.asarray(posting)
            elif len(found) * 32 < size:  # few candidates left: binary search the long list
                where = np.minimum(np.searchsorted(posting, found), size - 1)
                found = found[np.asarray(posting[where]) == found]
            else:
                found = np.intersect1d(found, np.asarray(posting), assume_unique=True)
            if not len(found):
                break
        return found if found is not None else np.zeros(0, dtype=np.uint32)

    def candidates(self, keys: Iterable[str]) -> np.ndarray | None:
        """Record numbers that may hold one of the normalised matcher `keys`; None when a
        key has no alphanumeric run (every record is then a candidate: scan instead)."""
        parts = [self._posting(self.hasher.one(_ALWAYS))]
        for key in keys:
            tokens = key_tokens(key)
            if not tokens:
                return None
            parts.append(self._all_of(tokens))
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.uint32)

    def group_candidates(self, groups: Iterable[GroupKey]) -> np.ndarray:
        parts = [self._posting(self.hasher.one(_ALWAYS))]
        parts += [self._posting(self.hasher.group(g)) for g in groups]
        return np.unique(np.concatenate(parts))

    # -- re-reading records

    def read(self, source: CorpusSource, numbers: np.ndarray) -> Iterator[tuple[Shard, int, Any, bytes]]:
        """(shard, record number, record row, raw line) of the given record numbers, in corpus order."""
        numbers = np.unique(numbers)
        rows = self.records[numbers] if len(numbers) else self.records[:0]
        for shard in source.shards:
            mask = rows["shard"] == shard.number
            mine, own = rows[mask], numbers[mask]
            if not len(mine):
                continue
            if shard.compression is None:
                bom = 3 if self.manifest["shards"][shard.number].get("bom") else 0
                fd = os.open(shard.path, os.O_RDONLY)
                try:
                    for number, row in zip(own.tolist(), mine, strict=True):
                        yield shard, number, row, os.pread(fd, int(row["length"]), int(row["offset"]) + bom)
                finally:
                    os.close(fd)
                continue
            wanted = mine["line"]
            at = 0
            for first, block, count in jsonl_blocks_counted(shard):
                if at >= len(wanted):
                    break
                if int(wanted[at]) >= first + count:
                    continue
                lines = block.split(b"\n")
                while at < len(wanted) and int(wanted[at]) < first + count:
                    yield shard, int(own[at]), mine[at], lines[int(wanted[at]) - first]
                    at += 1

    def scan(self, source: str | Path | CorpusSource, patterns_by_subject: Sequence[Iterable[str]], *, seed: int,
             pool_size: Callable[[int], int], exclude_ids: frozenset[str] = frozenset()) -> CorpusScan:
        """`scan.scan_corpus` by look-up: the same hits, group members and pool."""
        return index_scan(self, open_source(source), patterns_by_subject, seed=seed, pool_size=pool_size,
                          exclude_ids=exclude_ids)


def _default_id(source: CorpusSource, shard: Shard, ordinal: int) -> str:
    return source.default_id(shard, ordinal)


def _records_of(index: CorpusIndex, source: CorpusSource, numbers: np.ndarray
                ) -> Iterator[tuple[int, Shard, Any, Any]]:
    """(position, shard, row, JSON value or None) of candidate records."""
    for shard, _, row, raw in index.read(source, numbers):
        line = int(row["line"])
        yield shard.position(line), shard, row, parse_json(raw, shard, str(line + 1))


def _record(source: CorpusSource, shard: Shard, row: Any, value: Any) -> Record | None:
    line = int(row["line"])
    try:
        return parse_record(shard.path, str(line + 1), value, _default_id(source, shard, int(row["ordinal"])))
    except RecordMisfit:
        return None


def _index_hits(index: CorpusIndex, source: CorpusSource, matcher: MultiMatcher, numbers: np.ndarray,
                exclude_ids: frozenset[str]) -> list[Hit]:
    found = list(_records_of(index, source, numbers))
    subjects = matcher.scan([searchable_text_of(value) for _, _, _, value in found]) if found else {}
    hits: list[Hit] = []
    for i in sorted(subjects):
        position, shard, row, value = found[i]
        record = _record(source, shard, row, value)
        if record is not None and record.id not in exclude_ids:
            hits.append((position, record, tuple(sorted(subjects[i]))))
    return hits


def _index_pool(index: CorpusIndex, source: CorpusSource, *, seed: int, threshold: int) -> list[Sampled]:
    """The indexed records under a rank threshold, as `scan_shard` samples them (pending lines)."""
    if not threshold or not len(index.positions):
        return []
    numbers: list[np.ndarray] = []
    kept: list[np.ndarray] = []
    for start in range(0, len(index.positions), RANK_CHUNK):  # memory: one chunk, whatever the corpus
        keys = ranks(np.asarray(index.positions[start:start + RANK_CHUNK]), seed)
        chosen = np.arange(len(keys)) if threshold >= RANK_SPACE else np.flatnonzero(keys < np.uint64(threshold))
        numbers.append(chosen + start)
        kept.append(keys[chosen])
    rank_of = dict(zip(np.concatenate(numbers).tolist(), np.concatenate(kept).tolist(), strict=True))
    out: list[Sampled] = []
    for shard, number, row, raw in index.read(source, np.concatenate(numbers)):
        line = int(row["line"])
        prefix = "" if source.single else f"{shard.name}:"
        out.append((rank_of[number], shard.position(line),
                    Pending(str(shard.path), str(line + 1), raw, prefix, int(row["ordinal"]))))
    return out


def index_scan(index: CorpusIndex, source: CorpusSource, patterns_by_subject: Sequence[Iterable[str]], *,
               seed: int, pool_size: Callable[[int], int],
               exclude_ids: frozenset[str] = frozenset()) -> CorpusScan:
    """What `scan.scan_corpus` finds, from the index for its indexed shards (and by the scan
    for the shards it does not index, or for keys it cannot look up)."""
    from unlearning.corpus.scan import merge_hits, scan_corpus

    matcher = MultiMatcher(patterns_by_subject)
    numbers = index.candidates(matcher.keys) if not matcher.empty else np.zeros(0, dtype=np.uint32)
    if numbers is None:
        log.warning("index: a key has no letter or digit; falling back to the scan")
        found = scan_corpus(source, patterns_by_subject, seed=seed, pool_size=pool_size, exclude_ids=exclude_ids)
        found.method = "scan (a key the index cannot look up)"
        return found
    others = [shard for shard in source.shards if shard.name not in index.indexed]
    threshold = first_threshold(source, len(patterns_by_subject), pool_size)
    prefilter = Prefilter(matcher.keys, phrases=True) if others else None
    parts = [scan_shard(source, shard, matcher, seed=seed, threshold=threshold, exclude_ids=exclude_ids,
                        prefilter=prefilter) for shard in others]
    hits = sorted(_index_hits(index, source, matcher, numbers, exclude_ids) + merge_hits(parts),
                  key=lambda hit: hit[0])
    groups = forget_groups(hits)
    direct = {record.id for _, record, _ in hits}
    members: list[tuple[int, Record]] = []
    if groups:
        for position, shard, row, value in _records_of(index, source, index.group_candidates(groups)):
            record = _record(source, shard, row, value)
            if record is not None and record.id not in exclude_ids and record.id not in direct \
                    and group_key(record) in groups:
                members.append((position, record))
        members += [m for shard in others for m in group_shard(source, shard, groups, exclude_ids=exclude_ids)
                    if m[1].id not in direct]
        members.sort(key=lambda m: m[0])
    excluded = direct | {record.id for _, record in members}
    wanted = pool_size(len(excluded))

    def sample(threshold: int, parts: list[Any] | None) -> list[Sampled]:
        own = _index_pool(index, source, seed=seed, threshold=threshold)
        if parts is None:
            parts = [sample_shard(source, shard, seed=seed, threshold=threshold, exclude_ids=exclude_ids)
                     for shard in others]
            return own + [entry for part in parts for entry in part]
        return own + [entry for part in parts for entry in part.pool]

    pool = resolve_pool(sample(threshold, parts), wanted, excluded | exclude_ids)
    while len(pool) < wanted and threshold < RANK_SPACE:
        threshold = min(RANK_SPACE, threshold * 4)
        pool = resolve_pool(sample(threshold, None), wanted, excluded | exclude_ids)
    method = "index" if not others else f"index ({len(others)} shard(s) not indexed, scanned)"
    return CorpusScan(hits, members, pool, method=method)
