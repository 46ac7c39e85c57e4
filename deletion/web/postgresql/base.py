"""Django's PostgreSQL backend, health-checking a persistent connection only after it
sat idle.

``CONN_HEALTH_CHECKS`` makes Django send ``SELECT 1`` before the first query of every
request on a reused connection: a round trip per API call (the token look-up is the
API's one Django query), paid under load on a connection last used milliseconds
before.  This wrapper skips that check while the connection was used less than
``PING_AFTER_IDLE`` seconds ago, as the domain engine's pool does
(``deletion.web.domain_session``); a connection that errored is still tested at the
request's end (``close_if_unusable_or_obsolete``), and an idle one before its next use.

It also offers ``prepared_cursor()``: Django binds parameters on the client and never
prepares (so that transaction-mode poolers work), which makes PostgreSQL parse and plan
a statement afresh on every call.  For the API token look-up, run on every API call (a
four-table join), that cost the server about 0.7 ms of CPU a call against 0.1 ms prepared.
A prepared cursor binds on the server and prepares its statement on the connection the
first time, as the domain engine's psycopg connections already do for theirs.
"""
from __future__ import annotations

import math
import time
from typing import Any

from django.db.backends.postgresql import base
from django.db.backends.utils import CursorWrapper
from psycopg import errors

from deletion.web.domain_session import PING_AFTER_IDLE

# Django opens its connections with ``prepare_threshold=None``, under which psycopg
# prepares nothing, not even on request.  The wrapper raises it to this, which psycopg's
# own count never reaches: still nothing is prepared unless a cursor asks.  Its other
# cursors bind on the client, which never prepares.
EXPLICIT_ONLY = 2**62


class PreparedCursor(base.ServerBindingCursor):
    """Server-side binding, every statement prepared (``prepare=True``), results in binary
    (``binary=True``): the token look-up's six times were parsed from text by Django's time
    zone loader, in Python (a loader made per column and result, and a regular expression
    per value); psycopg's binary loaders, in C, give the same aware UTC datetimes (Django
    keeps the connection's zone UTC), and the call 40-50 us less CPU."""

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> Any:
        return super().execute(query, params, prepare=True if prepare is None else prepare,
                               binary=True if binary is None else binary)


class ReusedPreparedCursor(PreparedCursor):
    """The prepared cursor a connection hands out again and again (``prepared_cursor``):
    ``close()`` leaves it open for the next call.  A new psycopg cursor looked its result
    loaders up afresh for every column of the token look-up's 22 on every API call; this one
    keeps them from one call to the next (the same columns, the same types)."""

    def close(self) -> None:
        pass


class DatabaseOperations(base.DatabaseOperations):
    def last_executed_query(self, cursor: Any, sql: str, params: Any) -> str | None:
        # What Django's debug log shows for a prepared cursor's statement: the text with its
        # values written in, as Django composes it under server-side binding.
        if isinstance(cursor, PreparedCursor):
            try:
                return str(self.compose_sql(sql, params))
            except errors.DataError:
                return None
        return super().last_executed_query(cursor, sql, params)  # type: ignore[no-any-return]


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_used = -math.inf
        self._prepared: tuple[Any, ReusedPreparedCursor] | None = None  # (psycopg connection, its cursor)

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        if connection.prepare_threshold is None:
            connection.prepare_threshold = EXPLICIT_ONLY
        return connection

    def _close(self) -> None:
        self._prepared = None  # the cursor goes with its connection
        super()._close()

    def close_if_health_check_failed(self) -> None:
        # Called before every query; Django clears health_check_done when a request starts.
        now = time.monotonic()
        if self.connection is not None and now - self._last_used < PING_AFTER_IDLE:
            self.health_check_done = True
        super().close_if_health_check_failed()
        self._last_used = now

    def prepared_cursor(self) -> CursorWrapper:
        """``cursor()``, but the statements it runs are prepared on this connection (each
        once per connection): for a few fixed statements run on every request.  The
        wrapper is Django's (errors translated, queries logged where Django logs them)."""
        self.close_if_health_check_failed()
        self.ensure_connection()
        with self.wrap_database_errors:
            # One cursor per connection, made again only for a new connection (a cursor is
            # the connection's, and a Django connection is one thread's).
            held = self._prepared
            if held is None or held[0] is not self.connection or held[1].closed:
                cursor = ReusedPreparedCursor(self.connection)
                # As create_cursor does: the connection's time zone on the cursor where they differ.
                tzloader = self.connection.adapters.get_loader(base.TIMESTAMPTZ_OID, base.Format.TEXT)
                if self.timezone != tzloader.timezone:
                    base.register_tzloader(self.timezone, cursor)
                held = self._prepared = (self.connection, cursor)
            return self._prepare_cursor(held[1])
