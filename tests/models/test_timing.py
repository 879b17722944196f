"""Interleaved timing: every function once per round, at least ``repeats`` rounds and ``min_seconds``."""

from __future__ import annotations

import time

import pytest

from qpart.models.timing import interleaved_medians, median_seconds


def test_every_round_runs_every_function_once_in_a_changing_order():
    calls: list[int] = []
    fns = [lambda i=i: calls.append(i) for i in range(4)]
    interleaved_medians(fns, warmup=1, repeats=6)
    timed = calls[4:]  # one warm-up call each, first
    rounds = [timed[k:k + 4] for k in range(0, len(timed), 4)]
    assert len(rounds) == 6 and all(sorted(r) == [0, 1, 2, 3] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # shuffled, not a fixed rotation


def test_min_seconds_adds_rounds_until_that_long_has_passed():
    calls = []
    start = time.perf_counter()
    interleaved_medians([lambda: calls.append(1)], warmup=0, repeats=2, min_seconds=0.05)
    assert time.perf_counter() - start >= 0.05 and len(calls) > 2


def test_medians_follow_the_functions_and_bad_repeats_are_refused():
    slow, fast = interleaved_medians([lambda: time.sleep(0.004), lambda: None], warmup=0, repeats=5)
    assert slow >= 0.004 > fast
    assert median_seconds(lambda: time.sleep(0.002), warmup=0, repeats=3) >= 0.002
    with pytest.raises(ValueError, match="repeats"):
        interleaved_medians([lambda: None], warmup=0, repeats=0)


def test_each_round_settles_then_times_a_burst_back_to_back():
    calls: list[int] = []
    fns = [lambda i=i: calls.append(i) for i in range(3)]
    interleaved_medians(fns, warmup=0, repeats=4, settle=2, burst=3)
    runs = [calls[k:k + 5] for k in range(0, len(calls), 5)]  # settle + burst per function
    assert len(runs) == 12 and all(len(set(r)) == 1 for r in runs)
    rounds = [sorted(r[0] for r in runs[k:k + 3]) for k in range(0, 12, 3)]
    assert rounds == [[0, 1, 2]] * 4


@pytest.mark.parametrize("bad", [{"burst": 0}, {"settle": -1}, {"min_seconds": float("inf")},
                                 {"min_seconds": float("nan")}, {"min_seconds": -1.0}])
def test_settings_that_cannot_finish_or_time_nothing_are_refused(bad):
    with pytest.raises(ValueError):
        interleaved_medians([lambda: None], warmup=0, repeats=1, **bad)
