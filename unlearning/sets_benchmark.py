"""Throughput of set building: one subject versus many, over a large generated corpus.

    python -m unlearning.sets_benchmark --corpus /tmp/bench-100mb.jsonl --mb 100

writes the corpus if it is missing (keep it out of git: /tmp), then times
`build_sets` for 1 and 100 subjects and prints one JSON line.  Parsing the
file and the corpus's Merkle digest are timed separately: they cost the same
whatever the subjects, once per corpus version.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from unlearning.corpus import Record, load_corpus
from unlearning.demo.corpus import general_sentences, generate_demo_corpus
from unlearning.sets import Subject, build_sets


def write_benchmark_corpus(path: str | Path, *, target_mb: float = 100.0, people: int = 4000,
                           seed: int = 0) -> list[dict[str, Any]]:
    """Demo people's records, then general text records up to `target_mb`; returns the people."""
    demo = generate_demo_corpus(people=people, control=0, seed=seed, general=0, heldout=0)
    rng = random.Random(seed)
    target = int(target_mb * 1_000_000)
    out = Path(path)
    written = 0
    with out.open("w", encoding="utf-8") as handle:
        for record in demo.records:
            line = json.dumps(record.to_json(), ensure_ascii=False) + "\n"
            handle.write(line)
            written += len(line.encode("utf-8"))
        index = 0
        while written < target:
            text = " ".join(general_sentences(rng, 3, exclude=set()))
            line = json.dumps(Record(id=f"bg{index:08d}", text=text).to_json()) + "\n"
            handle.write(line)
            written += len(line)
            index += 1
    return list(demo.people)


def measure(corpus_path: str | Path, people: list[dict[str, Any]], *,
            subject_counts: tuple[int, ...] = (1, 100), seed: int = 0) -> dict[str, Any]:
    size_mb = Path(corpus_path).stat().st_size / 1_000_000
    started = time.perf_counter()
    corpus = load_corpus(corpus_path)
    parse_s = time.perf_counter() - started
    started = time.perf_counter()
    corpus.manifest_digest  # noqa: B018  (cached; computed once per corpus, not per request)
    digest_s = time.perf_counter() - started
    rng = random.Random(seed)
    result: dict[str, Any] = {"corpus_mb": round(size_mb, 1), "records": len(corpus),
                              "parse_s": round(parse_s, 2), "corpus_digest_s": round(digest_s, 2),
                              "runs": []}
    for count in subject_counts:
        chosen = rng.sample(people, count)
        subjects = [Subject(p["name"], tuple(p["aliases"]), (p["email"], p["phone"])) for p in chosen]
        started = time.perf_counter()
        sets = build_sets(corpus, subjects)
        seconds = time.perf_counter() - started
        result["runs"].append({"subjects": count, "seconds": round(seconds, 2),
                               "mb_per_s": round(size_mb / seconds, 1),
                               "forget": len(sets.forget), "unmatched": len(sets.unmatched)})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/bench-100mb.jsonl"))
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--people", type=int, default=4000)
    args = parser.parse_args()
    people = generate_demo_corpus(people=args.people, control=0, general=0, heldout=0).people
    if not args.corpus.is_file():
        write_benchmark_corpus(args.corpus, target_mb=args.mb, people=args.people)
    print(json.dumps(measure(args.corpus, list(people))))  # a command-line report


if __name__ == "__main__":
    main()
