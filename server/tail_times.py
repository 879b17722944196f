"""What a lone tail request takes on this server: the start-up profile plus what lone requests
took beyond it lately.

The start-up profile times every cut's tail back to back through the worker pool. A request from
an edge device usually finds the server idle, and an idle server is slower by a roughly fixed
amount (caches and the worker thread go cold), not a factor: priced with the profile alone, a
lone device's request cost up to twice what the planner said. So every executed batch of one
sample moves a per-model-version extra (an exponential average of measured minus profiled time,
each sample clamped to [-profile, +MAX_EXTRA_S]) and prices use profile + extra for every cut
with a tail. Batches of several samples run at another per-sample cost and leave it alone. Lone
requests under load also carry waits for the interpreter lock; those are real too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 0.2  # weight of the newest lone request in the extra
MAX_EXTRA_S = 0.05  # one stalled run moves the extra by at most ALPHA x this


@dataclass
class _Model:
    profile: list[float]
    extra_s: float = 0.0


@dataclass
class TailTimes:
    """Per model version: the profiled batch-1 tail seconds per cut and the live extra."""

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
        return [max(0.0, t + entry.extra_s) if t > 0 else 0.0 for t in entry.profile]

    def observe(self, name: str, version: str, cut: int, samples: int, compute_s: float) -> None:
        """One executed batch; only batches of one sample move the extra."""
        entry = self._models.get((name, version))
        if entry is None or samples != 1 or not 0 <= cut < len(entry.profile) or entry.profile[cut] <= 0:
            return
        delta = min(MAX_EXTRA_S, max(-entry.profile[cut], compute_s - entry.profile[cut]))
        entry.extra_s += ALPHA * (delta - entry.extra_s)
