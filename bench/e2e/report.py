"""What a grid reports: its summary, the Markdown table, the plot, a line per cell."""

from __future__ import annotations

import math
import statistics
import sys
from typing import Any


def _progress(cell: dict[str, Any], prefix: str = "") -> None:
    q = cell["strategies"]["qpart"]
    print(f"{prefix}{cell['model']:<14} {cell['device']:<15} {cell['rate_mbps']:>5g} Mb/s "
          f"{cell['preset']:<14} "
          f"{cell['cache']:<4}  qpart cut {q['cut']}  J {q['measured_J']:.4g} (pred {q['predicted_J']:.4g})  "
          f"best {cell['best']:<12} regret {cell['qpart_regret']:+.1%}  steal {_pct(cell.get('cpu_steal'))}"
          + "".join(f" {k} {v:.1f}s" for k, v in (cell.get("wall_s") or {}).items()),
          file=sys.stderr)


def _attempts(cell: dict[str, Any]) -> str:
    """The attempts a cell took, with each discarded one's regret and steal (every repetition's)."""
    reps = cell.get("repetitions") or [cell]
    gone = [d for r in reps for d in r.get("discarded") or []]
    return str(len(reps) + len(gone)) + "".join(f" ({d['qpart_regret']:+.1%} at {_pct(d['cpu_steal'])})"
                                        for d in gone)


def _pct(share: float | None) -> str:
    return "?" if share is None else f"{share:.1%}"


def is_baseline(name: str) -> bool:
    """A strategy that is not one of the planner's own patterns (fixed strategies, naive baselines)."""
    return name != "qpart" and not name.startswith("cut-")


def _error(s: dict[str, Any]) -> float | None:
    m = s.get("measured_time_s", 0.0)
    return abs(s["predicted_time_s"] - m) / m if m > 0 else None


def time_errors(cells: list[dict[str, Any]]) -> dict[str, float]:
    """Median |predicted - measured| / measured end-to-end time per strategy; a forced cut's per
    model (``<model> cut-k``), since cut k is a different place in each model."""
    by: dict[str, list[float]] = {}
    for c in cells:
        for name, s in c["strategies"].items():
            e = _error(s)
            if e is not None:
                key = f"{c.get('model', '?')} {name}" if name.startswith("cut-") else name
                by.setdefault(key, []).append(e)
    def order(key: str) -> tuple[str, int, str]:
        model, _, cut = key.partition(" cut-")
        return (model, int(cut), "") if cut else ("", 0, key)

    return {k: statistics.median(by[k]) for k in sorted(by, key=order)}


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The acceptance numbers: regret (mean, 95th percentile, max, significant losses), prediction
    error (overall and per strategy), where the planner strictly wins, the CPU steal."""
    errors = [e for c in cells for s in c["strategies"].values() if (e := _error(s)) is not None]
    names = sorted({s for c in cells for s in c["strategies"] if s != "qpart"})
    beats = {s: sum(1 for c in cells if s in c["strategies"]
                    and c["strategies"]["qpart"]["measured_J"] < c["strategies"][s]["measured_J"])
             for s in names}
    lost_to = {s: sum(1 for c in cells if (c.get("versus") or {}).get(s, {}).get("significant_loss")
                      and c["versus"][s]["meets_demand"]) for s in names if is_baseline(s)}
    steal = [c["cpu_steal"] for c in cells if c.get("cpu_steal") is not None]
    gaps = sorted(abs(c["twin_gap"]) for c in cells if "twin_gap" in c)
    regrets = sorted(c["qpart_regret"] for c in cells)
    losses = [c for c in cells if c.get("significant_loss")]
    return {"cells": len(cells), "mean_regret": statistics.mean(regrets),
            "p95_regret": p95(regrets),
            "max_regret": regrets[-1],
            "cells_regret_over_5pct": sum(1 for r in regrets if r > 0.05),
            "significant_losses": len(losses),
            "significant_loss_cells": [_where(c) for c in losses],
            "median_time_error": statistics.median(errors),
            "median_time_error_by_strategy": time_errors(cells),
            "cells_qpart_beats": beats, "cells_baseline_beats_qpart_significantly": lost_to,
            "plan_checks_ok": all(c["qpart_plan_check"] for c in cells),
            # the planner's plan against its own twin (bench.e2e.sitting): the noise floor
            "twin": {"median_abs_gap": statistics.median(gaps), "p95_abs_gap": p95(gaps),
                     "max_abs_gap": gaps[-1],
                     "significant": sum(1 for c in cells if c.get("twin_significant"))} if gaps else None,
            # the host's noise the VM can see (bench.cpu_ticks); None where /proc/stat has none
            "cpu_steal": {"median": statistics.median(steal), "max": max(steal)} if steal else None}


def p95(ordered: list[float]) -> float:
    """The 95th percentile of sorted values: the smallest that at least 95% of them do not exceed."""
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _where(c: dict[str, Any]) -> str:
    return (f"{c.get('model')} {c.get('device')} {c.get('rate_mbps')} Mbit/s {c.get('preset')} "
            f"{c.get('cache')}: {c['qpart_regret']:+.1%} against {c['best']}")


def best_baselines(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model, rate and cache state, the baseline nearest the planner: the one whose median
    (over those cells: devices and presets) of the planner's J over its J is highest (nearest 1, or
    above it), among those that keep the demand."""
    rows = []
    for model, rate, cache in sorted({(c["model"], c["rate_mbps"], c["cache"]) for c in cells}):
        group = [c for c in cells if (c["model"], c["rate_mbps"], c["cache"]) == (model, rate, cache)]
        ratios: dict[str, list[float]] = {}
        for c in group:
            q = c["strategies"]["qpart"]["measured_J"]
            for name, s in c["strategies"].items():
                if is_baseline(name) and s["meets_demand"]:
                    ratios.setdefault(name, []).append(q / s["measured_J"])
        name = max(ratios, key=lambda n: statistics.median(ratios[n]))
        rows.append({"model": model, "rate_mbps": rate, "cache": cache, "best_baseline": name,
                     "cells": len(group), "qpart_over_baseline_median": statistics.median(ratios[name]),
                     "qpart_over_baseline_max": max(ratios[name]),
                     "cells_qpart_strictly_beats": sum(1 for r in ratios[name] if r < 1)})
    return rows


