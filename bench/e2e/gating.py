"""The steal gate: a cell run under too much CPU steal is measured again, and summarized apart."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from bench.e2e.repetitions import merge
from bench.e2e.report import _progress, summarize
from bench.harness.exchange import ExchangeProbe

STEAL_GATE = 0.05
STEAL_RETRIES = 2


def over_gate(cell: dict[str, Any], gate: float) -> bool:
    """Whether a cell ran under more CPU steal than ``gate`` (unknown steal: no)."""
    steal = cell.get("cpu_steal")
    return steal is not None and steal > gate


def steal_gated(measure: Callable[[], dict[str, Any]], probes: deque[ExchangeProbe], gate: float,
                retries: int) -> dict[str, Any]:
    """``measure()`` a cell, and again (at most ``retries`` more times) while the CPU steal it ran
    under (``cpu_steal``) exceeds ``gate``; the last attempt is the cell's record, the earlier ones
    ride along under ``"discarded"``, whole, for the raw summary (:func:`summarize`).

    The decision reads the steal only, never a result, and keeps the last attempt, not the best.
    Steal and regret were correlated in one grid (dbfb5d4: every cell under 5% steal within 5% of
    the best, every failure at 11.7-24.2% steal), not in another (4ae9e72: 24 cells over 5% steal,
    all within 5%), so a gated grid is evidence beside its first attempts, never instead of them.
    The link probe of an attempt over the gate, discarded or kept for want of retries, leaves the
    window (``probes``): the retry, and the cells after, price with the probes from before it (in
    7095d24's grid a cell kept at 16.8% steal left its probe and a 4.5 ms implied overhead; the
    next cell, at 1.8% steal, priced a 4.65 ms overhead where the quiet cells measured about 1.1,
    and lost 46.3%). The probe order's random stream (``probe_rng``) is not rewound. A cell whose
    steal is unknown is never retried."""
    kept = list(probes)
    discarded: list[dict[str, Any]] = []
    while True:
        cell = measure()
        stolen = over_gate(cell, gate)
        if stolen:  # its link probe is no measure of the link for the cells after it either
            probes.clear()
            probes.extend(kept)
        if not stolen or len(discarded) >= retries:
            return {**cell, "discarded": discarded}
        for one in cell.get("cells", [cell]):  # a sitting's cells, or one cell
            _progress(one, f"discarded (steal over {gate:.0%}): ")
        discarded.append(cell)


def sitting_cells(measure: Callable[[], dict[str, Any]], probes: deque[ExchangeProbe],
                  implied: deque[float], gate: float, retries: int) -> list[dict[str, Any]]:
    """One sitting's cells (:mod:`bench.e2e.sitting`: a device's presets, cold and warm), the sitting
    :func:`steal_gated` as one measurement: each cell carries the same cell of every discarded
    attempt under ``"discarded"``. ``measure()`` returns ``{"cells": [...], "cpu_steal": ...,
    "implied_rtt_s": ..., "downloaded": [...]}``; only a kept attempt's traffic, and only one within
    the gate (or of unknown steal), enters the overhead window (``implied``)."""
    sitting = steal_gated(measure, probes, gate, retries)
    if sitting["implied_rtt_s"] is not None and not over_gate(sitting, gate):
        implied.append(sitting["implied_rtt_s"])
    cells = [{**cell, "discarded": [d["cells"][i] for d in sitting["discarded"]]}
             for i, cell in enumerate(sitting["cells"])]
    for cell in cells:
        _progress(cell)
    return cells


def first_attempts(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each cell as first measured, before :func:`steal_gated` measured any again. Not an ungated
    run: the cells after a retried one follow from its kept attempt (held segments, the link's
    probe and overhead windows, the time they ran at)."""
    def first(c: dict[str, Any]) -> dict[str, Any]:
        return c["discarded"][0] if c.get("discarded") else c

    return [merge([first(r) for r in c["repetitions"]]) if c.get("repetitions") else first(c) for c in cells]


def gated_summary(cells: list[dict[str, Any]], gate: float) -> dict[str, Any]:
    """:func:`summarize` of the cells as recorded, beside the raw grid's (first attempts) and how
    many cells were measured again or stayed over the steal gate."""
    over = [c for c in cells if over_gate(c, gate)]
    return {**summarize(cells), "steal_gate": gate,
            "cells_measured_again": sum(1 for c in cells if c.get("discarded") or any(
                r.get("discarded") for r in c.get("repetitions", []))),
            "cells_over_steal_gate": len(over),
            "cells_over_steal_gate_regret_over_5pct": sum(1 for c in over if c["qpart_regret"] > 0.05),
            "first_attempts": summarize(first_attempts(cells))}
