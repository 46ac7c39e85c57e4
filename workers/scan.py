"""Set building over a sharded corpus by many worker processes at once.

A corpus of several shards is scanned shard by shard (`unlearning.corpus.scan`): each
shard's hits, forget-group members and retain sample are independent of the others, so
`erasure.scan_shard` tasks (a Celery group on the `default` queue) scan them in parallel
and one merge (`unlearning.sets.assemble_sets`) turns them into exactly the sets that one
process scanning the shards in order builds.

How the work is shared, so that it is safe without a result backend and never waits for
a worker that is not there: the coordinator (the build-sets stage) writes the phase's
spec into the job's private scan folder, sends one task per shard, and then works
through the shards itself too.  Whoever creates a shard's claim file first (an atomic
`O_EXCL` create) scans it and writes its result atomically (temp file + rename); a claim
whose holder stops touching it for `CLAIM_STALE_S` is taken over.  A shard task is
idempotent: it returns at once when the result is there or the shard is claimed, and is
retried alone on I/O errors.  The scan folder holds subjects' identifiers and records:
it lives in the job's work directory (mode 0700), every file in it (spec and shard results)
is AES-GCM encrypted with the service's key and bound to its own path as associated data
(mode 0600), and the folder is removed when the sets are built.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCAN_SHARD = "erasure.scan_shard"
CLAIM_STALE_S = 60.0
CLAIM_TOUCH_S = 10.0
POLL_S = 0.01  # a look at a few files: cheap, and each phase waits half of it on average
PHASES = ("match", "groups", "sample")

Dispatch = Callable[[Path, str, Sequence[int]], None]


@dataclass(frozen=True)
class ScanSpec:
    """What every shard task of one phase needs (written once by the coordinator)."""

    corpus_path: str
    phase: str  # match | groups | sample
    patterns: list[list[str]]
    seed: int
    threshold: int
    exclude_ids: list[str]
    groups: list[list[str]]  # (group field, value) pairs of the forget groups (phase "groups")

    def to_json(self) -> dict[str, Any]:
        return {"corpus_path": self.corpus_path, "phase": self.phase, "patterns": self.patterns,
                "seed": self.seed, "threshold": str(self.threshold), "exclude_ids": self.exclude_ids,
                "groups": self.groups}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanSpec:
        return cls(str(data["corpus_path"]), str(data["phase"]), [list(p) for p in data["patterns"]],
                   int(data["seed"]), int(data["threshold"]), list(data["exclude_ids"]),
                   [list(g) for g in data["groups"]])


SCAN_CONTEXT = "erasure-work.scan"
SCAN_MAGIC = b"erasure-scan/1\n"


class ScanFileError(RuntimeError):
    """A scan file that is not one of ours or does not open for its path."""


def _row(path: Path) -> str:
    # The phase folder's random name and the file name: a file moved elsewhere does not open.
    return f"{path.parent.name}/{path.name}"


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Encrypt and write `data` atomically (temporary name + rename), mode 0600."""
    import orjson

    from deletion.domain import crypto

    try:
        encoded = orjson.dumps(data)
    except TypeError:  # an integer beyond 64 bits in some record's meta
        encoded = json.dumps(data, ensure_ascii=False).encode("utf-8")
    sealed, key_id = crypto.keyring().encrypt(encoded, context=SCAN_CONTEXT, row=_row(path))
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(SCAN_MAGIC + key_id.encode("ascii") + b"\n" + sealed)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _read(path: Path) -> Any:
    import orjson

    from deletion.domain import crypto

    data = path.read_bytes()
    if not data.startswith(SCAN_MAGIC):
        raise ScanFileError(f"{path.name} is not an encrypted scan file")
    key_id, _, sealed = data[len(SCAN_MAGIC):].partition(b"\n")
    try:
        plain = crypto.keyring().decrypt(sealed, key_id_=key_id.decode("ascii"), context=SCAN_CONTEXT,
                                         row=_row(path))
    except (crypto.DecryptionError, UnicodeDecodeError) as exc:
        raise ScanFileError(f"{path.name} does not open ({exc})") from exc
    return orjson.loads(plain)


def _result_path(phase_dir: Path, shard: int) -> Path:
    return phase_dir / f"shard-{shard:05d}.json"


def _claim(phase_dir: Path, shard: int) -> Path | None:
    """Take the shard (True) unless someone live holds it; a stale claim is taken over."""
    claim = phase_dir / f"shard-{shard:05d}.claim"
    for _ in range(2):
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return claim
        except FileExistsError:
            try:
                age = time.time() - claim.stat().st_mtime
            except FileNotFoundError:
                continue
            if age < CLAIM_STALE_S:
                return None
            log.warning("shard %s of %s: claim stale for %.0f s, taking it over", shard, phase_dir.name, age)
            claim.unlink(missing_ok=True)
    return None


