"""Paired drop statistics and the noise↔drop mapping."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qpart.kernels import activation_group
from qpart.offline.validation import PairedDrop, budget_for_level, paired_drop, predicted_drop
from qpart.profiles.artifacts import AccuracyPoint


def test_paired_drop_counts_lost_and_gained():
    ref = np.array([True, True, False, False, True])
    new = np.array([False, True, True, False, True])
    d = paired_drop(ref, new)
    assert (d.n, d.lost, d.gained, d.drop) == (5, 1, 1, 0.0)


def test_bound_without_any_flip_is_a_few_over_n():
    # Exact: the lost side at 97.5% gives ~3.69 / n; Wilson at 95% gives z^2 / n ~ 2.7 / n.
    assert 3.0 / 6000 < PairedDrop(n=6000, lost=0, gained=0).upper_bound(0.95) < 4.0 / 6000
    assert 2.0 / 6000 < PairedDrop(n=6000, lost=0, gained=0).upper_bound(0.95, "newcombe") < 3.0 / 6000


@settings(max_examples=200, deadline=None)
@given(n=st.integers(50, 20000), data=st.data(), method=st.sampled_from(["newcombe", "exact"]))
def test_bound_is_above_the_point_estimate(n, data, method):
    lost = data.draw(st.integers(0, n))
    gained = data.draw(st.integers(0, n - lost))
    d = PairedDrop(n, lost, gained)
    assert d.upper_bound(0.95, method) >= d.drop


@pytest.mark.parametrize(("p_lost", "p_gained"), [
    (0.012, 0.007), (0.006, 0.001), (0.02, 0.0), (0.003, 0.003), (0.008, 0.0), (0.03, 0.02), (0.0005, 0.0),
])
@pytest.mark.parametrize("method", ["newcombe", "exact"])
def test_bound_has_the_promised_coverage(p_lost, p_gained, method):
    # Simulated patterns with a known net drop: the 95% bound must cover it about 95% of the time.
    # 3,000 draws: a coverage of 0.95 would fall below 0.935 with probability < 1e-4.
    rng = np.random.default_rng(7)
    draws = rng.multinomial(6000, [p_lost, p_gained, 1 - p_lost - p_gained], size=3000)
    covered = np.mean([PairedDrop(6000, int(a), int(b)).upper_bound(0.95, method) >= p_lost - p_gained
                       for a, b, _ in draws])
    assert covered >= 0.935


def test_budget_stops_before_the_first_point_above_the_level():
    pts = [AccuracyPoint(noise=n, predicted_noise=n, drop=d)
           for n, d in [(1.0, 0.0), (2.0, 0.004), (3.0, 0.02), (4.0, 0.003)]]
    assert budget_for_level(pts, 0.005) == 2.0
    assert budget_for_level(pts, 0.05) == 4.0
    assert budget_for_level(pts, 0.0001) == 1.0
    assert 0 < budget_for_level(pts[1:], 0.0001) < 2.0  # below every point: scaled down


def test_predicted_drop_is_monotone_in_noise():
    pts = [AccuracyPoint(noise=n, predicted_noise=n, drop=d)
           for n, d in [(1.0, 0.001), (2.0, 0.0005), (3.0, 0.02)]]
    values = [predicted_drop(pts, x) for x in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 10.0)]
    assert values == sorted(values)


def test_activation_groups_divide_the_sample():
    for numel in (10, 64, 784, 3136, 6272, 12544, 25088):
        g = activation_group(numel, 256)
        assert numel % g == 0 and g <= 256
    assert activation_group(12544, 256) == 256
