"""How many samples a calibration uses, and which levels its check samples can certify at all.

The rule (``docs/guide/how-much-data.md``): from 10,000 calibration samples up, 4,000 fit and
6,000 check samples (the shipped artifacts' split); below that, 40% fit (at least 100) and the rest
check. A level ``a`` can be certified on ``n`` check samples only if the job's own bound
(:class:`offline.ltt.Test`) passes a pattern that lost and gained nothing: with the exact bound
at δ = 0.05 that is ``n ≥ ln(2/δ) / a``, about 3.7 / ``a``. Both are decided from the sources'
lengths and the settings alone, before any sample is decoded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from qpart.offline.errors import CalibrationConfigError
from qpart.offline.ltt import Bound, Test
from qpart.offline.settings import CalibrationSettings
from qpart.offline.validation import PairedDrop

LARGE = 10_000
"""From this many calibration samples up, the split is :data:`LARGE_SPLIT`."""
LARGE_SPLIT = (4000, 6000)
"""(fit, check) samples from :data:`LARGE` up: the shipped artifacts' calibration."""
FIT_SHARE = (2, 5)
"""Below :data:`LARGE`: the fit samples' share, 2/5 (40%), rounded down; the rest are check samples."""
MIN_SAMPLES = 100
"""The fewest fit samples, and the fewest check samples, a job takes."""
_MAX_CHECK = 1 << 40


