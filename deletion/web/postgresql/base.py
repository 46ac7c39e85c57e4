"""Django's PostgreSQL backend, health-checking a persistent connection only after it
sat idle.

``CONN_HEALTH_CHECKS`` makes Django send ``SELECT 1`` before the first query of every
request on a reused connection: a round trip per API call (the token look-up is the
API's one Django query), paid under load on a connection last used milliseconds
before.  This wrapper skips that check while the connection was used less than
``PING_AFTER_IDLE`` seconds ago, as the domain engine's pool does
(``deletion.web.domain_session``); a connection that errored is still tested at the
request's end (``close_if_unusable_or_obsolete``), and an idle one before its next use.
"""
from __future__ import annotations

import math
import time
from typing import Any

from django.db.backends.postgresql import base

from deletion.web.domain_session import PING_AFTER_IDLE


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_used = -math.inf

    def close_if_health_check_failed(self) -> None:
        # Called before every query; Django clears health_check_done when a request starts.
        now = time.monotonic()
        if self.connection is not None and now - self._last_used < PING_AFTER_IDLE:
            self.health_check_done = True
        super().close_if_health_check_failed()
        self._last_used = now
