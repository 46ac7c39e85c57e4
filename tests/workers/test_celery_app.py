"""The Celery app's delivery rules, routing and beat schedule (no worker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers import routing
from workers.beat import SCHEDULE
from workers.celery_app import DeliveryLimits, EagerModeForbidden, make_celery


@pytest.fixture
def app(tmp_path: Path):
    return make_celery(f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}")


def test_unlearning_runs_on_the_gpu_queue_and_everything_else_on_default() -> None:
    assert routing.queue_for(routing.UNLEARN) == "gpu"
    for name in (routing.BUILD_SETS, routing.VERIFY, routing.CERTIFY, routing.PROMOTE,
                 routing.RELAY_OUTBOX, routing.NOTIFY_RECIPIENTS, "erasure.unknown"):
        assert routing.queue_for(name) == "default"
    assert routing.route_task(routing.UNLEARN, (), {}, {})["queue"] == "gpu"


def test_delivery_is_json_only_late_acked_one_at_a_time_and_never_eager(app) -> None:
    conf = app.conf
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_always_eager is False
    assert {q.name for q in conf.task_queues} == {"default", "gpu"}


def test_a_task_asked_to_run_eagerly_is_refused(app) -> None:
    calls = []

    @app.task(name="test.eager")
    def eager_task() -> None:
        calls.append(1)

    app.conf.task_always_eager = True
    with pytest.raises(EagerModeForbidden):
        eager_task.delay()
    with pytest.raises(EagerModeForbidden):
        eager_task.apply()
    assert calls == []


def test_time_limits_stay_below_the_brokers_visibility_timeout() -> None:
    app = make_celery("redis://127.0.0.1:6379/0")
    visibility = app.conf.broker_transport_options["visibility_timeout"]
    assert app.conf.task_soft_time_limit < app.conf.task_time_limit < visibility
    with pytest.raises(ValueError):
        DeliveryLimits(soft_time_limit_s=10, time_limit_s=20, visibility_timeout_s=15)


def test_a_redis_key_prefix_travels_in_the_broker_url() -> None:
    app = make_celery("redis://127.0.0.1:6379/3?key_prefix=tenant-a:")
    assert app.conf.broker_transport_options["global_keyprefix"] == "tenant-a:"
    assert app.conf.broker_read_url == "redis://127.0.0.1:6379/3"
    assert app.conf.broker_write_url == "redis://127.0.0.1:6379/3"


def test_the_sqlalchemy_broker_polls_fast_without_engine_options(app) -> None:
    from kombu.transport import sqlalchemy as sqla_transport

    # Anything in broker_transport_options would reach create_engine and crash the worker.
    assert app.conf.broker_transport_options == {}
    assert sqla_transport.Transport.polling_interval <= 0.1


def test_the_environment_broker_variable_cannot_smuggle_in_another_url(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://elsewhere:6379/0?key_prefix=x:")
    app = make_celery(f"sqla+sqlite:///{tmp_path / 'b.sqlite3'}")
    assert app.conf.broker_read_url.startswith("sqla+sqlite:///")


def test_beat_runs_every_housekeeping_task_each_expiring_within_its_period() -> None:
    tasks = {entry["task"] for entry in SCHEDULE.values()}
    assert tasks == {routing.RELAY_OUTBOX, routing.SCHEDULE_BATCHES, routing.RECONCILE,
                     routing.WATCH_DEADLINES, routing.DESTROY_CHECKPOINTS,
                     routing.PURGE_IDENTIFIERS, routing.NOTIFY_RECIPIENTS,
                     routing.CHECK_SERVING_DIGESTS, routing.EXPORT_CHAIN_HEADS,
                     routing.SWEEP_WORK_FILES, routing.PRUNE_OUTBOX, routing.RESEAL_CIPHERTEXTS,
                     routing.SEAL_AUDIT_CHAIN, routing.CHECK_CHAIN_HEADS,
                     routing.VERIFY_CERTIFICATE_CHAIN}
    for entry in SCHEDULE.values():
        period = entry["schedule"].total_seconds()
        assert 0 < entry["options"]["expires"] <= period
        assert entry["options"]["queue"] == routing.queue_for(entry["task"])
    assert SCHEDULE["relay-outbox"]["schedule"].total_seconds() <= 1.0


def test_every_routed_task_name_is_registered_by_the_worker() -> None:
    from workers.celery_app import app

    app.loader.import_default_modules()  # what a starting worker does: every `include` module

    for name in (*routing.STAGE_TASKS, *(e["task"] for e in SCHEDULE.values())):
        assert name in app.tasks, name


def test_a_redis_channel_whose_connection_was_closed_raises_a_connection_error() -> None:
    """The guard behind the Redis-restart fix (docs/reliability.md): once Celery has
    detached the transport (`client` None), building a Redis client must raise the
    connection error every caller handles, not the AttributeError that killed the worker."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from workers.celery_app import REDIS_TRANSPORT

    app = make_celery(broker_url="redis://127.0.0.1:6379/15")
    assert app.conf.broker_transport == REDIS_TRANSPORT
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        channel._pool = None
        connection.transport.client = None
        with pytest.raises(RedisConnectionError):
            channel._create_client()
