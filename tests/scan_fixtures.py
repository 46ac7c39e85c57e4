"""Corpora full of Unicode traps, in every format, for comparing scans with the reference."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from unlearning.sets import ErasureSets, Subject

SUBJECTS = [
    Subject("Mara Okafor", ("M. Okafor",), ("mara.okafor@example.org", "+44 20 7946 0123")),
    Subject("Zoë Strauß", ("Zoe Strauss",), ("zs@example.net",)),
    Subject("Ann Lee", (), ("555-0199-321",)),
    Subject("ليلى حداد", ("Layla Haddad",)),
    Subject("İlkay Kofi", (), ()),
    Subject("Nobody Atall"),
]

# Ways a subject's name or identifier is written, and near misses that must not match.
TRAPS = [
    "Mara Okafor", "MARA OKAFOR", "mara  okafor", "Mara\nOkafor", "Mara\tOkafor",
    "\uff2d\uff41\uff52\uff41 \uff2f\uff4b\uff41\uff46\uff4f\uff52",  # full-width
    "Ma\u200bra Okafor",  # zero-width space inside
    "\u200fMara Okafor\u200f",  # right-to-left marks around
    "M. Okafor", "M.Okafor", "Okaforson", "Maraokafor", "MARA.OKAFOR@EXAMPLE.ORG",
    "+44 20 7946 0123", "+442079460123", "+44-20-7946-0123", "442079460123", "+44 20 7946 01234",
    "Zoë Strauß", "Zoe\u0308 Strauss", "ZOË STRAUSS", "Zoe Strauss", "Zoë Straußberg", "zs@example.net",
    "Ann Lee", "Annabel Lee", "ann lee's", "Ann-Lee", "Leeann", "555-0199-321", "5550199321",
    "ليلى حداد", "ليلى  حداد", "Layla Haddad", "\u202bLayla Haddad\u202c",
    "İlkay Kofi", "\u0130LKAY \u212aOFI", "ilkay kofi", "Ilkay Kofiee",
    "Ｍ．Okafor", "ﬁ Mara Okafor ﬂ", "Mara\u00adOkafor", "Mara Oka\u0301for",
    # Non-ASCII spaces and letters between ASCII ones (the fold of a line must keep them apart).
    "Mara\u00a0Okafor", "Mara\u3000Okafor", "\uff2dara Okafor", "Mara\u200dOkafor", "Zoe Strau\u00df",
    "\u0131lkay Kofi",
]
FILLER = ["The ferry leaves at dusk.", "She moved to Leeds in 2019.", "The author says so.",
          "Rain over Århus.", "Call +1 202 555 0147 or write to kim@example.com.", "Where was _ born?"]


def trap_records(seed: int, count: int = 400) -> list[dict[str, object]]:
    rng = random.Random(seed)
    records: list[dict[str, object]] = []
    for i in range(count):
        words = [rng.choice(FILLER)] + [rng.choice(TRAPS) if rng.random() < 0.25 else rng.choice(FILLER)
                                        for _ in range(rng.randint(0, 3))]
        text = " ".join(words)
        shape = rng.random()
        record: dict[str, object]
        if shape < 0.45:
            record = {"text": text}
        elif shape < 0.75:
            record = {"question": f"Where was {rng.choice(TRAPS)} born?", "answer": text}
        elif shape < 0.9:
            record = {"messages": [{"role": "user", "content": rng.choice(FILLER)},
                                   {"role": "assistant", "content": text}]}
        else:
            record = {"prompt": rng.choice(FILLER), "response": text,
                      "perturbed_answer": [rng.choice(TRAPS), rng.choice(FILLER)]}
        if rng.random() < 0.8:
            record["id"] = f"r{i:05d}"
        if rng.random() < 0.5:
            record[rng.choice(["doc", "thread", "source"])] = rng.choice(["d1", "d2", "d-3", 7, "--", "Ünï"])
        records.append(record)
    return records


def write_jsonl(path: Path, records: list[dict[str, object]], seed: int) -> Path:
    """JSONL with escapes, raw UTF-8, blank lines and a record that fits no shape."""
    rng = random.Random(seed)
    lines = []
    for record in records:
        lines.append(json.dumps(record, ensure_ascii=rng.random() < 0.4))
        if rng.random() < 0.05:
            lines.append(rng.choice(["", "   ", '{"id": "misfit", "note": "no text"}']))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _table(records: list[dict[str, object]]) -> pa.Table:
    normalised = [{**r, **({k: str(r[k]) for k in ("doc", "thread", "source") if k in r})} for r in records]
    return pa.Table.from_struct_array(pa.array(normalised))


def corpora(root: Path, seed: int) -> dict[str, Path]:
    records = trap_records(seed)
    jsonl = write_jsonl(root / "c.jsonl", records, seed)
    out = {"jsonl": jsonl}
    (root / "c.jsonl.gz").write_bytes(gzip.compress(jsonl.read_bytes()))
    out["gzip"] = root / "c.jsonl.gz"
    (root / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl.read_bytes()))
    out["zstd"] = root / "c.jsonl.zst"
    pq.write_table(_table(records), root / "c.parquet", row_group_size=37)
    out["parquet"] = root / "c.parquet"
    (root / "c.json").write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    out["array"] = root / "c.json"
    shards = root / "shards"
    shards.mkdir()
    write_jsonl(shards / "a.jsonl", records[:150], seed + 1)
    pq.write_table(_table(records[150:300]), shards / "b.parquet", row_group_size=50)
    (shards / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        write_jsonl(root / "tail.jsonl", records[300:], seed + 2).read_bytes()))
    out["shards"] = shards
    return out


def saved_bytes(sets: ErasureSets, out: Path) -> dict[str, bytes]:
    sets.save(out)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}
