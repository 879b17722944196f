"""bench.e2e.repetitions: a cell's figures are medians of its repetitions, and a loss counts only when
its bootstrap interval lies above +5%."""

from __future__ import annotations

import statistics

import pytest

from bench.e2e.gating import first_attempts, gated_summary
from bench.e2e.repetitions import bootstrap_ratio, merge


def _rep(js: dict[str, float], steal: float = 0.01, **extra: object) -> dict[str, object]:
    return {"model": "m", "device": "d", "rate_mbps": 1.0, "preset": "p", "cache": "cold", "reps": 5,
            "qpart_plan_check": True, "cpu_steal": steal, "implied_rtt_s": None,
            "strategies": {s: {"measured_J": j, "predicted_J": j, "measured_time_s": j, "predicted_time_s": j,
                               "cut": 0, "pattern_id": s, "meets_demand": s != "lossy"}
                           for s, j in js.items()}, **extra}


def test_the_interval_is_a_percentile_interval_of_paired_resamples():
    assert bootstrap_ratio([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]) == (2.0, 2.0)
    lo, hi = bootstrap_ratio([1.0, 1.2, 1.1], [1.0, 1.0, 1.0], seed="x")
    assert 1.0 <= lo <= 1.1 <= hi <= 1.2
    assert bootstrap_ratio([1.0, 1.2, 1.1], [1.0, 1.0, 1.0], seed="x") == (lo, hi)  # seeded
    with pytest.raises(ValueError):
        bootstrap_ratio([1.0], [1.0, 2.0])


def test_a_cell_is_the_median_of_its_repetitions_and_its_best_keeps_the_demand():
    cell = merge([_rep({"qpart": 1.0, "a": 1.2, "lossy": 0.1}), _rep({"qpart": 3.0, "a": 0.9, "lossy": 0.1}),
                  _rep({"qpart": 1.1, "a": 1.0, "lossy": 0.1})])
    assert cell["strategies"]["qpart"]["measured_J"] == 1.1 and cell["strategies"]["a"]["measured_J"] == 1.0
    assert cell["best"] == "a" and cell["best_any"] == "lossy"  # lossy does not keep the demand
    assert cell["qpart_regret"] == pytest.approx(0.1)
    assert cell["strategies"]["qpart"]["J_repetitions"] == [1.0, 3.0, 1.1]
    assert cell["reps"] == 15 and len(cell["repetitions"]) == 3


def test_a_cells_server_time_parts_are_medians_of_its_repetitions_too():
    reps = [_rep({"qpart": 1.0}) for _ in range(3)]
    parts = [(3e-4, 3e-3, 2e-4), (5e-4, 4e-3, 1e-4), (1e-4, 2e-3, 3e-4)]  # the last is no median
    for rep, (q, c, d) in zip(reps, parts, strict=True):
        rep["strategies"]["qpart"].update(measured_queue_s=q, measured_compute_s=c, measured_decode_s=d)
    merged = merge(reps)["strategies"]["qpart"]
    assert (merged["measured_queue_s"], merged["measured_compute_s"], merged["measured_decode_s"]) == (
        3e-4, 3e-3, 2e-4)  # not the last repetition's


def test_a_loss_is_significant_only_when_every_resample_loses_more_than_5pct():
    steady = merge([_rep({"qpart": 1.2, "a": 1.0})] * 3)
    assert steady["significant_loss"] and steady["regret_ci95"] == pytest.approx([0.2, 0.2])
    # one repetition where the planner won: the interval reaches below +5%, not significant
    mixed = merge([_rep({"qpart": 1.2, "a": 1.0}), _rep({"qpart": 1.2, "a": 1.0}),
                   _rep({"qpart": 0.9, "a": 1.0})])
    assert mixed["qpart_regret"] == pytest.approx(0.2) and not mixed["significant_loss"]
    assert mixed["regret_ci95"][0] < 0.05
    near = merge([_rep({"qpart": 1.04, "a": 1.0})] * 3)  # a steady 4% is no significant loss
    assert not near["significant_loss"]
    assert merge([_rep({"qpart": 1.0, "a": 1.3})] * 3)["regret_ci95"] == [0.0, 0.0]  # planner best
    assert steady["versus"]["a"]["significant_loss"] and steady["versus"]["a"]["meets_demand"]


