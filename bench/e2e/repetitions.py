"""A cell from its interleaved repetitions: medians, regret, and when a loss is significant.

Every cell is measured ``--repetitions`` times (at least 3), each repetition a whole measurement of
its own (profile, link probe, plan, interleaved rounds), and the repetitions of one cell are
interleaved with the other cells of the same rate and model: repetition 1 of each of them, then
repetition 2, and so on, so that a slow spell of this shared host falls on several cells' single
repetitions rather than on one cell's every measurement.

A strategy's figure in a cell is the median over the repetitions of each repetition's median. The
cell's best is the strategy with the smallest median ``J`` among those that keep the demand; the
planner's regret is its median ``J`` over the best's, minus 1. A loss is significant when the 95%
bootstrap interval of that ratio (repetitions resampled with replacement, the same draw for both
strategies, since they ran in the same rounds) lies entirely above ``1 + SIGNIFICANT_LOSS``.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

BOOTSTRAP_DRAWS = 10_000
SIGNIFICANT_LOSS = 0.05
_MEDIANED = ("predicted_J", "predicted_time_s", "predicted_local_s", "predicted_transfer_s",
             "predicted_server_s", "measured_J", "measured_time_s", "measured_local_s", "measured_transfer_s",
             "measured_round_trip_s", "measured_server_s", "measured_queue_s", "measured_compute_s",
             "measured_decode_s", "measured_upload_bytes", "transfer_bytes", "download_s")


def bootstrap_ratio(num: list[float], den: list[float], draws: int = BOOTSTRAP_DRAWS,
                    seed: str = "") -> tuple[float, float]:
    """95% percentile interval of ``median(num) / median(den)`` over paired resamples."""
    if len(num) != len(den) or not num:
        raise ValueError("bootstrap_ratio needs paired, non-empty samples")
    rng = random.Random(seed)
    n = len(num)
    ratios = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(statistics.median(num[i] for i in idx) / statistics.median(den[i] for i in idx))
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[min(draws - 1, int(0.975 * draws))]


def _strategy(entries: list[dict[str, Any]]) -> dict[str, Any]:
    out = {k: statistics.median(e[k] for e in entries) for k in _MEDIANED if k in entries[0]}
    cuts = [e["cut"] for e in entries]
    return {**entries[-1], **out, "cut": max(set(cuts), key=cuts.count), "cuts": cuts,
            "pattern_ids": [e["pattern_id"] for e in entries],
            "meets_demand": all(e["meets_demand"] for e in entries),
            "J_repetitions": [e["measured_J"] for e in entries]}


def _versus(q: dict[str, Any], other: dict[str, Any], seed: str) -> dict[str, Any]:
    """The planner's median J over another strategy's, its bootstrap interval (as regrets), and
    whether the planner lost significantly (interval above 1 + :data:`SIGNIFICANT_LOSS`)."""
    lo, hi = bootstrap_ratio(q["J_repetitions"], other["J_repetitions"], seed=seed)
    return {"regret": q["measured_J"] / other["measured_J"] - 1.0, "ci95": [lo - 1.0, hi - 1.0],
            "significant_loss": lo > 1.0 + SIGNIFICANT_LOSS, "meets_demand": other["meets_demand"]}


def _twin(q: dict[str, Any], reps: list[dict[str, Any]], seed: str) -> dict[str, Any]:
    """The planner's plan measured a second time in the same rounds (``twin_J``, where the
    repetitions have it): its median J over the planner's, minus 1 (``twin_gap``: the noise floor
    of a strategy's J in this cell), and whether that gap passes for a significant loss, as a loss
    of the planner would (the test's false alarms on one strategy against itself)."""
    if not all("twin_J" in r for r in reps):
        return {}
    js = [r["twin_J"] for r in reps]
    lo, hi = bootstrap_ratio(js, q["J_repetitions"], seed=seed + "/twin")
    return {"twin_J_repetitions": js, "twin_gap": statistics.median(js) / q["measured_J"] - 1.0,
            "twin_ci95": [lo - 1.0, hi - 1.0],
            "twin_significant": lo > 1.0 + SIGNIFICANT_LOSS or hi < 1.0 / (1.0 + SIGNIFICANT_LOSS)}


def merge(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell's record from its repetitions' (each as :func:`bench.e2e.sitting.run_sitting` made it)."""
    names = [s for s in reps[0]["strategies"] if all(s in r["strategies"] for r in reps)]
    strategies = {s: _strategy([r["strategies"][s] for r in reps]) for s in names}
    keep = [s for s in names if strategies[s]["meets_demand"]]
    best = min(keep, key=lambda s: strategies[s]["measured_J"])
    seed = f"{reps[0]['model']}/{reps[0]['device']}/{reps[0]['rate_mbps']}/{reps[0]['preset']}"
    versus = {s: _versus(strategies["qpart"], strategies[s], seed) for s in names if s != "qpart"}
    lo, hi = (versus[best]["ci95"][0] + 1.0, versus[best]["ci95"][1] + 1.0) if best != "qpart" else (1.0, 1.0)
    steal = [r["cpu_steal"] for r in reps if r.get("cpu_steal") is not None]
    last = reps[-1]
    twin = _twin(strategies["qpart"], reps, seed)
    return {**{k: v for k, v in last.items() if k not in ("strategies", "discarded")},
            "strategies": strategies, "best": best,
            "best_any": min(names, key=lambda s: strategies[s]["measured_J"]),
            "qpart_regret": strategies["qpart"]["measured_J"] / strategies[best]["measured_J"] - 1.0,
            "regret_ci95": [lo - 1.0, hi - 1.0], "significant_loss": lo > 1.0 + SIGNIFICANT_LOSS,
            "versus": versus, "reps": sum(r["reps"] for r in reps), "repetitions": reps,
            **twin, "cpu_steal": statistics.mean(steal) if steal else None,
            "cpu_steal_max": max(steal) if steal else None,
            "qpart_plan_check": all(r["qpart_plan_check"] for r in reps)}
