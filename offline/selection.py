"""One pattern per (cut, level) by Learn then Test (:mod:`offline.ltt`): a search on the fit samples
places the ladder, and one fixed-sequence pass over the check samples chooses from it."""

from __future__ import annotations

from dataclasses import dataclass

from qpart.models.data import Dataset
from qpart.offline.allocation import allocate, pattern_bits
from qpart.offline.ltt import Test, fixed_sequence, grid_budget, grid_index, learn, rungs
from qpart.offline.samples import Reference
from qpart.offline.state import State, evaluate, is_lossless
from qpart.offline.validation import PairedDrop
from qpart.profiles.artifacts import FLOAT_BITS


@dataclass(frozen=True)
class Selection:
    """The chosen bits, their counts on the check samples (None: lossless, not tested), the
    ladder's length, how many of its rungs passed before the first failure, and its anchor."""

    bits: dict[str, int]
    check: PairedDrop | None
    rungs: int
    passed: int
    anchor: int


def _bits(st: State, cut: int, k: int) -> dict[str, int]:
    s = st.settings
    return allocate(st.items[cut], grid_budget(k, s.ladder_steps), s.budget_units)


def anchor(st: State, cut: int, level: float, budget: float, floor: int | None = None) -> int:
    """The grid point of the largest budget whose pattern passes on the fit samples, its counts
    scaled to the check samples' number (lossless patterns pass), searched from ``budget`` or from
    ``floor`` (a lower level's anchor, which passes here too) if higher; the lowest point searched
    when none passes."""
    s = st.settings
    test = Test(level, s.confidence, s.bound, scale_to=s.check_count)

    def passes(k: int) -> bool:
        bits = _bits(st, cut, k)
        return is_lossless(bits) or test.passes(
            evaluate(st, cut, bits, st.data.fit, st.data.fit_ref, st.fit_cache))

    start = max(grid_index(budget, s.ladder_steps), floor if floor is not None else -(1 << 30))
    found = learn(passes, start, s.ladder_steps, s.search_octaves)
    return start - s.search_octaves * s.ladder_steps if found is None else found


def ladder(st: State, cut: int, at: int, floor: int | None = None) -> list[dict[str, int]]:
    """The distinct patterns at the ladder's grid points around ``at``, and at ``floor`` (a lower
    level's anchor: a deep first rung, usually tested already) when below them; smallest budget
    first, lossless ones left out (lossless is the fallback, not a candidate)."""
    out: list[dict[str, int]] = []
    points = rungs(at, st.settings.ladder)
    for k in ([floor] if floor is not None and floor < points[0] else []) + points:
        bits = _bits(st, cut, k)
        if not is_lossless(bits) and bits not in out:
            out.append(bits)
    return out


def select(st: State, cut: int, level: float, budget: float, floor: int | None = None) -> Selection:
    """Learn the ladder on the fit samples, then test it once on the check samples, in order, until
    the first failure; the fewest bits among the rungs that passed, or lossless if none did.
    ``floor``: the anchor of a lower level at this cut (see :func:`anchor`)."""
    s = st.settings
    at = anchor(st, cut, level, budget, floor)
    candidates = ladder(st, cut, at, floor)
    test = Test(level, s.confidence, s.bound)

    def check(i: int) -> PairedDrop:
        return evaluate(st, cut, candidates[i], st.data.check, st.data.check_ref, st.check_cache)

    passed = fixed_sequence(len(candidates), lambda i: test.passes(check(i)))
    if passed == 0:
        return Selection({it.name: FLOAT_BITS for it in st.items[cut]}, None, len(candidates), 0, at)
    best = min(range(passed), key=lambda i: pattern_bits(st.items[cut], candidates[i]))
    return Selection(candidates[best], check(best), len(candidates), passed, at)


def predicted_bits(st: State, cut: int, level: float, budget: float, probe: Probe) -> dict[str, int]:
    """What (cut, level) is expected to end with, for deciding whether to calibrate the cut
    (``offline.pruning``): the pattern the search starts from at the level's budget, or one or two
    octaves below, the first that passes the level's test on ``probe``'s fit samples (counts scaled
    to the check samples' number); float32 when none does. Fit samples only: the check samples stay
    unread, so the promise is untouched."""
    s = st.settings
    test = Test(level, s.confidence, s.bound, scale_to=s.check_count)
    start = grid_index(budget, s.ladder_steps)
    for k in (start, start - s.ladder_steps, start - 2 * s.ladder_steps):
        bits = _bits(st, cut, k)
        if is_lossless(bits) or test.passes(evaluate(st, cut, bits, probe.samples, probe.ref, probe.cache)):
            return bits
    return {it.name: FLOAT_BITS for it in st.items[cut]}


@dataclass
class Probe:
    """The first fit samples, on which :func:`predicted_bits` tests its guesses, with their counts."""

    samples: Dataset
    ref: Reference
    cache: dict[str, PairedDrop]

    @classmethod
    def of(cls, st: State, count: int) -> Probe:
        """The first ``count`` fit samples; all of them when there are no more, reading the counts
        the mapping measured but never adding to the job's: a count made here, with the job's
        threads, must not stand in for the one a validation worker makes with its own (float
        rounding can differ), or a cut's patterns could differ from ``--cuts all``'s."""
        fit, ref = st.data.fit, st.data.fit_ref
        if count >= len(fit):
            return cls(fit, ref, dict(st.fit_cache))
        return cls(Dataset(fit.images[:count], fit.labels[:count], fit.split, fit.indices_sha256),
                   Reference(ref.anchor[:count], ref.hits[:count]), {})