def test_first_attempts_merge_each_repetitions_first_measurement():
    reps = [_rep({"qpart": 1.0, "a": 1.0}, discarded=[_rep({"qpart": 2.0, "a": 1.0}, steal=0.2)]),
            _rep({"qpart": 1.0, "a": 1.0}, discarded=[]), _rep({"qpart": 1.0, "a": 1.0}, discarded=[])]
    cell = merge(reps)
    assert cell["qpart_regret"] == 0.0
    raw = first_attempts([cell])[0]
    assert raw["strategies"]["qpart"]["J_repetitions"] == [2.0, 1.0, 1.0]
    assert gated_summary([cell], 0.05)["cells_measured_again"] == 1


def test_the_resamples_are_paired_so_a_drift_both_strategies_share_cancels():
    # the host ran slower in each repetition for both: paired, the ratio is 1.1 in every resample;
    # resampled apart it would range from 1.1 x 1/3 to 1.1 x 3
    assert bootstrap_ratio([1.1, 2.2, 3.3], [1.0, 2.0, 3.0]) == pytest.approx((1.1, 1.1))


def test_regret_is_the_ratio_of_the_medians_and_a_loss_to_any_strategy_counts_from_5pct():
    cell = merge([_rep({"qpart": 1.0, "a": 1.0}), _rep({"qpart": 1.2, "a": 1.0}),
                  _rep({"qpart": 1.5, "a": 1.4})])
    assert cell["qpart_regret"] == pytest.approx(0.2)  # median 1.2 over median 1.0, not a median of ratios
    steady = merge([_rep({"qpart": 1.03, "a": 1.0, "b": 0.97})] * 3)
    assert not steady["versus"]["a"]["significant_loss"]  # a steady 3% is under the 5% line
    assert steady["versus"]["b"]["significant_loss"]  # 6.2%
    assert steady["best"] == "b" and steady["significant_loss"]


def test_the_twin_gap_is_the_planners_plan_against_itself_and_its_false_alarms_are_counted():
    same = merge([_rep({"qpart": j, "a": 2.0}, twin_J=j) for j in (1.0, 1.1, 0.9)])
    assert same["twin_gap"] == 0.0 and same["twin_ci95"] == [0.0, 0.0] and not same["twin_significant"]
    apart = merge([_rep({"qpart": j, "a": 2.0}, twin_J=j * 1.1) for j in (1.0, 1.1, 0.9)])
    assert apart["twin_gap"] == pytest.approx(0.1) and apart["twin_significant"]
    below = merge([_rep({"qpart": j, "a": 2.0}, twin_J=j / 1.1) for j in (1.0, 1.1, 0.9)])
    assert below["twin_significant"]  # either of the two worse than the other is a false alarm
    near = merge([_rep({"qpart": j, "a": 2.0}, twin_J=j * f)
                  for j, f in ((1.0, 1.04), (1.1, 0.97), (0.9, 1.0))])
    assert not near["twin_significant"]
    assert "twin_gap" not in merge([_rep({"qpart": 1.0, "a": 2.0})] * 3)  # runs from before the twin
    sm = gated_summary([same, apart, below, near], 0.05)
    assert sm["twin"]["significant"] == 2 and sm["twin"]["max_abs_gap"] == pytest.approx(0.1)
    assert sm["twin"]["median_abs_gap"] == pytest.approx(statistics.median(
        [0.0, 0.1, 1 - 1 / 1.1, abs(near["twin_gap"])]))