class _Touch:
    """Keeps a claim fresh while its shard is scanned."""

    def __init__(self, claim: Path) -> None:
        self.claim, self.stop = claim, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(CLAIM_TOUCH_S):
            self.claim.touch(exist_ok=True)

    def __enter__(self) -> _Touch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def scan_one_shard(phase_dir: Path, shard_number: int) -> bool:
    """Scan one shard of a phase unless it is done or held; True when this call scanned it."""
    from unlearning.corpus import open_source
    from unlearning.corpus.scan import ShardScan, group_shard, sample_shard, scan_shard
    from unlearning.text_matching import MultiMatcher

    result = _result_path(phase_dir, shard_number)
    if result.is_file():
        return False
    claim = _claim(phase_dir, shard_number)
    if claim is None:
        return False
    try:
        if result.is_file():  # finished between our look and our claim
            return False
        spec = ScanSpec.from_json(_read(phase_dir / "spec.json"))
        source = open_source(spec.corpus_path)
        shard = source.shards[shard_number]
        exclude = frozenset(spec.exclude_ids)
        with _Touch(claim):
            if spec.phase == "match":
                data = scan_shard(source, shard, MultiMatcher(spec.patterns), seed=spec.seed,
                                  threshold=spec.threshold, exclude_ids=exclude).to_json()
            elif spec.phase == "groups":
                groups = frozenset((g[0], g[1]) for g in spec.groups)
                members = group_shard(source, shard, groups, exclude_ids=exclude)
                data = {"members": [[p, r.to_json()] for p, r in members]}
            else:
                pool = sample_shard(source, shard, seed=spec.seed, threshold=spec.threshold, exclude_ids=exclude)
                data = ShardScan(shard_number, [], pool).to_json()
        _write_atomic(result, data)
        log.info("scan %s shard %s done by pid %s", phase_dir.name, shard_number, os.getpid())
        return True
    finally:
        claim.unlink(missing_ok=True)


def _run_phase(scan_dir: Path, spec: ScanSpec, shards: int, *, dispatch: Dispatch | None,
               participate: bool, timeout_s: float) -> list[dict[str, Any]]:
    """Write the spec, send the shard tasks, scan what nobody else took, wait, load."""
    phase_dir = scan_dir / f"{spec.phase}-{uuid.uuid4().hex[:8]}"
    for folder in (scan_dir, phase_dir):  # private, whatever the umask
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    _write_atomic(phase_dir / "spec.json", spec.to_json())
    if dispatch is not None:
        dispatch(phase_dir, spec.phase, range(shards))
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        missing = [k for k in range(shards) if not _result_path(phase_dir, k).is_file()]
        if not missing:
            break
        if participate:
            for k in missing:
                scan_one_shard(phase_dir, k)
        else:
            for k in missing:
                if _stale(phase_dir, k, started):
                    scan_one_shard(phase_dir, k)  # the worker that held it (or was sent it) is gone
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(missing)} shard scans of {spec.phase} did not finish in {timeout_s:.0f} s")
        time.sleep(POLL_S)
    results = [_read(_result_path(phase_dir, k)) for k in range(shards)]
    log.info("scan phase %s: %s shards in %.2f s", spec.phase, shards, time.monotonic() - started)
    return results


def _stale(phase_dir: Path, shard: int, started: float) -> bool:
    """A shard nobody works on: its claim went quiet, or nobody claimed it in time."""
    claim = phase_dir / f"shard-{shard:05d}.claim"
    try:
        return time.time() - claim.stat().st_mtime > CLAIM_STALE_S
    except FileNotFoundError:
        return time.monotonic() - started > CLAIM_STALE_S


