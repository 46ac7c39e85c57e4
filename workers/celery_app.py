"""The Celery application: one place for broker, serialisation and delivery rules.

Production uses Redis; the embedded default uses kombu's server-less
`sqla+sqlite://` (or `filesystem://`) transport with a real worker process.
Eager mode is refused outright: a task that runs inside the caller would skip
the broker, the claims and the time limits that the pipeline relies on.

    celery -A workers.celery_app worker -Q default,gpu
    celery -A workers.celery_app beat
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from celery import Celery, Task
from kombu.transport import redis as redis_transport
from redis.exceptions import ConnectionError as RedisConnectionError

from workers import routing

log = logging.getLogger(__name__)

# kombu's virtual transports poll; 1 s by default makes each stage hand-over
# cost a second.  The SQLAlchemy transport passes every broker_transport_options
# entry to create_engine (polling_interval there crashes the worker), so the
# interval is set on the transport classes instead.
EMBEDDED_POLLING_SECONDS = 0.1


@dataclass(frozen=True)
class DeliveryLimits:
    """Time limits stay below the broker's visibility timeout, or Redis would
    hand a still-running task to a second worker."""

    soft_time_limit_s: int = 10_200
    time_limit_s: int = 10_800
    visibility_timeout_s: int = 12_600

    def __post_init__(self) -> None:
        if not self.soft_time_limit_s < self.time_limit_s < self.visibility_timeout_s:
            raise ValueError("need soft_time_limit < time_limit < visibility_timeout")


class _ClosedTransportChannel(redis_transport.Channel):
    """kombu's Redis channel, raising a connection error (not AttributeError) once the
    kombu connection that owned it has been closed.

    Why: when Redis goes away while the worker holds an acks-late task, Celery's
    consumer calls `connection.collect()` (which detaches the transport: its `client`
    becomes None) and then `connection.close()`, which closes the default channel and
    restores its unacked message; the restore builds a fresh Redis pool from
    `self.connection.client.hostname` and dies with AttributeError, which none of the
    callers expect, so the whole worker exits ("Unrecoverable error") (celery/kombu
    5.7).  A connection error is what every caller on that path already handles
    (`maybe_close_channel`, `ignore_errors`, `Message.ack_log_error`): the consumer
    reconnects and the running task goes on.  The message is not lost: its unacked
    copy stays in Redis (restored after the visibility timeout), or, when Redis came
    back empty, the database's claims and the outbox relay carry the job on.
    """

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or getattr(transport, "client", None) is None:
            raise RedisConnectionError("the kombu connection of this channel is closed")
        params: dict[str, Any] = super()._connparams(  # type: ignore[no-untyped-call]
            asynchronous=asynchronous)
        return params


class ClosedTransportSafeRedisTransport(redis_transport.Transport):
    """kombu's Redis transport with `_ClosedTransportChannel` (see there why)."""

    Channel = _ClosedTransportChannel


REDIS_TRANSPORT = f"{__name__}:ClosedTransportSafeRedisTransport"


class EagerModeForbidden(RuntimeError):
    """Raised when anything asks Celery to run a task inside the caller."""


class PipelineTask(Task):  # type: ignore[misc]
    """Base task: refuses eager execution (Task.apply is what eager mode calls)."""

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        raise EagerModeForbidden(
            f"task {self.name} asked to run eagerly; the pipeline runs only on a real worker"
        )


def is_embedded_broker(url: str) -> bool:
    return url.startswith(("sqla+", "sqlalchemy+", "filesystem:"))


def _split_key_prefix(url: str) -> tuple[str, str | None]:
    """`redis://host/0?key_prefix=p:` -> the URL without it, and the prefix.

    A key prefix lets several deployments (or test runs) share one Redis
    without taking each other's tasks; it travels inside CELERY_BROKER_URL so
    that every process of a deployment gets the same one.
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = next((v for k, v in query if k == "key_prefix"), None)
    rest = urlencode([(k, v) for k, v in query if k != "key_prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix


def _transport_options(broker_url: str, limits: DeliveryLimits) -> dict[str, Any]:
    if broker_url.startswith(("redis:", "rediss:")):
        options: dict[str, Any] = {"visibility_timeout": limits.visibility_timeout_s}
        prefix = _split_key_prefix(broker_url)[1]
        if prefix:
            options["global_keyprefix"] = prefix
        return options
    if broker_url.startswith("filesystem:"):
        folder = Path(broker_url.removeprefix("filesystem://") or "var/broker")
        (folder / "processed").mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
            "polling_interval": EMBEDDED_POLLING_SECONDS,
        }
    # SQLAlchemy transport: options go to create_engine, so none here.
    return {}


def _set_embedded_polling() -> None:
    from kombu.transport import sqlalchemy as sqla_transport

    sqla_transport.Transport.polling_interval = EMBEDDED_POLLING_SECONDS


def _broker_url_for_kombu(url: str) -> str:
    # kombu wants `filesystem://` with the folder in transport options.
    if url.startswith("filesystem:"):
        return "filesystem://"
    if url.startswith(("redis:", "rediss:")):
        return _split_key_prefix(url)[0]
    return url


def make_celery(broker_url: str, *, limits: DeliveryLimits | None = None) -> Celery:
    """Build the app for `broker_url`; no result backend (results live in the database)."""
    limits = limits or DeliveryLimits()
    if is_embedded_broker(broker_url):
        _set_embedded_polling()
    if broker_url.startswith("sqla+sqlite:///"):
        Path(broker_url.removeprefix("sqla+sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    kombu_url = _broker_url_for_kombu(broker_url)
    app = Celery("erasure", broker=kombu_url, task_cls=PipelineTask)
    app.conf.update(
        # Celery lets the CELERY_BROKER_URL variable override `broker`; the read and
        # write URLs take precedence over it, so the cleaned URL is the one used.
        broker_read_url=kombu_url,
        broker_write_url=kombu_url,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=limits.soft_time_limit_s,
        task_time_limit=limits.time_limit_s,
        broker_transport_options=_transport_options(broker_url, limits),
        # `rediss:` keeps kombu's own transport: naming one explicitly would skip
        # kombu's check that TLS is configured for it.
        broker_transport=REDIS_TRANSPORT if broker_url.startswith("redis:") else None,
        broker_connection_retry_on_startup=True,
        task_queues=routing.TASK_QUEUES,
        task_default_queue=routing.DEFAULT_QUEUE,
        task_default_exchange=routing.DEFAULT_QUEUE,
        task_default_routing_key=routing.DEFAULT_QUEUE,
        task_routes=(routing.route_task,),
        task_always_eager=False,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        enable_utc=True,
        timezone="UTC",
        include=["workers.tasks", "workers.integrity_tasks", "workers.scan"],
    )
    from workers.beat import SCHEDULE

    app.conf.beat_schedule = SCHEDULE
    return app


def _configured_broker_url() -> str:
    # The broker URL only: beat (and `celery inspect`) then start without any key or
    # database setting; task bodies load the rest of the settings when they run.
    from deletion.domain.config import broker_url

    return broker_url()


app = make_celery(_configured_broker_url())
