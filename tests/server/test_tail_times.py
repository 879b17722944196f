"""Lone requests' measured tail times move the prices; batches and outliers do not run away."""

from __future__ import annotations

import pytest

from server.tail_times import ALPHA, RATIO_BOUNDS, TailTimes


def test_no_profile_no_figures():
    times = TailTimes()
    assert times.seconds("m", "1") is None and times.profile("m", "1") is None
    times.observe("m", "1", 0, 1, 0.5)  # nothing to scale yet: ignored
    assert times.scale("m", "1") == 1.0


def test_lone_requests_move_every_cut_by_one_scale():
    times = TailTimes()
    times.set_profile("m", "1", [0.002, 0.001, 0.0])
    times.observe("m", "1", 1, 1, 0.002)  # twice the profile
    assert times.scale("m", "1") == pytest.approx(1 + ALPHA)
    for _ in range(60):
        times.observe("m", "1", 0, 1, 0.004)
    assert times.seconds("m", "1") == pytest.approx([0.004, 0.002, 0.0], rel=1e-3)
    assert times.profile("m", "1") == [0.002, 0.001, 0.0]  # the start-up profile is kept


def test_batches_other_versions_and_the_last_cut_leave_the_scale_alone():
    times = TailTimes()
    times.set_profile("m", "1", [0.002, 0.0])
    times.observe("m", "1", 0, 8, 0.1)
    times.observe("m", "2", 0, 1, 0.1)
    times.observe("m", "1", 1, 1, 0.1)  # no tail at the last cut
    times.observe("m", "1", 7, 1, 0.1)
    assert times.scale("m", "1") == 1.0


def test_one_stalled_run_moves_the_scale_by_a_bounded_step():
    times = TailTimes()
    times.set_profile("m", "1", [0.001, 0.0])
    times.observe("m", "1", 0, 1, 10.0)  # a 10 s stall
    assert times.scale("m", "1") == pytest.approx(1 + ALPHA * (RATIO_BOUNDS[1] - 1))