def build_sets_sharded(
    corpus_path: str | Path, subjects: Sequence[Any], *, scan_dir: Path, seed: int,
    exclude_ids: frozenset[str] = frozenset(), corpus_digest: str | None = None,
    retain_per_forget: int | None = None, dispatch: Dispatch | None = None,
    participate: bool = True, timeout_s: float = 3600.0,
) -> Any:
    """`unlearning.sets.build_sets(corpus_path, ...)` with its shards scanned by many
    processes (`dispatch` sends the shard tasks; None: this process alone).  Returns
    the same `ErasureSets`, byte for byte."""
    from unlearning.corpus import open_source, record_from_json
    from unlearning.corpus.scan import (
        RANK_SPACE,
        ShardScan,
        first_threshold,
        forget_groups,
        merge_hits,
        resolve_pool,
    )
    from unlearning.sets import DEFAULT_RETAIN_PER_FORGET, assemble_sets, pool_size

    per_forget = DEFAULT_RETAIN_PER_FORGET if retain_per_forget is None else retain_per_forget
    source = open_source(corpus_path)
    shards = len(source.shards)
    patterns = [list(s.patterns()) for s in subjects]
    wanted_for: Callable[[int], int] = lambda forget: pool_size(per_forget, forget)  # noqa: E731
    threshold = first_threshold(source, len(subjects), wanted_for)

    def spec(phase: str, threshold: int, groups: list[list[str]] | None = None) -> ScanSpec:
        return ScanSpec(str(source.root), phase, patterns if phase == "match" else [], seed, threshold,
                        sorted(exclude_ids), groups or [])

    run = dict(dispatch=dispatch, participate=participate, timeout_s=timeout_s)
    try:
        parts = [ShardScan.from_json(d) for d in _run_phase(scan_dir, spec("match", threshold), shards, **run)]
        hits = merge_hits(parts)
        groups = forget_groups(hits)
        direct = {record.id for _, record, _ in hits}
        members = []
        if groups:
            found = _run_phase(scan_dir, spec("groups", 0, sorted([list(g) for g in groups])), shards, **run)
            members = sorted(((int(p), record_from_json(r)) for d in found for p, r in d["members"]
                              if r["id"] not in direct), key=lambda m: m[0])
        excluded = direct | {record.id for _, record in members} | exclude_ids
        wanted = wanted_for(len(direct) + len(members))
        pool = resolve_pool((entry for part in parts for entry in part.pool), wanted, excluded)
        while len(pool) < wanted and threshold < RANK_SPACE:
            threshold = min(RANK_SPACE, threshold * 4)
            sampled = _run_phase(scan_dir, spec("sample", threshold), shards, **run)
            pool = resolve_pool((e for d in sampled for e in ShardScan.from_json(d).pool), wanted, excluded)
    finally:
        shutil.rmtree(scan_dir, ignore_errors=True)
    return assemble_sets(subjects, hits, members, pool, retain_per_forget=per_forget, seed=seed,
                         corpus_digest=corpus_digest or "")


def celery_dispatch(app: Any) -> Dispatch:
    """Send one `erasure.scan_shard` task per shard (a Celery group on `default`)."""
    from celery import group

    def send(phase_dir: Path, phase: str, shards: Sequence[int]) -> None:
        from workers.runtime import config

        relative = phase_dir.relative_to(config().checkpoint_dir).as_posix()
        group(app.signature(SCAN_SHARD, args=(relative, k)) for k in shards).apply_async()

    return send


# ---------------------------------------------------------------- corpus index

BUILD_INDEX = "erasure.build_corpus_index"
INDEX_CONTEXT = b"erasure-corpus-index\x00"
# Corpora smaller than this are scanned (seconds: docs/benchmarks.md); a larger one without
# an index gets one built by a worker after its first request, for the requests after it.
INDEX_MIN_BYTES = 256 << 20
INDEX_LOCK_STALE_S = 6 * 3600.0


def index_key(content_digest: str) -> bytes:
    """The index's token-hash key: the service's blind-index key, bound to the corpus."""
    import hashlib
    import hmac

    from deletion.domain import crypto

    return hmac.new(crypto.keyring().blind_index_key, INDEX_CONTEXT + content_digest.encode("ascii"),
                    hashlib.sha256).digest()


def index_dir(content_digest: str) -> Path:
    """Where a corpus's index lives: beside the workers' other private files, by content digest."""
    from workers import workfiles

    return workfiles.config().checkpoint_dir / "corpus-index" / content_digest[:32]


def open_index(corpus_path: str | Path, content_digest: str) -> tuple[Any, str]:
    """(the corpus's index, "index") when one is there, fresh and covering every shard;
    (None, why not) otherwise."""
    from unlearning.corpus.index import CorpusIndex, IndexUnusable

    try:
        index = CorpusIndex.open(index_dir(content_digest), corpus_path, key=index_key(content_digest),
                                 corpus_digest=content_digest)
    except IndexUnusable as exc:
        return None, str(exc)
    if not all(s["indexed"] for s in index.manifest["shards"]):
        return None, "the index does not cover every shard (Parquet, Arrow or JSON arrays are scanned)"
    return index, "index"


