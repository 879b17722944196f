"""How much of a grid's mean regret its noise alone makes (issue 27, item 1).

``python -m bench.e2e.analyses.regret_noise bench/runs/RAW.json --json OUT`` (a raw grid of ``bench.e2e``)

A cell's regret (:mod:`bench.e2e.repetitions`) is the planner's median ``J`` over the smallest
median ``J`` among the strategies that keep the demand, minus 1. The smallest is picked from the
same noisy figures it is then judged on. Where several strategies tie, the smallest of their noisy
medians lies below their true values, and the planner shows a regret even if it chose as well as
any of them (the winner's curse). The curse grows with the number of near ties (16 to 42 distinct
rivals a cell in the grids so far) and with the noise. For a planner that keeps the demand it is
never negative.

Beside the grid's figure, this module gives two others.

- **Held out** (leave one repetition out). For each repetition k, the best strategy is chosen by
  its median ``J`` over the other repetitions, and the regret is read on repetition k alone: the
  log of the planner's ``J`` there over the chosen strategy's there. A cell's figure is
  ``exp(mean over k) - 1`` (a mean of logs, not of ratios: one repetition's ratio of noisy figures
  is lifted by about ``exp(sigma^2) - 1``). Choosing and judging on disjoint repetitions removes
  the curse. It errs the other way instead: where the other repetitions choose a strategy that is
  not the true best, the reading is against a weaker rival, and a planner tied with the best reads
  below zero. So, if the repetitions are independent and no strategy's noise has an offset of its
  own, the grid's figure lies above the true mean regret in expectation and the held-out one below
  it.
- **Tied floor**: the grid's statistic, in expectation, for a planner that is the cell's best. It
  is simulated on each cell's own figures (every rival at its median ``J``, the planner at the
  smallest of them) with each repetition's noise as large as the planner's twin showed in the
  sitting (:func:`sitting_sigmas`). It is a rough figure. It comes out low where rivals are truly
  tied: they look spread apart at their measured medians, which thins the ties the curse feeds on,
  and the twin misses the noise of downloads (it shares the planner's) and of whatever a
  repetition shares. It comes out high where the noise is heavy-tailed (the twin's gaps are): the
  simulation's log-normal noise has the gaps' root mean square, which overstates their core, and
  medians discount the tails. It is not to be added to the predicted figure: where a strategy the
  planner may not offer is the best, both count its gap.

- **Predicted**: the regret the cost model itself expects, the planner's predicted ``J`` over the
  smallest predicted ``J`` among the demand-keeping strategies, minus 1. The planner minimizes
  predicted ``J`` over what it may offer, so this is what the strategies it may not offer would
  save by its own pricing (QPART-as-published, for one, is judged by its test drop alone, the
  planner's patterns by the promise's bound). It carries no measurement noise.

Each mean comes with a 95% bootstrap interval over sittings (model, device and rate: a sitting's
cells share their rounds, so they are resampled together), the same draws for every figure, and
the interval of the grid's figure less the held-out one.

It reads the repetitions the grid stored. It does not replace the issue's statistic: the acceptance
is the grid's own summary.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bench import write_json
from bench.e2e.report import p95
from bench.e2e.summary import Sitting, mean_interval, sitting_of

BOOTSTRAP_DRAWS = 2_000
SIMULATIONS = 2_000

def _series(cell: dict[str, Any]) -> tuple[list[float], dict[str, list[float]]]:
    """The planner's J per repetition, and every demand-keeping strategy's (the planner's among
    them only if it keeps the demand, as in :func:`bench.e2e.repetitions.merge`)."""
    strategies = cell["strategies"]
    keep = {s: list(v["J_repetitions"]) for s, v in strategies.items() if v["meets_demand"]}
    return list(strategies["qpart"]["J_repetitions"]), keep


def held_out(cell: dict[str, Any]) -> float:
    """``exp`` of the mean over repetitions k of the log of the planner's J on k over the J on k of
    the strategy the other repetitions' medians call best, minus 1."""
    planner, keep = _series(cell)
    n = len(planner)
    if n < 2:
        raise ValueError("held-out regret needs at least 2 repetitions")
    logs = []
    for k in range(n):
        rest = [i for i in range(n) if i != k]
        best = min(keep, key=lambda s: (statistics.median(keep[s][i] for i in rest), s))
        logs.append(math.log(planner[k] / keep[best][k]))
    return math.exp(statistics.mean(logs)) - 1.0


def predicted(cell: dict[str, Any]) -> float:
    """The planner's predicted J over the smallest predicted J of a demand-keeping strategy, minus 1."""
    strategies = cell["strategies"]
    keep = [v["predicted_J"] for v in strategies.values() if v["meets_demand"]]
    return float(strategies["qpart"]["predicted_J"] / min(keep) - 1.0)


