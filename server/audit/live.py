"""The live disagreement rate of each (model, version, level), with an anytime-valid confidence
sequence (ADR 0024).

The sequence is ville's :class:`ville.BernoulliCS`: the beta-binomial mixture of Howard et al.
(2021), intersected over time, so that with probability at least 1 − δ it holds the true rate at
every moment at once; a dashboard may read it every 15 s, or after every audit, without making
its alerts wrong more often than δ. ville keeps one value per observation (for plots); the subclass
here keeps only the current interval, so a server audited for months holds a few numbers.

The reference an alert compares with is the test split's: per pattern, the Clopper–Pearson upper
bound at 1 − δ of its ``test_disagreement`` over the artifact's test samples (the test split is a
sample too; the bound keeps its noise from reading as drift), averaged over the audited samples.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ville
from scipy.stats import beta


class CurrentCS(ville.BernoulliCS):  # type: ignore[misc]  # ville ships no type hints (Any base)
    """:class:`ville.BernoulliCS` (running intersection on) that keeps only its current interval."""

    def __init__(self, alpha: float) -> None:
        super().__init__(alpha=alpha, intersect=True)

    def update(self, x: Any) -> CurrentCS:
        """Add observations (0 agreed, 1 disagreed); the history is cut to the last interval."""
        super().update(x)
        for history in (self._est, self._lo, self._hi):
            if history:
                history[:] = [history[-1][-1:]]
        return self


def reference_bound(test_disagreement: float, test_samples: int, delta: float) -> float:
    """The Clopper–Pearson upper bound at 1 − ``delta`` of a rate measured on ``test_samples``."""
    k = round(test_disagreement * test_samples)
    if k >= test_samples:
        return 1.0
    return float(beta.ppf(1 - delta, k + 1, test_samples - k))


@dataclass
class LevelAudit:
    """What the audits of one (model, version, level) found."""

    level: float
    cs: CurrentCS
    audited: int = 0
    agreed: int = 0
    reference_sum: float = 0.0  # over audited samples with a reference: their pattern's bound
    referenced: int = 0
    lower: float = 0.0
    upper: float = 1.0

    @property
    def reference(self) -> float | None:
        """The mean test-split bound of the audited samples' patterns (None: none had one)."""
        return self.reference_sum / self.referenced if self.referenced else None


@dataclass(frozen=True)
class LevelView:
    """A snapshot of one :class:`LevelAudit` for the metrics."""

    model: str
    version: str
    level: float
    audited: int
    agreed: int
    lower: float
    upper: float
    reference: float | None


@dataclass
class LiveDisagreement:
    """Every (model, version, level)'s audits; thread-safe (the worker adds, scrapes read)."""

    delta: float
    _levels: dict[tuple[str, str, float], LevelAudit] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, model: str, version: str, level: float, disagreed: np.ndarray,
            reference: float | None) -> LevelAudit:
        """Add one audit's samples (``disagreed``: bool per sample)."""
        x = np.asarray(disagreed, dtype=bool)
        with self._lock:
            entry = self._levels.get((model, version, level))
            if entry is None:
                entry = self._levels[(model, version, level)] = LevelAudit(level, CurrentCS(self.delta))
            if x.size == 0:
                return entry
            entry.cs.update(x.astype(np.float64))
            entry.lower, entry.upper = entry.cs.interval()
            entry.audited += int(x.size)
            entry.agreed += int(x.size - x.sum())
            if reference is not None:
                entry.reference_sum += reference * x.size
                entry.referenced += int(x.size)
            return entry

    def snapshot(self) -> list[LevelView]:
        """Every level audited so far, as it stands."""
        with self._lock:
            return [LevelView(m, v, e.level, e.audited, e.agreed, e.lower, e.upper, e.reference)
                    for (m, v, _), e in sorted(self._levels.items())]
