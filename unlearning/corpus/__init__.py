"""Training corpora as users bring them: records of three shapes in any of the usual formats.

A record has one of three shapes: free text (`text`), a question/answer pair
(`question` + `answer`, or the synonyms `prompt` + `response` or `completion`), or a chat
(`messages`: a list of `{"role", "content"}` turns; the assistant turns are what a
model learns; a turn's `content` may be a list of OpenAI text parts); optional `id`, a
grouping field (`doc`, `source` or `thread`), the TOFU extras and `meta` (`records`).
Alpaca (`instruction`/`input`/`output`), Dolly (`instruction`/`context`/`response`) and
ShareGPT (`conversations`) records are read as question/answer and chat records.  A corpus
is a file or a directory of shards: JSONL
(plain, gzip, zstd), JSON arrays, Parquet, Arrow, CSV/TSV, a Hugging Face `datasets` folder
(`formats`), read as a stream of positioned records with a load report (`source`); one
whose fields have other names is rewritten under the engine's (`convert`).

Digests: `record_digest` hashes a record's canonical JSON; `merkle_root` pins a set
of records; a corpus's `manifest_digest` is the Merkle root of all its records, so it
depends on content, not on file layout or format.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from unlearning.corpus.formats import Shard
from unlearning.corpus.records import (
    GROUP_FIELDS,
    KNOWN_FIELDS,
    OPTIONAL_TEXT_FIELDS,
    SHAPES,
    CorpusError,
    Message,
    Record,
    RecordMisfit,
    merkle_root,
    merkle_root_of_leaves,
    parse_record,
    record_digest,
    record_digest_bytes,
    record_from_json,
)
from unlearning.corpus.source import (
    Corpus,
    CorpusInfo,
    CorpusSource,
    LoadReport,
    Skipped,
    inspect_corpus,
    iter_positioned,
    iter_records,
    load_corpus,
    open_source,
)

__all__ = [
    "GROUP_FIELDS", "KNOWN_FIELDS", "OPTIONAL_TEXT_FIELDS", "SHAPES", "Corpus", "CorpusError",
    "CorpusInfo", "CorpusSource", "LoadReport", "Message", "Record", "RecordMisfit", "Shard", "Skipped",
    "inspect_corpus", "iter_positioned", "iter_records", "load_corpus", "merkle_root",
    "merkle_root_of_leaves", "open_source", "parse_record", "record_digest", "record_digest_bytes",
    "record_from_json", "write_jsonl",
]


def write_jsonl(records: Sequence[Record] | Iterable[Record], path: str | Path) -> Path:
    """Write records as JSONL (one canonical object a line)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record.to_json(), ensure_ascii=False, sort_keys=True) + "\n")
    return out
