"""Monte Carlo of the promise: how often the chosen pattern's true drop exceeds its level, for the
Learn-then-Test selection and for the budget search it replaced. ``python -m tests.offline.ltt_sim``
prints the table."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from qpart.offline import selection
from qpart.offline.ltt import Test, grid_budget, grid_index
from qpart.offline.settings import CalibrationSettings
from qpart.offline.validation import PairedDrop

STEPS, OCTAVES = 4, 14  # the job's defaults (ladder_steps, search_octaves and the old max_tightenings)
N_FIT, N_CHECK = 4000, 6000
SPAN = range(-90, 70)  # rungs simulated, in grid steps from the crossing


@dataclass(frozen=True)
class Setting:
    """Synthetic rungs: at grid step ``k`` from the crossing, lost and gained rates ``(lost, gained)
    · u(k)`` with ``u = 2^(k / growth)``; ``lost − gained`` is the level at ``k = 0``, so the true
    drops straddle it, the nearest within a few percent of it (the hardest case for a test).
    ``plateau``: ``u`` stays at 1.01 for that many steps past the crossing (a drop flat just over
    the level). ``start``: where D(a), the first budget either procedure tries, falls."""

    name: str
    level: float
    lost: float
    gained: float
    start: int = 4
    plateau: int = 0
    growth: int = 16

    def scale(self) -> np.ndarray:
        k = np.array(SPAN, dtype=float)
        u = 2.0 ** (k / self.growth)
        if self.plateau:
            above = 1.01 * 2.0 ** ((k - self.plateau) / self.growth)
            u = np.where((k > 0) & (k <= self.plateau), 1.01, np.where(k > self.plateau, above, u))
        return u

    def rates(self) -> tuple[np.ndarray, np.ndarray]:
        u = self.scale()
        return np.minimum(self.lost * u, 0.6), np.minimum(self.gained * u, 0.3)

    def drops(self) -> np.ndarray:
        lost, gained = self.rates()
        return lost - gained


SETTINGS = (
    Setting("no gains, 1%", 0.01, 0.01, 0.0),
    Setting("some gains, 1%", 0.01, 0.013, 0.003),
    Setting("high churn, 1%", 0.01, 0.02, 0.01),
    Setting("0.1% level", 0.001, 0.0012, 0.0002),
    Setting("steep (drop doubles an octave), 1%", 0.01, 0.013, 0.003, growth=4),
    Setting("plateau just over 1% for 4 octaves", 0.01, 0.01, 0.0, start=16, plateau=16),
)
AGREEMENT = (
    Setting("flips, 1%", 0.01, 0.01, 0.0),
    Setting("flips, 0.1%", 0.001, 0.001, 0.0),
    Setting("flips, steep (double an octave), 1%", 0.01, 0.01, 0.0, growth=4),
    Setting("flips on a plateau just over 1% for 4 octaves", 0.01, 0.01, 0.0, start=16, plateau=16),
)
"""The settings of the top1-agreement metric: a pattern only loses (changes a top-1), never gains."""


def draw(setting: Setting, n: int, reps: int, nested: bool, rng: np.random.Generator) -> np.ndarray:
    """``[reps, rungs, 2]`` lost and gained counts. Nested: one uniform per sample, lost below the
    lost rate and gained above ``1 − gained rate``, so a rung's flips include the smaller rungs'
    (neighbouring patterns flip mostly the same samples); else each rung drawn on its own."""
    lost, gained = setting.rates()
    if not nested:
        p = np.stack([lost, gained, 1 - lost - gained], axis=1)
        return np.stack([rng.multinomial(n, row, size=reps)[:, :2] for row in p], axis=1)
    edges = np.concatenate([[0.0], np.maximum.accumulate(lost)])
    tops = np.concatenate([[0.0], np.maximum.accumulate(gained)])
    cells = np.concatenate([np.diff(edges), np.diff(tops)])
    counts = rng.multinomial(n, [*cells, 1 - cells.sum()], size=reps)
    k = len(lost)
    return np.stack([counts[:, :k].cumsum(1), counts[:, k:2 * k].cumsum(1)], axis=2)


class SyntheticState:
    """What :func:`offline.selection.select` reads of the job's state, over synthetic rungs: one
    distinct pattern per grid step ``k`` (``{"k": k, "w": 1}``: never lossless), fewer bits at
    larger budgets, and each pattern's counts on the fit or check samples drawn beforehand. It
    records which sample set each evaluation read, in order."""

    def __init__(self, settings: CalibrationSettings, offset: int, rungs_count: int) -> None:
        self.settings = settings
        self.items: dict[int, list[object]] = {0: []}
        self.data = SimpleNamespace(fit="fit", check="check", fit_ref=None, check_ref=None)
        self.fit_cache: dict[str, PairedDrop] = {}
        self.check_cache: dict[str, PairedDrop] = {}
        self.offset, self.last = offset, rungs_count - 1
        self.counts: dict[str, np.ndarray] = {}
        self.reads: list[tuple[str, int]] = []

    def draw(self, fit: np.ndarray, check: np.ndarray) -> None:
        """The next repetition: fresh samples, empty caches."""
        self.counts = {"fit": fit, "check": check}
        self.fit_cache.clear()
        self.check_cache.clear()
        self.reads.clear()

    def evaluate(self, _st: object, _cut: int, bits: dict[str, int], ds: str, _ref: object,
                 _cache: object) -> PairedDrop:
        k = bits["k"]
        self.reads.append((ds, k))
        row = self.counts[ds][min(max(k + self.offset, 0), self.last)]
        return PairedDrop(N_FIT if ds == "fit" else N_CHECK, int(row[0]), int(row[1]), self.settings.paired)


@contextmanager
def synthetic(sim: SyntheticState) -> Iterator[None]:
    """:mod:`offline.selection` on ``sim``'s rungs: the allocation gives grid step ``k`` at budget
    ``2^(k / steps)``, a pattern's bits fall as ``k`` grows, evaluations read ``sim``'s counts."""
    steps = sim.settings.ladder_steps
    saved = selection.allocate, selection.evaluate, selection.pattern_bits
    selection.allocate = lambda _items, budget, _units: {"k": grid_index(budget, steps), "w": 1}
    selection.evaluate = sim.evaluate
    selection.pattern_bits = lambda _items, bits: -bits["k"]
    try:
        yield
    finally:
        selection.allocate, selection.evaluate, selection.pattern_bits = saved


def new_choice(sim: SyntheticState, level: float, start: int) -> int | None:
    """``offline.selection.select`` itself, on ``sim``: the search on the fit samples, the ladder,
    one fixed-sequence pass on the check samples. The chosen grid step, or None for lossless."""
    chosen = selection.select(sim, 0, level, grid_budget(start, STEPS))  # type: ignore[arg-type]
    return chosen.bits["k"] if chosen.check is not None else None


def old_choice(check: Callable[[int], bool], start: int) -> int | None:
    """``offline/job.py:_validate`` as it stood before Learn then Test (``expand_steps`` 0,
    ``max_tightenings`` 14, two bisection steps), with the pattern at budget ``b`` the grid step
    at or below it, as the allocation's patterns change with the budget."""
    budget = grid_budget(start, STEPS)

    def ok(b: float) -> bool:
        return check(grid_index(b, STEPS))

    passed = budget if ok(budget) else None
    failed_at = None if passed is not None else budget
    d, tightenings = budget, 0
    while passed is None and tightenings < OCTAVES:
        d /= 2
        tightenings += 1
        passed = d if ok(d) else None
        failed_at = d if passed is None else failed_at
    if passed is None:
        return None  # lossless
    if failed_at is not None:
        lo, hi = passed, failed_at
        for _ in range(2):
            mid = math.sqrt(lo * hi)
            if ok(mid):
                passed, lo = mid, mid
            else:
                hi = mid
    return grid_index(passed, STEPS)


