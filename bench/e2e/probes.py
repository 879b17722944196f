"""The device's measures of its link: the exchange's overhead, its upload rate, the goodput."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from bench.e2e.device import Link, ModelView
from bench.exchange import ExchangeProbe, fit_exchange, probe_medians
from bench.link import ShapedLink, idle_gap_s
from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan, upload_body
from qpart.kernels.coding import Coding
from qpart.profiles.devices import get_device
from qpart.server.planner import PlanInputs, price_upload
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


@dataclass(frozen=True)
class ProbeUpload:
    """One of a probe's two uploads: its cut-0 pattern (as the model view lists it), how it is
    packed, the body as sent and its headers, and the coding it is sent in (None: as is)."""

    pattern: dict[str, Any]
    packing: PacketFormat
    body: bytes
    headers: dict[str, str]
    coding: Coding | None


def probe_uploads(model: ModelView, image: np.ndarray) -> tuple[ProbeUpload, ProbeUpload]:
    """The probe's small and large upload: the cut-0 packet of ``image`` at the fewest bits and as
    float32, each sent as a plan sends it, compressed in the coding the calibration found to shrink
    that packet most (``CutProfile.coding_ratio``; as is where none shrinks it).

    Sent as is, fmnist-mobilenet's float32 packet is 49 KB, ten times the largest body any of its
    plans uploads (its coded float32, about 4 KB): at 5 Mbit/s it held the server idle 79 ms
    before each of the probe's tail requests, and the server prices a cut's tail by its last lone
    requests (``server.tail_times``), here the probe's: at 79ce700 fmnist-mobilenet's cut-0 tail
    was priced 0.2 to 0.9 ms over what the rounds measured at 5 Mbit/s. The fitted upload rate
    also came from bodies no plan sends.
    """
    cut0 = [p for p in model.patterns if p["cut"] == 0]
    ratios = model.artifact.cuts[0].coding_ratio
    out = []
    for p in (min(cut0, key=lambda p: p["activation_bits"]), max(cut0, key=lambda p: p["activation_bits"])):
        bits = p["activation_bits"]
        shrunk = [(ratios[c][bits], c) for c in Coding if bits in ratios.get(c, {}) and ratios[c][bits] < 1]
        coding = min(shrunk)[1] if shrunk else None
        encoding = "identity" if coding is None else coding.value
        packing = PacketFormat.model_validate({**p, "upload_encoding": encoding})
        body, headers = upload_body(packing, encode_for_plan(image, packing))
        out.append(ProbeUpload(p, packing, body, headers, coding))
    return out[0], out[1]


def probe_exchange(client: httpx.Client, url: str, model: ModelView, image: np.ndarray, link: Link,
                   rng: random.Random, rounds: int = 21) -> ExchangeProbe:
    """One probe of the exchange on the shaped link itself (:mod:`bench.exchange` fits it).

    The device uploads :func:`probe_uploads` of the image, ``rounds`` pairs, each pair in a random
    order, each upload encoded first (as :func:`run_once` does) and sent after
    :meth:`ShapedLink.quiet`; an exchange's rest is its round trip less the server's reported
    queue + compute. Body wire times are the bodies' bytes at the measured goodput.

    A probe of the unshaped link missed what the link itself hides: it priced the exchanges
    of the previous full run 1.7 ms (1 Mbit/s) and 0.3 ms (5 Mbit/s) above what their measured
    cut-0 exchanges implied (medians over each rate's 24 cells, ``bench/results/e2e.json`` as of
    ec5b1b3).
    """
    pair = probe_uploads(model, image)
    rests: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i in rng.sample((0, 1), 2):
            upload = pair[i]
            body, headers = upload_body(upload.packing, encode_for_plan(image, upload.packing))
            link.wire.quiet()
            start = time.perf_counter()
            r = client.post(url + upload.pattern["infer_url"], content=body, headers=headers)
            elapsed = time.perf_counter() - start
            r.raise_for_status()
            answer = r.json()
            rests[i].append(elapsed - float(answer["queue_s"]) - float(answer["compute_s"]))
    small, large = (len(u.body) * 8 / link.goodput_bps for u in pair)
    return probe_medians(rests[0], rests[1], small, large)


def fit_link(model: ModelView, link: Link, probes: Sequence[ExchangeProbe],
             image: np.ndarray) -> tuple[float, float]:
    """(rtt, upload rate) from ``probes`` (:func:`bench.exchange.fit_exchange`) of ``image``, with
    the small exchange priced by the cost model as a plan's upload of its body is."""
    small = probe_uploads(model, image)[0]
    pattern = model.pattern(small.pattern["pattern_id"])
    device = get_device("raspberry-pi-4")  # the transfer term depends on the link alone
    ratio = None if small.coding is None else len(small.body) / pattern.activation_bytes

    def transfer(upload_rate_bps: float) -> float:
        bare = PlanInputs(device, PRESETS[WeightPreset.LATENCY_FIRST], link.goodput_bps, 0.0, 1, 1.0,
                          frozenset(), upload_rate_bps=upload_rate_bps)
        costs = price_upload(model.artifact, pattern, None, 0, bare, answer_bytes=model.answer_bytes,
                             ratio=ratio, coding=small.coding)
        return costs.time_s.transfer

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
