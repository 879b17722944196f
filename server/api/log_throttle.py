"""Rate-limited warnings: a logging filter that lets a few of each warning through per interval and
counts the rest, so that a client sending malformed requests cannot fill the log.

uvicorn's protocol writes one warning per malformed request ("Invalid HTTP request received.",
"Unsupported upgrade request."); any client can send those as fast as it likes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

WARNINGS_PER_INTERVAL = 10
INTERVAL_S = 60.0
_MAX_KEYS = 256  # distinct warning templates tracked; a flood of new ones shares one budget


@dataclass
class _Window:
    started: float
    passed: int = 0
    suppressed: int = 0


class WarningThrottle(logging.Filter):
    """Passes at most ``per_interval`` records of each warning (by its unformatted message) per
    ``interval_s``; the last one passed says that more are counted, and the first one passed
    after some were dropped says how many (a count waits for the next such warning).
    Errors and above always pass: they are the server's own faults, not a client's noise."""

    def __init__(self, per_interval: int = WARNINGS_PER_INTERVAL, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.per_interval = per_interval
        self.interval_s = interval_s
        self._clock = clock
        self._windows: dict[str, _Window] = {}

    def _window(self, key: str, now: float) -> _Window:
        if key not in self._windows and len(self._windows) >= _MAX_KEYS:
            key = ""  # past the cap, every new template shares one window
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window(now)
        return window

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        now = self._clock()
        window = self._window(str(record.msg), now)
        notes = []
        if now - window.started >= self.interval_s:
            if window.suppressed:
                notes.append(f"{window.suppressed} more like it suppressed since the last one logged")
            window.started, window.passed, window.suppressed = now, 0, 0
        if window.passed >= self.per_interval:
            window.suppressed += 1
            return False
        window.passed += 1
        if window.passed == self.per_interval:
            notes.append(f"{self.per_interval} like it in {self.interval_s:g} s: more are counted, "
                         "not logged")
        if notes:
            record.msg = f"{record.getMessage()} ({'; '.join(notes)})"
            record.args = None
        return True


def throttle_warnings(logger: logging.Logger, per_interval: int = WARNINGS_PER_INTERVAL,
                      interval_s: float = INTERVAL_S) -> WarningThrottle:
    """Put a :class:`WarningThrottle` on ``logger`` (once: an existing one is returned)."""
    for existing in logger.filters:
        if isinstance(existing, WarningThrottle):
            return existing
    throttle = WarningThrottle(per_interval, interval_s)
    logger.addFilter(throttle)
    return throttle
