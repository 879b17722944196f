"""What a lone tail request takes on this server: the start-up profile, scaled by what lone
requests took lately.

The start-up profile times every cut's tail back to back through the worker pool. A request from
an edge device usually finds the server idle, and an idle server is slower: on this VM the CNN's
whole-model tail took 0.70 ms back to back, 0.88 ms after 2 ms of idle, 1.19 ms after 5 ms and
1.53 ms after 20 ms (through the pool, median of 35). Priced with the profile alone, a lone
device's request cost twice what the planner said. So every executed batch of one sample moves
a per-model scale (an exponential average of measured over profiled time) and prices use
profile x scale. Batches of several samples run at another per-sample cost and leave it alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 0.2  # weight of the newest lone request in the scale
RATIO_BOUNDS = (0.25, 4.0)  # one stalled or lucky run moves the scale by at most this much


@dataclass
class _Model:
    profile: list[float]
    scale: float = 1.0


@dataclass
class TailTimes:
    """Per model version: the profiled batch-1 tail seconds per cut and the live scale."""

    _models: dict[tuple[str, str], _Model] = field(default_factory=dict)

    def set_profile(self, name: str, version: str, seconds: list[float]) -> None:
        """The start-up profile of a model version (scale 1)."""
        self._models[(name, version)] = _Model(list(seconds))

    def profile(self, name: str, version: str) -> list[float] | None:
        """The start-up profile, or None before it is measured."""
        entry = self._models.get((name, version))
        return None if entry is None else list(entry.profile)

    def scale(self, name: str, version: str) -> float:
        """Measured over profiled time of lone requests lately (1 before any)."""
        entry = self._models.get((name, version))
        return 1.0 if entry is None else entry.scale

    def seconds(self, name: str, version: str) -> list[float] | None:
        """Per cut, what a lone request's tail takes now; None before the profile is measured."""
        entry = self._models.get((name, version))
        return None if entry is None else [t * entry.scale for t in entry.profile]

    def observe(self, name: str, version: str, cut: int, samples: int, compute_s: float) -> None:
        """One executed batch; only batches of one sample move the scale."""
        entry = self._models.get((name, version))
        if entry is None or samples != 1 or not 0 <= cut < len(entry.profile) or entry.profile[cut] <= 0:
            return
        low, high = RATIO_BOUNDS
        ratio = min(high, max(low, compute_s / entry.profile[cut]))
        entry.scale += ALPHA * (ratio - entry.scale)
