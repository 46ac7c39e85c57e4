"""Where a corpus's items come from: its shards, and one streaming reader per file format.

A corpus is one file or a directory.  Files: JSONL (`.jsonl`, `.ndjson`, plain, gzip
`.gz` or zstd `.zst`/`.zstd`), JSON arrays (`.json`: `[...]` or `{"records": [...]}`),
Parquet (`.parquet`), Arrow IPC (`.arrow`, stream or file format) and CSV or TSV (`.csv`,
`.tsv`: a header row naming the fields, every cell read as text, an empty cell absent).
A directory is a
Hugging Face `datasets` folder (`save_to_disk`: `state.json` names its arrow shards; a
`dataset_dict.json` names its splits) or a folder of shards of any of these, taken in
the sorted order of their relative paths.  Every reader streams: memory stays bounded
by one block (JSONL, JSON), one row group (Parquet) or one record batch (Arrow, CSV).

An *item* is one line, array element or row; its *position* is
`(shard number << 40) | index in the shard`, so a shard's positions are known without
reading the shards before it (shards can be read in parallel).  Blank JSONL lines have
positions but no item.  Unreadable files raise `CorpusError` naming the file, the line
or row, and the reason.
"""

from __future__ import annotations

import gzip
import json
import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from unlearning.corpus.records import CorpusError

SHARD_BITS = 40
BLOCK = 8 << 20

_JSONL_SUFFIXES = {".jsonl": None, ".ndjson": None, ".jsonl.gz": "gzip", ".ndjson.gz": "gzip",
                   ".jsonl.zst": "zstd", ".jsonl.zstd": "zstd", ".ndjson.zst": "zstd"}
_OTHER_SUFFIXES = {".json": "json", ".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".csv": "csv",
                   ".tsv": "tsv"}
COLUMNAR = ("parquet", "arrow", "csv", "tsv")  # read as pyarrow record batches (`columnar_batches`)
KNOWN = "jsonl, json, parquet, arrow, csv, tsv"


@dataclass(frozen=True)
class Shard:
    """One file of a corpus: its format, its compression and its number in the corpus."""

    path: Path
    name: str  # relative to the corpus root (the file name for a one-file corpus)
    format: str  # jsonl | json | parquet | arrow | csv | tsv
    compression: str | None
    number: int

    def position(self, index: int) -> int:
        return (self.number << SHARD_BITS) | index


def shard_format(path: Path) -> tuple[str, str | None] | None:
    """(format, compression) of a file by its name, or None when it is no corpus file."""
    name = path.name.lower()
    for suffix, compression in _JSONL_SUFFIXES.items():
        if name.endswith(suffix):
            return "jsonl", compression
    return (_OTHER_SUFFIXES[path.suffix.lower()], None) if path.suffix.lower() in _OTHER_SUFFIXES else None


def discover_shards(root: Path) -> tuple[tuple[Shard, ...], tuple[str, ...]]:
    """The shards of a corpus file or directory, and the files of a directory it ignored."""
    if root.is_file():
        fmt, compression = shard_format(root) or ("jsonl", None)  # the old rule: any name is JSONL
        return (Shard(root, root.name, fmt, compression, 0),), ()
    if not root.is_dir():
        raise CorpusError(root, "0", None, "file not found")
    files, ignored = _dataset_files(root)
    if files is None:
        files, ignored = [], []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            relative = path.relative_to(root).as_posix()
            if any(part.startswith(".") for part in Path(relative).parts):
                continue
            (files if shard_format(path) else ignored).append(path)
    shards = []
    for number, path in enumerate(files):
        found = shard_format(path)
        if found is None:
            raise CorpusError(path, "0", None, f"not a corpus file ({KNOWN})")
        shards.append(Shard(path, path.relative_to(root).as_posix(), found[0], found[1], number))
    if not shards:
        raise CorpusError(root, "0", None, f"no corpus files ({KNOWN}) in the directory")
    return tuple(shards), tuple(p.relative_to(root).as_posix() for p in ignored)


