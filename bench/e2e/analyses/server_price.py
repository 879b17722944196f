"""How a ``bench.e2e`` grid's server time compared with its price at cut 0.

``python -m bench.e2e.analyses.server_price GRID --json OUT`` reads a grid's cells and writes, per model:

- ``overrun_ms``: per cut-0 strategy (the planner's packet, the fixed ones, the image plans), the
  median over its cells of measured minus priced server seconds;
- ``parts_ms``: per cut-0 strategy, the medians of the measured server time's parts (the wait for
  the tail worker, the compute, the decoding; grids from 731e119 on keep them);
- ``price_error_by_rate_ms``: per link rate, the median of priced minus measured server seconds of
  one strategy (``--strategy``, default ``all-server``) in one cache state (``--cache``, cold),
  which shows how the price the sitting planned with depended on the rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import write_json

PARTS = ("queue", "compute", "decode")


def _cut0(cells: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for cell in cells:
        for name, s in cell["strategies"].items():
            if s.get("cut") == 0 and s.get("measured_server_s", 0.0) > 0:
                runs[(cell["model"], name)].append(s)
    return runs


def overrun_ms(cells: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per model and cut-0 strategy: median(measured - predicted server seconds), in ms."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (model, name), runs in sorted(_cut0(cells).items()):
        gaps = [s["measured_server_s"] - s["predicted_server_s"] for s in runs]
        out[model][name] = 1e3 * statistics.median(gaps)
    return dict(out)


def parts_ms(cells: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per model and cut-0 strategy: the medians of the server time's parts, in ms (where kept)."""
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for (model, name), runs in sorted(_cut0(cells).items()):
        if all(f"measured_{p}_s" in s for s in runs for p in PARTS):
            out[model][name] = {p: 1e3 * statistics.median(s[f"measured_{p}_s"] for s in runs) for p in PARTS}
    return dict(out)


def price_error_by_rate_ms(cells: list[dict[str, Any]], strategy: str = "all-server",
                           cache: str = "cold") -> dict[str, dict[str, float]]:
    """Per model and link rate: median(predicted - measured server seconds) of ``strategy`` in
    ``cache`` cells, in ms."""
    errors: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for cell in cells:
        s = cell["strategies"].get(strategy)
        if cell["cache"] == cache and s is not None and s.get("measured_server_s", 0.0) > 0:
            errors[cell["model"]][cell["rate_mbps"]].append(s["predicted_server_s"] - s["measured_server_s"])
    return {model: {f"{rate:g}": 1e3 * statistics.median(v) for rate, v in sorted(by_rate.items())}
            for model, by_rate in sorted(errors.items())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.e2e.analyses.server_price", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path, help="a bench.e2e grid's JSON")
    parser.add_argument("--json", type=Path, help="where to write the figures (default: stdout only)")
    parser.add_argument("--strategy", default="all-server", help="the strategy of the by-rate figure")
    parser.add_argument("--cache", default="cold", choices=("cold", "warm"), help="its cache state")
    args = parser.parse_args(argv)
    grid = json.loads(args.grid.read_text())
    cells = grid["cells"]
    doc = {"grid": str(args.grid), "grid_provenance": grid.get("provenance"),
           "overrun_ms": overrun_ms(cells), "parts_ms": parts_ms(cells),
           "price_error_by_rate_ms": price_error_by_rate_ms(cells, args.strategy, args.cache),
           "strategy": args.strategy, "cache": args.cache}
    if args.json:
        write_json(args.json, doc)  # with this run's provenance
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
