"""Bit allocation: minimize the bits sent subject to a logit-noise budget.

Exact method, in two steps:

1. a multiple-choice knapsack over the budget discretised into ``M`` units, each noise rounded *up*
   to whole units, so that the pattern it returns is feasible for the real budget;
   ``O(items · choices · M)``. Rounding up can miss the optimum, by a whole bit width of one
   tensor, when the optimum's noise lies within ``items`` units of the budget;
2. so its cost then bounds a search of the exact Pareto front (bits, noise) of the tensors taken in
   order, with the noise summed in the same order and the same floats as :func:`pattern_noise`.
   That front's cheapest pattern is the exact optimum, and it replaces step 1's only when it is
   strictly cheaper. A front larger than :data:`MAX_FRONT` is abandoned for step 1's answer.

Continuous closed form (used by the QPART baseline and documented here): with
``noise_l(b) = a_l · e^{-k b}``, ``k = ln 4``, and cost ``c_l · b`` bits, the KKT conditions with
an active constraint give ``λ = Σ_j c_j / (k D)`` and

    b_l* = (1/k) · ln(a_l · Σ_j c_j / (c_l · D)),

which *depends on the budget D*. QPART's Eq. 40 cancels every accuracy term for the bit width at
the cut; it is not used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from qpart.offline.errors import CalibrationConfigError
from qpart.profiles.artifacts import FLOAT_BITS

PARAM_BITS = 64
"""Bits of per-group parameters: a float32 scale and a float32 min."""

MAX_FRONT = 50_000
"""Most (bits, noise) states the exact search keeps after one tensor before it gives up."""


@dataclass(frozen=True)
class Item:
    """One tensor to allocate: ``noise[b]`` for each allowed bit width, and its size."""

    name: str
    numel: int
    groups: int
    noise: dict[int, float]

    def cost_bits(self, bits: int) -> int:
        """Bits on the wire at ``bits`` per element, with per-group scale and min."""
        if bits >= FLOAT_BITS:
            return FLOAT_BITS * self.numel
        return bits * self.numel + PARAM_BITS * self.groups


def allocate(items: Sequence[Item], budget: float, units: int) -> dict[str, int]:
    """The minimum-bit pattern with total noise ``<= budget`` (see the module doc for the method).

    Every item also has the float choice (``FLOAT_BITS``, zero noise), so a solution always exists.
    """
    if budget <= 0 or not math.isfinite(budget):
        return {it.name: FLOAT_BITS for it in items}
    gridded = _grid_allocate(items, budget, units)
    bound = pattern_bits(items, gridded)
    exact = _front_allocate(items, budget, bound)
    if exact is not None and pattern_bits(items, exact) < bound and pattern_noise(items, exact) <= budget:
        return exact
    return gridded


def _options(it: Item) -> list[tuple[int, float]]:
    return [(FLOAT_BITS, 0.0), *sorted(it.noise.items())]


def _front_allocate(items: Sequence[Item], budget: float, bound: int) -> dict[str, int] | None:
    """The exact optimum by its Pareto front, pruned by the cost ``bound`` of a feasible pattern;
    ``None`` if the front outgrows :data:`MAX_FRONT`."""
    least = [min(it.cost_bits(b) for b, _ in _options(it)) for it in items]
    rest = np.concatenate([np.cumsum(least[::-1])[::-1], [0]]).astype(np.int64)
    cost = np.zeros(1, dtype=np.int64)
    noise = np.zeros(1, dtype=np.float64)
    steps: list[tuple[list[tuple[int, float]], np.ndarray, np.ndarray]] = []
    for i, it in enumerate(items):
        options = _options(it)
        opt_cost = np.array([it.cost_bits(b) for b, _ in options], dtype=np.int64)
        opt_noise = np.array([n for _, n in options], dtype=np.float64)
        cand_cost = (cost[:, None] + opt_cost[None, :]).ravel()
        cand_noise = (noise[:, None] + opt_noise[None, :]).ravel()
        keep = np.flatnonzero((cand_noise <= budget) & (cand_cost + rest[i + 1] <= bound))
        order = keep[np.lexsort((cand_noise[keep], cand_cost[keep]))]
        sorted_noise = cand_noise[order]
        earlier = np.concatenate([[np.inf], np.minimum.accumulate(sorted_noise)[:-1]])
        order = order[sorted_noise < earlier]  # cheaper than every state with less noise
        if len(order) > MAX_FRONT:
            return None
        cost, noise = cand_cost[order], cand_noise[order]
        steps.append((options, order // len(options), order % len(options)))
    if len(cost) == 0:
        return None
    state = 0  # the cheapest: the front is ordered by cost
    result: dict[str, int] = {}
    for it, (options, parent, choice) in zip(reversed(items), reversed(steps), strict=True):
        result[it.name] = options[int(choice[state])][0]
        state = int(parent[state])
    return result


def _grid_allocate(items: Sequence[Item], budget: float, units: int) -> dict[str, int]:
    """Step 1: the knapsack over ``units`` whole units of the budget, noise rounded up."""
    unit = budget / units
    inf = np.iinfo(np.int64).max // 4
    dp = np.full(units + 1, inf, dtype=np.int64)
    dp[0] = 0
    choice_tables = []
    for it in items:
        options = _options(it)
        new = np.full(units + 1, inf, dtype=np.int64)
        pick = np.zeros(units + 1, dtype=np.int8)
        for idx, (bits, noise) in enumerate(options):
            u = math.ceil(noise / unit) if noise > 0 else 0
            if u > units:
                continue
            cand = np.full(units + 1, inf, dtype=np.int64)
            cand[u:] = dp[: units + 1 - u] + it.cost_bits(bits)
            better = cand < new
            new[better] = cand[better]
            pick[better] = idx
        choice_tables.append((options, pick))
        dp = new
    j = int(np.argmin(dp))
    result: dict[str, int] = {}
    for it, (options, pick) in zip(reversed(items), reversed(choice_tables), strict=True):
        bits, noise = options[int(pick[j])]
        result[it.name] = bits
        j -= math.ceil(noise / unit) if noise > 0 else 0
    return result


def pattern_noise(items: Sequence[Item], bits: dict[str, int]) -> float:
    """Predicted total noise of a pattern under additivity, summed left to right in plain float64
    (not ``sum()``, which compensates from Python 3.12 on): the order the front search adds in."""
    total = 0.0
    for it in items:
        total += 0.0 if bits[it.name] >= FLOAT_BITS else it.noise[bits[it.name]]
    return total


def pattern_bits(items: Sequence[Item], bits: dict[str, int]) -> int:
    """Total bits on the wire of a pattern."""
    return sum(it.cost_bits(bits[it.name]) for it in items)


def closed_form_bits(scales: Sequence[float], costs: Sequence[float], budget: float,
                     k: float = math.log(4.0)) -> list[float]:
    """Continuous KKT solution for ``noise_l = scales[l] · e^{-k b}`` (see module doc)."""
    if budget <= 0:
        raise CalibrationConfigError("the noise budget must be positive")
    total = float(sum(costs))
    return [math.log(max(a, 1e-300) * total / (c * budget)) / k for a, c in zip(scales, costs, strict=True)]


def qpart_paper_bits(items: Sequence[Item], budget: float, fit_bits: int = 8,
                     lo: int = 2, hi: int = 8) -> dict[str, int]:
    """QPART as published: ``s·4^-b`` fitted at ``fit_bits``, closed form, rounded, clipped."""
    scales = [it.noise[fit_bits] * 4.0**fit_bits for it in items]
    costs = [float(it.numel) for it in items]
    raw = closed_form_bits(scales, costs, budget)
    return {it.name: int(min(hi, max(lo, round(b)))) for it, b in zip(items, raw, strict=True)}
