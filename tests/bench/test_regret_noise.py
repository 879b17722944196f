"""bench.e2e.analyses.regret_noise: the held-out regret removes the winner's curse that the grid's
statistic has."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.e2e.analyses.regret_noise import (
    analyse,
    held_out,
    main,
    mean_interval,
    predicted,
    sitting_sigmas,
    tied_floor,
)


def _cell(js: dict[str, list[float]], i: int = 0, keeps: dict[str, bool] | None = None,
          twin: list[float] | None = None, pids: list[str] | None = None) -> dict[str, Any]:
    keeps = keeps or {}
    strategies: dict[str, Any] = {s: {"J_repetitions": v, "meets_demand": keeps.get(s, True),
                                      "predicted_J": statistics.median(v)} for s, v in js.items()}
    strategies["qpart"]["pattern_ids"] = pids or ["p"] * len(js["qpart"])
    medians = {s: statistics.median(v) for s, v in js.items() if keeps.get(s, True)}
    best = min(medians, key=lambda s: medians[s])
    cell = {"model": "m", "device": f"d{i}", "rate_mbps": 1.0, "preset": "p", "cache": "cold", "best": best,
            "strategies": strategies, "qpart_regret": statistics.median(js["qpart"]) / medians[best] - 1.0}
    return cell | ({"twin_J_repetitions": twin} if twin is not None else {})


def _noisy_cells(n: int, planner_excess: float, sigma: float, rivals: int, seed: int,
                 twin: bool = False) -> list[dict[str, Any]]:
    """Cells where ``rivals`` strategies tie at J = 1 and the planner's true J is 1 + excess."""
    rng = random.Random(seed)
    cells = []
    for i in range(n):
        js = {"qpart": [(1 + planner_excess) * (1 + rng.gauss(0, sigma)) for _ in range(3)]}
        js |= {f"s{k}": [1 + rng.gauss(0, sigma) for _ in range(3)] for k in range(rivals)}
        t = [(1 + planner_excess) * (1 + rng.gauss(0, sigma)) for _ in range(3)] if twin else None
        cells.append(_cell(js, i, twin=t))
    return cells


def test_held_out_reads_each_repetition_against_the_others_choice():
    cell = _cell({"qpart": [1.0, 1.2, 1.1], "a": [0.9, 1.3, 1.0], "b": [1.05, 1.05, 1.5]})
    # k=0: the others (1, 2) choose by median over them: qpart 1.15, a 1.15, b 1.275 -> a (tie: name)
    # k=1: over (0, 2): qpart 1.05, a 0.95, b 1.275 -> a;  k=2: over (0, 1): qpart 1.1, a 1.1, b 1.05 -> b
    logs = [math.log(1.0 / 0.9), math.log(1.2 / 1.3), math.log(1.1 / 1.5)]
    assert held_out(cell) == pytest.approx(math.exp(statistics.mean(logs)) - 1)


def test_without_noise_held_out_is_the_grid_figure():
    cell = _cell({"qpart": [1.1] * 3, "a": [1.0] * 3, "b": [1.3] * 3})
    assert held_out(cell) == pytest.approx(cell["qpart_regret"]) == pytest.approx(0.1)


def test_a_strategy_that_misses_the_demand_is_never_chosen_the_planner_included():
    cell = _cell({"qpart": [1.0, 1.0, 1.0], "cheap": [0.5, 0.5, 0.5]}, keeps={"cheap": False})
    assert held_out(cell) == 0.0
    missed = _cell({"qpart": [0.9] * 3, "a": [1.0] * 3}, keeps={"qpart": False})
    assert missed["qpart_regret"] == pytest.approx(-0.1) and held_out(missed) == pytest.approx(-0.1)


def test_a_tied_planner_shows_the_curse_in_the_grid_statistic_and_none_held_out():
    cells = _noisy_cells(300, 0.0, 0.03, rivals=8, seed=1)
    got = analyse({"cells": cells}, draws=500)["summary"]
    assert got["regret"]["mean"] > 0.02  # the winner's curse: a tied planner "loses"
    # held out, tied rivals can only be chosen among ties: no curse, and no weaker rival either
    assert abs(got["held_out"]["mean"]) < 0.003
    lo, hi = got["held_out"]["mean_ci95"]
    assert lo < 0.0 < hi
    assert got["regret_less_held_out"]["mean_ci95"][0] > 0.0
    assert "tied_floor" not in got  # no twins: no noise figure


def test_a_planner_truly_worse_shows_it_held_out():
    cells = _noisy_cells(300, 0.10, 0.01, rivals=4, seed=2)
    got = analyse({"cells": cells}, draws=200)["summary"]
    assert got["held_out"]["mean"] == pytest.approx(0.10, abs=0.003)
    assert got["regret"]["mean"] > got["held_out"]["mean"] + 0.005  # the curse, on top


