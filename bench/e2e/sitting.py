"""A sitting: one model, device and rate, every preset cold and warm, measured in one set of rounds.

A cell (model, device, rate, preset, cache state) differs from the other cells of its sitting only
in what the planner and the fixed strategies choose and in what the device pays to download: a
pattern's run (head on the device, upload, tail on the server) is the same work whatever the
preset's weights or the device's cache. So a sitting profiles the host and probes the link once,
asks for every cell's plans (the cold ones first; a preset's warm cell holding what its own cold
cell needed), downloads each segment once (its seconds charged to every cold strategy that needs
it), and runs every distinct pattern of all its cells in the same interleaved rounds. Each cell's
``J`` is then the cost model's weights for its preset on those runs, plus its downloads.

Besides taking about a quarter of the time of measuring each cell apart (the full grid, a cell at
a time, was estimated at 2.4 h from the quick grid at 4000768), this pairs the cells of a sitting:
a cold and a warm cell's strategies ran in the same rounds on the same host, so they differ by
their downloads and choices, not by when they were measured.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from bench.e2e.artifacts import is_float
from bench.e2e.baselines import ENCODER_PREFIX, Baseline, profile
from bench.e2e.baselines import run_once as run_baseline
from bench.e2e.cell import (
    _inputs,
    _plan,
    _predict,
    _results,
    choose_fixed,
    forced_cuts,
    image_offer,
    implied_rtt,
    is_image_plan,
    offered_webp,
    run_rounds,
)
from bench.e2e.config import STRATEGIES
from bench.e2e.device import Link, ModelView, _head, measured_j, run_once
from bench.harness.device_clock import ReferenceClock
from qpart.profiles.costs import PlanInputs
from qpart.profiles.devices import DeviceProfile
from qpart.server.planning.images import INPUT_PNG

CACHES = ("cold", "warm")
TWIN = "twin:"  # a run key's prefix: the same plan run again, once more a round, under another name


@dataclass
class CellPlans:
    """One cell of a sitting: its preset and cache state, what the device holds, every strategy's plan."""

    preset: str
    cache: str
    held: frozenset[str]
    inputs: PlanInputs
    qplan: dict[str, Any]
    plan_s: float
    plans: dict[str, dict[str, Any]]


def plan_cell(client: httpx.Client, url: str, model: ModelView, device: DeviceProfile, preset: str,
              cache: str, link: Link, held: set[str], image: dict[str, Any] | None) -> CellPlans:
    """The planner's plan (POST /v1/plan), every fixed strategy's and every forced cut's, each
    sending its packet the way the cost model prices cheaper."""
    inputs = _inputs(device, preset, link, held)
    qplan, plan_s = _plan(client, url, model, device, preset, link, held, image)
    plans = ({"qpart": qplan} | {s: model.plan_of(choose_fixed(model, s, inputs)) for s in STRATEGIES[1:]}
             | forced_cuts(model, inputs))
    for s in list(plans)[1:]:
        plans[s]["upload_encoding"] = _predict(model, plans[s], inputs)["upload_encoding"]
    return CellPlans(preset, cache, frozenset(held), inputs, qplan, plan_s, plans)


