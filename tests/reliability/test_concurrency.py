"""Concurrency: many requests submitted and approved at the same instant, from threads
with sessions of their own, against a real worker and beat (tests/pipeline_fixtures.py).

Whatever the interleaving, every request must end certified exactly once, each model's
certificates must form one linear lineage (each base is the previous candidate), each
model must serve exactly one checkpoint, and both chains must verify.  A deadlock shows
up as a request that never completes (the wait times out).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from deletion.domain import registry
from deletion.domain.audit import audit_verify
from deletion.domain.certificates import certificate_verify_chain
from deletion.domain.config import current
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import (
    Certificate,
    Checkpoint,
    ErasureRequest,
    Job,
    Model,
    utcnow,
)
from deletion.domain.services.requests import request_approve, request_submit
from deletion.domain.signing import keyring_load
from tests.pipeline_fixtures import RunningPipeline

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("reliability_concurrency")]  # one pipeline per module

log = logging.getLogger(__name__)

ONE_MODEL_REQUESTS = 20
SPREAD_MODELS = ("demo", "demo-b", "demo-c", "demo-d")
# The tiny corpus trains 24 people and the first test erases 20 from `demo`: the
# 20 spread requests give `demo` the people it has left.
SPREAD_SHARE = {"demo": 2, "demo-b": 6, "demo-c": 6, "demo-d": 6}
SPREAD_REQUESTS = sum(SPREAD_SHARE.values())
WAIT_S = 600.0


class PeoplePerModel:
    """Trained people, each handed out once per model (every model has its own copy of
    the corpus, so one person may be erased from several models)."""

    def __init__(self, pipeline: RunningPipeline) -> None:
        path = pipeline.work_dir / "corpora" / "demo" / "people.jsonl"
        self._people = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                        if line]
        self._used: dict[str, int] = {}

    def take(self, model: str) -> dict[str, Any]:
        index = self._used.get(model, 0)
        self._used[model] = index + 1
        return self._people[index]


@pytest.fixture(scope="module")
def engine(pipeline: RunningPipeline) -> Iterator[Any]:
    engine = make_engine(pipeline.database_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def people(pipeline: RunningPipeline) -> PeoplePerModel:
    return PeoplePerModel(pipeline)


@pytest.fixture(scope="module")
def four_models(pipeline: RunningPipeline, engine: Any) -> tuple[str, ...]:
    """`demo` plus three models on copies of the tiny corpus and base, each with files of
    its own (an erasure retires and later destroys its model's base directory)."""
    corpus_src = pipeline.work_dir / "corpora" / "demo"
    with session_scope(engine) as session:
        demo = session.scalars(select(Model).where(Model.name == "demo")).one()
        base_dir = Path(session.get_one(Checkpoint, demo.serving_checkpoint_id).directory)
        manifest_digest = registry.corpus_current(session, name="demo").manifest_digest
    for name in SPREAD_MODELS[1:]:
        corpus_dir = pipeline.work_dir / "corpora" / name
        checkpoint_dir = pipeline.work_dir / "checkpoints" / name / "v1"
        shutil.copytree(corpus_src, corpus_dir)
        shutil.copytree(base_dir, checkpoint_dir)
        with session_scope(engine) as session:
            registry.corpus_register(session, actor="system:test", name=name,
                                     path=str(corpus_dir / "corpus.jsonl"),
                                     manifest_digest=manifest_digest)
            registry.model_register(session, actor="system:test", name=name,
                                    description="tiny copy for the concurrency tests",
                                    corpus_name=name)
            registry.checkpoint_register(session, actor="system:test", model_name=name,
                                         directory=str(checkpoint_dir), serving=True)
    return SPREAD_MODELS


def submit_and_approve_at_once(engine: Any, work: list[tuple[str, dict[str, Any]]], *,
                               schedule: bool = False) -> list[str]:
    """One thread per (model, person), released together by a barrier; each submits and
    approves with sessions of its own, priority immediate.  With `schedule`, each thread
    then runs the batch scheduler itself, so twenty schedulers race each other and beat
    (as if several beats had been deployed by mistake)."""
    from workers.scheduler import batches_schedule

    barrier = threading.Barrier(len(work))
    references: list[str | None] = [None] * len(work)
    errors: list[BaseException] = []

    def one(index: int, model: str, person: dict[str, Any]) -> None:
        try:
            barrier.wait(timeout=60)
            with session_scope(engine) as session:
                reference = request_submit(
                    session, actor="user:officer", name=person["name"],
                    aliases=person["aliases"], emails=[person["email"]], ground="17(1)(b)",
                    received_at=utcnow(), model_name=model, priority="immediate",
                ).reference
            with session_scope(engine) as session:
                request_approve(session, actor="user:reviewer", reference=reference)
            references[index] = reference
            if schedule:
                batches_schedule()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            errors.append(error)

    threads = [threading.Thread(target=one, args=(i, m, p), daemon=True)
               for i, (m, p) in enumerate(work)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert all(r is not None for r in references)
    return [r for r in references if r is not None]


def assert_linear_and_certified(session: Any, *, model_name: str,
                                references: list[str]) -> tuple[int, int]:
    """Every reference certified exactly once for this model; certificates chain base ->
    candidate; promotions form one line; one serving checkpoint.  Returns (jobs, lineage
    length in promoted checkpoints after the first)."""
    model = session.scalars(select(Model).where(Model.name == model_name)).one()
    promoted = session.scalars(
        select(Checkpoint).where(Checkpoint.model_id == model.id,
                                 Checkpoint.promoted_at.is_not(None))
        .order_by(Checkpoint.promoted_at, Checkpoint.id)
    ).all()
    for earlier, later in zip(promoted, promoted[1:], strict=False):
        assert later.parent_id == earlier.id, (model_name, earlier.id, later.id)
    serving = session.scalars(select(Checkpoint).where(
        Checkpoint.model_id == model.id, Checkpoint.status == "serving")).all()
    assert [c.id for c in serving] == [model.serving_checkpoint_id] == [promoted[-1].id]

    certified: list[str] = []
    pairs: list[tuple[str, str]] = []
    for certificate in session.scalars(select(Certificate).order_by(Certificate.seq)):
        payload = json.loads(certificate.payload)
        if payload["model"]["name"] != model_name:
            continue
        certified += [r["reference"] for r in payload["requests"]]
        pairs.append((payload["model"]["base_checkpoint"]["digest"],
                      payload["model"]["candidate_checkpoint"]["digest"]))
    assert len(certified) == len(set(certified))
    assert set(references) <= set(certified)
    assert pairs and pairs[0][0] == promoted[0].digest
    for (_, candidate), (base, _) in zip(pairs, pairs[1:], strict=False):
        assert base == candidate, model_name
    assert pairs[-1][1] == promoted[-1].digest
    assert len(pairs) == len(promoted) - 1

    request_ids = session.scalars(select(ErasureRequest.id)
                                  .where(ErasureRequest.reference.in_(references))).all()
    jobs = session.scalar(select(func.count(func.distinct(Job.id))).where(
        Job.requests.any(ErasureRequest.id.in_(request_ids)), Job.stage == "done"))
    return int(jobs or 0), len(pairs)


def wait_all(pipeline: RunningPipeline, references: list[str]) -> None:
    for reference in references:
        assert pipeline.wait_for_request(reference, timeout_s=WAIT_S) == "completed"


def assert_chains_verify(session: Any) -> None:
    chain = certificate_verify_chain(session, keyring_load(current().signing_keyring_dir))
    assert chain.ok, chain
    audit = audit_verify(session)
    assert audit.ok, audit


def test_twenty_requests_for_one_model_at_once_with_racing_schedulers_end_certified_in_one_line(
    pipeline: RunningPipeline, engine: Any, people: PeoplePerModel,
) -> None:
    work = [("demo", people.take("demo")) for _ in range(ONE_MODEL_REQUESTS)]
    started = time.monotonic()
    references = submit_and_approve_at_once(engine, work, schedule=True)
    wait_all(pipeline, references)
    elapsed = time.monotonic() - started

    with session_scope(engine) as session:
        jobs, lineage = assert_linear_and_certified(session, model_name="demo",
                                                    references=references)
        assert_chains_verify(session)
    assert 1 <= jobs <= ONE_MODEL_REQUESTS
    print(f"\n{ONE_MODEL_REQUESTS} requests for one model at once: {jobs} jobs, "
          f"lineage {lineage} promotions, {elapsed:.1f} s")


def test_twenty_requests_over_four_models_at_once_end_certified_in_one_line_per_model(
    pipeline: RunningPipeline, engine: Any, people: PeoplePerModel,
    four_models: tuple[str, ...],
) -> None:
    # Interleaved, so the threads of different models race each other.
    order = sorted((i, model) for model in four_models for i in range(SPREAD_SHARE[model]))
    work_people = [(model, people.take(model)) for _, model in order]
    started = time.monotonic()
    references = submit_and_approve_at_once(engine, work_people)
    wait_all(pipeline, references)
    elapsed = time.monotonic() - started

    by_model: dict[str, list[str]] = {}
    for (model, _), reference in zip(work_people, references, strict=True):
        by_model.setdefault(model, []).append(reference)
    figures = {}
    with session_scope(engine) as session:
        for model, refs in by_model.items():
            figures[model] = assert_linear_and_certified(session, model_name=model,
                                                         references=refs)
        assert_chains_verify(session)
    assert set(figures) == set(four_models)
    print(f"\n{SPREAD_REQUESTS} requests over {len(four_models)} models at once: "
          f"(jobs, lineage) per model {figures}, {elapsed:.1f} s")
