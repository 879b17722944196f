"""Accuracy statistics: paired drops, their one-sided upper bound, and the noise↔drop mapping.

The bound is on the *net* drop ``Δ = P(lost) − P(gained)`` of a pattern against the float model
on the same samples, where "lost" means correct→wrong and "gained" wrong→correct; counting gains
keeps it far tighter than a bound on losses alone. Two methods, with ``n10`` lost and ``n01``
gained out of ``n``:

* ``exact`` (default): Clopper–Pearson upper on ``P(lost)`` and lower on ``P(gained)``, each at
  ``1 − α/2``; ``Δ ≤ UB10 − LB01`` with probability at least ``1 − α`` (Bonferroni). Always
  valid, and 20–40% looser than the next one when gains offset losses.
* ``newcombe``: Newcombe's square-and-add (MOVER) bound for a paired difference, from
  one-sided Wilson score limits of ``P(lost)`` (upper) and ``P(gained)`` (lower), with the
  multinomial correlation of the two cells. Its coverage is nominal, not exact: simulated over
  4,000 draws per setting at n = 6,000 it was 0.947–0.98 for (lost, gained) rates from
  (0.05%, 0%) to (3%, 2%) (``tests/offline/test_validation.py`` re-checks this).
  Not the default: on fmnist-resnet, under the budget search ``offline.ltt`` replaced (the
  largest of several budgets passing on the same samples), 2 of 50 patterns ended over their
  level on the test split, where the exact bound left none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.stats import beta, norm

from qpart.profiles.artifacts import AccuracyPoint


@dataclass(frozen=True)
class PairedDrop:
    """Paired comparison of a pattern with the float model on the same samples."""

    n: int
    lost: int
    gained: int
    paired: bool = True
    """Gains offset losses (a paired bound); false, for a label-free metric whose gains are 0 by
    construction: a one-sample Clopper–Pearson bound on the share lost, at the full confidence."""

    @property
    def drop(self) -> float:
        """Measured net top-1 drop (fraction)."""
        return (self.lost - self.gained) / self.n

    def upper_bound(self, confidence: float, method: str = "exact") -> float:
        """One-sided upper confidence bound of the net drop (see the module doc for methods); a
        one-sample count (not :attr:`paired`) is bounded exactly whatever the method."""
        if not self.paired:
            return _one_sample_upper(self.n, self.lost, confidence)
        if method == "newcombe":
            return self._newcombe(confidence)
        return _exact_upper(self.n, self.lost, self.gained, confidence)

    def _newcombe(self, confidence: float) -> float:
        z = float(norm.ppf(confidence))
        p10, p01 = self.lost / self.n, self.gained / self.n
        up10 = _wilson(self.lost, self.n, z)[1] - p10
        down01 = p01 - _wilson(self.gained, self.n, z)[0]
        # Multinomial cells are negatively correlated; with the minus sign it widens the bound.
        phi = -math.sqrt(p10 * p01 / max((1 - p10) * (1 - p01), 1e-12))
        return p10 - p01 + math.sqrt(max(up10**2 + down01**2 - 2 * phi * up10 * down01, 0.0))


@lru_cache(maxsize=1 << 16)
def _exact_upper(n: int, lost: int, gained: int, confidence: float) -> float:
    """Clopper–Pearson with Bonferroni (module doc); cached, as tests ask for the same counts often."""
    half = (1.0 - confidence) / 2.0
    ub_lost = 1.0 if lost >= n else float(beta.ppf(1 - half, lost + 1, n - lost))
    lb_gained = 0.0 if gained == 0 else float(beta.ppf(half, gained, n - gained + 1))
    return ub_lost - lb_gained


@lru_cache(maxsize=1 << 16)
def _one_sample_upper(n: int, lost: int, confidence: float) -> float:
    """Clopper–Pearson upper bound of a share, one-sided at ``confidence`` (no Bonferroni split:
    only losses are counted)."""
    return 1.0 if lost >= n else float(beta.ppf(confidence, lost + 1, n - lost))


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    p = k / n
    c = z * z / n
    center = (p + c / 2) / (1 + c)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + c)
    return center - half, center + half


def paired_drop(reference_correct: np.ndarray, correct: np.ndarray, paired: bool = True) -> PairedDrop:
    """Count lost and gained samples between two boolean hit vectors (the float model's and a
    pattern's, under one metric: :mod:`qpart.models.metrics`); ``paired``: the metric's."""
    return PairedDrop(
        n=int(reference_correct.size),
        lost=int(np.sum(reference_correct & ~correct)),
        gained=int(np.sum(~reference_correct & correct)),
        paired=paired,
    )


def budget_for_level(points: list[AccuracyPoint], level: float) -> float:
    """Noise budget ``D(a)``, in the units the allocation sums (the tables' predicted noise).

    The measured points give a monotone upper envelope of drop against predicted noise; ``D(a)``
    is the predicted noise of the last point before the envelope first exceeds ``a``. Below the
    smallest point the budget is that point's noise scaled down in proportion to the level.
    """
    ordered = sorted(points, key=lambda p: p.predicted_noise)
    budget = 0.0
    for p in ordered:
        if p.drop > level:
            break
        budget = p.predicted_noise
    if budget == 0.0 and ordered:
        first = ordered[0]
        budget = first.predicted_noise * level / max(first.drop, level) * 0.5
    return budget


def predicted_drop(points: list[AccuracyPoint], noise: float) -> float:
    """Drop predicted for a pattern's predicted noise by the monotone envelope of the points."""
    ordered = sorted(points, key=lambda p: p.predicted_noise)
    envelope = np.maximum.accumulate([max(p.drop, 0.0) for p in ordered])
    xs = [p.predicted_noise for p in ordered]
    if not xs or noise <= 0:
        return 0.0
    return float(np.interp(noise, [0.0, *xs], [0.0, *envelope]))
