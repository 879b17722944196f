"""Bit allocation: the DP is optimal and feasible; the closed form depends on the budget."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qpart.offline.allocation import (
    Item,
    _grid_allocate,
    allocate,
    closed_form_bits,
    pattern_bits,
    pattern_noise,
    qpart_paper_bits,
)
from qpart.profiles.artifacts import FLOAT_BITS


def _item(name, numel, scale, groups=4):
    return Item(name, numel, groups, {b: scale / float((1 << b) - 1) ** 2 for b in range(2, 9)})


def _brute_force(items, budget):
    best = None
    choices = [[FLOAT_BITS, *it.noise] for it in items]
    for combo in itertools.product(*choices):
        bits = {it.name: b for it, b in zip(items, combo, strict=True)}
        if pattern_noise(items, bits) <= budget:
            cost = pattern_bits(items, bits)
            best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=60, deadline=None)
@given(scales=st.lists(st.floats(0.01, 100), min_size=1, max_size=3),
       sizes=st.lists(st.integers(10, 5000), min_size=3, max_size=3),
       budget=st.floats(1e-4, 10))
def test_dp_is_feasible_and_near_optimal(scales, sizes, budget):
    items = [_item(f"t{i}", n, s) for i, (s, n) in enumerate(zip(scales, sizes, strict=False))]
    bits = allocate(items, budget, units=4000)
    assert pattern_noise(items, bits) <= budget * (1 + 1e-9)
    # The grid step alone missed this by a bit width (1,466 bits against 1,335 for scales
    # [1, 1, 76.3125], sizes [10, 15, 216], budget 8.48046875); the front search makes it exact.
    assert pattern_bits(items, bits) == _brute_force(items, budget)


def test_the_optimum_just_inside_the_budget_is_found():
    scales, sizes = [1.0, 1.0, 76.3125], [10, 15, 216]
    items = [_item(f"t{i}", n, s) for i, (s, n) in enumerate(zip(scales, sizes, strict=True))]
    bits = allocate(items, 8.48046875, units=4000)
    assert pattern_bits(items, bits) == 1335 == _brute_force(items, 8.48046875)
    assert pattern_noise(items, bits) <= 8.48046875


def test_a_front_too_large_falls_back_to_the_feasible_grid_answer(monkeypatch):
    scales, sizes, budget = [1.0, 1.0, 76.3125], [10, 15, 216], 8.48046875  # the grid misses by a bit width
    items = [_item(f"t{i}", n, s) for i, (s, n) in enumerate(zip(scales, sizes, strict=True))]
    assert pattern_bits(items, allocate(items, budget, units=4000)) == 1335
    monkeypatch.setattr("qpart.offline.allocation.MAX_FRONT", 1)
    bits = allocate(items, budget, units=4000)
    assert bits == _grid_allocate(items, budget, 4000) and pattern_bits(items, bits) == 1466
    assert pattern_noise(items, bits) <= budget


def test_tighter_budget_never_gives_fewer_bits():
    items = [_item("a", 1000, 5.0), _item("b", 200, 50.0), _item("c", 5000, 1.0)]
    costs = [pattern_bits(items, allocate(items, d, 2000)) for d in (1.0, 0.1, 0.01, 0.001)]
    assert costs == sorted(costs)


def test_zero_budget_is_lossless():
    items = [_item("a", 10, 1.0)]
    assert allocate(items, 0.0, 100) == {"a": FLOAT_BITS}


def test_closed_form_depends_on_the_budget():
    loose = closed_form_bits([1.0, 2.0], [100, 10], budget=0.1)
    tight = closed_form_bits([1.0, 2.0], [100, 10], budget=0.001)
    # Each 4x tighter budget costs one more bit per tensor (k = ln 4).
    assert all(math.isclose(t - lo, math.log(100) / math.log(4)) for t, lo in zip(tight, loose, strict=True))


def test_closed_form_meets_its_budget_exactly_in_the_continuum():
    scales, costs, budget = [3.0, 0.5, 8.0], [100.0, 400.0, 50.0], 0.05
    bits = closed_form_bits(scales, costs, budget)
    total = sum(a * math.exp(-math.log(4) * b) for a, b in zip(scales, bits, strict=True))
    assert math.isclose(total, budget, rel_tol=1e-9)


def test_qpart_paper_baseline_is_clipped_to_2_to_8_bits():
    items = [_item("a", 10, 1e-9), _item("b", 10, 1e9)]
    bits = qpart_paper_bits(items, budget=1.0)
    assert bits == {"a": 2, "b": 8}


def test_budget_must_be_positive_for_closed_form():
    with pytest.raises(ValueError, match="positive"):
        closed_form_bits([1.0], [1.0], 0.0)