def sitting_sigmas(cells: list[dict[str, Any]]) -> dict[Sitting, float]:
    """Per sitting, the noise of one strategy's J in one repetition, as the planner's twin shows it:
    the planner's plan measured twice in the same rounds differs by ``d = log(twin / planner)`` per
    repetition, and two independent draws of noise ``sigma`` differ by ``sqrt(2) * sigma``, so
    ``sigma^2`` is the mean of ``d^2 / 2`` over the sitting's distinct twin pairs. A pair is one
    repetition's run of one plan: cells of a sitting whose planners ran the same plan in a
    repetition (a preset's cold and warm cells, mostly) share it, and it counts once."""
    pairs: dict[Sitting, dict[tuple[int, str, float, float], float]] = {}
    for c in cells:
        if "twin_J_repetitions" not in c:
            continue
        q = c["strategies"]["qpart"]
        got = pairs.setdefault(sitting_of(c), {})
        for r, (pid, t, j) in enumerate(zip(q["pattern_ids"], c["twin_J_repetitions"], q["J_repetitions"],
                                            strict=True)):
            got[(r, pid, t, j)] = math.log(t / j)
    return {k: math.sqrt(statistics.mean(d * d / 2.0 for d in v.values())) for k, v in pairs.items()}


def tied_floor(cell: dict[str, Any], sigma: float, draws: int, rng: np.random.Generator) -> float:
    """The grid's statistic for a planner that is the cell's best, in expectation, simulated.

    The planner's true J is the smallest of the cell's medians (its own or a demand-keeping
    rival's), every rival's is its median. Each distinct run of a repetition draws its noise once
    (log-normal, ``sigma``): a rival whose J in a repetition is the planner's ran the planner's plan
    there and takes its draw and its true J, and two rivals that ran the same plan share a draw. A
    strategy's figure is the median of its repetitions, as in the grid."""
    planner, keep = _series(cell)
    if not keep or all(v == planner for v in keep.values()):
        return 0.0
    n = len(planner)
    names = sorted(keep)
    medians = np.array([statistics.median(keep[s]) for s in names])
    best = min(statistics.median(planner), float(medians.min()))
    true = np.tile(medians[:, None], (1, n))  # (strategy, repetition)
    run = np.zeros((len(names), n), dtype=np.int64)  # which draw: 0 is the planner's run
    for r in range(n):
        ids: dict[float, int] = {planner[r]: 0}
        for i, s in enumerate(names):
            run[i, r] = ids.setdefault(keep[s][r], len(ids))
            if run[i, r] == 0:
                true[i, r] = best
    noise = np.exp(sigma * rng.standard_normal((draws, n, int(run.max()) + 1)))  # (draw, rep, run)
    q = np.median(best * noise[:, :, 0], axis=1)
    reps = np.arange(n)[None, :]
    figures = np.median(true[None] * noise[:, reps, run], axis=2)  # (draw, strategy)
    return float(np.mean(q / np.minimum(q, figures.min(axis=1)) - 1.0))


def analyse(doc: dict[str, Any], draws: int = BOOTSTRAP_DRAWS, simulations: int = SIMULATIONS,
            ) -> dict[str, Any]:
    """Per cell the grid's regret beside the held-out regret, the predicted one and the tied
    planner's floor; their
    means (with intervals) and 95th percentiles over the grid, and their means per model."""
    sigmas = sitting_sigmas(doc["cells"])
    rng = np.random.default_rng(20261203)
    cells = []
    for c in doc["cells"]:
        sigma = sigmas.get(sitting_of(c))
        regret, out = c["qpart_regret"], held_out(c)
        cells.append({"model": c["model"], "device": c["device"], "rate_mbps": c["rate_mbps"],
                      "preset": c["preset"], "cache": c["cache"], "best": c["best"], "regret": regret,
                      "held_out": out, "regret_less_held_out": regret - out, "predicted": predicted(c),
                      "sigma": sigma,
                      "tied_floor": None if sigma is None else tied_floor(c, sigma, simulations, rng)})
    keys = ["regret", "held_out", "regret_less_held_out", "predicted"]
    keys += ["tied_floor"] if all(c["sigma"] is not None for c in cells) else []

    def figures(key: str) -> dict[str, Any]:
        values = [c[key] for c in cells]
        return {"mean": statistics.mean(values), "mean_ci95": mean_interval(cells, key, draws, "sittings"),
                "p95": p95(sorted(values)), "max": max(values),
                "cells_over_5pct": sum(v > 0.05 for v in values)}

    models = sorted({c["model"] for c in cells})
    by_model = {m: {k: statistics.mean(c[k] for c in cells if c["model"] == m) for k in keys} for m in models}
    return {"cells": cells, "summary": {"cells": len(cells), **{k: figures(k) for k in keys},
                                        "by_model": by_model}}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path, help="a bench.e2e JSON document")
    parser.add_argument("--draws", type=int, default=BOOTSTRAP_DRAWS,
                        help=f"bootstrap resamples of the sittings (default {BOOTSTRAP_DRAWS})")
    parser.add_argument("--simulations", type=int, default=SIMULATIONS,
                        help=f"simulated grids per cell for the tied floor (default {SIMULATIONS})")
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    args = parser.parse_args(argv)
    doc = json.loads(args.grid.read_text())
    if not doc.get("cells") or "J_repetitions" not in doc["cells"][0]["strategies"]["qpart"]:
        parser.error(f"{args.grid}: not a bench.e2e grid with repetitions")
    out = {"grid": str(args.grid), "grid_provenance": doc.get("provenance"), "draws": args.draws,
           "simulations": args.simulations,
           **analyse(doc, args.draws, args.simulations)}
    print(json.dumps(out["summary"]))
    write_json(args.json, out)


if __name__ == "__main__":
    main()
