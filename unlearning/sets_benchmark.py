"""Throughput and memory of set building over large generated corpora.

    python -m unlearning.sets_benchmark write --out /tmp/bench-100mb.jsonl --mb 100
    python -m unlearning.sets_benchmark scan --corpus /tmp/bench-100mb.jsonl --subjects 100 [--reference]

`write` makes a corpus of the demo's people (their records, then general text up to the
size; keep it out of git: /tmp).  `scan` builds the sets for `--subjects` of those people
(names, aliases, e-mail addresses, phones) and prints one JSON line: seconds (and the
process's CPU seconds over the same stretch, steadier on a shared machine), MB/s,
peak resident memory of the process (`VmHWM`, `peak_rss_mb`), forget and retain sizes.  Run it in a
fresh process per figure so that the peak memory is that of the scan alone.  The fast
scan streams the path; `--reference` loads the corpus and runs the in-memory reference
(what set building did before), for comparison.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

from unlearning.corpus import Record
from unlearning.demo.corpus import general_sentences, generate_demo_corpus
from unlearning.sets import Subject, build_sets, build_sets_reference

PEOPLE = 4000


def benchmark_people(people: int = PEOPLE, seed: int = 0) -> list[dict[str, Any]]:
    return list(generate_demo_corpus(people=people, control=0, seed=seed, general=0, heldout=0).people)


def write_benchmark_corpus(path: str | Path, *, target_mb: float = 100.0, people: int = PEOPLE,
                           seed: int = 0, shards: int = 1) -> list[dict[str, Any]]:
    """Demo people's records, then general text records up to `target_mb`; returns the people.

    With `shards` > 1, `path` is a directory of that many JSONL shards (records dealt in
    turn), the layout a sharded scan reads in parallel.
    """
    demo = generate_demo_corpus(people=people, control=0, seed=seed, general=0, heldout=0)
    rng = random.Random(seed)
    target = int(target_mb * 1_000_000)
    out = Path(path)
    if shards > 1:
        out.mkdir(parents=True, exist_ok=True)
        handles = [(out / f"part-{k:04d}.jsonl").open("w", encoding="utf-8") for k in range(shards)]
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        handles = [out.open("w", encoding="utf-8")]
    written = 0
    try:
        for index, record in enumerate(demo.records):
            line = json.dumps(record.to_json(), ensure_ascii=False) + "\n"
            handles[index % len(handles)].write(line)
            written += len(line.encode("utf-8"))
        index = 0
        while written < target:
            text = " ".join(general_sentences(rng, 3, exclude=set()))
            line = json.dumps(Record(id=f"bg{index:09d}", text=text).to_json()) + "\n"
            handles[index % len(handles)].write(line)
            written += len(line)
            index += 1
    finally:
        for handle in handles:
            handle.close()
    return list(demo.people)


def subjects_of(people: list[dict[str, Any]], count: int, *, seed: int = 0) -> list[Subject]:
    chosen = random.Random(seed).sample(people, count)
    return [Subject(p["name"], tuple(p["aliases"]), (p["email"], p["phone"])) for p in chosen]


def corpus_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB.

    The high-water mark of this program's own memory (`VmHWM` of /proc/self/status), not
    `ru_maxrss`: Linux carries `ru_maxrss` across `execve` from the process that forked, so
    a scan started by a benchmark holding models read the benchmark's 1.8 GB as its peak.
    `ru_maxrss` (KiB on Linux) where /proc is not there."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_scan(corpus: Path, subjects: list[Subject], *, reference: bool = False, seed: int = 0) -> dict[str, Any]:
    size_mb = corpus_bytes(corpus) / 1e6
    baseline = peak_rss_mb()
    started, cpu = time.perf_counter(), time.process_time()
    if reference:
        from unlearning.corpus import load_corpus

        sets = build_sets_reference(load_corpus(corpus), subjects, seed=seed)
    else:
        sets = build_sets(corpus, subjects, seed=seed)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    return {"corpus_mb": round(size_mb, 1), "subjects": len(subjects), "seconds": seconds, "cpu_seconds": cpu_seconds,
            "mb_per_s": size_mb / seconds, "peak_rss_mb": peak_rss_mb(), "rss_before_mb": baseline,
            "forget": len(sets.forget), "retain": len(sets.retain), "unmatched": len(sets.unmatched),
            "implementation": "reference (load_corpus + in-memory match)" if reference else "fast scan (streamed)"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write")
    write.add_argument("--out", type=Path, required=True)
    write.add_argument("--mb", type=float, default=100.0)
    write.add_argument("--shards", type=int, default=1)
    scan = commands.add_parser("scan")
    scan.add_argument("--corpus", type=Path, required=True)
    scan.add_argument("--subjects", type=int, default=100)
    scan.add_argument("--reference", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "write":
        write_benchmark_corpus(args.out, target_mb=args.mb, shards=args.shards)
        return 0
    result = measure_scan(args.corpus, subjects_of(benchmark_people(), args.subjects), reference=args.reference)
    sys.stdout.write(json.dumps(result) + "\n")  # a command-line report
    return 0


if __name__ == "__main__":
    sys.exit(main())