class Downloads:
    """What the device fetched in a sitting over the shaped link, each segment (and autoencoder's
    encoder) once: its seconds are charged to every strategy that needs it and does not hold it."""

    def __init__(self, client: httpx.Client, url: str, model: ModelView, link: Link) -> None:
        self.client, self.url, self.model, self.link = client, url, model, link
        self.seconds: dict[str, float] = {}  # segment id or encoder name -> download seconds
        self.needed: set[str] = set()  # what the cell being charged needed and did not hold

    def _fetch(self, key: str, path: str) -> float:
        if key not in self.seconds:
            self.link.wire.quiet()
            start = time.perf_counter()
            r = self.client.get(self.url + path)
            self.seconds[key] = time.perf_counter() - start
            r.raise_for_status()
            if not key.startswith(ENCODER_PREFIX):
                self.model.segments[key] = r.content
        return self.seconds[key]

    def segment(self, seg: dict[str, Any] | None, held: frozenset[str]) -> float:
        if not seg or seg["id"] in held:
            return 0.0
        self.needed.add(seg["id"])
        return self._fetch(seg["id"], seg["url"])

    def charges(self, cell: CellPlans, baselines: list[Baseline],
                ) -> tuple[dict[str, float], dict[str, Callable[..., Any]], set[str]]:
        """Each of a cell's strategies' download seconds, their heads, and what the cell needed
        that it did not hold (fetched for it now or for another cell of the sitting before)."""
        model = self.model
        download_s, heads = {}, {}
        self.needed = set()
        for s, p in cell.plans.items():
            download_s[s] = self.segment(p.get("segment"), cell.held)
            if is_image_plan(p["pattern_id"]):  # the device runs no head: it uploads its image
                continue
            heads[s] = _head(model, p, model.segments[p["segment"]["id"]] if p.get("segment") else None)
        for b in baselines:
            if b.kind != "ae":
                download_s[b.name] = 0.0
                continue
            lossless = model.plan_of(next(p for p in model.patterns if is_float(p) and p["cut"] == b.cut))
            download_s[b.name] = self.segment(lossless["segment"], cell.held)
            segment = model.segments[lossless["segment"]["id"]]
            model.heads[f"ae-head-{b.cut}"] = _head(model, lossless, segment)
            encoder = f"{ENCODER_PREFIX}{model.name}-{b.cut}"  # held as a segment is
            if encoder not in cell.held:
                self.needed.add(encoder)
                download_s[b.name] += self._fetch(encoder, f"/bench/ae/{model.name}/{b.cut}/encoder")
        return download_s, heads, set(self.needed)


def _key(p: dict[str, Any]) -> str:
    """The runs a plan shares: its pattern and upload coding; an input-image plan is the request of
    the baseline of its name (``input-png``, ``input-webp@<q>``) to the product's route, so it
    shares that baseline's runs."""
    if is_image_plan(p["pattern_id"]):
        return str(p["pattern_id"])
    return f"{p['pattern_id']}/{p.get('upload_encoding', 'identity')}"


def _plan_cells(client: httpx.Client, url: str, model: ModelView, device: DeviceProfile,
                presets: tuple[str, ...], link: Link, image: dict[str, Any] | None,
                baselines: list[Baseline], downloads: Downloads,
                ) -> tuple[list[CellPlans], list[tuple[dict[str, float], dict[str, Callable[..., Any]]]]]:
    """Every cell's plans, cold ones first, and each cell's download charges and heads. A preset's
    warm cell holds what its own cold cell needed (as when each cell was measured apart: the warm
    cell of one preset does not hold what only another preset's cold cell downloaded)."""
    cells: list[CellPlans] = []
    charged: list[tuple[dict[str, float], dict[str, Callable[..., Any]]]] = []
    cold_needed: dict[str, set[str]] = {}
    for cache in CACHES:
        for preset in presets:
            held = cold_needed[preset] if cache == "warm" else set()
            cells.append(plan_cell(client, url, model, device, preset, cache, link, held, image))
            download_s, heads, needed = downloads.charges(cells[-1], baselines)
            charged.append((download_s, heads))
            if cache == "cold":
                cold_needed[preset] = needed
    return cells, charged