def default_split(available: int) -> tuple[int, int]:
    """(fit, check) samples the rule gives ``available`` calibration samples (module doc).

    Raises:
        CalibrationConfigError: fewer than ``2 × MIN_SAMPLES``.
    """
    if available >= LARGE:
        return LARGE_SPLIT
    fit = max(MIN_SAMPLES, available * FIT_SHARE[0] // FIT_SHARE[1])
    if available - fit < MIN_SAMPLES:
        raise CalibrationConfigError(
            f"the calibration source holds {available:,} samples; a calibration needs at least "
            f"{2 * MIN_SAMPLES} ({MIN_SAMPLES} fit and {MIN_SAMPLES} check samples), and a level of a% "
            "about 3.7/a check samples (docs/guide/how-much-data.md)")
    return fit, available - fit


def resolve_samples(s: CalibrationSettings, available: int, where: str) -> CalibrationSettings:
    """``s`` with ``fit_samples`` and ``check_samples`` given a value where they were None (the rule,
    bounded by what a given one leaves) and ``noise_samples`` clipped to the fit samples: the
    settings the job runs, checkpoints and records. ``where`` names the source in a refusal.

    Raises:
        CalibrationConfigError: the counts asked for exceed ``available`` (one line naming the flags
            and a split that fits), or ``available`` is too few for any calibration.
    """
    fit_default, check_default = default_split(available)
    fit = s.fit_samples if s.fit_samples is not None else max(0, min(
        fit_default, available - (s.check_samples or 0)))
    check = s.check_samples if s.check_samples is not None else max(0, min(check_default, available - fit))
    asked = (s.fit_samples or 0) + (s.check_samples or 0)
    if fit + check > available or fit < MIN_SAMPLES or check < MIN_SAMPLES:
        flags = [(name, value) for name, value in (("fit", s.fit_samples), ("check", s.check_samples))
                 if value is not None]
        given = " + ".join(f"--{name}-samples {value}" for name, value in flags)
        wrong = (f"{'ask' if len(flags) > 1 else 'asks'} for {asked:,}" if asked > available else
                 f"would leave {fit:,} fit and {check:,} check samples (each at least {MIN_SAMPLES})")
        raise CalibrationConfigError(
            f"{given} {wrong} of the {available:,} calibration samples in {where}; give a split that fits, "
            f"e.g. --fit-samples {fit_default} --check-samples {check_default} (leave both out for that "
            "split: docs/guide/how-much-data.md)")
    return s.model_copy(update={"fit_samples": fit, "check_samples": check,
                                "noise_samples": min(s.noise_samples, fit)})


def size_job(s: CalibrationSettings, available: int, where: str) -> CalibrationSettings:
    """:func:`resolve_samples`, then :func:`check_levels` on the result: the settings a job runs.

    Raises:
        CalibrationConfigError: as those two do.
    """
    resolved = resolve_samples(s, available, where)
    check_levels(resolved)
    return resolved


def smallest_level(check: int, confidence: float, bound: Bound, paired: bool = True) -> float:
    """The tightest level ``check`` check samples can certify: the bound on a pattern that lost
    and gained none of them (:meth:`offline.validation.PairedDrop.upper_bound`; ``paired``: the
    metric's)."""
    return PairedDrop(check, 0, 0, paired).upper_bound(confidence, bound)


def checks_needed(level: float, confidence: float, bound: Bound, lost_share: float = 0.0,
                  paired: bool = True) -> int:
    """The fewest check samples on which a pattern that loses ``lost_share × level`` of them (and
    gains none) passes ``level`` (:class:`offline.ltt.Test`); 0 lost: the fewest that can certify
    ``level`` at all (``paired``: the metric's)."""
    test = Test(level, confidence, bound)

    def passes(n: int) -> bool:
        return test.passes(PairedDrop(n, math.ceil(n * level * lost_share), 0, paired))

    hi = MIN_SAMPLES
    while not passes(hi):
        hi *= 2
        if hi > _MAX_CHECK:
            raise CalibrationConfigError(f"level {level:g} cannot be certified on any number of samples")
    lo = hi // 2 if hi > MIN_SAMPLES else 0
    while hi - lo > 1:  # passes(hi), not passes(lo) (lo = 0: none)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    return hi


def uncertified_levels(s: CalibrationSettings) -> tuple[float, ...]:
    """The levels of ``s`` its check samples cannot certify, tightest first (resolved settings)."""
    return tuple(a for a in s.levels
                 if not Test(a, s.confidence, s.bound).passes(
                     PairedDrop(s.check_count, 0, 0, s.paired)))


def lossless_levels(s: CalibrationSettings) -> tuple[float, ...]:
    """The levels the job keeps lossless, untested: those it cannot certify, when
    ``s.uncertified`` is ``lossless`` (else none: the job was refused)."""
    return uncertified_levels(s) if s.uncertified == "lossless" else ()


def check_levels(s: CalibrationSettings) -> None:
    """Refuse levels the check samples cannot certify, unless ``s.uncertified`` keeps them lossless.

    Raises:
        CalibrationConfigError: one line naming the levels, the check samples each needs and the flag.
    """
    levels = uncertified_levels(s)
    if not levels or s.uncertified == "lossless":
        return
    need = ", ".join(f"{percent(a)} needs {checks_needed(a, s.confidence, s.bound, paired=s.paired):,}"
                     for a in levels)
    raise CalibrationConfigError(
        f"{'level' if len(levels) == 1 else 'levels'} {', '.join(percent(a) for a in levels)} cannot be "
        f"certified with {s.check_count:,} check samples (with none lost the bound is "
        f"{smallest_level(s.check_count, s.confidence, s.bound, s.paired) * 100:.2f}%): {need} check "
        f"samples under the {s.metric} metric; give "
        "more data or --check-samples, leave those levels out (--levels), or keep them lossless (float32, "
        "untested) with --uncertified lossless (docs/guide/how-much-data.md)")


def percent(level: float) -> str:
    """A level as a percentage without trailing zeros (``0.25%``)."""
    return f"{level * 100:.4f}".rstrip("0").rstrip(".") + "%"


def calibration_needed(check: int) -> int | None:
    """The fewest calibration samples whose default split has at least ``check`` check samples
    (None: more than the rule ever gives; give --check-samples)."""
    if check > LARGE_SPLIT[1]:
        return None
    lo, hi = 2 * MIN_SAMPLES, LARGE
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if default_split(mid)[1] >= check else (mid + 1, hi)
    return lo


def guidance_table(levels: Sequence[float], confidence: float, bound: Bound) -> str:
    """The markdown table of ``docs/guide/how-much-data.md``: per level, the check samples that can
    certify it at all, those a pattern losing half the level needs, and the calibration samples
    whose default split holds them."""
    rows = ["| level | check samples: none lost | check samples: half the level lost "
            "| calibration samples (default split), half lost |", "|---|---|---|---|"]
    for a in levels:
        least, half = checks_needed(a, confidence, bound), checks_needed(a, confidence, bound, 0.5)
        total = calibration_needed(half)
        shown = f"{total:,}" if total is not None else f"give --check-samples {half}"
        rows.append(f"| {percent(a)} | {least:,} | {half:,} | {shown} |")
    return "\n".join(rows)
