"""What a grid reports: its summary, the Markdown table, the plot, a line per cell."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from bench.e2e.config import STRATEGIES


def _progress(cell: dict[str, Any], prefix: str = "") -> None:
    q = cell["strategies"]["qpart"]
    print(f"{prefix}{cell['model']:<14} {cell['device']:<15} {cell['rate_mbps']:>5g} Mb/s "
          f"{cell['preset']:<14} "
          f"{cell['cache']:<4}  qpart cut {q['cut']}  J {q['measured_J']:.4g} (pred {q['predicted_J']:.4g})  "
          f"best {cell['best']:<12} regret {cell['qpart_regret']:+.1%}  steal {_pct(cell.get('cpu_steal'))}",
          file=sys.stderr)


def _attempts(cell: dict[str, Any]) -> str:
    """The attempts a cell took, with each discarded one's regret and steal."""
    gone = cell.get("discarded") or []
    return str(1 + len(gone)) + "".join(f" ({d['qpart_regret']:+.1%} at {_pct(d['cpu_steal'])})"
                                        for d in gone)


def _pct(share: float | None) -> str:
    return "?" if share is None else f"{share:.1%}"


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The acceptance numbers: regret, prediction error, where the planner strictly wins."""
    errors = [abs(s["predicted_time_s"] - s["measured_time_s"]) / s["measured_time_s"]
              for c in cells for s in c["strategies"].values() if s["measured_time_s"] > 0]
    beats = {s: sum(1 for c in cells
                    if c["strategies"]["qpart"]["measured_J"] < c["strategies"][s]["measured_J"])
             for s in STRATEGIES[1:]}
    steal = [c["cpu_steal"] for c in cells if c.get("cpu_steal") is not None]
    return {"cells": len(cells), "max_regret": max(c["qpart_regret"] for c in cells),
            "cells_regret_over_5pct": sum(1 for c in cells if c["qpart_regret"] > 0.05),
            "median_time_error": statistics.median(errors), "cells_qpart_beats": beats,
            "plan_checks_ok": all(c["qpart_plan_check"] for c in cells),
            # the host's noise the VM can see (bench.cpu_ticks); None where /proc/stat has none
            "cpu_steal": {"median": statistics.median(steal), "max": max(steal)} if steal else None}


def markdown(doc: dict[str, Any]) -> str:
    """One row per cell: the planner's measured J, the best strategy, the regret."""
    lines = ["| model | device | Mbit/s | preset | cache | reps | qpart cut | qpart J | best | best J | "
             "regret | " + " | ".join(STRATEGIES[1:]) + " | steal | attempts |",
             "|" + "---|" * (13 + len(STRATEGIES) - 1)]
    for c in doc["cells"]:
        s = c["strategies"]
        others = " | ".join(f"{s[k]['measured_J']:.4g}" for k in STRATEGIES[1:])
        lines.append(f"| {c['model']} | {c['device']} | {c['rate_mbps']:g} | {c['preset']} | {c['cache']} | "
                     f"{c['reps']} | "
                     f"{s['qpart']['cut']} | {s['qpart']['measured_J']:.4g} | {c['best']} | "
                     f"{s[c['best']]['measured_J']:.4g} | {c['qpart_regret']:+.1%} | {others} | "
                     f"{_pct(c.get('cpu_steal'))} | {_attempts(c)} |")
    sm = doc["summary"]
    gated = "first_attempts" in sm
    lines += ["", ("After the steal gate (each cell's last attempt): " if gated else "")
              + f"Cells: {sm['cells']}; max regret {sm['max_regret']:+.1%}; cells over 5%: "
              f"{sm['cells_regret_over_5pct']}; median |predicted - measured| / measured time "
              f"{sm['median_time_error']:.1%}; cells where qpart strictly beats each: "
              f"{sm['cells_qpart_beats']}; CPU steal per cell "
              + ("unknown" if not sm.get("cpu_steal") else
                 f"median {sm['cpu_steal']['median']:.1%}, max {sm['cpu_steal']['max']:.1%}")]
    if gated:
        raw = sm["first_attempts"]
        lines += ["", f"Steal gate {sm['steal_gate']:.0%}: {sm['cells_measured_again']} cells measured "
                  f"again; {sm['cells_over_steal_gate']} stayed over the gate "
                  f"({sm['cells_over_steal_gate_regret_over_5pct']} of them over 5% regret). As first "
                  f"measured: max regret {raw['max_regret']:+.1%}; cells over 5%: "
                  f"{raw['cells_regret_over_5pct']}; median time error {raw['median_time_error']:.1%}; "
                  f"cells where qpart strictly beats each: {raw['cells_qpart_beats']}"]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    """Predicted vs measured end-to-end time per strategy, and the planner's regret per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    for s in STRATEGIES:
        pts = [(c["strategies"][s]["predicted_time_s"], c["strategies"][s]["measured_time_s"])
               for c in doc["cells"]]
        a.scatter(*zip(*pts, strict=True), s=10, label=s)
    lo = min(min(c["strategies"][s]["measured_time_s"] for s in STRATEGIES) for c in doc["cells"])
    hi = max(max(c["strategies"][s]["measured_time_s"] for s in STRATEGIES) for c in doc["cells"])
    a.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    a.set(xscale="log", yscale="log", xlabel="predicted end-to-end time (s)", ylabel="measured (s)",
          title="Cost model vs real transfers")
    a.legend(fontsize=8)
    b.bar(range(len(doc["cells"])), [100 * c["qpart_regret"] for c in doc["cells"]])
    b.axhline(5, color="r", lw=0.8, ls="--")
    b.set(xlabel="cell", ylabel="planner regret (%)", title="Measured J of the plan vs the measured best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
