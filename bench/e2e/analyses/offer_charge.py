"""What a grid's acceptance figures would have been had the device's input-image offer been charged
to the planner (ADR 0015, Consequences): every repetition's planner J plus the offer's encoding,
less the one its plan uploaded (whose runs time it already).

``python -m bench.e2e.analyses.offer_charge GRID.json [--png-only] [--scale S] --json OUT``

The offer's encode time in a repetition is what the grid priced its baselines' encoding at: the
``input-png`` baseline's predicted local time, and the offered WebP quality's (the lowest promised
at the grid's demand; none in grids from before ADR 0015, or with ``--png-only``). Its energy is
the device's compute energy for that time; the objective takes both at the cell's preset weights.
``--scale`` charges a share of it (1/256: a device that encodes up front on one request in 256).
``--product-refresh`` charges the share the product's device pays (ADR 0016): one request in
:data:`~qpart.client.image_offers.REFRESH`, or one in
:data:`~qpart.client.image_offers.REFRESH_FAR` in a repetition whose cheapest offered image plan the
cost model priced at least :data:`~qpart.client.image_offers.FAR` above the planner's plan (the
grid's own predicted J of the ``input-*`` strategies, as the plan's ``input_image_plan`` gives the
device the server's). The device's count carries over from plan to plan, so a cell with any near
repetition is charged 1/256 in every repetition; one condition held still, as a grid cell holds it.
A device whose conditions change (rates, presets) keys one count per model and image size across
them, and pays closer to 1/256 where any of its conditions is near.
The regret and its significance are recomputed as :mod:`bench.e2e.repetitions` computes them.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path
from typing import Any

from bench import REPO, write_json
from bench.e2e.baselines import product_quality
from bench.e2e.repetitions import SIGNIFICANT_LOSS, bootstrap_ratio
from bench.e2e.report import p95
from qpart.client.image_offers import FAR, REFRESH, REFRESH_FAR
from qpart.profiles.artifacts import load_artifact
from qpart.profiles.devices import get_device
from qpart.server.schemas import PRESETS, WeightPreset


@functools.cache
def offered_quality(model: str) -> int | None:
    """The WebP quality the model's device offers at the grid's demand, from its committed
    artifact's ladder (as the grid's device picks it)."""
    return product_quality(load_artifact(REPO / "artifacts" / model))


def offer_seconds(rep: dict[str, Any], model: str, png_only: bool) -> float:
    """The offer's encoding in one repetition beyond what the planner's plan uploaded."""
    s = rep["strategies"]
    offered = {k: s[k]["predicted_local_s"] for k in _offered(rep, model, png_only)}
    return float(sum(offered.values()) - offered.get(s["qpart"]["pattern_id"], 0.0))


def _offered(rep: dict[str, Any], model: str, png_only: bool) -> list[str]:
    """The strategies of a repetition that are the device's offered image plans."""
    webp = f"input-webp@{offered_quality(model)}"
    return ["input-png"] + ([webp] if not png_only and webp in rep["strategies"] else [])


def near(rep: dict[str, Any], model: str, png_only: bool, far: float = FAR) -> bool:
    """Whether the cheapest offered image plan priced less than ``far`` above the planner's plan in
    one repetition (ADR 0016; ``far``: the device's :data:`~qpart.client.image_offers.FAR`, or
    another to weigh it)."""
    s = rep["strategies"]
    image = min(s[k]["predicted_J"] for k in _offered(rep, model, png_only))
    return bool(image < (1.0 + far) * s["qpart"]["predicted_J"])


def product_share(cell: dict[str, Any], png_only: bool, far: float = FAR) -> float:
    """The share of the offer's encoding the product's device pays in a cell: 1/REFRESH_FAR where
    every repetition is far, else 1/REFRESH in all (the device's count carries over from plan to
    plan: once 256 offers have passed, the first near plan brings the refresh)."""
    any_near = any(near(r, cell["model"], png_only, far) for r in cell["repetitions"])
    return 1.0 / (REFRESH if any_near else REFRESH_FAR)


def charged_cell(cell: dict[str, Any], png_only: bool, scale: float | None,
                 far: float = FAR) -> dict[str, Any]:
    """One cell's regret and significance with the offer charged: ``scale`` of it, or (None) the
    product device's share (:func:`product_share` with ``far``)."""
    w = PRESETS[WeightPreset(cell["preset"])]
    device = get_device(cell["device"])
    reps = cell["repetitions"]
    names = [k for k in reps[0]["strategies"] if all(k in r["strategies"] for r in reps)]
    js = {k: [r["strategies"][k]["measured_J"] for r in reps] for k in names}
    share = product_share(cell, png_only, far) if scale is None else scale
    for i, rep in enumerate(reps):
        extra = share * offer_seconds(rep, cell["model"], png_only)
        js["qpart"][i] += w.time * extra + w.energy * device.compute_energy_j(extra, 0.0)
    meets = [k for k in names if all(r["strategies"][k]["meets_demand"] for r in reps)]
    median = {k: statistics.median(v) for k, v in js.items()}
    best = min(meets, key=lambda k: median[k])
    seed = f"{cell['model']}/{cell['device']}/{cell['rate_mbps']}/{cell['preset']}"
    low = 1.0 if best == "qpart" else bootstrap_ratio(js["qpart"], js[best], seed=seed)[0]
    return {"model": cell["model"], "device": cell["device"], "rate_mbps": cell["rate_mbps"],
            "preset": cell["preset"], "cache": cell["cache"], "best": best,
            "regret": median["qpart"] / median[best] - 1.0, "significant_loss": low > 1.0 + SIGNIFICANT_LOSS}


def summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean, 95th percentile and max regret, cells over 5%, significant losses."""
    regrets = sorted(c["regret"] for c in cells)
    return {"cells": len(cells), "mean_regret": statistics.mean(regrets),
            "p95_regret": p95(regrets),
            "max_regret": regrets[-1], "cells_regret_over_5pct": sum(r > 0.05 for r in regrets),
            "significant_losses": sum(c["significant_loss"] for c in cells)}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path, help="a bench.e2e JSON document")
    parser.add_argument("--png-only", action="store_true",
                        help="charge the PNG alone (grids before ADR 0015)")
    share = parser.add_mutually_exclusive_group()
    share.add_argument("--scale", type=float, default=1.0, help="share of the offer charged (default 1)")
    share.add_argument("--product-refresh", action="store_true",
                       help=f"charge the share the product's device pays: 1/{REFRESH}, or 1/{REFRESH_FAR} "
                       f"where the image plans price at least FAR above the plan (ADR 0016)")
    parser.add_argument("--far", type=float, default=FAR,
                        help=f"FAR for --product-refresh (default {FAR}, the device's; another weighs it)")
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    args = parser.parse_args(argv)
    doc = json.loads(args.grid.read_text())
    scale = None if args.product_refresh else args.scale
    cells = [charged_cell(c, args.png_only, scale, args.far) for c in doc["cells"]]
    out = {"grid": str(args.grid), "grid_provenance": doc.get("provenance"), "png_only": args.png_only,
           "scale": scale, "product_refresh": {"every": REFRESH, "every_far": REFRESH_FAR, "far": args.far}
           if scale is None else None, "as_measured": {k: doc["summary"][k] for k in (
               "mean_regret", "p95_regret", "max_regret", "cells_regret_over_5pct", "significant_losses")},
           "offer_charged": summary(cells), "cells": cells}
    print(json.dumps({"as_measured": out["as_measured"], "offer_charged": out["offer_charged"]}))
    write_json(args.json, out)


if __name__ == "__main__":
    main()
