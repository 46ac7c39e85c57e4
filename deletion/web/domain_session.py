"""The web's one door into the domain database: a SQLAlchemy session per unit of work,
on the same DATABASE_URL as Django's own tables."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from deletion.domain.db import make_engine, session_scope

# A pooled connection is pinged before use only after sitting idle this long: under load
# every request reuses one returned milliseconds ago, and pinging it cost a round trip.
PING_AFTER_IDLE = 5.0
_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def domain_engine() -> Engine:
    # Keyed by URL so that tests which point DOMAIN_DATABASE_URL at a fresh database
    # get a fresh engine, and the process otherwise reuses one connection pool.
    url = settings.DOMAIN_DATABASE_URL
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = make_engine(url, ping_after_idle=PING_AFTER_IDLE)
        return engine


@contextmanager
def domain_session() -> Iterator[Session]:
    """Commit on success, roll back on any exception (which then propagates)."""
    with session_scope(domain_engine()) as session:
        yield session
