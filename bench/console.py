"""Progress as the benchmarks go: one rich progress bar per long step, a line per result."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console as RichConsole
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class Console:
    """Writes to stderr; ``quiet`` (the smoke test) keeps the terminal clean."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.quiet = quiet
        self._rich = RichConsole(stderr=True, quiet=quiet)
        self._started = time.monotonic()

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self._started
        self._rich.print(f"[dim]{elapsed:7.1f}s[/dim] {message}", highlight=False)

    def section(self, title: str) -> None:
        self._rich.rule(title)

    @contextmanager
    def task(self, label: str) -> Iterator[Callable[[Any], None]]:
        """A progress callback (takes unlearning.progress.Progress) drawing one bar for ``label``."""
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=self._rich, transient=True, disable=self.quiet) as bar:
            task = bar.add_task(label, total=None)

            def callback(progress: Any) -> None:
                bar.update(task, description=f"{label} [{progress.stage}]",
                           completed=progress.step, total=progress.total or None)

            started = time.monotonic()
            yield callback
        self.say(f"{label}: {time.monotonic() - started:.1f} s")
