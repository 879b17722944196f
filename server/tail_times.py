"""What a lone tail request takes on this server: the start-up profile plus what lone requests
took beyond it lately.

The start-up profile times every cut's tail in interleaved rounds through the worker pool. A
request from an edge device usually finds the server idle, and an idle server is slower by a
roughly fixed amount (caches and the worker thread go cold), not a factor: priced with the profile
alone, a lone device's request cost up to twice what the planner said. So every executed batch of
one sample moves a per-model-version extra (an exponential average of measured minus profiled
time, each sample clamped to [-profile, +MAX_EXTRA_S]), which prices every cut with a tail.

The profile is also wrong by different amounts at different cuts, and one extra moved by every
cut's requests then misprices them all: in issue 27's grid, where every cut runs, fmnist-mobilenet's
cut-30 tail took 1.0-1.6 ms and was priced at 1.4-5.4 ms as the extra followed the other cuts. So each cut
that lone requests ran at least CUT_MIN_SAMPLES times is priced with an extra of its own instead,
the median of its last CUT_WINDOW samples (one stall moves no median): a cut the planner uses
converges to what it takes, a cut no request ran keeps profile + the shared extra. A cut's own price
lapses back to the shared one once CUT_STALE_AFTER lone samples of other cuts came after its newest:
the planner stops choosing a cut priced too high (say, sampled under load), so its samples would
never be corrected. Batches of
several samples run at another per-sample cost and leave both alone. Lone requests under load
also carry waits for the interpreter lock; those are real too.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

ALPHA = 0.2  # weight of the newest lone request in the extra
MAX_EXTRA_S = 0.05  # one stalled run moves the extra by at most ALPHA x this
CUT_WINDOW = 9  # a cut's own extra: the median of its last this many lone samples
CUT_MIN_SAMPLES = 3  # ... once it has at least this many
CUT_STALE_AFTER = 64  # ... and while its newest is among the model version's last this many lone samples


@dataclass
class _Model:
    profile: list[float]
    extra_s: float = 0.0
    cut_deltas: dict[int, deque[float]] = field(default_factory=dict)  # the cuts lone requests ran
    lone: int = 0  # lone samples seen, every cut
    cut_last: dict[int, int] = field(default_factory=dict)  # per cut, ``lone`` at its newest sample

    def extra_at(self, cut: int) -> float:
        own = self.cut_deltas.get(cut)
        fresh = self.lone - self.cut_last.get(cut, -CUT_STALE_AFTER) < CUT_STALE_AFTER
        if own is not None and len(own) >= CUT_MIN_SAMPLES and fresh:
            return statistics.median(own)
        return self.extra_s


@dataclass
class TailTimes:
    """Per model version: the profiled batch-1 tail seconds per cut, the live shared extra and the
    extras of the cuts lone requests ran."""

    _models: dict[tuple[str, str], _Model] = field(default_factory=dict)

    def set_profile(self, name: str, version: str, seconds: list[float]) -> None:
        """The start-up profile of a model version (extra 0)."""
        self._models[(name, version)] = _Model(list(seconds))

    def profile(self, name: str, version: str) -> list[float] | None:
        """The start-up profile, or None before it is measured."""
        entry = self._models.get((name, version))
        return None if entry is None else list(entry.profile)

    def extra(self, name: str, version: str) -> float:
        """Seconds lone requests took beyond the profile lately (0 before any)."""
        entry = self._models.get((name, version))
        return 0.0 if entry is None else entry.extra_s

    def seconds(self, name: str, version: str) -> list[float] | None:
        """Per cut, what a lone request's tail takes now; None before the profile is measured.
        Cuts without a tail (profiled at 0) stay 0."""
        entry = self._models.get((name, version))
        if entry is None:
            return None
        return [max(0.0, t + entry.extra_at(cut)) if t > 0 else 0.0 for cut, t in enumerate(entry.profile)]

    def observe(self, name: str, version: str, cut: int, samples: int, compute_s: float) -> None:
        """One executed batch; only batches of one sample move the extra."""
        entry = self._models.get((name, version))
        if entry is None or samples != 1 or not 0 <= cut < len(entry.profile) or entry.profile[cut] <= 0:
            return
        delta = min(MAX_EXTRA_S, max(-entry.profile[cut], compute_s - entry.profile[cut]))
        entry.lone += 1
        entry.cut_deltas.setdefault(cut, deque(maxlen=CUT_WINDOW)).append(delta)
        entry.cut_last[cut] = entry.lone
        entry.extra_s += ALPHA * (delta - entry.extra_s)
