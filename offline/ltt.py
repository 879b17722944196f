"""Learn then Test (Angelopoulos, Bates, Candès, Jordan, Lei 2021, arXiv 2110.01052): a ladder of
candidates fixed from the fit samples, then one fixed-sequence test of it on the check samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from qpart.models.metrics import DEFAULT_METRIC, get_metric
from qpart.offline.settings import CalibrationSettings
from qpart.offline.validation import PairedDrop
from qpart.profiles.artifacts import Promise

Bound = Literal["exact", "newcombe"]
REFERENCE = "Learn then Test, Angelopoulos et al. 2021, arXiv 2110.01052"
BOUNDS = {"exact": "exact paired bound (Clopper–Pearson upper on lost, lower on gained, Bonferroni)",
          "newcombe": "Newcombe's paired bound (nominal coverage only, not exact)"}
ONE_SAMPLE = "exact one-sample bound (Clopper–Pearson upper on the share lost; nothing can be gained)"


@dataclass(frozen=True)
class Test:
    """``drop > level`` rejected at ``1 − confidence`` when the upper bound is at most ``level``.

    ``scale_to``: judge counts as if seen on that many samples (the fit samples' forecast of the
    check samples' verdict); None: as counted.
    """

    level: float
    confidence: float
    bound: Bound = "exact"
    scale_to: int | None = None

    def upper(self, n: int, lost: int, gained: int, paired: bool = True) -> float:
        """The bound on ``lost`` and ``gained`` out of ``n`` (scaled when ``scale_to`` is set);
        ``paired``: the metric's (:attr:`qpart.models.metrics.Metric.paired`; false: losses alone)."""
        if self.scale_to is not None and self.scale_to != n:
            r = self.scale_to / n
            n, lost, gained = self.scale_to, round(lost * r), round(gained * r)
        return PairedDrop(n, lost, gained, paired).upper_bound(self.confidence, self.bound)

    def passes(self, d: PairedDrop) -> bool:
        """The verdict on every sample, by the bound ``d``'s metric calls for."""
        return self.upper(d.n, d.lost, d.gained, d.paired) <= self.level


def grid_index(budget: float, steps: int) -> int:
    """The grid point at or below ``budget`` on the grid ``2^(k / steps)``."""
    return math.floor(steps * math.log2(max(budget, 1e-300)) + 1e-9)


def grid_budget(k: int, steps: int) -> float:
    """Budget of grid point ``k``."""
    return float(2.0 ** (k / steps))


def learn(passes: Callable[[int], bool], start: int, steps: int, octaves: int) -> int | None:
    """The highest grid point the search finds passing, from ``start``: up an octave at a time
    while it passes, or down until one does (None if none does within ``octaves``), then
    bisection to half an octave. Adaptive and free to repeat itself: it reads only fit samples."""
    up = passes(start)
    last = start
    for _ in range(octaves):
        k = last + (steps if up else -steps)
        if passes(k) != up:
            lo, hi = (last, k) if up else (k, last)
            return _bisect(passes, lo, hi, max(1, steps // 2))
        last = k
    return last if up else None


def _bisect(passes: Callable[[int], bool], lo: int, hi: int, resolution: int) -> int:
    """The last passing point found between a passing ``lo`` and a failing ``hi``."""
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


def rungs(anchor: int, offsets: Sequence[int]) -> list[int]:
    """Grid points of a ladder, most conservative (smallest budget) first."""
    return sorted({anchor + o for o in offsets})


def fixed_sequence(count: int, passes: Callable[[int], bool]) -> int:
    """Fixed-sequence testing: rungs ``0, 1, ...`` each tested at the full level, in order, until
    the first failure; returns how many passed. The first rung whose drop exceeds the level stops
    the sequence unless it passes by chance (probability at most δ), so every passed rung is
    within its level with probability at least 1 − δ, with no correction for the ladder's length."""
    for i in range(count):
        if not passes(i):
            return i
    return count


def chance(bound: Bound) -> str:
    """How sure a promise backed by ``bound`` is, in words (the exact bound's coverage is exact)."""
    return "at least 1−δ" if bound == "exact" else "about 1−δ (the bound's coverage is nominal, not exact)"


def promise(delta: float, bound: Bound, check_samples: int, ladder: str,
            metric: str = DEFAULT_METRIC) -> str:
    """The sentence a calibration promises (artifact, report, README), in ``metric``'s words."""
    judged = get_metric(metric)
    how = BOUNDS[bound] if judged.paired else ONE_SAMPLE
    sure = chance(bound if judged.paired else "exact")
    return (f"For each pattern, with probability {sure} over the draw of the check samples, its "
            f"{judged.summary} on data from the calibration distribution is at most its level: "
            f"δ = {delta:g}; bound: {how}; {check_samples:,} check samples; ladder: {ladder}; "
            f"fixed-sequence testing ({REFERENCE}).")


def ladder_text(steps: int, offsets: Sequence[int]) -> str:
    """The ladder in words (its grid and rungs)."""
    shown = ", ".join(f"{o:+d}" for o in sorted(set(offsets)))
    return (f"per (cut, level), the distinct patterns the allocation gives at noise budgets {shown} steps "
            f"of 2^(1/{steps}) from the largest budget whose pattern passes the bound on the fit samples "
            "(and, first, at the next lower level's such budget when below them), tested on the check "
            "samples from the smallest budget up until the first failure; the pattern is the one with "
            "the fewest bits among those that passed (none: lossless)")


def make_promise(s: CalibrationSettings) -> Promise:
    """The artifact's promise for a calibration run with these settings."""
    ladder = ladder_text(s.ladder_steps, s.ladder)
    return Promise(statement=promise(s.delta, s.bound, s.check_count, ladder, s.metric), metric=s.metric,
                   delta=s.delta, bound=s.bound, check_samples=s.check_count, ladder=ladder)
