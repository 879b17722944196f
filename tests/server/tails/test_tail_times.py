"""Lone requests' measured tail times move the prices of every cut by one extra, and of a cut they
ran by its own; batches, cuts without a tail and stalls do not run away with it."""

from __future__ import annotations

import pytest

from qpart.server.tails.tail_times import (
    ALPHA,
    CUT_MIN_SAMPLES,
    CUT_STALE_AFTER_S,
    CUT_WINDOW,
    LONE_AFTER_IDLE_S,
    MAX_EXTRA_S,
    TailTimes,
)

IDLE = 1.0  # seconds without a tail batch before a lone request


def test_no_profile_no_figures():
    times = TailTimes()
    assert times.seconds("m", "1") is None and times.profile("m", "1") is None
    times.observe("m", "1", 0, 1, 0.5, idle_s=IDLE)  # nothing to compare with yet: ignored
    assert times.extra("m", "1") == 0.0


def test_lone_requests_add_one_extra_to_every_cut_with_a_tail():
    times = TailTimes()
    times.set_profile("m", "1", [0.002, 0.0001, 0.0])
    times.observe("m", "1", 0, 1, 0.003, idle_s=IDLE)  # 1 ms over the profile
    assert times.extra("m", "1") == pytest.approx(ALPHA * 0.001)
    for _ in range(80):
        times.observe("m", "1", 1, 1, 0.0011, idle_s=IDLE)  # a short late tail sees the same idle cost
    assert times.seconds("m", "1") == pytest.approx([0.003, 0.0011, 0.0], rel=1e-3)
    assert times.profile("m", "1") == [0.002, 0.0001, 0.0]  # the start-up profile is kept


def test_batches_other_versions_and_the_last_cut_leave_the_extra_alone():
    times = TailTimes()
    times.set_profile("m", "1", [0.002, 0.0])
    times.observe("m", "1", 0, 8, 0.1, idle_s=IDLE)
    times.observe("m", "2", 0, 1, 0.1, idle_s=IDLE)
    times.observe("m", "1", 1, 1, 0.1, idle_s=IDLE)  # no tail at the last cut
    times.observe("m", "1", 7, 1, 0.1, idle_s=IDLE)
    assert times.extra("m", "1") == 0.0


def test_one_stalled_run_moves_the_extra_by_a_bounded_step_and_fast_runs_cannot_go_negative():
    times = TailTimes()
    times.set_profile("m", "1", [0.001, 0.0])
    times.observe("m", "1", 0, 1, 10.0, idle_s=IDLE)  # a 10 s stall
    assert times.extra("m", "1") == pytest.approx(ALPHA * MAX_EXTRA_S)
    for _ in range(200):
        times.observe("m", "1", 0, 1, 0.0, idle_s=IDLE)
    assert times.seconds("m", "1")[0] >= 0.0


def test_a_cut_lone_requests_ran_is_priced_by_its_own_samples_and_the_others_by_the_shared_extra():
    times = TailTimes()
    times.set_profile("m", "1", [0.002, 0.006, 0.001, 0.0])  # cut 1's profile 5 ms too high
    for _ in range(30):  # interleaved, as every cut runs in the end-to-end grid
        times.observe("m", "1", 0, 1, 0.0025, idle_s=IDLE)
        times.observe("m", "1", 1, 1, 0.001, idle_s=IDLE)
    got = times.seconds("m", "1")
    assert got[0] == pytest.approx(0.0025) and got[1] == pytest.approx(0.001)  # each what it took
    # cut 2 never ran: its profile plus the shared extra, which mixes the others' samples
    assert got[2] == pytest.approx(max(0.0, 0.001 + times.extra("m", "1")))
    assert got[3] == 0.0


def test_a_cuts_own_price_needs_a_few_samples_and_ignores_one_stall():
    times = TailTimes()
    times.set_profile("m", "1", [0.002, 0.0])
    for _ in range(CUT_MIN_SAMPLES - 1):
        times.observe("m", "1", 0, 1, 0.001, idle_s=IDLE)
    assert times.seconds("m", "1")[0] == pytest.approx(0.002 + times.extra("m", "1"))  # not yet its own
    times.observe("m", "1", 0, 1, 0.001, idle_s=IDLE)
    assert times.seconds("m", "1")[0] == pytest.approx(0.001)
    times.observe("m", "1", 0, 1, 10.0, idle_s=IDLE)  # one stall: the median of the window does not move
    assert times.seconds("m", "1")[0] == pytest.approx(0.001)


