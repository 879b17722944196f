"""What a lone tail request takes on this server: the start-up profile plus what lone requests
took beyond it lately.

The start-up profile times every cut's tail in interleaved rounds through the worker pool. A
request from an edge device usually finds the server idle, and an idle server is slower by a
roughly fixed amount (caches and the worker thread go cold), not a factor: priced with the profile
alone, a lone device's request cost up to twice what the planner said. So every lone request (a
batch of one sample that found the server idle, below) moves a per-model-version extra (an
exponential average of measured minus profiled time, each sample clamped to [-profile,
+MAX_EXTRA_S]), which prices every cut with a tail.

The profile is also wrong by different amounts at different cuts, and one extra moved by every
cut's requests then misprices them all: in issue 27's grid, where every cut runs,
fmnist-mobilenet's cut-30 tail took 1.0-1.6 ms and was priced at 1.4-5.4 ms as the extra followed
the other cuts. So each cut that lone requests ran at least CUT_MIN_SAMPLES times is priced with an
extra of its own instead, the median of its last CUT_WINDOW samples (one stall moves no median): a
cut the planner uses converges to what it takes, a cut no request ran keeps profile + the shared
extra. A cut's own price lapses back to the shared one once CUT_STALE_AFTER_S seconds passed since
its newest sample: the planner stops choosing a cut priced too high (say, sampled during a slow
spell), so its samples would never be corrected. The lapse counts seconds, not other cuts' samples:
counted in samples (64 of them), a burst at one cut lapsed every other cut to an extra that burst
alone had set. In issue 27's grid at 01785b1, the 42 cut-0 requests of each sitting's link probe
did that to fmnist-mobilenet: its cut-28 and cut-30 tails took 1.0-2.1 ms and were priced at
0.0-3.2 ms, their profiles plus the shared extra the probe had just set. A cut's first sample after
a lapse starts its window afresh: kept, the old window's median (say, of slow samples) would price
it again at once, and a cut priced too high would be retried once a lapse. Batches of several
samples run at another per-sample cost and leave both alone.

A lone request is also one that found the server idle: a batch of one that began less than
LONE_AFTER_IDLE_S after the previous tail batch (of any model) ended, or that ran beside another
batch, leaves both prices alone (ADR 0018; the batcher reports each batch's idle time). Right
after other work the server is still warm: in ``bench.e2e.analyses.tail_context`` at 94d57ed, where the client
paused between requests, fmnist-mobilenet's cut-0 compute (tail and decoding) took 2.4 ms back to
back and 2.5 ms after 5 ms pauses, 3.0 and 3.4 ms in the run that paused 20 ms, 3.2 and 4.1 ms in
the one that paused 100 ms. A burst of
requests, such as the 42 cut-0 requests of a sitting's link probe in issue 27's grid (each sent
1.24 ms after the previous answer at 100 Mbit/s), had set cut 0's window to warm samples alone:
fmnist-mobilenet's cut-0 tail was priced at 2.53 ms where the sitting's requests, each after a
device's work, took 3.54. Under steady load every batch follows another closely, and the prices
keep what the last idle requests took: a cut's own until it lapses, the shared extra until idle
requests move it again. What lone requests under steady load take (warmer caches, but waits for
the interpreter lock and the event loop) no longer moves them, and is not measured here.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

ALPHA = 0.2  # weight of the newest lone request in the extra
MAX_EXTRA_S = 0.05  # one stalled run moves the extra by at most ALPHA x this
CUT_WINDOW = 9  # a cut's own extra: the median of its last this many lone samples
CUT_MIN_SAMPLES = 3  # ... once it has at least this many
CUT_STALE_AFTER_S = 300.0  # ... and while its newest sample is at most this many seconds old
LONE_AFTER_IDLE_S = 0.01  # a batch of one prices lone requests if no tail ran this long before it


@dataclass
class _Model:
    profile: list[float]
    extra_s: float = 0.0
    cut_deltas: dict[int, deque[float]] = field(default_factory=dict)  # the cuts lone requests ran
    cut_last: dict[int, float] = field(default_factory=dict)  # per cut, the clock at its newest sample

    def fresh(self, cut: int, now: float) -> bool:
        """Whether the cut's newest lone sample is at most CUT_STALE_AFTER_S old."""
        return cut in self.cut_last and now - self.cut_last[cut] <= CUT_STALE_AFTER_S

    def extra_at(self, cut: int, now: float) -> float:
        own = self.cut_deltas.get(cut)
        if own is not None and len(own) >= CUT_MIN_SAMPLES and self.fresh(cut, now):
            return statistics.median(own)
        return self.extra_s


@dataclass
class TailTimes:
    """Per model version: the profiled batch-1 tail seconds per cut, the live shared extra and the
    extras of the cuts lone requests ran."""

    clock: Callable[[], float] = time.monotonic  # seconds; a cut's own price lapses by it
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
        now = self.clock()
        return [max(0.0, t + entry.extra_at(cut, now)) if t > 0 else 0.0
                for cut, t in enumerate(entry.profile)]

    def observe(self, name: str, version: str, cut: int, samples: int, compute_s: float, *,
                idle_s: float) -> None:
        """One executed batch, begun ``idle_s`` after the previous tail batch ended; only batches
        of one sample after at least LONE_AFTER_IDLE_S of idling move the prices."""
        entry = self._models.get((name, version))
        if (entry is None or samples != 1 or idle_s < LONE_AFTER_IDLE_S
                or not 0 <= cut < len(entry.profile) or entry.profile[cut] <= 0):
            return
        delta = min(MAX_EXTRA_S, max(-entry.profile[cut], compute_s - entry.profile[cut]))
        now = self.clock()
        own = entry.cut_deltas.setdefault(cut, deque(maxlen=CUT_WINDOW))
        if not entry.fresh(cut, now):
            own.clear()  # lapsed (or new): its old samples price it no more
        own.append(delta)
        entry.cut_last[cut] = now
        entry.extra_s += ALPHA * (delta - entry.extra_s)