def markdown(doc: dict[str, Any]) -> str:
    """One row per cell (the planner, the best, the regret and its interval, the nearest baseline),
    the summary, the prediction error per strategy, and the best baseline per model and rate."""
    lines = ["| model | device | Mbit/s | preset | cache | rounds | qpart cut | qpart J | best | best J | "
             "regret | 95% interval | nearest baseline | its J | steal | attempts |", "|" + "---|" * 16]
    for c in doc["cells"]:
        s = c["strategies"]
        base = [n for n in s if is_baseline(n) and s[n]["meets_demand"]]
        near = min(base, key=lambda n: s[n]["measured_J"]) if base else "-"
        ci = c.get("regret_ci95")
        lines.append(f"| {c['model']} | {c['device']} | {c['rate_mbps']:g} | {c['preset']} | {c['cache']} | "
                     f"{c['reps']} | {s['qpart']['cut']} | {s['qpart']['measured_J']:.4g} | {c['best']} | "
                     f"{s[c['best']]['measured_J']:.4g} | {c['qpart_regret']:+.1%} | "
                     + (f"{ci[0]:+.1%} to {ci[1]:+.1%}" if ci else "-")
                     + f"{' **significant**' if c.get('significant_loss') else ''} | {near} | "
                     + (f"{s[near]['measured_J']:.4g}" if base else "-")
                     + f" | {_pct(c.get('cpu_steal'))} | {_attempts(c)} |")
    sm = doc["summary"]
    lines += ["", _summary_line(sm, "first_attempts" in sm)]
    if "first_attempts" in sm:
        raw = sm["first_attempts"]
        lines += ["", f"Steal gate {sm['steal_gate']:.0%}: {sm['cells_measured_again']} cells measured "
                  f"again; {sm['cells_over_steal_gate']} stayed over the gate "
                  f"({sm['cells_over_steal_gate_regret_over_5pct']} of them over 5% regret). As first "
                  f"measured: max regret {raw['max_regret']:+.1%}; cells over 5%: "
                  f"{raw['cells_regret_over_5pct']}; median time error {raw['median_time_error']:.1%}; "
                  f"cells where qpart strictly beats each: {raw['cells_qpart_beats']}"]
    if sm.get("median_time_error_by_strategy"):
        lines += ["", "| strategy | median time error |", "|---|---|"]
        lines += [f"| {k} | {v:.1%} |" for k, v in sm["median_time_error_by_strategy"].items()]
    if doc["cells"] and "versus" in doc["cells"][0]:
        lines += ["", "| model | Mbit/s | cache | best baseline | cells | planner J / its J (median, max) | "
                  "planner strictly better |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['rate_mbps']:g} | {r['cache']} | {r['best_baseline']} | "
                  f"{r['cells']} | "
                  f"{r['qpart_over_baseline_median']:.3f}, {r['qpart_over_baseline_max']:.3f} | "
                  f"{r['cells_qpart_strictly_beats']} |" for r in best_baselines(doc["cells"])]
    return "\n".join(lines) + "\n"


def _summary_line(sm: dict[str, Any], gated: bool) -> str:
    mean = (f"mean regret {sm['mean_regret']:+.2%}; 95th percentile {sm['p95_regret']:+.1%}; "
            if "mean_regret" in sm else "")
    significant = (f"significant losses (95% interval above +5%): {sm['significant_losses']}; "
                   if "significant_losses" in sm else "")
    return (("After the steal gate (each cell's last attempt): " if gated else "")
            + f"Cells: {sm['cells']}; {mean}max regret {sm['max_regret']:+.1%}; cells over 5%: "
            f"{sm['cells_regret_over_5pct']}; {significant}median |predicted - measured| / measured time "
            f"{sm['median_time_error']:.1%}; cells where qpart strictly beats each: "
            f"{sm['cells_qpart_beats']}; "
            + (f"the planner's plan against its twin (the same plan measured again in the same rounds): "
               f"median |gap| {sm['twin']['median_abs_gap']:.1%}, 95th percentile "
               f"{sm['twin']['p95_abs_gap']:.1%}, max {sm['twin']['max_abs_gap']:.1%}, "
               f"'significant' {sm['twin']['significant']}; " if sm.get("twin") else "")
            + "CPU steal per cell "
            + ("unknown" if not sm.get("cpu_steal") else
               f"median {sm['cpu_steal']['median']:.1%}, max {sm['cpu_steal']['max']:.1%}"))