def run_sitting(client: httpx.Client, url: str, model: ModelView, device: DeviceProfile, ratio: float,
                presets: tuple[str, ...], link: Link, images: np.ndarray, pixels: np.ndarray,
                baselines: list[Baseline], reps: tuple[int, int, float], clock: ReferenceClock,
                repetition: int) -> tuple[list[dict[str, Any]], float | None, set[str]]:
    """Every cell of one sitting (each preset, cold then warm) in one repetition: the cells' records
    (in preset order, cold before warm), the exchange overhead the sitting's traffic implies, and
    what it downloaded."""
    # The server prices tails with what recent requests took: the same figures price the rest.
    info = client.get(f"{url}/v1/models/{model.name}").json()
    model.tail_s, model.decode_s = info["server_tail_s"], info["server_decode_s"]
    image = image_offer(baselines, model, pixels, images, ratio)
    started = time.perf_counter()
    downloads = Downloads(client, url, model, link)
    cells, charged = _plan_cells(client, url, model, device, presets, link, image, baselines, downloads)
    fetched = time.perf_counter()
    for b in baselines:
        if not (image is not None and (b.name == INPUT_PNG or b is offered_webp(baselines, model))):
            # (those two were profiled for the offer)
            profile(b, model, pixels, images[:1])
    profiled = time.perf_counter()
    # Strategies (of any cell) that chose the same pattern do the same thing: each distinct pattern
    # runs once per round and its runs count for every strategy that chose it (otherwise two names
    # for one plan would differ by measurement noise alone). A pattern sent raw, deflated or
    # zstd-compressed is three plans.
    work: dict[str, tuple[dict[str, Any], Callable[..., Any]]] = {}
    for cell, (_, heads) in zip(cells, charged, strict=True):
        for s, p in cell.plans.items():
            if not is_image_plan(p["pattern_id"]):
                work.setdefault(_key(p), (p, heads[s]))
    named = {b.name: b for b in baselines}
    # The planner's plan of each cell runs twice a round, under its own key and as its twin: the
    # two are one strategy measured twice, so how far apart they come out is this host's noise
    # floor for a strategy's J in that cell (the twin is never a strategy, never a cell's best).
    twins = {TWIN + _key(cell.qplan) for cell in cells}
    order = [k for k in work if k not in named] + list(named) + sorted(twins)

    def once(pid: str, i: int) -> dict[str, float]:
        pid = pid.removeprefix(TWIN)
        if pid in named:
            return run_baseline(client, url, model, named[pid], pixels[i], images[i : i + 1], ratio, link)
        plan, head = work[pid]
        return run_once(client, url, model, plan, head, images[i : i + 1], ratio, link)

    # a fresh order stream per repetition: the same orders in every repetition would repeat any
    # effect of a pattern's place in a round in all of them, and the repetitions would not be
    # independent measurements of the cell
    rng = random.Random(f"{model.name}/{device.name}/{link.rate_mbps}/{repetition}")
    runs, speeds = run_rounds(once, order, len(images), clock, model.reference_s, rng, reps)
    wall_s = {"downloads": fetched - started, "baseline_profiles": profiled - fetched,
              "rounds": time.perf_counter() - profiled}
    exchanged = {_key(p): p for cell in cells for p in cell.plans.values()
                 if p["cut"] < model.cuts - 1 and not is_image_plan(p["pattern_id"])}
    implied = implied_rtt(model, exchanged, runs, cells[0].inputs)  # each plan in its own coding
    shared = {"reps": len(speeds), "wall_s": wall_s, "implied_rtt_s": implied,
              "host_speed": {"median": statistics.median(speeds), "min": min(speeds), "max": max(speeds)}}
    records = [_cell_record(model, device, ratio, cell, baselines, download_s, runs) | shared
               for cell, (download_s, _) in zip(cells, charged, strict=True)]
    records.sort(key=lambda r: (presets.index(r["preset"]), CACHES.index(r["cache"])))
    return records, implied, set(downloads.seconds)


def _cell_record(model: ModelView, device: DeviceProfile, ratio: float, cell: CellPlans,
                 baselines: list[Baseline], download_s: dict[str, float],
                 runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """One cell's record: every strategy's prediction beside its measurement, the best, the regret."""
    keyed = {s: runs[_key(p)] for s, p in cell.plans.items()} | {b.name: runs[b.name] for b in baselines}
    out = _results(model, device, cell.preset, cell.inputs, ratio, cell.qplan, cell.plans, baselines,
                   download_s, keyed)
    twin = measured_j(device, cell.preset, model.artifact.cuts[cell.qplan["cut"]].head_flops,
                      download_s["qpart"], runs[TWIN + _key(cell.qplan)])
    best = min((s for s in out if out[s]["meets_demand"]), key=lambda s: out[s]["measured_J"])
    return {"preset": cell.preset, "cache": cell.cache, "strategies": out, "best": best,
            "plan_s": cell.plan_s, "best_any": min(out, key=lambda s: out[s]["measured_J"]),
            "twin_J": twin["measured_J"],
            "qpart_regret": out["qpart"]["measured_J"] / out[best]["measured_J"] - 1.0,
            # the server's prediction for its plan equals this benchmark's pricing of it
            "qpart_plan_check": math.isclose(_predict(model, cell.qplan, cell.inputs)["objective"],
                                             cell.qplan["predicted"]["objective"], rel_tol=1e-9)}
