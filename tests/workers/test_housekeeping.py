"""Beat's housekeeping on a real PostgreSQL database, without a worker: the reconciler,
the batch scheduler, the deadline watcher, checkpoint destruction and Art. 19 webhooks."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from deletion.domain import registry
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import (
    AuditEvent,
    Certificate,
    Checkpoint,
    DeadlineAlert,
    ErasureRequest,
    Job,
    Notification,
    OutboxMessage,
    utcnow,
)
from deletion.domain.services.jobs import job_claim, job_create, job_fail
from deletion.domain.services.recipients import notification_record, recipient_register
from deletion.domain.services.requests import request_approve, request_submit
from tests.conftest import drop_database, fresh_database_url
from workers import routing
from workers.runtime import use_database


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    url = fresh_database_url("erasure_workers_unit")
    broker_dir = tmp_path_factory.mktemp("broker")
    # Anything relayed goes to a broker nobody reads: these tests look at the outbox.
    use_database(url, broker_url=f"sqla+sqlite:///{broker_dir / 'broker.sqlite3'}")
    engine = make_engine(url)
    yield engine
    engine.dispose()
    use_database(None)
    drop_database(url)


def a_model(engine: Any, tmp_path: Path, *, window_hours: int = 24) -> str:
    """A registered model with a serving v1 checkpoint (a directory with one file)."""
    name = f"m-{uuid.uuid4().hex[:8]}"
    directory = tmp_path / name / "v1"
    directory.mkdir(parents=True)
    (directory / "weights.bin").write_bytes(b"weights")
    with session_scope(engine) as session:
        registry.corpus_register(session, actor="test", name=f"c-{name}", path="/dev/null",
                                 manifest_digest="0" * 64, record_count=1)
        registry.model_register(session, actor="test", name=name, corpus_name=f"c-{name}",
                                batch_window_hours=window_hours)
        registry.checkpoint_register(session, actor="test", model_name=name,
                                     directory=str(directory), serving=True)
    return name


def an_approved_request(engine: Any, model: str, *, priority: str = "batch",
                        received_days_ago: int = 0) -> str:
    with session_scope(engine) as session:
        reference = request_submit(
            session, actor="user:officer", name=f"Person {uuid.uuid4().hex[:6]}",
            ground="17(1)(a)", received_at=utcnow() - timedelta(days=received_days_ago),
            model_name=model, priority=priority,
        ).reference
    with session_scope(engine) as session:
        request_approve(session, actor="user:reviewer", reference=reference)
    return reference


def a_job(engine: Any, model: str) -> int:
    reference = an_approved_request(engine, model)
    with session_scope(engine) as session:
        return job_create(session, actor="test", model_name=model, references=[reference],
                          method="asu").id


def outbox_for(engine: Any, job_id: int) -> list[str]:
    with session_scope(engine) as session:
        rows = session.scalars(select(OutboxMessage).order_by(OutboxMessage.id))
        return [r.task_name for r in rows if r.args.get("job_id") == job_id]


# ------------------------------------------------------------------- reconciler


def test_the_reconciler_resends_a_stage_whose_worker_vanished(engine: Any, tmp_path: Path) -> None:
    from workers.reconciler import jobs_reconcile

    job_id = a_job(engine, a_model(engine, tmp_path))
    with session_scope(engine) as session:
        assert job_claim(session, job_id=job_id, expected_stage="queued",
                         next_stage="building_sets", worker="worker@gone:1")
    before = outbox_for(engine, job_id)

    assert not [r for r in jobs_reconcile() if r.job_id == job_id]  # heartbeat is fresh
    later = utcnow() + timedelta(hours=2)
    resumed = [r for r in jobs_reconcile(now=later) if r.job_id == job_id]

    assert [(r.task_name, r.reason) for r in resumed] == [(routing.BUILD_SETS,
                                                           "worker lost mid-stage")]
    assert outbox_for(engine, job_id) == [*before, routing.BUILD_SETS]


def test_the_reconciler_resends_a_hand_over_that_never_arrived(engine: Any, tmp_path: Path) -> None:
    from workers.reconciler import jobs_reconcile

    job_id = a_job(engine, a_model(engine, tmp_path))
    with session_scope(engine) as session:
        job_claim(session, job_id=job_id, expected_stage="queued", next_stage="building_sets")
        job_claim(session, job_id=job_id, expected_stage="building_sets", next_stage="unlearning")
        session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=None))

    assert not [r for r in jobs_reconcile() if r.job_id == job_id]  # just handed over
    resumed = [r for r in jobs_reconcile(now=utcnow() + timedelta(hours=2)) if r.job_id == job_id]

    assert [(r.task_name, r.reason) for r in resumed] == [(routing.UNLEARN, "hand-over lost")]


def test_a_failed_job_with_attempts_left_is_queued_again_after_a_backoff(
    engine: Any, tmp_path: Path,
) -> None:
    from workers.reconciler import jobs_reconcile

    job_id = a_job(engine, a_model(engine, tmp_path))
    with session_scope(engine) as session:
        job_claim(session, job_id=job_id, expected_stage="queued", next_stage="building_sets")
        job_fail(session, job_id=job_id, error="OperationalError: blip")

    assert not [r for r in jobs_reconcile() if r.job_id == job_id]  # still backing off
    resumed = [r for r in jobs_reconcile(now=utcnow() + timedelta(minutes=5)) if r.job_id == job_id]

    assert [r.reason for r in resumed] == ["retry after failure"]
    with session_scope(engine) as session:
        job = session.get_one(Job, job_id)
        assert (job.stage, job.attempts) == ("queued", 1)


def test_a_stage_is_taken_over_only_when_its_heartbeat_is_stale(engine: Any, tmp_path: Path) -> None:
    from workers.runtime import StageRun, stage_take_over

    job_id = a_job(engine, a_model(engine, tmp_path))
    with session_scope(engine) as session:
        job_claim(session, job_id=job_id, expected_stage="queued", next_stage="building_sets",
                  worker="worker@elsewhere:1")
    with session_scope(engine) as session:
        assert not stage_take_over(session, run=StageRun(job_id), stage="building_sets")
        assert not stage_take_over(session, run=StageRun(job_id), stage="unlearning")
    with session_scope(engine) as session:
        session.execute(update(Job).where(Job.id == job_id)
                        .values(heartbeat_at=utcnow() - timedelta(hours=1)))
    with session_scope(engine) as session:
        assert stage_take_over(session, run=StageRun(job_id), stage="building_sets")
    with session_scope(engine) as session:
        # The winner's heartbeat is fresh again: a second copy loses.
        assert not stage_take_over(session, run=StageRun(job_id), stage="building_sets")
        assert session.get_one(Job, job_id).attempts == 1


# -------------------------------------------------------------------- scheduler


def test_approved_requests_wait_for_the_window_unless_immediate_or_near_their_deadline(
    engine: Any, tmp_path: Path,
) -> None:
    from workers.scheduler import batches_schedule

    waiting_model = a_model(engine, tmp_path)
    an_approved_request(engine, waiting_model)
    urgent_model = a_model(engine, tmp_path)
    old = an_approved_request(engine, urgent_model, received_days_ago=27)
    fresh = an_approved_request(engine, urgent_model)
    immediate_model = a_model(engine, tmp_path)
    now_ref = an_approved_request(engine, immediate_model, priority="immediate")

    created = {s.model_name: s for s in batches_schedule()}

    assert waiting_model not in created
    assert created[urgent_model].reason == "deadline"
    # One job per model: the whole pending batch rides along, earliest deadline first.
    assert created[urgent_model].references == (old, fresh)
    assert created[immediate_model].references == (now_ref,)
    later = {s.model_name for s in batches_schedule(now=utcnow() + timedelta(hours=25))}
    assert waiting_model in later and urgent_model not in later


def test_a_model_with_a_running_job_gets_no_second_job(engine: Any, tmp_path: Path) -> None:
    from workers.scheduler import batches_schedule

    model = a_model(engine, tmp_path)
    a_job(engine, model)
    an_approved_request(engine, model, priority="immediate")
    assert model not in {s.model_name for s in batches_schedule()}


def test_each_deadline_alert_is_sent_once(engine: Any, tmp_path: Path) -> None:
    from workers.scheduler import deadlines_watch

    model = a_model(engine, tmp_path)
    reference = an_approved_request(engine, model, received_days_ago=26)
    deadlines_watch()
    deadlines_watch()
    with session_scope(engine) as session:
        request = session.scalars(select(ErasureRequest)
                                  .where(ErasureRequest.reference == reference)).one()
        kinds = session.scalars(select(DeadlineAlert.kind)
                                .where(DeadlineAlert.request_id == request.id)).all()
    assert kinds == ["7d"]


# ------------------------------------------------------------------ destruction


def test_retired_checkpoints_are_destroyed_after_the_grace_window(engine: Any, tmp_path: Path) -> None:
    from workers.housekeeping import checkpoints_destroy_due

    model = a_model(engine, tmp_path)
    candidate_dir = tmp_path / model / "v2"
    candidate_dir.mkdir()
    (candidate_dir / "weights.bin").write_bytes(b"still holds the subject")
    with session_scope(engine) as session:
        candidate = registry.checkpoint_register(session, actor="test", model_name=model,
                                                 directory=str(candidate_dir))
        registry.checkpoint_retire(session, actor="test", checkpoint_id=candidate.id,
                                   reason="rejected")
        candidate_id, digest = candidate.id, candidate.digest

    assert checkpoints_destroy_due() >= 1

    assert not candidate_dir.exists()
    with session_scope(engine) as session:
        checkpoint = session.get_one(Checkpoint, candidate_id)
        assert checkpoint.status == "destroyed" and checkpoint.destroyed_at is not None
        event = session.scalars(select(AuditEvent).where(
            AuditEvent.action == "checkpoint.destroyed",
            AuditEvent.object_ref == str(candidate_id))).one()
        assert json.loads(event.details)["digest"] == digest
    # The serving checkpoint is never touched.
    assert (tmp_path / model / "v1" / "weights.bin").exists()


# ------------------------------------------------------------ Art. 19 webhooks


class _Receiver(BaseHTTPRequestHandler):
    responses: list[int] = []
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((dict(self.headers), body))
        self.send_response(type(self).responses.pop(0) if type(self).responses else 204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_webhook_recipient_is_retried_until_it_accepts_and_every_attempt_is_recorded(
    engine: Any, tmp_path: Path,
) -> None:
    from workers.notifications import SIGNATURE_HEADER, TIMESTAMP_HEADER, notifications_deliver_due

    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Receiver.responses, _Receiver.received = [500], []
    try:
        model = a_model(engine, tmp_path)
        reference = an_approved_request(engine, model)
        with session_scope(engine) as session:
            recipient = recipient_register(
                session, actor="test", name=f"r-{uuid.uuid4().hex[:6]}", kind="webhook",
                endpoint_url=f"http://127.0.0.1:{server.server_port}/hook", secret="s3cret",
                model_name=model)
            notification_record(session, actor="test", reference=reference,
                                recipient_id=recipient.id, status="pending",
                                next_attempt_at=utcnow())
            recipient_id = recipient.id

        assert notifications_deliver_due() == 0  # the receiver answers 500
        with session_scope(engine) as session:
            notification = session.scalars(select(Notification).where(
                Notification.recipient_id == recipient_id)).one()
            assert (notification.status, notification.attempts, notification.response_code) == (
                "failed", 1, 500)
            assert notification.next_attempt_at > utcnow()  # backing off
            session.execute(update(Notification).where(Notification.id == notification.id)
                            .values(next_attempt_at=utcnow()))

        assert notifications_deliver_due() == 1
        with session_scope(engine) as session:
            notification = session.get_one(Notification, notification.id)
            assert (notification.status, notification.attempts) == ("sent", 2)
            actions = session.scalars(select(AuditEvent.action).where(
                AuditEvent.object_ref == reference, AuditEvent.action.like("notification.%"))
                .order_by(AuditEvent.seq)).all()
            assert actions == ["notification.pending", "notification.failed", "notification.sent"]
    finally:
        server.shutdown()

    headers, body = _Receiver.received[-1]
    expected = hmac.new(b"s3cret", headers[TIMESTAMP_HEADER].encode() + b"." + body,
                        hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == f"sha256={expected}"
    document = json.loads(body)
    assert document["reference"] == reference and document["event"] == "erasure.completed"
    assert "Person" not in body.decode()


# ---------------------------------------------------------------------- re-base


def test_a_job_whose_base_stopped_serving_is_rebased_not_promoted(engine: Any, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from deletion.domain.services.certification import job_certify_and_promote
    from deletion.domain.signing import Signer

    model = a_model(engine, tmp_path)
    job_id = a_job(engine, model)
    other = tmp_path / model / "other"
    other.mkdir()
    (other / "weights.bin").write_bytes(b"promoted by someone else")
    candidate_dir = tmp_path / model / "candidate"
    candidate_dir.mkdir()
    (candidate_dir / "weights.bin").write_bytes(b"candidate")
    with session_scope(engine) as session:
        for current, nxt in (("queued", "building_sets"), ("building_sets", "unlearning"),
                             ("unlearning", "verifying"), ("verifying", "certifying")):
            claim = job_claim(session, job_id=job_id, expected_stage=current, next_stage=nxt)
            assert claim
        job = session.get_one(Job, job_id)
        candidate = registry.checkpoint_register(session, actor="test", model_name=model,
                                                 directory=str(candidate_dir), job_id=job_id)
        moved = registry.checkpoint_register(session, actor="test", model_name=model,
                                             directory=str(other))
        # The serving pointer moves under the job (an operator's action, say).
        job.model.serving_checkpoint_id = moved.id
        job.sets = {"forget": 1}

    with session_scope(engine) as session:
        outcome = job_certify_and_promote(
            session, job_id=job_id, claim=claim, versions={},
            signer=Signer.from_private_key(Ed25519PrivateKey.generate()), actor="test")
        assert outcome.rebased

    with session_scope(engine) as session:
        job = session.get_one(Job, job_id)
        assert (job.stage, job.base_checkpoint_id, job.candidate_checkpoint_id) == (
            "queued", moved.id, None)
        assert job.sets is None
        assert session.get_one(Checkpoint, candidate.id).status == "retired"
        assert session.scalars(select(Certificate)).first() is None
    assert outbox_for(engine, job_id)[-1] == routing.BUILD_SETS
