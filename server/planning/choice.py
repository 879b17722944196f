"""One plan request's decision: price every admissible pattern and pick one (docs/cost-model.md).

:func:`plan_request` owns the loop that the engine used to drive function by function; it reads nothing
but its arguments, so the engine only gathers the prices and segments it needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from qpart.profiles.artifacts import CalibrationArtifact, Pattern
from qpart.profiles.costs import PlanInputs
from qpart.server.errors import BadRequestError
from qpart.server.planning.planner import (
    Candidate,
    allowed_patterns,
    best_at_cut,
    choose,
    only_lossless,
    price_options,
)

# A pattern's head segment as the device's runtime gets it: (segment id, size in bytes), or
# (None, 0) at cut 0 (no head); the offer function returns None where that runtime cannot run it.
SegmentOffer = tuple[str | None, int]


@dataclass(frozen=True)
class ServerPrices:
    """What this server's side of a model version costs lately, per cut (``tails.tail_times``,
    ``tails.decode_times``)."""

    tail_s: list[float]  # a sample's tail, per cut
    decode_s: dict[str, list[float]]  # per upload coding, per cut: a sample's packet decoding
    answer_bytes: int  # one answer's body


@dataclass(frozen=True)
class PlanOutcome:
    """The chosen candidate, beside the all-server and all-device ones and the image plans'."""

    chosen: Candidate
    all_server: Candidate
    all_device: Candidate | None
    image: Candidate | None  # the cheapest input-image plan the request's offer got
    lossless: bool  # every plan at the demand sends float32 (planner.only_lossless)


def plan_request(artifact: CalibrationArtifact, demand: float, deadline_s: float | None, inputs: PlanInputs,
         prices: ServerPrices, offer: Callable[[Pattern], SegmentOffer | None],
         images: list[Candidate]) -> PlanOutcome:
    """Choose (cut, level) minimising the request's objective among the patterns no looser than
    ``demand`` that ``offer`` offers, and the input-image plans ``images``; with ``deadline_s``,
    the most accurate plan that meets it.

    Raises:
        BadRequestError: a candidate prices to a non-finite number.
        UnprocessableError: no candidate meets the deadline, or every cost is infinite.
    """
    candidates: list[Candidate] = []
    for pattern in allowed_patterns(artifact, demand):
        offered = offer(pattern)
        if offered is None:
            continue  # the device's runtime cannot run this cut's head: never offered (ADR 0019)
        seg_id, size = offered
        # Raw and compressed uploads are separate candidates: the cheaper one may miss a
        # deadline the other meets (compressing can save energy and cost time).
        decode = {coding: per_cut[pattern.cut] for coding, per_cut in prices.decode_s.items()}
        options = price_options(artifact, pattern, seg_id, size, inputs, prices.tail_s[pattern.cut],
                                prices.answer_bytes, decode)
        candidates += [Candidate(pattern, seg_id, size, costs) for costs in options]
    candidates += images
    _require_finite(candidates)
    chosen = choose(candidates, deadline_s)
    all_server = best_at_cut(candidates, 0)
    assert all_server is not None, "cut 0 has no head: every runtime is offered it"
    return PlanOutcome(chosen, all_server, best_at_cut(candidates, len(artifact.cuts) - 1),
                       min(images, key=lambda c: c.costs.objective) if images else None,
                       only_lossless(candidates))


def _require_finite(candidates: list[Candidate]) -> None:
    """Every predicted number must be finite (JSON has no infinity: it would be sent as null)."""
    for c in candidates:
        t, e = c.costs.time_s, c.costs.energy_j
        numbers = (t.local, t.transfer, t.server, t.total, e.local, e.transfer, e.total,
                   c.costs.server_cost, c.costs.objective)
        if not all(math.isfinite(x) for x in numbers):
            raise BadRequestError(
                f"the plan for cut {c.pattern.cut} prices to a non-finite number: the request's "
                "rate_bps, weights or device profile figures are too large")
