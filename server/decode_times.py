"""What decoding an uploaded activation packet costs this server: its Content-Encoding undone and
its codes dequantized, per sample, by model version, cut and coding.

That work is server time (answers count it in ``compute_s``), so a packet plan is priced with it
beside the tail's. A timing loop says 30-40 us for a cut-0 packet here; served requests, which
find the caches cold after the device's own work, took 0.18-0.25 ms (a quick ``bench.e2e`` grid's
medians, ``Server-Timing: decode``), 12-16% of fmnist-cnn's 1.5 ms cut-0 tail. So, as the image
plans' decoding is (:class:`server.images.ImageTimes`), the price is what served requests took:
the median of the last :data:`WINDOW` samples of a (cut, coding) once there are :data:`LEAST`, else
the median of the model version's last :data:`WINDOW` samples of any cut and coding, else 0 (the
first requests teach it). Each sample is counted at most :data:`MAX_SAMPLE_S`, so that one stall
cannot price a coding out.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from qpart.server.content import IDENTITY

WINDOW = 9
LEAST = 3
MAX_SAMPLE_S = 0.01  # a sample's most (ten times the slowest decoding the grid saw per sample)


@dataclass
class _Model:
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    own: dict[tuple[int, str], deque[float]] = field(default_factory=dict)

    def price(self, cut: int, coding: str) -> float:
        seen = self.own.get((cut, coding))
        if seen is not None and len(seen) >= LEAST:
            return statistics.median(seen)
        return statistics.median(self.recent) if len(self.recent) >= LEAST else 0.0


@dataclass
class DecodeTimes:
    """Per model version: the served packets' decoding seconds per sample, by cut and coding."""

    _models: dict[tuple[str, str], _Model] = field(default_factory=dict)

    def observe(self, name: str, version: str, cut: int, coding: str, seconds: float, samples: int) -> None:
        """A served packet of ``samples`` samples at ``cut``, sent in ``coding``, took ``seconds``
        to decode."""
        if samples < 1:
            return
        entry = self._models.setdefault((name, version), _Model())
        each = min(MAX_SAMPLE_S, max(0.0, seconds / samples))
        entry.recent.append(each)
        entry.own.setdefault((cut, coding), deque(maxlen=WINDOW)).append(each)

    def seconds(self, name: str, version: str, cuts: int, coding: str = IDENTITY) -> list[float]:
        """Per cut of the model version's ``cuts``, the decoding price of one sample sent in
        ``coding`` (all 0 before any sample; the last cut, which uploads nothing, is 0)."""
        entry = self._models.get((name, version), _Model())
        return [entry.price(cut, coding) if cut < cuts - 1 else 0.0 for cut in range(cuts)]

    def prices(self, name: str, version: str, cuts: int, codings: Iterable[str]) -> dict[str, list[float]]:
        """:meth:`seconds` for identity and each of ``codings``, keyed by coding."""
        return {c: self.seconds(name, version, cuts, c) for c in dict.fromkeys([IDENTITY, *codings])}
