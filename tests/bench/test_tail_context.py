"""bench.e2e.analyses.tail_context: the server's tail time by what the client did before the request."""

from __future__ import annotations

from bench.e2e.analyses.tail_context import CONDITIONS, _repeat, summary


def test_the_summary_gives_each_conditions_median_quartiles_and_count():
    s = summary({"sleep": [1.0, 2.0, 3.0, 4.0, 5.0], "torch": [2.0, 2.0, 9.0]})
    assert s["sleep"]["median_s"] == 3.0 and s["sleep"]["n"] == 5
    assert s["sleep"]["q1_s"] < 3.0 < s["sleep"]["q3_s"]
    assert s["torch"]["median_s"] == 2.0


def test_the_busy_condition_keeps_the_client_busy_for_its_seconds():
    import time
    start = time.perf_counter()
    calls: list[int] = []
    _repeat(lambda: calls.append(1))(0.01)
    assert time.perf_counter() - start >= 0.01  # at least its seconds (a loaded host may add more)
    assert calls  # the work ran, again and again
    assert CONDITIONS == ("back-to-back", "sleep", "busy", "torch")
