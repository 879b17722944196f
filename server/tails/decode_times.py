"""What decoding an uploaded activation packet costs this server: its Content-Encoding undone and
its codes dequantized, per sample, by model version, cut and coding.

That work is server time (answers count it in ``compute_s``), so a packet plan is priced with it
beside the tail's. A timing loop says 30-40 us for a cut-0 packet here; served requests, which
find the caches cold after the device's own work, took 0.18-0.27 ms (fmnist-cnn and
fmnist-mobilenet; the medians of ``Server-Timing: decode`` in a quick ``bench.e2e`` grid, not
committed), 12-16% of fmnist-cnn's cut-0 tail price in that grid (1.51 ms). So, as the image
plans' decoding is priced from served images (:class:`server.planning.images.ImageTimes`), the price is
what lone requests (one sample each, as a device sends) took: the median of the last
:data:`WINDOW` samples of a (cut, coding) once there are :data:`LEAST` and while its newest is at
most :data:`STALE_AFTER_S` old, else the median of the model version's last :data:`WINDOW` samples
of any cut and coding that are at most :data:`STALE_AFTER_S` old (at least :data:`LEAST` of them),
else 0 (the first requests teach it). The lapse is there for a price set too high (a few stalls):
the planner stops choosing that cut and coding, so no new sample would correct it (and where it
stops choosing packets at all, none would correct the pooled price either); a (cut, coding)'s
first sample after a lapse starts its window afresh, as the tails' own prices do
(:mod:`server.tails.tail_times`). Batches of several samples decode at another per-sample cost and are
not counted.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from qpart.server.tails.content import IDENTITY

WINDOW = 9
LEAST = 3
STALE_AFTER_S = 300.0  # a (cut, coding)'s own price lapses this long after its newest sample
MAX_SAMPLE_S = 0.01  # a sample counts at most this (served cut-0 packets took 0.18-0.27 ms here)


@dataclass
class _Model:
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))  # (clock, s)
    own: dict[tuple[int, str], deque[float]] = field(default_factory=dict)
    last: dict[tuple[int, str], float] = field(default_factory=dict)  # the clock at each key's newest

    def fresh(self, key: tuple[int, str], now: float) -> bool:
        return key in self.last and now - self.last[key] <= STALE_AFTER_S

    def price(self, cut: int, coding: str, now: float) -> float:
        seen = self.own.get((cut, coding))
        if seen is not None and len(seen) >= LEAST and self.fresh((cut, coding), now):
            return statistics.median(seen)
        pooled = [s for t, s in self.recent if now - t <= STALE_AFTER_S]
        return statistics.median(pooled) if len(pooled) >= LEAST else 0.0


@dataclass
class DecodeTimes:
    """Per model version: the served packets' decoding seconds per sample, by cut and coding."""

    clock: Callable[[], float] = time.monotonic  # seconds; a (cut, coding)'s own price lapses by it
    _models: dict[tuple[str, str], _Model] = field(default_factory=dict)

    def observe(self, name: str, version: str, cut: int, coding: str, seconds: float, samples: int) -> None:
        """A served packet of ``samples`` samples at ``cut``, sent in ``coding``, took ``seconds``
        to decode; only lone samples count."""
        if samples != 1:
            return
        entry = self._models.setdefault((name, version), _Model())
        each, key, now = min(MAX_SAMPLE_S, max(0.0, seconds)), (cut, coding), self.clock()
        own = entry.own.setdefault(key, deque(maxlen=WINDOW))
        if not entry.fresh(key, now):
            own.clear()  # lapsed (or new): its old samples price it no more
        own.append(each)
        entry.last[key] = now
        entry.recent.append((now, each))

    def seconds(self, name: str, version: str, cuts: int, coding: str = IDENTITY) -> list[float]:
        """Per cut of the model version's ``cuts``, the decoding price of one sample sent in
        ``coding`` (all 0 before any sample; the last cut, which uploads nothing, is 0)."""
        entry, now = self._models.get((name, version), _Model()), self.clock()
        return [entry.price(cut, coding, now) if cut < cuts - 1 else 0.0 for cut in range(cuts)]

    def prices(self, name: str, version: str, cuts: int, codings: Iterable[str]) -> dict[str, list[float]]:
        """:meth:`seconds` for identity and each of ``codings``, keyed by coding."""
        return {c: self.seconds(name, version, cuts, c) for c in dict.fromkeys([IDENTITY, *codings])}