def test_the_noise_per_sitting_is_the_twin_gap_over_root_two():
    a = _cell({"qpart": [1.0, 2.0, 1.0]}, twin=[math.e ** 0.02, 2.0, 1.0])
    warm = a | {"cache": "warm"}  # the same runs: counted once
    b = _cell({"qpart": [1.0, 1.0, 1.0]}, twin=[1.0, math.e ** -0.04, 1.0], pids=["p", "other", "p"])
    other = _cell({"qpart": [1.0, 1.0, 1.0]}, i=9, twin=[1.0, 1.0, 1.0])
    got = sitting_sigmas([a, warm, b, other])
    # sitting d0's distinct runs: a's three; b's first (its figures are not a's first's) and second
    # (another plan); b's third is a's third (same repetition, plan and figures)
    pairs = [0.02, 0.0, 0.0, 0.0, -0.04]
    assert got[("m", "d0", 1.0)] == pytest.approx(math.sqrt(statistics.mean(d * d / 2 for d in pairs)))
    assert got[("m", "d9", 1.0)] == 0.0


def test_the_tied_floor_is_the_statistic_for_a_planner_as_good_as_the_best():
    rng = np.random.default_rng(0)
    alone = _cell({"qpart": [1.0, 1.1, 0.9], "cut-0": [1.0, 1.1, 0.9]})  # one plan under two names
    assert tied_floor(alone, 0.05, 1000, rng) == 0.0
    far = _cell({"qpart": [1.0, 1.0, 1.0], "a": [2.0, 2.0, 2.0]})
    assert tied_floor(far, 0.03, 1000, rng) == pytest.approx(0.0, abs=1e-6)
    # the planner measured worse than a rival still counts as tied with it
    # (eight rivals' distinct runs: identical figures would be one plan's runs under two names)
    tied = _cell({"qpart": [1.2, 1.2, 1.2]} | {f"s{k}": [1.0 + 1e-12 * k] * 3 for k in range(8)})
    assert tied_floor(tied, 0.0, 100, rng) == 0.0
    noisy = tied_floor(tied, 0.03, 4000, rng)
    # the median of 3 readings spreads about 0.67 sigma; one of 9 such medians lies, in expectation,
    # 1.49 of that above their least: about 0.03
    assert noisy == pytest.approx(1.49 * 0.67 * 0.03, rel=0.1)


def test_a_rival_that_ran_the_planners_plan_in_a_repetition_takes_its_draw_there():
    rng = np.random.default_rng(1)
    # "a" ran the planner's plan in repetitions 0 and 1: there it takes the planner's draws, and
    # only its own third run can move it, so it undercuts the planner less than a free rival does
    shared = _cell({"qpart": [1.0, 1.0, 1.0], "a": [1.0, 1.0, 1.0 + 1e-12]})
    free = _cell({"qpart": [1.0, 1.0, 1.0], "a": [1.0 + 1e-12, 1.0 + 2e-12, 1.0 + 3e-12]})
    got_shared, got_free = tied_floor(shared, 0.03, 20000, rng), tied_floor(free, 0.03, 20000, rng)
    assert 0.0 < got_shared < 0.75 * got_free


def test_analyse_with_twins_gives_the_tied_floor():
    cells = _noisy_cells(40, 0.0, 0.03, rivals=8, seed=4, twin=True)
    got = analyse({"cells": cells}, draws=200, simulations=500)["summary"]
    # sigma from the twins is about 0.03: the floor is about the curse the grid figure shows
    assert got["tied_floor"]["mean"] == pytest.approx(got["regret"]["mean"], rel=0.5)
    assert set(got["by_model"]["m"]) == {"regret", "held_out", "regret_less_held_out", "predicted",
                                         "tied_floor"}


def test_the_predicted_regret_is_the_cost_models_own():
    cell = _cell({"qpart": [1.0] * 3, "paper": [1.0] * 3, "far": [2.0] * 3, "lossy": [0.5] * 3},
                 keeps={"lossy": False})
    cell["strategies"]["qpart"]["predicted_J"] = 1.0
    cell["strategies"]["paper"]["predicted_J"] = 0.8  # cheaper by the model, not measured so
    assert predicted(cell) == pytest.approx(0.25)
    cell["strategies"]["paper"]["predicted_J"] = 1.5
    assert predicted(cell) == 0.0


def test_the_interval_resamples_sittings_whole():
    # two sittings of four cells: whole sittings give means of 0, 0.5 or 1; cells drawn one by one
    # would give (0.125, 0.875)
    cells = [{"model": "m", "device": d, "rate_mbps": 1.0, "x": x} for d, x in
             [("a", 0.0)] * 4 + [("b", 1.0)] * 4]
    assert mean_interval(cells, "x", 2000, "s") == [0.0, 1.0]


def test_main_writes_the_figures_and_refuses_what_is_not_a_grid(tmp_path: Path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"cells": _noisy_cells(4, 0.0, 0.01, rivals=2, seed=3)}))
    out = tmp_path / "out.json"
    main([str(grid), "--draws", "50", "--simulations", "50", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["summary"]["cells"] == 4 and len(doc["cells"]) == 4
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cells": []}))
    with pytest.raises(SystemExit):
        main([str(bad), "--json", str(out)])
