"""Which failures a task retries, and how long it waits (shared by every task module)."""

from __future__ import annotations

import errno
import random

from sqlalchemy.exc import OperationalError

# Errno values of an OSError worth retrying in a few seconds: the network, a busy or
# full disk, an exhausted process table.  Everything else (ENOENT, EACCES, EROFS,
# EISDIR, ENOTDIR, ELOOP, EINVAL, ...) fails the same way on every retry.
TRANSIENT_ERRNOS = frozenset({
    errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT, errno.ECONNRESET,
    errno.ECONNREFUSED, errno.ECONNABORTED, errno.EHOSTUNREACH, errno.ENETUNREACH,
    errno.ENETDOWN, errno.ENETRESET, errno.EPIPE, errno.ESTALE, errno.ENOSPC, errno.EDQUOT,
    errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS,
})
# What the periodic tasks let Celery retry (each is idempotent, and the next tick comes anyway).
PERIODIC_TRANSIENT: tuple[type[BaseException], ...] = (OperationalError, ConnectionError,
                                                       TimeoutError)
MAX_RETRIES = 5
BACKOFF_BASE_S = 5.0
BACKOFF_MAX_S = 300.0


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same task in a few seconds can succeed."""
    if isinstance(exc, OperationalError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, OSError):
        return exc.errno in TRANSIENT_ERRNOS
    return False


def backoff_seconds(retries: int) -> float:
    """Exponential backoff with full jitter, so crashed neighbours do not retry in step."""
    return random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**retries))
