"""The device's measures of its link: the exchange's overhead, its upload rate, the goodput."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence

import httpx
import numpy as np

from bench.e2e.cell import _predict
from bench.e2e.device import Link, ModelView
from bench.harness.exchange import ExchangeProbe, fit_exchange, probe_medians
from bench.harness.link import ShapedLink, idle_gap_s
from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan
from qpart.profiles.costs import PlanInputs
from qpart.profiles.devices import get_device
from qpart.server.schemas import PRESETS, WeightPreset


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
    """One probe of the exchange on the shaped link itself (:mod:`bench.harness.exchange` fits it).

    The device uploads the image at cut 0 with the fewest bits and as float32, ``rounds`` pairs,
    each pair in a random order, each upload encoded first (as :func:`run_once` does) and sent
    after :meth:`ShapedLink.quiet`; an exchange's rest is its round trip less the server's
    reported queue + compute. Body wire times are the cost model's, at the measured goodput.

    A probe of the unshaped link missed what the link itself hides: it priced the exchanges
    of the previous full run 1.7 ms (1 Mbit/s) and 0.3 ms (5 Mbit/s) above what their measured
    cut-0 exchanges implied (medians over each rate's 24 cells, ``bench/results/e2e.json`` as of
    ec5b1b3, in git history).
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
    """(rtt, upload rate) from ``probes`` (:func:`bench.harness.exchange.fit_exchange`), with the small
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
