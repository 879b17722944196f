"""End to end: the QPART planner against fixed strategies, over a real rate-shaped link.

``python -m bench.e2e [--quick] --json PATH``  (root: it makes a private network namespace)

The process re-runs itself under ``unshare -n``: a network namespace of its own whose only
interface is loopback, with MTU 1500 and a token-bucket shaper (``tc qdisc ... tbf``) set to each
channel rate in turn. The QPART server (pinned to core 0) and the simulated device
(this process, core 1) talk over 127.0.0.1 inside it, so segment downloads, activation uploads
and answers really cross the shaped link. Nothing else is reachable from inside.

Device compute is this machine's measured time scaled by the profile's speed: with ``H`` the
host's FLOP/s (the whole model's FLOPs over its measured batch-1 time) and ``F`` the profile's
``flops_per_s``, a head that takes ``t`` here takes ``t * H / F`` on the device. ``H`` comes from
the profile just before each cell; within the cell, each round's device seconds are also scaled by
the host's speed in that round against the profile, read from a reference workload that runs among
the round's strategies (:mod:`bench.device_clock`): the device's speed holds still while this shared
machine's wanders. The device profile sent to the planner carries per-cut head times measured
the same way (the profiler of ``qpart device profile``), so prediction and measurement use one
clock. Before every cell the device also measures its link as a device in the field can, on the
link itself (:func:`probe_exchange`): the exchange's fixed overhead (``rtt_s``) and the rate at
which an upload body's bytes cost time (``upload_rate_bps``, ADR 0006). Its plan request carries
the fit of the medians of its last three probes at this rate and model (:data:`PROBE_WINDOW`),
except that the overhead is the median of that fit and what the last two cells' own exchanges
implied (:func:`implied_rtt`, :func:`bench.exchange.overhead`).

Strategies per cell (model, device, rate, weight preset, cache state):

- ``qpart``: the server's plan for a 1% accuracy demand (POST /v1/plan);
- ``all-server``: cut 0, the float32 input uploaded;
- ``all-device``: the last cut, the float32 model downloaded and run on the device;
- ``neurosurgeon``: the cut with the smallest predicted objective, float32 weights and activation;
- ``uniform-int8``: the best cut with every weight tensor and the activation at 8 bits;
- ``qpart-paper``: QPART as published (its bit allocation, at the 1% level), best cut.

Every strategy offers deflate and zstd uploads (ADRs 0005, 0007) and sends its packet the way the
cost model prices cheapest; the device's compression time is part of its encode time (measured,
scaled).

A cell's best is the strategy with the smallest measured ``J`` among those that keep the accuracy
demand (:func:`meets_demand`); ``best_any`` ignores the demand.

Fixed strategies pick their cut with the same cost model and inputs as the planner. Their bit
patterns are served by the same server: the benchmark writes a copy of the artifacts with extra
patterns at level 1.0, which no demand (< 1) ever admits, so the planner never sees them.

Cold cache: the device holds no segment, downloads count. Warm: it holds every segment it
downloaded in the cold pass of the same cell. A plan is fetched once per cell and not counted
(devices reuse plans while conditions hold). The strategies run in rounds, one inference each on
the round's test image, in a fresh random order per round, until at least ``--reps`` rounds and
``--cell-seconds`` have passed (at most ``--max-reps`` rounds); the median is reported, plus the
one download when cold. (A fixed count would leave the fast cells, where strategies differ by a
tenth of a millisecond in a few milliseconds of noisy round trip, to too few rounds.)

CPU steal (time the hypervisor gave this virtual machine's CPUs to others) is recorded per cell.
A cell that ran under more than ``--steal-gate`` (default 5%) is measured again, at most
``--steal-retries`` (2) more times (:func:`steal_gated`); the decision reads the steal, never a
result. An attempt over the gate, kept or not, leaves nothing in the link windows that price the
cells after it. The JSON keeps every discarded attempt inside its cell, and the summary gives the grid as
first measured (``first_attempts``) beside the grid as recorded.

Measured ``J`` uses the cost model's weights and powers on measured times:
``J = w_t*T + w_e*(P_compute*T_local + P_tx*T_transfer) + w_c*price*T_server``, where
``T_server`` is the queue + compute time the server reports and ``T_transfer`` the rest of the
round trip.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from bench import REPO, cpu_ticks, steal_fraction, write_json
from bench.device_clock import ENCODE_RUNS, HEAD_RUNS, ReferenceClock
from bench.exchange import PROBE_WINDOW, TRAFFIC_WINDOW, ExchangeProbe, fit_exchange, overhead, probe_medians
from bench.link import ShapedLink, idle_gap_s
from bench.loadgen import GENERATOR_CORE, Server, enter_private_network, start_server
from bench.shaped_server import CONTROL_PORT_ENV
from qpart.client.plans import HeadSpec, PacketFormat
from qpart.client.profiler import CodingSeconds, coding_times, head_calls, measure_encodes
from qpart.client.runtime import encode_for_plan, load_head, upload_body
from qpart.kernels.coding import Coding
from qpart.kernels.packing import packed_size
from qpart.models.data import Split, load_split
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.registry import get_model
from qpart.models.timing import interleaved_medians, median_latency, median_seconds
from qpart.profiles.artifacts import ARTIFACT_FILE, CalibrationArtifact, Pattern, load_artifact
from qpart.profiles.devices import DeviceProfile, MeasuredHeads, get_device
from qpart.server.planner import PlanInputs, price
from qpart.server.schemas import PRESETS, WeightPreset

DEVICES = ("raspberry-pi-4", "jetson-nano", "phone-soc")
RATES_MBPS = (1.0, 5.0, 20.0, 100.0)
MODELS = ("fmnist-cnn", "fmnist-resnet")
PRESET_NAMES = ("latency-first", "energy-first")
DEMAND = 0.01
EXTRA_LEVEL = 1.0  # level of the baselines' patterns: above every demand, never planned
STRATEGIES = ("qpart", "all-server", "all-device", "neurosurgeon", "uniform-int8", "qpart-paper")
QUICK_DEVICES = ("raspberry-pi-4", "phone-soc")
QUICK_RATES_MBPS = (1.0, 20.0)
QUICK_PRESETS = ("latency-first",)
PORT = 18500
CLOCK = "reference"  # the reference workload's place in a round's order (not a pattern id)
FILLER_PORT = 18501  # bench.shaped_server's orders (filler frames per response)


# ---- artifacts with the baselines' patterns -----------------------------------------------------

def _act_bytes(artifact: CalibrationArtifact, cut: int, bits: int, group: int) -> int:
    if cut == len(artifact.cuts) - 1:
        return 0
    n = artifact.cuts[cut].activation_numel
    return 4 * n if bits >= 32 else packed_size(n, bits) + 8 * (n // group)


def with_baselines(artifact: CalibrationArtifact) -> CalibrationArtifact:
    """The artifact plus uniform-int8 and QPART-as-published patterns at level 1.0."""
    extra = []
    by_cut = {p.cut: p for p in artifact.patterns if p.level == 0}
    for cut in artifact.cuts:
        ref = by_cut[cut.index]
        act_bits = ref.activation_bits if cut.index == len(artifact.cuts) - 1 else 8
        extra.append(ref.model_copy(update={
            "pattern_id": f"u8-c{cut.index}", "level": EXTRA_LEVEL, "activation_bits": act_bits,
            "weight_bits": dict.fromkeys(cut.head_tensors, 8),
            "activation_bytes": _act_bytes(artifact, cut.index, act_bits, ref.group_size)}))
    for p in artifact.baseline_qpart_paper:
        if p.level == DEMAND:
            extra.append(p.model_copy(update={"pattern_id": f"paper-{p.pattern_id}", "level": EXTRA_LEVEL}))
    return artifact.model_copy(update={"patterns": [*artifact.patterns, *extra]})


def write_artifacts(source: Path, models: list[str], dest: Path) -> None:
    """Copies of the models' artifact folders with the baselines' patterns added."""
    for model in models:
        folder = dest / model
        folder.mkdir(parents=True)
        shutil.copy(source / model / "weights.safetensors", folder / "weights.safetensors")
        artifact = with_baselines(load_artifact(source / model))
        (folder / ARTIFACT_FILE).write_text(artifact.model_dump_json(indent=1))


# ---- the simulated device -----------------------------------------------------------------------

@dataclass
class Link:
    """What the device measured of its link at the current rate."""

    rate_mbps: float
    goodput_bps: float
    rtt_s: float
    wire: ShapedLink  # the shaped link itself, set to rate_mbps
    upload_rate_bps: float | None = None  # an upload body's bit/s (probe_exchange; None: goodput)


@dataclass
class ModelView:
    """A served model as the device sees it: patterns, tail times, artifact."""

    name: str
    version: str
    cuts: int
    tail_s: list[float]
    patterns: list[dict[str, Any]]
    artifact: CalibrationArtifact
    host_head_s: list[float]
    host_encode_s: list[float]
    answer_bytes: int
    heads: dict[str, torch.nn.Module] = field(default_factory=dict)
    segments: dict[str, bytes] = field(default_factory=dict)  # what the device has downloaded
    host_coding_s: CodingSeconds = field(default_factory=dict)  # per coding, cut and bits
    activations: list[np.ndarray] = field(default_factory=list)  # the real image's, every cut but the last
    reference_s: float = 0.0  # the reference workload's time in the last profile (bench.device_clock)

    def plan_of(self, p: dict[str, Any]) -> dict[str, Any]:
        """A pattern in the form of a plan (what :class:`client.plans.HeadSpec` reads)."""
        return {**p, "model": self.name, "version": self.version, "cuts": self.cuts}

    def pattern(self, pattern_id: str) -> Pattern:
        return next(p for p in self.artifact.patterns if p.pattern_id == pattern_id)


def measure_rtt(client: httpx.Client, url: str, model: ModelView, image: np.ndarray, idle_s: float) -> float:
    """The latency floor of one inference exchange on the unshaped link: median of 31 tail
    requests' round trips minus the server's reported queue + compute time. It holds what the
    cost model has no term for: HTTP handling on both ends, decoding, the answer's parsing.

    Each request follows ``idle_s`` of silence, as every measured transfer does (ShapedLink.quiet): a
    server (and client) that idled for milliseconds answers slower than a busy one. Measured on
    this VM (80 sequential CNN tail requests, median), the rest of an exchange took 0.9 ms back to
    back, 1.6 ms after 3 ms idle and 2.4 ms after 20 ms: back-to-back probes priced the measured
    exchanges at half their cost.
    """
    p = min((p for p in model.patterns if p["cut"] == 0), key=lambda p: p["activation_bits"])
    packet = encode_for_plan(image, PacketFormat.model_validate(p))
    rtts = []
    for i in range(51):  # the first 20 are warm-up (first requests of a process run slow)
        time.sleep(idle_s)
        start = time.perf_counter()
        r = client.post(url + p["infer_url"], content=packet)
        elapsed = time.perf_counter() - start
        r.raise_for_status()
        answer = r.json()
        if i >= 20:
            rtts.append(elapsed - float(answer["queue_s"]) - float(answer["compute_s"]))
    return statistics.median(rtts)


def probe_rtt(client: httpx.Client, url: str, model: ModelView, image: np.ndarray, wire: ShapedLink,
              rate_mbps: float) -> float:
    """:func:`measure_rtt` on the unshaped link, idling as transfers at ``rate_mbps`` do; the link
    is left shaped at ``rate_mbps``."""
    wire.set_rate(None)
    rtt = measure_rtt(client, url, model, image, idle_gap_s(rate_mbps))
    wire.set_rate(rate_mbps)
    return rtt


def probe_exchange(client: httpx.Client, url: str, model: ModelView, image: np.ndarray, link: Link,
                   rng: random.Random, rounds: int = 21) -> ExchangeProbe:
    """One probe of the exchange on the shaped link itself (:mod:`bench.exchange` fits it).

    The device uploads the image at cut 0 with the fewest bits and as float32, ``rounds`` pairs,
    each pair in a random order, each upload encoded first (as :func:`run_once` does) and sent
    after :meth:`ShapedLink.quiet`; an exchange's rest is its round trip less the server's
    reported queue + compute. Body wire times are the cost model's, at the measured goodput.

    A probe of the unshaped link missed what the link itself hides: it priced the exchanges
    of the previous full run 1.7 ms (1 Mbit/s) and 0.3 ms (5 Mbit/s) above what their measured
    cut-0 exchanges implied (medians over each rate's 24 cells, ``bench/results/e2e.json`` as of
    ec5b1b3).
    """
    cut0 = [p for p in model.patterns if p["cut"] == 0]
    pair = [min(cut0, key=lambda p: p["activation_bits"]), max(cut0, key=lambda p: p["activation_bits"])]
    plans = [PacketFormat.model_validate(p) for p in pair]
    rests: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i in rng.sample((0, 1), 2):
            packet = encode_for_plan(image, plans[i])
            link.wire.quiet()
            start = time.perf_counter()
            r = client.post(url + pair[i]["infer_url"], content=packet)
            elapsed = time.perf_counter() - start
            r.raise_for_status()
            answer = r.json()
            rests[i].append(elapsed - float(answer["queue_s"]) - float(answer["compute_s"]))
    small, large = (model.pattern(p["pattern_id"]).activation_bytes * 8 / link.goodput_bps for p in pair)
    return probe_medians(rests[0], rests[1], small, large)


def fit_link(model: ModelView, link: Link, probes: Sequence[ExchangeProbe]) -> tuple[float, float]:
    """(rtt, upload rate) from ``probes`` (:func:`bench.exchange.fit_exchange`), with the small
    exchange priced by the cost model as the plans are."""
    small = min((p for p in model.patterns if p["cut"] == 0), key=lambda p: p["activation_bits"])
    device = get_device("raspberry-pi-4")  # the transfer term depends on the link alone

    def transfer(upload_rate_bps: float) -> float:
        bare = PlanInputs(device, PRESETS[WeightPreset.LATENCY_FIRST], link.goodput_bps, 0.0, 1, 1.0,
                          frozenset(), upload_rate_bps=upload_rate_bps)
        return float(_predict(model, small, bare)["time_s"]["transfer"])

    return fit_exchange(probes, link.goodput_bps, transfer)


def measure_link(client: httpx.Client, url: str, model: ModelView, wire: ShapedLink, rtt: float) -> Link:
    """Goodput at the shaped rate: ranged downloads of ~2 s of data (payload bits per second;
    shorter ones read low, TCP's slow start weighs more)."""
    biggest = max((p["segment"] for p in model.patterns if p["segment"]), key=lambda s: s["size_bytes"])
    rate_mbps = wire.rate_mbps
    if rate_mbps is None:
        raise ValueError("measure_link needs a shaped link")
    n = min(biggest["size_bytes"], max(256 * 1024, int(rate_mbps * 1e6 / 8 * 2)))
    rates = []
    for _ in range(2):
        wire.quiet()
        start = time.perf_counter()
        r = client.get(url + biggest["url"], headers={"Range": f"bytes=0-{n - 1}"})
        r.raise_for_status()
        rates.append(len(r.content) * 8 / max(1e-6, time.perf_counter() - start - rtt))
    return Link(rate_mbps, statistics.median(rates), rtt, wire)


def host_flops_per_s(model: ModelView) -> float:
    """This machine's FLOP/s on the whole model at batch 1 (its measured head at the last cut)."""
    return model.artifact.cuts[-1].head_flops / model.host_head_s[-1]


def device_profile(name: str, models: list[ModelView]) -> tuple[DeviceProfile, dict[str, float]]:
    """The preset with per-cut head times = host times x (host FLOP/s / device FLOP/s)."""
    base = get_device(name)
    ratios = {m.name: host_flops_per_s(m) / base.flops_per_s for m in models}
    def scaled(m: ModelView, coding: Coding) -> list[dict[int, float]]:
        return [{b: t * ratios[m.name] for b, t in cut.items()} for cut in m.host_coding_s.get(coding, [])]

    measured = {m.name: MeasuredHeads(version=m.version, head_s=[t * ratios[m.name] for t in m.host_head_s],
                                      encode_s=[t * ratios[m.name] for t in m.host_encode_s],
                                      coding_s={c: scaled(m, c) for c in Coding if m.host_coding_s.get(c)},
                                      warmup=2, repeats=3, min_seconds=PROFILE_SECONDS["head"])
                for m in models}
    return base.model_copy(update={"measured": measured}), ratios


@dataclass
class Choice:
    """A strategy's plan in a cell and what the cost model predicts for it."""

    plan: dict[str, Any]
    predicted: dict[str, Any]


def _inputs(device: DeviceProfile, preset: str, link: Link, held: set[str]) -> PlanInputs:
    return PlanInputs(device, PRESETS[WeightPreset(preset)], link.goodput_bps, link.rtt_s, 1, 1.0,
                      frozenset(held), upload_codings=frozenset(Coding), upload_rate_bps=link.upload_rate_bps)


def _predict(model: ModelView, p: dict[str, Any], inputs: PlanInputs) -> dict[str, Any]:
    seg = p["segment"]
    pattern = model.pattern(p["pattern_id"])
    costs = price(model.artifact, pattern, seg["id"] if seg else None, seg["size_bytes"] if seg else 0,
                  inputs, model.tail_s[pattern.cut], model.answer_bytes)
    return costs.model_dump()


def choose_fixed(model: ModelView, strategy: str, inputs: PlanInputs) -> dict[str, Any]:
    """The fixed strategy's pattern (its best cut by predicted objective where it has a choice)."""
    last = model.cuts - 1
    lossless = [p for p in model.patterns if p["level"] == 0]
    if strategy == "all-server":
        options = [p for p in lossless if p["cut"] == 0]
    elif strategy == "all-device":
        options = [p for p in lossless if p["cut"] == last]
    elif strategy == "neurosurgeon":
        options = lossless
    elif strategy == "uniform-int8":
        options = [p for p in model.patterns if p["pattern_id"].startswith("u8-")]
    else:
        options = [p for p in model.patterns if p["pattern_id"].startswith("paper-")]
    return min(options, key=lambda p: (_predict(model, p, inputs)["objective"], p["cut"]))


def meets_demand(strategy: str, p: dict[str, Any]) -> bool:
    """Whether a strategy keeps the accuracy demand, so that it can be the cell's best.

    The planner's patterns are validated (calibration bound, then the test split); float32 ones are
    lossless; QPART-as-published is judged by its drop measured on the test split (artifact);
    uniform int8 is not measured here and is counted as keeping it (in its favour).
    """
    if strategy == "qpart-paper":
        return p["test_drop"] is not None and p["test_drop"] <= DEMAND
    return True


def _head(model: ModelView, plan: dict[str, Any], segment: bytes | None) -> torch.nn.Module:
    key = plan["pattern_id"]
    if key not in model.heads:
        model.heads[key] = load_head(HeadSpec.model_validate(plan), segment)
    return model.heads[key]


def run_once(client: httpx.Client, url: str, model: ModelView, plan: dict[str, Any],
             head: torch.nn.Module, image: np.ndarray, ratio: float, link: Link) -> dict[str, float]:
    """One inference: head on the device (timed, scaled), upload, tail on the server."""
    x = torch.from_numpy(image)
    # steady-state head time (median of 9) after 5 warm-up runs: the device just idled on the link
    # and its first runs are slow (seen: up to 1.5x). reprofile times every head the same way.
    host_head = (median_latency(head, x, warmup=HEAD_RUNS["settle"], repeats=HEAD_RUNS["burst"])
                 if plan["cut"] > 0 else 0.0)
    with torch.inference_mode():
        act = head(x).numpy() if plan["cut"] > 0 else image
    packet, host_encode = b"", 0.0
    headers: dict[str, str] = {}
    if plan["cut"] < model.cuts - 1:
        # quantize, pack and (if the plan says so) compress: all device work, timed in steady state
        # as the head is (untimed runs first)
        packing = PacketFormat.model_validate(plan)
        host_encode = median_seconds(lambda: upload_body(packing, encode_for_plan(act, packing)),
                                     warmup=ENCODE_RUNS["settle"], repeats=ENCODE_RUNS["burst"])
        packet, headers = upload_body(packing, encode_for_plan(act, packing))
    local = (host_head + host_encode) * ratio
    if plan["cut"] == model.cuts - 1:
        return {"local": local, "round_trip": 0.0, "server": 0.0}
    link.wire.quiet()
    start = time.perf_counter()
    r = client.post(url + plan["infer_url"], content=packet, headers=headers)
    round_trip = time.perf_counter() - start
    r.raise_for_status()
    body = r.json()
    return {"local": local, "round_trip": round_trip, "server": body["queue_s"] + body["compute_s"]}


def measured_j(device: DeviceProfile, preset: str, flops: float, download_s: float,
               runs: list[dict[str, float]]) -> dict[str, float]:
    """Median over runs of T and J (plus the one download), with the cost model's weights."""
    w = PRESETS[WeightPreset(preset)]
    ts, js, transfers = [], [], []
    for r in runs:
        transfer = download_s + max(0.0, r["round_trip"] - r["server"])
        transfers.append(transfer)
        t = r["local"] + transfer + r["server"]
        energy = device.compute_energy_j(r["local"], flops) + device.power_tx_w * transfer
        js.append(w.time * t + w.energy * energy + w.cost * 1.0 * r["server"])
        ts.append(t)
    return {"measured_J": statistics.median(js), "measured_time_s": statistics.median(ts),
            "measured_local_s": statistics.median(r["local"] for r in runs),
            "measured_transfer_s": statistics.median(transfers),
            "measured_round_trip_s": statistics.median(r["round_trip"] for r in runs),
            "measured_server_s": statistics.median(r["server"] for r in runs)}


def implied_rtt(model: ModelView, exchanged: dict[str, dict[str, Any]],
                runs: dict[str, list[dict[str, float]]], inputs: PlanInputs) -> float | None:
    """The exchange overhead a cell's own traffic implies (None if no plan crossed the link): for
    each plan that did, the median of its exchanges' rests (round trip less the server's time)
    less what the cost model prices its transfer at besides the overhead, no download; the
    median over those plans."""
    if not exchanged:
        return None
    held = frozenset(p["segment"]["id"] for p in exchanged.values() if p.get("segment"))
    bare = dataclasses.replace(inputs, rtt_s=0.0, held=held)
    rests = {k: statistics.median(r["round_trip"] - r["server"] for r in runs[k]) for k in exchanged}
    return float(statistics.median(rests[k] - _predict(model, p, bare)["time_s"]["transfer"]
                                   for k, p in exchanged.items()))


def run_rounds(once: Callable[[str, int], dict[str, float]], patterns: list[str], images: int,
               clock: ReferenceClock, reference_s: float, rng: random.Random,
               reps: tuple[int, int, float]) -> tuple[dict[str, list[dict[str, float]]], list[float]]:
    """``once(pattern, image)`` for every pattern each round until ``reps`` (least rounds, most
    rounds, least seconds) say stop; the runs per pattern and the host's speed in each round.

    Interleaved, in a fresh random order each round: a rotation keeps every pattern behind the same
    predecessor (one ran always right after all-device's 14 head runs and a long idle server, and
    measured up to 0.9 ms slower for it). The reference workload runs among them: the device's speed
    holds still while the host's wanders, so each round's device seconds (``local``) are scaled by
    the host's speed in it, ``reference_s`` (the profile's) over the reference's time there.
    """
    runs: dict[str, list[dict[str, float]]] = {pid: [] for pid in patterns}
    order = [*patterns, CLOCK]
    speeds: list[float] = []
    least, most, seconds = reps
    started = time.perf_counter()
    while len(speeds) < most and (len(speeds) < least or time.perf_counter() - started < seconds):
        i = len(speeds) % images
        rng.shuffle(order)
        this_round, speed = [], 1.0
        for pid in order:
            if pid == CLOCK:
                speed = reference_s / clock.seconds()
                continue
            this_round.append(once(pid, i))
            runs[pid].append(this_round[-1])
        for r in this_round:
            r["local"] *= speed
        speeds.append(speed)
    return runs, speeds


def run_cell(client: httpx.Client, url: str, model: ModelView, device: DeviceProfile, ratio: float,
             preset: str, link: Link, held: set[str], images: np.ndarray,
             reps: tuple[int, int, float], clock: ReferenceClock) -> tuple[dict[str, Any], set[str]]:
    """Every strategy in one cell; returns the cell's strategies and the segments downloaded."""
    # The server prices tails with what recent requests took: the same figures price the rest.
    model.tail_s = client.get(f"{url}/v1/models/{model.name}").json()["server_tail_s"]
    inputs = _inputs(device, preset, link, held)
    body = {"model": model.name, "version": model.version, "accuracy_demand": DEMAND,
            "rate_bps": link.goodput_bps, "rtt_s": link.rtt_s, "upload_rate_bps": link.upload_rate_bps,
            "upload_codings": sorted(Coding), "weights": preset,
            "device": device.model_dump(mode="json"), "held_segments": sorted(held)}
    start = time.perf_counter()
    plan = client.post(f"{url}/v1/plan", json=body)
    plan_s = time.perf_counter() - start
    plan.raise_for_status()
    qplan = plan.json()
    qplan["pattern_id"] = qplan["plan_id"].split("/", 1)[1]  # plan_id = model@version/pattern_id
    plans = {"qpart": qplan} | {s: model.plan_of(choose_fixed(model, s, inputs)) for s in STRATEGIES[1:]}
    for s in STRATEGIES[1:]:  # every strategy sends its packet the way the cost model prices cheaper
        plans[s]["upload_encoding"] = _predict(model, plans[s], inputs)["upload_encoding"]
    downloaded: set[str] = set()
    download_s: dict[str, float] = {}
    fetched: dict[str, float] = {}  # segment id -> download seconds in this cell
    heads = {}
    for s, p in plans.items():
        seg = p.get("segment")
        download_s[s] = 0.0
        if seg and seg["id"] not in held:  # not on the device: download it (once per cell)
            if seg["id"] not in fetched:
                link.wire.quiet()
                start = time.perf_counter()
                r = client.get(url + seg["url"])
                fetched[seg["id"]] = time.perf_counter() - start
                r.raise_for_status()
                model.segments[seg["id"]] = r.content
                downloaded.add(seg["id"])
            download_s[s] = fetched[seg["id"]]  # each strategy is charged its own download
        heads[s] = _head(model, p, model.segments[seg["id"]] if seg else None)
    # Strategies that chose the same pattern do the same thing: each distinct pattern runs once per
    # repetition and its runs count for every strategy that chose it (otherwise two names for one
    # plan would differ by measurement noise alone).
    # (A pattern sent raw, deflated or zstd-compressed is three plans.)
    def key(p: dict[str, Any]) -> str:
        return f"{p['pattern_id']}/{p.get('upload_encoding', 'identity')}"

    by_pattern = {key(p): s for s, p in reversed(plans.items())}

    def once(pid: str, i: int) -> dict[str, float]:
        s = by_pattern[pid]
        return run_once(client, url, model, plans[s], heads[s], images[i : i + 1], ratio, link)

    rng = random.Random(f"{model.name}/{device.name}/{link.rate_mbps}/{preset}/{sorted(held)}")
    runs, speeds = run_rounds(once, list(by_pattern), len(images), clock, model.reference_s, rng, reps)
    out = {}
    for s, p in plans.items():
        predicted = qplan["predicted"] if s == "qpart" else _predict(model, p, inputs)
        flops = model.artifact.cuts[p["cut"]].head_flops
        m = measured_j(device, preset, flops, download_s[s], runs[key(p)])
        out[s] = {"predicted_J": predicted["objective"], "predicted_time_s": predicted["time_s"]["total"],
                  "predicted_local_s": predicted["time_s"]["local"],
                  "predicted_transfer_s": predicted["time_s"]["transfer"],
                  "predicted_server_s": predicted["time_s"]["server"],
                  **m, "cut": p["cut"], "pattern_id": p["pattern_id"], "meets_demand": meets_demand(s, p),
                  "transfer_bytes": predicted["transfer_bytes"], "download_s": download_s[s]}
    best = min((s for s in out if out[s]["meets_demand"]), key=lambda s: out[s]["measured_J"])
    exchanged = {key(p): p for p in plans.values() if p["cut"] < model.cuts - 1}
    cell = {"strategies": out, "best": best, "plan_s": plan_s, "reps": len(speeds),
            "host_speed": {"median": statistics.median(speeds), "min": min(speeds), "max": max(speeds)},
            "best_any": min(out, key=lambda s: out[s]["measured_J"]),
            "implied_rtt_s": implied_rtt(model, exchanged, runs, inputs),
            "qpart_regret": out["qpart"]["measured_J"] / out[best]["measured_J"] - 1.0,
            # the server's prediction for its plan equals this benchmark's pricing of it
            "qpart_plan_check": math.isclose(_predict(model, qplan, inputs)["objective"],
                                             qplan["predicted"]["objective"], rel_tol=1e-9)}
    return cell, downloaded


# ---- the grid -----------------------------------------------------------------------------------

def _view(client: httpx.Client, url: str, name: str, artifacts: Path, image: np.ndarray,
          clock: ReferenceClock) -> ModelView:
    info = client.get(f"{url}/v1/models/{name}").json()
    torch.set_num_threads(1)
    view = ModelView(name, info["version"], info["cuts"], info["server_tail_s"], info["patterns"],
                     load_artifact(artifacts / name), [], [], info["answer_bytes"])
    reprofile(view, image, clock)
    return view


# Seconds of interleaved timing rounds per re-profile (models.timing.interleaved_medians). In the
# run before (e2e.json at b90a80c) one profile of 9 calls per cut read the CNN at 0.905 ms on this
# machine; the cell that followed took a median 1.267 ms, and the planner lost 25.1% there.
PROFILE_SECONDS = {"head": 2.0, "encode": 0.5, "coding": 1.0}  # coding: deflate and zstd, 0.5 s before


def reprofile(model: ModelView, image: np.ndarray, clock: ReferenceClock) -> None:
    """Measure the host's head, encode and coding times again. This shared machine's speed drifts
    over seconds to minutes (seen: the whole CNN 34% faster twenty minutes after the profile), and a
    device's time is host time x host FLOP/s / device FLOP/s: with a stale profile the planner's
    device times and the measured ones run on different clocks. The reference workload is timed in
    the same rounds: the cell's rounds scale device time by it (bench.device_clock)."""
    # the trained model on a real image: what the device runs; the reference in the same rounds
    calls = [*head_calls(model.name, trained=True, x=torch.from_numpy(image)), clock.call]
    with torch.inference_mode():
        *model.host_head_s, model.reference_s = interleaved_medians(
            calls, warmup=2, repeats=3, min_seconds=PROFILE_SECONDS["head"], **HEAD_RUNS)
    model.host_encode_s = measure_encodes(model.name, warmup=2, repeats=3,
                                          min_seconds=PROFILE_SECONDS["encode"], **ENCODE_RUNS)
    if not model.activations:  # the device compresses its own packets of the real image
        spec = get_model(model.name)
        gm = prepare(spec.load(), spec.input_shape)
        with torch.inference_mode():
            model.activations = [split(gm, cut)[0](torch.from_numpy(image)).numpy()
                                 for cut in cuts_of(gm)[:-1]]
    model.host_coding_s = coding_times(model.activations, warmup=2, repeats=3,
                                       min_seconds=PROFILE_SECONDS["coding"], **ENCODE_RUNS)


def _measure_cell(*, cache: str, held: set[str], client: httpx.Client, url: str, model: ModelView,
                  device: str, preset: str, link: Link, images: np.ndarray, reps: tuple[int, int, float],
                  clock: ReferenceClock, probes: deque[ExchangeProbe], implied: deque[float],
                  probe_rng: random.Random) -> dict[str, Any]:
    """One cell, with its record: the segments it downloaded under ``"downloaded"``."""
    # Before every cell, one clock for prediction and measurement: host head times (an all-device
    # run took 2.25 ms where its profile, taken three cells earlier, said 1.62) and the exchange's
    # overhead and upload rate (one cut-0 exchange took 2.1 to 3.1 ms across one rate's cells).
    ticks = cpu_ticks()
    reprofile(model, images[:1], clock)
    profile, ratios = device_profile(device, [model])
    probes.append(probe_exchange(client, url, model, images[:1], link, probe_rng))
    fitted, link.upload_rate_bps = fit_link(model, link, probes)
    link.rtt_s = overhead(fitted, implied)
    cell, got = run_cell(client, url, model, profile, ratios[model.name], preset, link, held, images,
                         reps, clock)
    return {"device": device, "rate_mbps": link.rate_mbps, "model": model.name, "preset": preset,
            "cache": cache, "goodput_mbps": link.goodput_bps / 1e6, "rtt_s": link.rtt_s,
            "probe_rtt_s": fitted,
            "upload_rate_mbps": None if link.upload_rate_bps is None else link.upload_rate_bps / 1e6,
            "probe": dataclasses.asdict(probes[-1]), "speed_ratio": ratios[model.name], **cell,
            "cpu_steal": steal_fraction(ticks, cpu_ticks()), "downloaded": sorted(got)}


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
        _progress(cell, f"discarded (steal over {gate:.0%}): ")
        discarded.append(cell)


def cold_then_warm(measure: Callable[..., dict[str, Any]], probes: deque[ExchangeProbe],
                   implied: deque[float], gate: float, retries: int) -> list[dict[str, Any]]:
    """One device and preset's two cells, each :func:`steal_gated`: cold (the device holds no
    segment), then warm (it holds what the cold cell's kept attempt downloaded).
    ``measure(cache=..., held=...)`` measures one cell; only a kept attempt's traffic, and only
    one within the gate (or of unknown steal), enters the overhead window (``implied``)."""
    held: set[str] = set()
    cells = []
    for cache in ("cold", "warm"):
        cell = steal_gated(functools.partial(measure, cache=cache, held=set(held)), probes, gate, retries)
        held |= set(cell.pop("downloaded"))
        if cell["implied_rtt_s"] is not None and not over_gate(cell, gate):
            implied.append(cell["implied_rtt_s"])
        cells.append(cell)
        _progress(cell)
    return cells


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The grid; returns the JSON document."""
    devices = QUICK_DEVICES if args.quick else DEVICES
    rates = args.rate or (QUICK_RATES_MBPS if args.quick else RATES_MBPS)
    presets = QUICK_PRESETS if args.quick else PRESET_NAMES
    images = load_split(Split.TEST, limit=args.max_reps).images
    reps = (args.reps, args.max_reps, args.cell_seconds)
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="qpart-e2e-") as tmp:
        write_artifacts(args.artifacts, list(args.model), Path(tmp))
        env = {"QPART_PORT": str(PORT), "QPART_TORCH_THREADS": "1", CONTROL_PORT_ENV: str(FILLER_PORT),
               "QPART_SEGMENT_CACHE_BYTES": str(256 << 20)}
        server: Server = start_server([sys.executable, "-m", "bench.shaped_server", "--artifacts", tmp],
                                      f"http://127.0.0.1:{PORT}", "/v2/health/ready", env)
        os.sched_setaffinity(0, {int(GENERATOR_CORE)})
        wire = ShapedLink(server_control_port=FILLER_PORT)
        try:
            with wire.client(timeout=300) as client:
                url = server.url
                clock = ReferenceClock(torch.from_numpy(images[:1]))
                views = [_view(client, url, m, Path(tmp), images[:1], clock) for m in args.model]
                probe_rng = random.Random(0)  # the order within each probe's pairs
                for rate in rates:
                    rtt = probe_rtt(client, url, views[0], images[:1], wire, rate)  # for the goodput only
                    link = measure_link(client, url, views[0], wire, rtt)
                    print(f"rate {rate:g} Mbit/s: goodput {link.goodput_bps / 1e6:.2f} Mbit/s",
                          file=sys.stderr)
                    for model in views:
                        # A full window from the start: the first cells smooth as the later do.
                        probes = deque((probe_exchange(client, url, model, images[:1], link, probe_rng)
                                        for _ in range(PROBE_WINDOW)), maxlen=PROBE_WINDOW)
                        implied: deque[float] = deque(maxlen=TRAFFIC_WINDOW)  # from the cells' traffic
                        for d in devices:
                            for preset in presets:
                                measure = functools.partial(
                                    _measure_cell, client=client, url=url, model=model, device=d,
                                    preset=preset, link=link, images=images, reps=reps, clock=clock,
                                    probes=probes, implied=implied, probe_rng=probe_rng)
                                cells += cold_then_warm(measure, probes, implied, args.steal_gate,
                                                        args.steal_retries)
        finally:
            wire.set_rate(None)
            wire.close()
            server.stop()
    return {"cells": cells, "summary": gated_summary(cells, args.steal_gate), "demand": DEMAND,
            "reps": {"least": args.reps, "most": args.max_reps, "cell_seconds": args.cell_seconds},
            "quick": args.quick, "host_flops_per_s": {v.name: host_flops_per_s(v) for v in views}}


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


def first_attempts(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each cell as first measured, before :func:`steal_gated` measured any again. Not an ungated
    run: the cells after a retried one follow from its kept attempt (held segments, the link's
    probe and overhead windows, the time they ran at)."""
    return [c["discarded"][0] if c.get("discarded") else c for c in cells]


def gated_summary(cells: list[dict[str, Any]], gate: float) -> dict[str, Any]:
    """:func:`summarize` of the cells as recorded, beside the raw grid's (first attempts) and how
    many cells were measured again or stayed over the steal gate."""
    over = [c for c in cells if over_gate(c, gate)]
    return {**summarize(cells), "steal_gate": gate,
            "cells_measured_again": sum(1 for c in cells if c.get("discarded")),
            "cells_over_steal_gate": len(over),
            "cells_over_steal_gate_regret_over_5pct": sum(1 for c in over if c["qpart_regret"] > 0.05),
            "first_attempts": summarize(first_attempts(cells))}


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


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="write results here (plus .md and .png)")
    parser.add_argument("--quick", action="store_true",
                        help=f"subset: devices {QUICK_DEVICES}, rates {QUICK_RATES_MBPS} Mbit/s, "
                             f"preset {QUICK_PRESETS} (both models, cold and warm)")
    parser.add_argument("--reps", type=int, default=11,
                        help="least inferences per strategy and cell (the median is reported)")
    parser.add_argument("--cell-seconds", type=float, default=6.0,
                        help="keep measuring a cell's strategies for at least this long (default 6)")
    parser.add_argument("--max-reps", type=int, default=400, help="most inferences per strategy and cell")
    parser.add_argument("--model", action="append", choices=MODELS, help="model(s) (default: both)")
    parser.add_argument("--rate", action="append", type=float, help="rate(s) in Mbit/s (default: the grid's)")
    parser.add_argument("--steal-gate", type=float, default=STEAL_GATE,
                        help="measure a cell again when the CPU steal it ran under exceeds this share "
                             f"(default {STEAL_GATE}; the first attempt is kept and summarized apart)")
    parser.add_argument("--steal-retries", type=int, default=STEAL_RETRIES,
                        help=f"most extra attempts per cell (default {STEAL_RETRIES}; 0: never again)")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    args = parser.parse_args(argv)
    if not 0.0 <= args.steal_gate <= 1.0:
        parser.error(f"--steal-gate is a share of CPU time between 0 and 1, not {args.steal_gate}")
    if args.steal_retries < 0:
        parser.error(f"--steal-retries counts extra attempts: 0 or more, not {args.steal_retries}")
    args.model = args.model or list(MODELS)
    enter_private_network("bench.e2e", argv, tools=("tc",), mtu=1500)
    doc = run(args)
    write_json(args.json, doc)
    args.json.with_suffix(".md").write_text(markdown(doc))
    plot(doc, args.json.with_suffix(".png"))
    print(markdown(doc))


if __name__ == "__main__":
    main()
