"""A grid's figures in a small file: what bench/README.md cites, without the raw rounds.

``python -m bench.e2e.summary RAW.json --out bench/results/e2e-<commit>-summary.json``

A full grid's JSON (``bench.e2e --json``) holds every round of every repetition: 16-27 MB. Raw
grids stay outside the tree (``bench/runs/``, ignored); the summary is what gets committed. It
holds the grid's own summary (mean, 95th percentile and max regret, significant losses and where,
median time error overall and per strategy or forced cut, cells the planner strictly wins per
baseline, baselines significantly better, the twin's gaps, CPU steal), the mean regret's 95%
bootstrap interval over sittings (the same draws as :mod:`bench.e2e.analyses.regret_noise`, so the
two agree), the worst median time errors, the same figures per link rate, the best baseline per
model, rate and cache state, one short row per cell, and where it came from: the raw file's name,
size and sha256 and the grid's provenance (commit, clean tree, when).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
from pathlib import Path
from typing import Any

from bench import write_json
from bench.e2e.report import best_baselines, summarize

BOOTSTRAP_DRAWS = 2_000
WORST_TIME_ERRORS = 5
MAX_SUMMARY_BYTES = 1 << 20

Sitting = tuple[str, str, float]


def sitting_of(cell: dict[str, Any]) -> Sitting:
    """The sitting a cell was measured in: its model, device and rate share one set of rounds."""
    return (cell["model"], cell["device"], cell["rate_mbps"])


def mean_interval(cells: list[dict[str, Any]], key: str, draws: int, seed: str) -> list[float]:
    """95% percentile interval of the mean of ``key`` over cells, sittings resampled together."""
    groups: dict[Sitting, list[float]] = {}
    for c in cells:
        groups.setdefault(sitting_of(c), []).append(c[key])
    sittings = list(groups.values())
    rng = random.Random(seed)
    means = []
    for _ in range(draws):
        drawn = [v for _ in sittings for v in sittings[rng.randrange(len(sittings))]]
        means.append(statistics.mean(drawn))
    means.sort()
    return [means[int(0.025 * draws)], means[min(draws - 1, int(0.975 * draws))]]


def worst_time_errors(summary: dict[str, Any], count: int = WORST_TIME_ERRORS) -> list[list[Any]]:
    """The ``count`` largest median time errors, ``[strategy or "<model> cut-k", error]``."""
    by = summary["median_time_error_by_strategy"]
    return [[k, by[k]] for k in sorted(by, key=lambda k: -by[k])[:count]]


def _cell_row(c: dict[str, Any]) -> dict[str, Any]:
    q = c["strategies"]["qpart"]
    return {"model": c["model"], "device": c["device"], "rate_mbps": c["rate_mbps"], "preset": c["preset"],
            "cache": c["cache"], "best": c["best"], "qpart_cut": q.get("cut"),
            "qpart_regret": c["qpart_regret"], "regret_ci95": c.get("regret_ci95"),
            "significant_loss": c.get("significant_loss"), "twin_gap": c.get("twin_gap"),
            "cpu_steal": c.get("cpu_steal")}


def _rate_figures(cells: list[dict[str, Any]]) -> dict[str, Any]:
    sm = summarize(cells)
    errors = sm["median_time_error_by_strategy"]
    return {"cells": sm["cells"], "mean_regret": sm["mean_regret"], "max_regret": sm["max_regret"],
            "cells_regret_over_5pct": sm["cells_regret_over_5pct"],
            "significant_losses": sm["significant_losses"],
            "median_time_error": sm["median_time_error"],
            "worst_time_errors": worst_time_errors(sm),
            "strategies_time_error_over_10pct": sum(1 for v in errors.values() if v > 0.10),
            "strategies_timed": len(errors),
            "cells_baseline_beats_qpart_significantly": sm["cells_baseline_beats_qpart_significantly"]}


def summarize_grid(doc: dict[str, Any], source: Path | None = None, raw: bytes | None = None,
                   draws: int = BOOTSTRAP_DRAWS) -> dict[str, Any]:
    """The summary document of one grid ``doc``; ``source`` and its bytes ``raw`` name the file."""
    cells = doc["cells"]
    if not cells:
        raise ValueError("a grid without cells has nothing to summarize")
    summary = doc.get("summary") or summarize(cells)
    rates = sorted({c["rate_mbps"] for c in cells})
    return {
        "source": None if source is None else {
            "file": source.name, "bytes": len(raw) if raw is not None else None,
            "sha256": hashlib.sha256(raw).hexdigest() if raw is not None else None},
        "grid_provenance": doc.get("provenance"),
        "setup": {"quick": doc.get("quick"), "repetitions": doc.get("repetitions"), "reps": doc.get("reps"),
                  "demand": doc.get("demand"), "runtimes": doc.get("runtimes"),
                  "idle_spinners": doc.get("idle_spinners"),
                  "models": sorted({c["model"] for c in cells}),
                  "devices": sorted({c["device"] for c in cells}),
                  "rates_mbps": rates, "presets": sorted({c["preset"] for c in cells})},
        "summary": summary,
        "mean_regret_ci95": mean_interval(cells, "qpart_regret", draws, "sittings"),
        "bootstrap_draws": draws,
        "worst_time_errors": worst_time_errors(summary),
        "by_rate": {f"{r:g}": _rate_figures([c for c in cells if c["rate_mbps"] == r]) for r in rates},
        "best_baselines": best_baselines(cells),
        "cells": [_cell_row(c) for c in cells],
    }


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path, help="a bench.e2e JSON document (the raw grid)")
    parser.add_argument("--out", type=Path, required=True, help="write the summary here")
    parser.add_argument("--draws", type=int, default=BOOTSTRAP_DRAWS,
                        help=f"bootstrap resamples of the sittings (default {BOOTSTRAP_DRAWS})")
    args = parser.parse_args(argv)
    raw = args.grid.read_bytes()
    doc = json.loads(raw)
    if not isinstance(doc, dict) or not doc.get("cells"):
        parser.error(f"{args.grid}: not a bench.e2e grid (no cells)")
    out = summarize_grid(doc, args.grid, raw, args.draws)
    write_json(args.out, out)
    size = args.out.stat().st_size
    if size > MAX_SUMMARY_BYTES:
        parser.error(f"{args.out}: {size} bytes, over the {MAX_SUMMARY_BYTES} a committed summary may take")
    lo, hi = out["mean_regret_ci95"]
    sm = out["summary"]
    print(f"{args.out}: {sm['cells']} cells, mean regret {sm['mean_regret']:+.2%} ({lo:+.2%} to {hi:+.2%}), "
          f"max {sm['max_regret']:+.1%}, {sm['significant_losses']} significant, "
          f"worst time error {out['worst_time_errors'][0][1]:.1%} ({out['worst_time_errors'][0][0]}); "
          f"{size} bytes")


if __name__ == "__main__":
    main()
