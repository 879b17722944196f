"""bench.e2e.summary: a raw grid's cited figures in a small file; bench.e2e's raw grids go outside
the tree by default."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import REPO
from bench.e2e import default_output
from bench.e2e.analyses.regret_noise import analyse
from bench.e2e.summary import MAX_SUMMARY_BYTES, main, summarize_grid

DEVICES = ("pi", "nano", "phone")
RATES = (1.0, 100.0)


def _cell(model: str, device: str, rate: float, preset: str, cache: str,
          rng: random.Random) -> dict[str, Any]:
    """A grid cell as bench.e2e writes it: the planner, two baselines and a forced cut, 3 repetitions."""
    js = {"qpart": [1.0 + rng.uniform(0, 0.1) for _ in range(3)], "all-server": [1.05, 1.1, 1.08],
          "input-png": [1.0 + rng.uniform(0, 0.2) for _ in range(3)], "cut-2": [1.3, 1.2, 1.25]}
    error = {"qpart": 0.02, "all-server": 0.04, "input-png": 0.08, "cut-2": 0.3 if rate == 100.0 else 0.01}
    strategies = {s: {"J_repetitions": v, "measured_J": sorted(v)[1], "predicted_J": sorted(v)[1],
                      "measured_time_s": 0.01, "predicted_time_s": 0.01 * (1 + error[s]), "cut": 0,
                      "meets_demand": True, "rounds": [0.01] * 50} for s, v in js.items()}
    best = min(strategies, key=lambda s: strategies[s]["measured_J"])
    regret = strategies["qpart"]["measured_J"] / strategies[best]["measured_J"] - 1
    return {"model": model, "device": device, "rate_mbps": rate, "preset": preset, "cache": cache,
            "best": best, "qpart_regret": regret, "qpart_plan_check": True, "cpu_steal": 0.001,
            "regret_ci95": [regret - 0.01, regret + 0.01], "significant_loss": regret > 0.08,
            "twin_gap": rng.uniform(-0.02, 0.02), "strategies": strategies,
            "versus": {"input-png": {"significant_loss": False, "meets_demand": True}}}


def _grid(seed: int = 3) -> dict[str, Any]:
    rng = random.Random(seed)
    cells = [_cell(m, d, r, p, c, rng) for m in ("cnn", "resnet") for d in DEVICES for r in RATES
             for p in ("latency-first", "energy-first") for c in ("cold", "warm")]
    return {"cells": cells, "demand": 0.01, "repetitions": 3, "quick": False,
            "provenance": {"commit": "abc1234", "tracked_files_changed": False}}


def test_the_summary_keeps_the_cited_figures_and_names_its_source(tmp_path):
    raw = tmp_path / "e2e-abc1234.json"
    raw.write_text(json.dumps(_grid()))
    out = tmp_path / "e2e-abc1234-summary.json"
    main([str(raw), "--out", str(out), "--draws", "200"])
    doc = json.loads(out.read_text())
    cells = json.loads(raw.read_text())["cells"]
    mean = sum(c["qpart_regret"] for c in cells) / len(cells)
    assert doc["summary"]["mean_regret"] == pytest.approx(mean)
    lo, hi = doc["mean_regret_ci95"]
    assert lo <= mean <= hi and lo < hi
    assert doc["source"] == {"file": raw.name, "bytes": raw.stat().st_size,
                             "sha256": hashlib.sha256(raw.read_bytes()).hexdigest()}
    assert doc["grid_provenance"]["commit"] == "abc1234"
    worst = [e for _, e in doc["worst_time_errors"]]
    assert worst == sorted(worst, reverse=True) and doc["worst_time_errors"][0][0] == "cnn cut-2"
    assert set(doc["by_rate"]) == {"1", "100"}
    assert doc["by_rate"]["100"]["strategies_time_error_over_10pct"] == 2  # each model's cut-2
    assert doc["by_rate"]["1"]["strategies_time_error_over_10pct"] == 0
    assert len(doc["cells"]) == len(cells) and "strategies" not in doc["cells"][0]
    assert {r["model"] for r in doc["best_baselines"]} == {"cnn", "resnet"}
    assert out.stat().st_size < raw.stat().st_size / 4 and out.stat().st_size < MAX_SUMMARY_BYTES


def test_the_summary_interval_is_the_regret_noise_interval():
    grid = _grid(seed=11)
    ours = summarize_grid(grid, draws=300)["mean_regret_ci95"]
    assert ours == analyse(grid, draws=300, simulations=10)["summary"]["regret"]["mean_ci95"]


def test_the_summary_refuses_a_file_that_is_not_a_grid(tmp_path):
    raw = tmp_path / "x.json"
    raw.write_text(json.dumps({"kernels": []}))
    with pytest.raises(SystemExit):
        main([str(raw), "--out", str(tmp_path / "s.json")])
    assert not (tmp_path / "s.json").exists()


def test_a_raw_grid_goes_by_default_where_git_ignores_it_and_no_archived_file_lives():
    path = default_output(quick=True)
    assert path.parent == REPO / "bench" / "runs" and path.name.startswith("e2e-") and "-quick-" in path.name
    ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO, check=False)
    assert ignored.returncode == 0
    tracked = subprocess.run(["git", "ls-files", "bench/results"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert all(Path(t).name != path.name for t in tracked)
    assert default_output(quick=False).name != path.name
