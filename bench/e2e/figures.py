"""A grid's pictures: predicted against measured time per strategy, the regret with its interval,
and a decision map per model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.e2e.report import is_baseline


def _family(name: str) -> str:
    if name.startswith("cut-"):
        return "forced cut-k"
    if name.startswith("input-"):
        return "input codecs"
    return name


def plot(doc: dict[str, Any], path: Path) -> None:
    """Predicted vs measured end-to-end time per strategy (forced cuts and input codecs one colour
    each), and the planner's regret per cell with its 95% bootstrap interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 5.5))
    points: dict[str, list[tuple[float, float]]] = {}
    for c in doc["cells"]:
        for name, s in c["strategies"].items():
            points.setdefault(_family(name), []).append((s["predicted_time_s"], s["measured_time_s"]))
    for family, pts in points.items():
        a.scatter(*zip(*pts, strict=True), s=8, label=family, alpha=0.7)
    every = [t for pts in points.values() for p in pts for t in p if t > 0]
    a.plot([min(every), max(every)], [min(every), max(every)], "k--", lw=0.8)
    a.set(xscale="log", yscale="log", xlabel="predicted end-to-end time (s)", ylabel="measured (s)",
          title="Cost model vs real transfers")
    a.legend(fontsize=7)
    regrets = [100 * c["qpart_regret"] for c in doc["cells"]]
    ci = [c.get("regret_ci95") or [c["qpart_regret"]] * 2 for c in doc["cells"]]
    colors = ["r" if c.get("significant_loss") else "C0" for c in doc["cells"]]
    b.bar(range(len(regrets)), regrets, color=colors)
    b.errorbar(range(len(regrets)), regrets, fmt="none", ecolor="k", lw=0.6,
               yerr=[[max(0.0, r - 100 * lo) for r, (lo, _) in zip(regrets, ci, strict=True)],
                     [max(0.0, 100 * hi - r) for r, (_, hi) in zip(regrets, ci, strict=True)]])
    b.axhline(5, color="r", lw=0.8, ls="--")
    b.set(xlabel="cell", ylabel="planner regret (%)",
          title="Planner vs best (medians), 95% bootstrap interval; red: significant")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def decision_map(doc: dict[str, Any], model: str, path: Path) -> None:
    """For one model, a panel per preset and cache state over channel rate x device (slowest device
    at the bottom): the planner's cut (colour, and the number; "image" for the input-image plan of
    ADR 0014, at cut 0), and the strategies that beat it
    there on median J while keeping the demand (baselines by name, the planner's own patterns at
    other cuts as ``cN``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in doc["cells"] if c["model"] == model]
    if not cells:
        return
    rates = sorted({c["rate_mbps"] for c in cells})
    devices = sorted({c["device"] for c in cells}, key=lambda d: min(
        c["speed_ratio"] for c in cells if c["device"] == d), reverse=True)
    panels = sorted({(c["preset"], c["cache"]) for c in cells})
    last = max(c["strategies"]["all-device"]["cut"] for c in cells)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 1.2 + 1.1 * len(devices)),
                             squeeze=False)
    for ax, (preset, cache) in zip(axes[0], panels, strict=True):
        grid = [[float("nan")] * len(rates) for _ in devices]
        for c in cells:
            if (c["preset"], c["cache"]) != (preset, cache):
                continue
            i, j = devices.index(c["device"]), rates.index(c["rate_mbps"])
            cut = c["strategies"]["qpart"]["cut"]
            grid[i][j] = cut
            ax.text(j, i, _cell_text(c), ha="center", va="center", fontsize=6.5)
        ax.imshow(grid, cmap="viridis", vmin=0, vmax=last, aspect="auto", alpha=0.55, origin="lower")
        ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates])
        ax.set_yticks(range(len(devices)), devices, fontsize=7)
        ax.set(xlabel="Mbit/s", title=f"{model}: {preset}, {cache}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell_text(c: dict[str, Any]) -> str:
    s = c["strategies"]
    q = s["qpart"]["measured_J"]
    beat = sorted((n for n in s if n != "qpart" and s[n]["meets_demand"] and s[n]["measured_J"] < q),
                  key=lambda n: s[n]["measured_J"])
    names = [n if is_baseline(n) else "c" + n.removeprefix("cut-") for n in beat]
    chosen = "image" if s["qpart"].get("pattern_id") == "input-png" else f"cut {s['qpart']['cut']}"
    text = chosen + (f"\n{c['qpart_regret']:+.0%}" if c["qpart_regret"] > 0.005 else "")
    return text + ("\n" + ",".join(names[:3]) if names else "")