def test_a_cuts_own_price_keeps_its_last_window_clamped_and_lapses_when_no_request_runs_it():
    clock = _Clock()
    times = TailTimes(clock=clock)
    times.set_profile("m", "1", [0.002, 0.003, 0.0])
    times.observe("m", "1", 1, 1, 0.030, idle_s=IDLE)
    times.observe("m", "1", 1, 1, 10.0, idle_s=IDLE)  # stalls: each clamped to MAX_EXTRA_S over the profile
    times.observe("m", "1", 1, 1, 10.0, idle_s=IDLE)
    assert times.seconds("m", "1")[1] == pytest.approx(0.003 + MAX_EXTRA_S)
    for _ in range(CUT_WINDOW):  # under load, then quiet: only the last window counts
        times.observe("m", "1", 1, 1, 0.030, idle_s=IDLE)
    for _ in range(CUT_WINDOW):
        times.observe("m", "1", 1, 1, 0.004, idle_s=IDLE)
    assert times.seconds("m", "1")[1] == pytest.approx(0.004)
    for _ in range(3):
        times.observe("m", "1", 1, 1, 0.030, idle_s=IDLE)
    assert times.seconds("m", "1")[1] == pytest.approx(0.004)  # the median of the window
    clock.now += CUT_STALE_AFTER_S + 1  # no request ran cut 1 since: it is not chosen any more
    times.observe("m", "1", 0, 1, 0.002, idle_s=IDLE)
    assert times.seconds("m", "1")[1] == pytest.approx(0.003 + times.extra("m", "1"))  # back to shared


def test_a_lapsed_cut_starts_its_window_afresh():
    clock = _Clock()
    times = TailTimes(clock=clock)
    times.set_profile("m", "1", [0.002, 0.003, 0.0])
    for _ in range(CUT_WINDOW):  # sampled under load
        times.observe("m", "1", 1, 1, 0.009, idle_s=IDLE)
    assert times.seconds("m", "1")[1] == pytest.approx(0.009)
    clock.now += CUT_STALE_AFTER_S + 1
    times.observe("m", "1", 1, 1, 0.003, idle_s=IDLE)  # tried again once lapsed: the old window is gone
    assert times.seconds("m", "1")[1] == pytest.approx(0.003 + times.extra("m", "1"))  # too few of its own
    for _ in range(CUT_MIN_SAMPLES - 1):
        times.observe("m", "1", 1, 1, 0.003, idle_s=IDLE)
    assert times.seconds("m", "1")[1] == pytest.approx(0.003)  # what it takes now


def test_a_burst_at_one_cut_does_not_lapse_the_others_own_prices():
    """In issue 27's grid each sitting's link probe sent 42 cut-0 requests: counted in samples, the
    lapse had priced every other cut of fmnist-mobilenet by the extra the burst set."""
    clock = _Clock()
    times = TailTimes(clock=clock)
    times.set_profile("m", "1", [0.006, 0.0015, 0.0])
    for _ in range(CUT_WINDOW):  # a round of the grid: every cut runs
        times.observe("m", "1", 0, 1, 0.006, idle_s=IDLE)
        times.observe("m", "1", 1, 1, 0.0015, idle_s=IDLE)
    for _ in range(1000):  # then a burst of slow cut-0 requests within a few seconds
        clock.now += 0.005
        times.observe("m", "1", 0, 1, 0.009, idle_s=IDLE)
    assert times.extra("m", "1") == pytest.approx(0.003, rel=1e-3)  # the shared extra follows cut 0
    assert times.seconds("m", "1")[:2] == pytest.approx([0.009, 0.0015])  # cut 1 keeps its own


def test_a_batch_of_one_right_after_other_work_leaves_the_prices_alone():
    """A burst of requests finds the server warm: its samples do not price lone requests, which
    find it idle (ADR 0018)."""
    times = TailTimes()
    times.set_profile("m", "1", [0.002, 0.0015, 0.0])
    for _ in range(CUT_WINDOW):  # lone requests, each after a device's work
        times.observe("m", "1", 0, 1, 0.003, idle_s=0.05)
    assert times.seconds("m", "1")[0] == pytest.approx(0.003)
    for _ in range(5 * CUT_WINDOW):  # then a burst, each request just after the last
        times.observe("m", "1", 0, 1, 0.002, idle_s=LONE_AFTER_IDLE_S / 3)
        times.observe("m", "1", 1, 1, 0.001, idle_s=0.0)
    assert times.seconds("m", "1")[0] == pytest.approx(0.003)
    assert times.extra("m", "1") == pytest.approx(0.001 * (1 - (1 - ALPHA) ** CUT_WINDOW))
    times.observe("m", "1", 0, 1, 0.0025, idle_s=LONE_AFTER_IDLE_S)  # idle long enough: counts
    assert list(times._models[("m", "1")].cut_deltas[0])[-1] == pytest.approx(0.0005)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
