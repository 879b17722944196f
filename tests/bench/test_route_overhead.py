"""bench.e2e.analyses.route_overhead: both routes answer the same PNG over real HTTP, and the interval is
of the difference of the medians."""

from __future__ import annotations

import json

import pytest

from bench.e2e.analyses.route_overhead import ROUTES, bootstrap_difference, main

pytestmark = pytest.mark.integration  # a bench.harness.shaped_server process on loopback


def test_the_interval_holds_the_difference_of_the_medians():
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0] * 8, [0.5, 1.5, 2.5, 3.5, 4.5] * 8
    low, high = bootstrap_difference(a, b)
    assert low <= 0.5 <= high
    pairs = [float(x) for x in range(40)]  # paired draws: a fixed shift is exact, a reversal is not
    assert bootstrap_difference(pairs, [x - 1.0 for x in pairs]) == [1.0, 1.0]
    low, high = bootstrap_difference(pairs, pairs[::-1])
    assert low < 0 < high
    assert bootstrap_difference([1.0] * 10, [1.0] * 10) == [0.0, 0.0]


def test_both_routes_are_measured_with_their_server_time_taken_out(tmp_path, cnn_only):
    out = tmp_path / "ro.json"
    main(["--pairs", "5", "--artifacts", str(cnn_only), "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["pairs"] == 5 and doc["body_bytes"] > 0
    for route in ROUTES:
        r = doc["routes"][route]
        assert 0 < r["server_s"] < r["round_trip_s"]
        assert 0 < r["outside_s"] < r["round_trip_s"]  # the reported server time taken out
    low, high = doc["outside_difference_ci95_s"]
    assert low <= doc["outside_difference_s"] <= high
    assert doc["provenance"]["commit"] is not None
    assert [len(doc["outside_s"][r]) for r in ROUTES] == [5, 5] and doc["seed"] == 0
