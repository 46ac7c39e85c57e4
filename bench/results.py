"""The results tree every family writes into, and the rule for what could not be measured."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

NOT_MEASURED = "not_measured"


def not_measured(reason: str) -> dict[str, str]:
    """The one shape of a figure that is missing; report.py prints it as "not measured: reason"."""
    return {NOT_MEASURED: reason}


def is_missing(value: Any) -> bool:
    return isinstance(value, dict) and NOT_MEASURED in value


def measure(target: MutableMapping[str, Any], key: str, fn: Callable[[], Any]) -> Any:
    """Store ``fn()`` under ``key``, or why it could not run.

    A benchmark harness must survive a missing or broken piece of another
    layer and still write every other figure; so this is the one place that
    catches any exception, logs it with its traceback and records the reason.
    """
    started = time.perf_counter()
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - recorded as "not measured", see docstring
        logger.exception("%s could not be measured", key)
        value = not_measured(f"{type(exc).__name__}: {exc}".strip()[:400])
    target[key] = value
    logger.info("%s done in %.1f s", key, time.perf_counter() - started)
    return value


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """``with stopwatch() as elapsed: ...; elapsed()`` - seconds since entry (perf_counter)."""
    started = time.perf_counter()
    yield lambda: time.perf_counter() - started
