"""Progress reporting for long engine calls.

The library never prints: every long call takes an optional callback that
receives a `Progress`.  The CLI turns those into a progress bar
(`progress_bar`), the workers into `job_progress` rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    """One progress report: `step` of `total` done in `stage`, ETA in seconds when known."""

    stage: str
    step: int
    total: int
    eta_seconds: float | None = None

    @property
    def fraction(self) -> float:
        return 0.0 if self.total <= 0 else min(1.0, self.step / self.total)


ProgressCallback = Callable[[Progress], None]


class ProgressTracker:
    """Computes ETAs from wall time and forwards reports to an optional callback.

    A linear ETA is enough here: training and unlearning steps cost about the
    same each, and the caller reports often.
    """

    def __init__(self, callback: ProgressCallback | None, *, stage: str, total: int) -> None:
        self.callback = callback
        self.stage = stage
        self.total = total
        self._started = time.monotonic()

    def report(self, step: int, *, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        if self.callback is None:
            return
        elapsed = time.monotonic() - self._started
        eta = None
        if step > 0 and self.total > 0:
            eta = max(0.0, elapsed / step * (self.total - step))
        self.callback(Progress(stage=self.stage, step=step, total=self.total, eta_seconds=eta))


@contextmanager
def progress_bar(*, enabled: bool = True) -> Iterator[ProgressCallback]:
    """A callback that drives one tqdm bar per stage on stderr (for the CLI only)."""
    import sys

    from tqdm import tqdm

    bars: dict[str, tqdm] = {}
    # On a terminal the bar redraws in place; in a log file every redraw is a new
    # chunk of text, so draw at most every 10 s there.
    interval = 0.1 if sys.stderr.isatty() else 10.0

    def callback(progress: Progress) -> None:
        if not enabled:
            return
        bar = bars.get(progress.stage)
        if bar is None:
            for other in bars.values():
                other.close()
            bar = bars[progress.stage] = tqdm(
                total=progress.total, desc=progress.stage, unit="step", leave=True,
                mininterval=interval,
            )
        if bar.total != progress.total:
            bar.total = progress.total
        bar.update(progress.step - bar.n)  # update() honours mininterval; refresh() would not

    try:
        yield callback
    finally:
        for bar in bars.values():
            bar.close()
