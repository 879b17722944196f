"""Progress bars for the long commands that show on a terminal and in a log alike.

On a terminal, rich's live bars. Anywhere else (a log file, a Kubernetes pod's log, CI), rich draws
nothing until the bar closes, so a job looks silent for its whole run; there :class:`LineProgress`
prints one plain line per task when the task starts, then at most every ``interval`` seconds and
when it completes: ``label: 120/469 (25.6%) elapsed 0:01:02 ETA 0:03:00``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.progress import Progress

LOG_INTERVAL_S = 10.0
"""Seconds between two lines of one task in a log."""


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


@dataclass
class _Task:
    description: str
    total: float | None
    started: float
    fields: dict[str, Any] = field(default_factory=dict)
    completed: float = 0.0
    printed_at: float | None = None
    finished: bool = False
    """Its completion line is printed (once: later updates are throttled like the others)."""


class LineProgress:
    """The subset of ``rich.progress.Progress`` the commands use, printed as plain lines."""

    def __init__(self, stream: TextIO | None = None, interval: float = LOG_INTERVAL_S) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.tasks: list[_Task] = []

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:  # the command's error line is the last word, not a repeated bar
            return
        for task_id, task in enumerate(self.tasks):
            if task.printed_at is not None and not self._done(task):
                self._print(task_id, time.monotonic())

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        """A new task; its first line is printed at once."""
        self.tasks.append(_Task(description, total, time.monotonic(), dict(fields)))
        task_id = len(self.tasks) - 1
        self._print(task_id, time.monotonic())
        return task_id

    def update(self, task_id: int, *, completed: float | None = None, total: float | None = None,
               description: str | None = None, advance: float | None = None, **fields: Any) -> None:
        """Move a task on; a line is printed if ``interval`` has passed or the task is complete."""
        task = self.tasks[task_id]
        if total is not None:
            task.total = total
        if description is not None:
            task.description = description
        if completed is not None:
            task.completed = completed
        if advance is not None:
            task.completed += advance
        task.fields.update(fields)
        now = time.monotonic()
        finished = self._done(task) and not task.finished
        if finished or task.printed_at is None or now - task.printed_at >= self.interval:
            task.finished = task.finished or finished
            self._print(task_id, now)

    @staticmethod
    def _done(task: _Task) -> bool:
        return task.total is not None and task.completed >= task.total

    def _print(self, task_id: int, now: float) -> None:
        task = self.tasks[task_id]
        elapsed = now - task.started
        if task.total:
            share = min(task.completed / task.total, 1.0)
            eta = _clock(elapsed * (1 - share) / share) if share > 0 else "?"
            text = (f"{task.description}: {task.completed:g}/{task.total:g} ({100 * share:.1f}%) "
                    f"elapsed {_clock(elapsed)} ETA {eta}")
        else:
            text = f"{task.description}: {task.completed:g} elapsed {_clock(elapsed)}"
        extra = " ".join(str(v) for v in task.fields.values() if str(v))
        print(f"{text} {extra}".rstrip(), file=self.stream, flush=True)
        task.printed_at = now


@contextmanager
def progress_bars(*columns: Any, transient: bool = False) -> Iterator[Any]:
    """rich bars with ``columns`` on a terminal, :class:`LineProgress` lines elsewhere."""
    console = Console(stderr=True)
    if console.is_terminal:
        with Progress(*columns, console=console, transient=transient) as bar:
            yield bar
    else:
        with LineProgress() as lines:
            yield lines