@dataclass(frozen=True)
class Rates:
    """Wrong promises out of ``reps`` for the new and the old procedure, and the mean true drop
    of the new one's choices over the level (its power)."""

    new: float
    old: float
    reps: int
    new_mean_drop: float

    def se(self, p: float) -> float:
        """Monte Carlo standard error of a rate ``p``."""
        return math.sqrt(max(p * (1 - p), 1e-12) / self.reps)


def past_the_first_failure(count: int, passes: Callable[[int], bool]) -> int:
    """A mutant of :func:`offline.ltt.fixed_sequence`: every rung up to the last that passes,
    failures before it ignored (each rung tested at the full δ: no longer a valid procedure)."""
    return max((i + 1 for i in range(count) if passes(i)), default=0)


def simulate(setting: Setting, reps: int, nested: bool, seed: int, confidence: float = 0.95,
             bound: str = "exact", metric: str = "top1-drop", mutant: bool = False) -> Rates:
    """Run both procedures on ``reps`` draws of fit and check samples, counts judged by
    ``metric``'s bound; ``mutant``: the new one with :func:`past_the_first_failure`."""
    rng = np.random.default_rng(seed)
    fit, check = (draw(setting, n, reps, nested, rng) for n in (N_FIT, N_CHECK))
    drops, offset = setting.drops(), -SPAN.start
    test = Test(setting.level, confidence, bound)  # type: ignore[arg-type]

    def judge(counts: np.ndarray, n: int, t: Test) -> Callable[[int], bool]:
        def passes(k: int) -> bool:
            i = min(max(k + offset, 0), len(drops) - 1)
            return t.passes(PairedDrop(n, int(counts[i, 0]), int(counts[i, 1]), settings.paired))
        return passes

    def true_drop(k: int | None) -> float:
        return 0.0 if k is None else float(drops[min(max(k + offset, 0), len(drops) - 1)])

    settings = CalibrationSettings(confidence=confidence, bound=bound, ladder_steps=STEPS,  # type: ignore[arg-type]
                                   search_octaves=OCTAVES, fit_samples=N_FIT, check_samples=N_CHECK,
                                   metric=metric)
    sim = SyntheticState(settings, offset, len(drops))
    new = old = 0
    total = 0.0
    original = selection.fixed_sequence
    if mutant:
        selection.fixed_sequence = past_the_first_failure
    try:
        with synthetic(sim):
            for r in range(reps):
                sim.draw(fit[r], check[r])
                chosen = true_drop(new_choice(sim, setting.level, setting.start))
                new += chosen > setting.level
                total += chosen
                old += true_drop(old_choice(judge(check[r], N_CHECK, test), setting.start)) > setting.level
    finally:
        selection.fixed_sequence = original
    return Rates(new / reps, old / reps, reps, total / reps / setting.level)


def table(reps: int = 4000, seed: int = 23, metric: str = "top1-drop",
          mutant: bool = False) -> list[tuple[Setting, bool, Rates]]:
    """Every setting of ``metric`` (:data:`SETTINGS`, or :data:`AGREEMENT` for top1-agreement),
    nested and independent rungs."""
    chosen = AGREEMENT if metric == "top1-agreement" else SETTINGS
    return [(s, nested, simulate(s, reps, nested, seed + i, metric=metric, mutant=mutant))
            for i, (s, nested) in enumerate((s, n) for s in chosen for n in (True, False))]


def main() -> None:
    """Print the table (Markdown)."""
    print("| setting | rungs | (lost, gained) at the level | new: wrong promises | old: wrong promises "
          "| new: mean true drop / level |")
    print("|---|---|---|---|---|---|")
    for s, nested, r in table():
        coupling = "nested" if nested else "independent"
        print(f"| {s.name} | {coupling} | ({s.lost:.2%}, {s.gained:.2%}) | {r.new:.4f} ± {r.se(r.new):.4f} "
              f"| {r.old:.4f} ± {r.se(r.old):.4f} | {r.new_mean_drop:.2f} |")


if __name__ == "__main__":
    main()
