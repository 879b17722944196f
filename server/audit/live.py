"""The live disagreement rate of each (model, version, level), with anytime-valid confidence
sequences over consecutive windows of audited samples (ADR 0024).

Each window's sequence is ville's :class:`ville.BernoulliCS`: the beta-binomial mixture of Howard
et al. (2021), intersected over time, so that with probability at least 1 − α it holds the window's
true rate at every moment at once; a dashboard may read it every 15 s, or after every audit, without
making an alert wrong more often. ville keeps one value per observation (for plots); the subclass
here keeps only the current interval, so a server audited for months holds a few numbers.

**Windows.** One sequence since the server started would take ever longer to notice a change: after
n samples at a rate under the level, a jump above it shows only once the jump outweighs them (about
n · (level − before) / (after − level) samples). So a sequence covers ``window`` audited samples
(QPART_AUDIT_WINDOW) and the next starts afresh; window k spends α_k = δ · 6 / (π² k²) of the error
budget (Σ α_k = δ, so over every window and every moment, the chance that any sequence ever
excludes its window's rate stays at most δ). The last complete window's final interval is kept
beside the current one: an alert on either does not clear at a window's start, only after a whole
window without the evidence.

The reference an alert compares with is the test split's: per pattern, the Clopper–Pearson upper
bound at 1 − δ of its ``test_disagreement`` over the artifact's test samples (the test split is a
sample too; the bound keeps its noise from reading as drift), averaged over the audited samples.
"""

from __future__ import annotations

import functools
import math
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


def window_alpha(delta: float, k: int) -> float:
    """The error window ``k`` (1, 2, ...) spends: δ · 6 / (π² k²), which sum to δ."""
    return delta * 6 / (math.pi**2 * k * k)


@functools.lru_cache(maxsize=4096)  # once per pattern: every consenting plan asks
def reference_bound(test_disagreement: float, test_samples: int, delta: float) -> float:
    """The Clopper–Pearson upper bound at 1 − ``delta`` of a rate measured on ``test_samples``."""
    k = round(test_disagreement * test_samples)
    if k >= test_samples:
        return 1.0
    return float(beta.ppf(1 - delta, k + 1, test_samples - k))


@dataclass(frozen=True)
class Interval:
    """A window's confidence interval on the disagreement rate, after ``samples`` of it."""

    lower: float
    upper: float
    samples: int


@dataclass
class LevelAudit:
    """What the audits of one (model, version, level) found."""

    level: float
    delta: float
    window: int  # audited samples per window
    promised: bool = False  # the level bounds the disagreement itself (top1-agreement)
    audited: int = 0
    agreed: int = 0
    reference_sum: float = 0.0  # over audited samples with a reference: their pattern's bound
    referenced: int = 0
    k: int = 1  # the current window's number
    current: Interval = Interval(0.0, 1.0, 0)
    previous: Interval | None = None  # the last complete window's final interval
    cs: CurrentCS = field(init=False)

    def __post_init__(self) -> None:
        self.cs = CurrentCS(window_alpha(self.delta, self.k))

    @property
    def reference(self) -> float | None:
        """The mean test-split bound of the audited samples' patterns (None: none had one)."""
        return self.reference_sum / self.referenced if self.referenced else None

    def add(self, x: np.ndarray) -> None:
        """Add samples (bool: disagreed), closing windows as they fill."""
        while x.size:
            take = x[: self.window - self.current.samples]
            x = x[take.size :]
            self.cs.update(take.astype(np.float64))
            lower, upper = self.cs.interval()
            self.current = Interval(lower, upper, self.current.samples + take.size)
            if self.current.samples == self.window:
                self.previous, self.k = self.current, self.k + 1
                self.current, self.cs = Interval(0.0, 1.0, 0), CurrentCS(window_alpha(self.delta, self.k))


@dataclass(frozen=True)
class LevelView:
    """A snapshot of one :class:`LevelAudit` for the metrics."""

    model: str
    version: str
    level: float
    audited: int
    agreed: int
    window: int  # the current window's number
    current: Interval
    previous: Interval | None
    reference: float | None
    promised: bool


@dataclass
class LiveDisagreement:
    """Every (model, version, level)'s audits; thread-safe (the worker adds, scrapes read)."""

    delta: float
    window: int = 10_000
    _levels: dict[tuple[str, str, float], LevelAudit] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, model: str, version: str, level: float, disagreed: np.ndarray,
            reference: float | None, *, promised: bool = False) -> LevelAudit:
        """Add one audit's samples (``disagreed``: bool per sample)."""
        x = np.asarray(disagreed, dtype=bool).ravel()
        with self._lock:
            entry = self._levels.get((model, version, level))
            if entry is None:
                entry = self._levels[(model, version, level)] = LevelAudit(level, self.delta, self.window,
                                                                           promised)
            entry.add(x)
            entry.audited += int(x.size)
            entry.agreed += int(x.size - x.sum())
            if reference is not None:
                entry.reference_sum += reference * x.size
                entry.referenced += int(x.size)
            return entry

    def snapshot(self) -> list[LevelView]:
        """Every level audited so far, as it stands."""
        with self._lock:
            return [LevelView(m, v, e.level, e.audited, e.agreed, e.k, e.current, e.previous, e.reference,
                              e.promised) for (m, v, _), e in sorted(self._levels.items())]
