"""bench.e2e's baselines: served by the same server, never admitted by the planner."""

from __future__ import annotations

from bench.e2e import (
    EXTRA_LEVEL,
    STRATEGIES,
    markdown,
    meets_demand,
    with_baselines,
)
from profiles.artifacts import load_artifact
from server.planner import allowed_patterns


def test_baseline_patterns_cover_every_cut_and_no_demand_admits_them(artifacts_dir):
    artifact = load_artifact(artifacts_dir / "fmnist-cnn")
    extended = with_baselines(artifact)
    extra = extended.patterns[len(artifact.patterns):]
    u8 = [p for p in extra if p.pattern_id.startswith("u8-")]
    paper = [p for p in extra if p.pattern_id.startswith("paper-")]
    assert sorted(p.cut for p in u8) == [c.index for c in artifact.cuts]
    assert all(set(p.weight_bits.values()) <= {8} for p in u8)
    assert all(p.activation_bits == 8 for p in u8 if p.cut < len(artifact.cuts) - 1)
    assert len(paper) == len(artifact.cuts) and all(p.level == EXTRA_LEVEL for p in extra)
    ids = [p.pattern_id for p in extra]
    assert len(set(ids)) == len(ids) and not set(ids) & {p.pattern_id for p in artifact.patterns}
    for demand in (0.0, 0.01, 0.5, 0.999):
        assert allowed_patterns(extended, demand) == allowed_patterns(artifact, demand)


def test_a_published_pattern_competes_only_if_its_test_drop_keeps_the_demand():
    assert meets_demand("qpart-paper", {"test_drop": 0.009})
    assert not meets_demand("qpart-paper", {"test_drop": 0.011})
    assert not meets_demand("qpart-paper", {"test_drop": None})
    assert meets_demand("all-server", {"test_drop": 0.0})


def test_the_table_names_each_cells_repetitions():
    cell = {"model": "m", "device": "d", "rate_mbps": 1.0, "preset": "p", "cache": "cold", "reps": 37,
            "best": "qpart", "qpart_regret": 0.0,
            "strategies": {s: {"measured_J": 1.0, "cut": 0} for s in STRATEGIES}}
    summary = {"cells": 1, "max_regret": 0.0, "cells_regret_over_5pct": 0, "median_time_error": 0.1,
               "cells_qpart_beats": {}}
    row = markdown({"cells": [cell], "summary": summary}).splitlines()[2]
    assert "| cold | 37 | 0 |" in row