def build_corpus_index(corpus_path: str | Path, content_digest: str) -> bool:
    """Build the corpus's index unless a fresh one is there or another worker builds it;
    True when this call built it."""
    from unlearning.corpus.index import build_index

    index, _ = open_index(corpus_path, content_digest)
    if index is not None:
        return False
    target = index_dir(content_digest)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(target.parent, 0o700)
    lock = target.parent / f".{target.name}.lock"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        if time.time() - lock.stat().st_mtime < INDEX_LOCK_STALE_S:
            log.info("corpus index %s: another worker builds it", target.name)
            return False
        lock.unlink(missing_ok=True)
        return build_corpus_index(corpus_path, content_digest)
    try:
        started = time.monotonic()
        manifest = build_index(corpus_path, target, key=index_key(content_digest), corpus_digest=content_digest)
        log.info("corpus index %s built: %s records, %s postings in %.1f s", target.name, manifest["records"],
                 manifest["postings"], time.monotonic() - started)
        return True
    finally:
        lock.unlink(missing_ok=True)


def _corpus_bytes(corpus_path: Path) -> int:
    from unlearning.corpus import open_source

    return sum(shard.path.stat().st_size for shard in open_source(corpus_path).shards)


def _request_index(corpus_path: Path, content_digest: str) -> None:
    """Send the index build to a worker (never fails the stage that asks)."""
    try:
        from workers.runtime import celery

        celery().send_task(BUILD_INDEX, args=(str(corpus_path), content_digest))
        log.info("corpus index %s: build requested", content_digest[:12])
    except Exception as exc:  # noqa: BLE001 - a broker hiccup costs the next request a scan, nothing more
        log.warning("corpus index %s: build not requested (%s)", content_digest[:12], type(exc).__name__)


def compute_sets(corpus_path: Path, subjects: Sequence[Any], *, job_work_dir: Path, seed: int,
                 exclude_ids: frozenset[str], corpus_digest: str | None = None,
                 content_digest: str | None = None) -> Any:
    """What the build-sets stage calls: by index look-up when the corpus (its content digest:
    the first version's, which tombstones do not change) has a fresh index; otherwise the
    scan, sharded when the corpus has several shards (and a large corpus gets its index
    built for the requests after this one)."""
    from unlearning.corpus import open_source
    from unlearning.sets import build_sets

    if content_digest:
        index, why = open_index(corpus_path, content_digest)
        if index is not None:
            log.info("sets by corpus index look-up (%s records indexed)", index.manifest["records"])
            return build_sets(corpus_path, subjects, seed=seed, exclude_ids=exclude_ids,
                              corpus_digest=corpus_digest, index=index)
        log.info("no usable corpus index (%s): scanning", why)
        if _corpus_bytes(corpus_path) >= INDEX_MIN_BYTES and not why.startswith("the index does not cover"):
            _request_index(corpus_path, content_digest)
    if len(open_source(corpus_path).shards) < 2:
        return build_sets(corpus_path, subjects, seed=seed, exclude_ids=exclude_ids, corpus_digest=corpus_digest)
    from workers.runtime import celery

    return build_sets_sharded(corpus_path, subjects, scan_dir=job_work_dir / "scan", seed=seed,
                              exclude_ids=exclude_ids, corpus_digest=corpus_digest,
                              dispatch=celery_dispatch(celery()))


def _register() -> None:
    from workers.celery_app import app
    from workers.retries import PERIODIC_TRANSIENT, backoff_seconds, is_transient

    @app.task(name=BUILD_INDEX, acks_late=True, reject_on_worker_lost=True)
    def build_corpus_index_task(corpus_path: str, content_digest: str) -> bool:
        """Build a corpus's index (idempotent: a fresh index, or one being built, returns at once)."""
        return build_corpus_index(corpus_path, content_digest)

    @app.task(bind=True, name=SCAN_SHARD, acks_late=True, reject_on_worker_lost=True,
              autoretry_for=PERIODIC_TRANSIENT, retry_backoff=True, max_retries=3)
    def scan_shard_task(self: Any, phase_dir: str, shard: int) -> bool:
        """One shard of one scan phase (idempotent: done or held shards return at once)."""
        from workers.runtime import config

        root = config().checkpoint_dir.resolve()
        folder = (root / phase_dir).resolve()
        if root not in folder.parents or not (folder / "spec.json").is_file():
            log.warning("scan_shard: no scan phase at %s; nothing to do", phase_dir)
            return False
        try:
            return scan_one_shard(folder, int(shard))
        except OSError as exc:  # a busy disk or a network share: retry; anything else fails
            if is_transient(exc):
                raise self.retry(exc=exc, countdown=backoff_seconds(self.request.retries)) from exc
            raise


_register()