def _dataset_files(root: Path) -> tuple[list[Path] | None, list[Path]]:
    """The arrow files of a `datasets.save_to_disk` folder, in their order; None otherwise."""
    splits = root / "dataset_dict.json"
    if splits.is_file():
        data = _read_json(splits)
        names = data.get("splits") if isinstance(data, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CorpusError(splits, "1", "splits", "expected a list of split names")
        files: list[Path] = []
        for name in names:
            found, _ = _dataset_files(root / name)
            if found is None:
                raise CorpusError(root / name / "state.json", "0", None, "file not found")
            files += found
        return files, []
    state = root / "state.json"
    if not state.is_file():
        return None, []
    data = _read_json(state)
    entries = data.get("_data_files") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CorpusError(state, "1", "_data_files", "expected a list of {filename} objects")
    files = []
    for number, entry in enumerate(entries):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            raise CorpusError(state, "1", f"_data_files[{number}].filename", "expected a file name")
        if not (root / name).is_file():
            raise CorpusError(root / name, "0", None, "file not found (named by state.json)")
        files.append(root / name)
    return files, []


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorpusError(path, "1", None, f"not readable JSON ({exc})") from exc


# --------------------------------------------------------------------- JSON values


def parse_json(line: bytes, shard: Shard, where: str) -> Any:
    """One JSON value: orjson, and Python's own parser for what orjson refuses but JSON
    readers commonly accept (NaN, integers beyond 64 bits, lone surrogates)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CorpusError(shard.path, where, None, f"not UTF-8 text ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise CorpusError(shard.path, where, None, f"invalid JSON: {exc.msg}") from exc


# --------------------------------------------------------------------------- JSONL


def open_bytes(shard: Shard) -> IO[bytes]:
    """The shard's bytes, decompressed as they are read."""
    try:
        handle: IO[bytes] = shard.path.open("rb")
    except OSError as exc:
        raise CorpusError(shard.path, "0", None, f"cannot be opened ({exc.strerror})") from exc
    if shard.compression == "gzip":
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    if shard.compression == "zstd":
        import zstandard

        reader: IO[bytes] = zstandard.ZstdDecompressor().stream_reader(handle, closefd=True)
        return reader
    return handle


def _read(handle: IO[bytes], shard: Shard, size: int) -> bytes:
    try:
        return handle.read(size)
    except (OSError, EOFError, ValueError) as exc:  # gzip.BadGzipFile is an OSError
        kind = {"gzip": "gzip", "zstd": "zstd"}.get(shard.compression or "", "")
        raise CorpusError(shard.path, "0", None,
                          f"not a readable {kind + ' ' if kind else ''}file ({exc})") from exc
    except Exception as exc:  # zstandard.ZstdError derives from Exception only
        raise CorpusError(shard.path, "0", None, f"not a readable zstd file ({exc})") from exc


def jsonl_blocks(shard: Shard, *, block: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(index of the block's first line, bytes of whole lines) for a JSONL shard.

    Lines are numbered from 0; a block ends with a newline except perhaps the last.
    A UTF-8 byte-order mark at the start of the file is dropped.
    """
    for first, data, _ in jsonl_blocks_counted(shard, block=block):
        yield first, data


def jsonl_blocks_counted(shard: Shard, *, block: int | None = None) -> Iterator[tuple[int, bytes, int]]:
    """`jsonl_blocks` with the number of lines of each block (counted once, here)."""
    size = block or BLOCK
    with open_bytes(shard) as handle:
        rest = b""
        line = 0
        first = True
        while True:
            data = _read(handle, shard, max(size, 3) if first else size)  # the whole mark, if any
            if not data:
                break
            if first:
                data = data.removeprefix(b"\xef\xbb\xbf")
                first = False
            data = rest + data
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            whole, rest = data[:cut + 1], data[cut + 1:]
            count = whole.count(b"\n")
            yield line, whole, count
            line += count
        if rest:
            yield line, rest, 1


def jsonl_windows(shard: Shard, *, block: int | None = None) -> Iterator[tuple[Any, int, int]]:
    """(data, start, end): whole lines of a JSONL shard as `data[start:end]`, a window at a time.

    A plain file is memory-mapped one window (about `BLOCK` bytes, to the last newline in
    it) at a time: the scan reads the page cache in place, with no copy, and memory stays
    bounded by one window whatever the file's size.  A compressed file, or one that cannot
    be mapped (a pipe, a platform without `mmap` flags), is read block by block and each
    block is its own window.  The lines are those of `jsonl_blocks`, the byte-order mark
    dropped the same way; a line longer than a window widens that window.  A registered
    corpus is immutable (its digest is pinned); a file truncated while it is mapped would
    end the reading process with SIGBUS, and the broker redeliver its task (late acks).
    """
    size = block or BLOCK
    mapped = _mapped_windows(shard, size) if shard.compression is None and hasattr(mmap, "MAP_SHARED") else None
    if mapped is None:
        for _, data in jsonl_blocks(shard, block=block):
            yield data, 0, len(data)
        return
    yield from mapped


def _mapped_windows(shard: Shard, size: int) -> Iterator[tuple[Any, int, int]] | None:
    try:
        handle = shard.path.open("rb")
    except OSError as exc:
        raise CorpusError(shard.path, "0", None, f"cannot be opened ({exc.strerror})") from exc
    with handle:
        try:
            total = os.fstat(handle.fileno()).st_size
            head = mmap.mmap(handle.fileno(), min(total, 3), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) \
                if total else None
        except (OSError, ValueError):
            return None  # not a mappable file: read it instead
        start = 3 if head is not None and head[:3] == b"\xef\xbb\xbf" else 0
        if head is not None:
            head.close()
        return _windows(shard, os.dup(handle.fileno()), total, start, size)


def _windows(shard: Shard, fd: int, total: int, position: int, size: int) -> Iterator[tuple[Any, int, int]]:
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # fault the window in at once
    try:
        while position < total:
            base = position - position % mmap.ALLOCATIONGRANULARITY
            length = min(total - base, position - base + size)
            while True:
                try:
                    window = mmap.mmap(fd, length, offset=base, flags=flags, prot=mmap.PROT_READ)
                except (OSError, ValueError) as exc:
                    raise CorpusError(shard.path, "0", None, f"cannot be read ({exc})") from exc
                if base + length >= total:
                    end = total - base
                    break
                cut = window.rfind(b"\n", position - base)
                if cut >= 0:
                    end = cut + 1
                    break
                window.close()
                length = min(total - base, length * 2)  # one line longer than the window
            yield window, position - base, end
            position = base + end
    finally:
        os.close(fd)


def jsonl_items(shard: Shard) -> Iterator[tuple[int, str, Any]]:
    """(line index, where, value) of every non-blank line."""
    for first, data in jsonl_blocks(shard):
        for offset, raw in enumerate(data.split(b"\n")):
            if raw.strip():
                where = str(first + offset + 1)
                yield first + offset, where, parse_json(raw, shard, where)


def looks_like_array(shard: Shard) -> bool:
    """A JSONL-named file that holds one JSON array (the old reader's rule)."""
    with open_bytes(shard) as handle:
        head = _read(handle, shard, 4096).removeprefix(b"\xef\xbb\xbf").lstrip()
    return head.startswith(b"[")


# ---------------------------------------------------------------------- JSON arrays

_SPECIAL = re.compile(rb'["\[\]{},:]')


def json_array_items(shard: Shard) -> Iterator[tuple[int, str, Any]]:
    """(item index, where, value) of a top-level JSON array, or of the array under the
    top-level key "records", read one block at a time (constant memory)."""
    with open_bytes(shard) as handle:
        yield from _ArrayScanner(shard, handle).items()


class _ArrayScanner:
    """Splits a JSON document into the elements of its record array without parsing the rest."""

    def __init__(self, shard: Shard, handle: IO[bytes]) -> None:
        self.shard, self.handle = shard, handle
        self.buf = b""
        self.eof = False
        self.lines_before = 0  # newlines dropped with consumed parts of the buffer

    def _more(self) -> bool:
        if self.eof:
            return False
        data = _read(self.handle, self.shard, BLOCK)
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _line(self, at: int) -> int:
        return self.lines_before + self.buf.count(b"\n", 0, at) + 1

    def _fail(self, at: int, reason: str) -> CorpusError:
        return CorpusError(self.shard.path, str(self._line(at)), None, reason)

    def _drop(self, upto: int) -> None:
        self.lines_before += self.buf.count(b"\n", 0, upto)
        self.buf = self.buf[upto:]

    def _string_end(self, start: int) -> int:
        """Index just past the string that opens at `start` (a quote)."""
        at = start + 1
        while True:
            end = self.buf.find(b'"', at)
            while end < 0:
                if not self._more():
                    raise self._fail(start, "invalid JSON: unterminated string")
                end = self.buf.find(b'"', at)
            backslashes = 0
            while self.buf[end - 1 - backslashes] == 0x5C:
                backslashes += 1
            if backslashes % 2 == 0:
                return end + 1
            at = end + 1

    def _next_special(self, at: int) -> re.Match[bytes]:
        while True:
            found = _SPECIAL.search(self.buf, at)
            if found:
                return found
            if not self._more():
                raise self._fail(len(self.buf), "invalid JSON: the document ends too early")

    def items(self) -> Iterator[tuple[int, str, Any]]:
        while not self.buf.lstrip().removeprefix(b"\xef\xbb\xbf") and self._more():
            pass
        self.buf = self.buf.removeprefix(b"\xef\xbb\xbf")
        body = self.buf.lstrip()
        if body.startswith(b"["):
            yield from self._array(self.buf.index(b"[") + 1)
        elif body.startswith(b"{"):
            yield from self._array(self._records_key(self.buf.index(b"{") + 1))
        else:
            raise CorpusError(self.shard.path, "1", None, "expected a JSON array of records")

    def _records_key(self, at: int) -> int:
        """Position just after the `[` of the top-level "records" array."""
        depth = 1
        key: bytes | None = None
        while True:
            token = self._next_special(at)
            char, at = token.group(), token.end()
            if char == b'"':
                end = self._string_end(token.start())
                if depth == 1:
                    key = self.buf[token.start():end]
                at = end
            elif char == b":":
                if depth == 1 and key is not None and json.loads(key) == "records":
                    rest = self._skip_space(at)
                    if self.buf[rest:rest + 1] != b"[":
                        raise self._fail(rest, "field 'records': expected a JSON array of records")
                    return rest + 1
            elif char in (b"{", b"["):
                depth += 1
            elif char in (b"}", b"]"):
                depth -= 1
                if depth == 0:
                    raise CorpusError(self.shard.path, "1", None,
                                      "expected a JSON array of records (or an object with 'records')")

    def _skip_space(self, at: int) -> int:
        while True:
            while at < len(self.buf) and self.buf[at] in b" \t\r\n":
                at += 1
            if at < len(self.buf) or not self._more():
                return at

    def _array(self, at: int) -> Iterator[tuple[int, str, Any]]:
        self._drop(at)
        at, start, depth, index = 0, 0, 0, 0
        while True:
            token = self._next_special(at)
            char, at = token.group(), token.end()
            if char == b'"':
                at = self._string_end(token.start())
            elif char in (b"{", b"["):
                depth += 1
            elif char in (b"}", b"]") and depth > 0:
                depth -= 1
            elif char in (b",", b"]") and depth == 0:
                raw = self.buf[start:token.start()]
                if raw.strip():
                    where = f"item {index}"
                    try:
                        value = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        lead = len(raw) - len(raw.lstrip())
                        value = parse_json(raw, self.shard, str(self._line(start + lead)))
                    yield index, where, value
                    index += 1
                elif char == b"," or index:
                    raise self._fail(start, "invalid JSON: an empty array element")
                if char == b"]":
                    return
                self._drop(at)
                at = start = 0


# ------------------------------------------------------------------ Parquet, Arrow, CSV


def _drop_nulls(value: Any) -> Any:
    """Columnar formats cannot leave a field out: a null struct field counts as absent."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    return value


def _csv_batches(shard: Shard) -> Iterator[Any]:
    """The record batches of a CSV or TSV shard, streamed, every column read as text (a
    column inferred as numbers from its first block would fail on a later row), an empty
    cell null (absent, as in Parquet)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    parse = pcsv.ParseOptions(delimiter="\t" if shard.format == "tsv" else ",", newlines_in_values=True)
    names = pcsv.open_csv(shard.path, parse_options=parse).schema.names
    if len(set(names)) != len(names):
        raise CorpusError(shard.path, "1", None, "the header row names a field twice")
    convert = pcsv.ConvertOptions(column_types={name: pa.string() for name in names}, strings_can_be_null=True,
                                  null_values=[""], quoted_strings_can_be_null=False)
    yield from pcsv.open_csv(shard.path, parse_options=parse, convert_options=convert,
                             read_options=pcsv.ReadOptions(block_size=1 << 22))


def columnar_batches(shard: Shard) -> Iterator[Any]:
    """The pyarrow record batches of a Parquet, Arrow, CSV or TSV shard."""
    import pyarrow as pa

    try:
        if shard.format in ("csv", "tsv"):
            yield from _csv_batches(shard)
            return
        if shard.format == "parquet":
            import pyarrow.parquet as pq

            parquet = pq.ParquetFile(shard.path)
            yield from parquet.iter_batches(batch_size=8192)
            return
        source = pa.memory_map(str(shard.path))
        try:
            reader: Any = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(source)
            for number in range(reader.num_record_batches):
                yield reader.get_batch(number)
            return
        yield from reader
    except (pa.ArrowException, OSError) as exc:
        kind = {"parquet": "Parquet", "csv": "CSV", "tsv": "TSV"}.get(shard.format, "Arrow")
        # pyarrow's CSV errors quote the offending row: its text stays out of the message.
        reason = re.sub(r"(columns?, got \d+):.*", r"\1", str(exc).splitlines()[0] if str(exc) else "", flags=re.S)
        raise CorpusError(shard.path, "0", None, f"not a readable {kind} file ({reason})") from exc


def columnar_items(shard: Shard) -> Iterator[tuple[int, str, Any]]:
    """(row index, where, row as a dict) of a Parquet, Arrow, CSV or TSV shard."""
    index = 0
    for batch in columnar_batches(shard):
        for row in batch.to_pylist():
            yield index, f"row {index}", _drop_nulls(row)
            index += 1


def shard_items(shard: Shard) -> Iterator[tuple[int, str, Any]]:
    """(index in the shard, where, JSON value) of every item of one shard."""
    if shard.format == "jsonl":
        return json_array_items(shard) if looks_like_array(shard) else jsonl_items(shard)
    if shard.format == "json":
        return json_array_items(shard)
    return columnar_items(shard)
