"""The simulated device: its view of a model and link, its profile, one inference, measured J."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import torch

from bench.harness.device_clock import ENCODE_RUNS, HEAD_RUNS, ReferenceClock
from bench.harness.link import ShapedLink
from qpart.client.onnx_runtime import create_session
from qpart.client.plans import HeadSpec, PacketFormat
from qpart.client.profiler import CodingSeconds, coding_times, head_calls, measure_encodes
from qpart.client.runtime import encode_for_plan, load_head, upload_body
from qpart.kernels.coding import Coding
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME, HeadRuntime
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.registry import get_model
from qpart.models.timing import interleaved_medians, median_seconds
from qpart.profiles.artifacts import CalibrationArtifact, Pattern
from qpart.profiles.devices import DeviceProfile, MeasuredHeads, get_device
from qpart.server.schemas import PRESETS, WeightPreset


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
    heads: dict[str, Callable[..., Any]] = field(default_factory=dict)
    segments: dict[str, bytes] = field(default_factory=dict)  # what the device has downloaded
    host_coding_s: CodingSeconds = field(default_factory=dict)  # per coding, cut and bits
    activations: list[np.ndarray] = field(default_factory=list)  # the real image's, every cut but the last
    reference_s: float = 0.0  # the reference workload's time in the last profile (bench.harness.device_clock)
    runtime: HeadRuntime = HeadRuntime.TORCH  # what runs the device's heads, and so its segments' form
    onnx_heads: list[OrtHead] = field(default_factory=list)  # runtime onnx: each cut's lossless head
    decode_s: dict[str, list[float]] = field(default_factory=dict)  # the server's, per coding and cut

    def decode_at(self, cut: int) -> dict[str, float]:
        """Per upload coding, the server's price for decoding one sample's packet at ``cut``."""
        return {coding: per_cut[cut] for coding, per_cut in self.decode_s.items()}

    def plan_of(self, p: dict[str, Any]) -> dict[str, Any]:
        """A pattern in the form of a plan (what :class:`client.plans.HeadSpec` reads)."""
        return {**p, "model": self.name, "version": self.version, "cuts": self.cuts}

    def pattern(self, pattern_id: str) -> Pattern:
        return next(p for p in self.artifact.patterns if p.pattern_id == pattern_id)


class OrtHead:
    """An ONNX segment's head in ONNX Runtime (one intra-op thread, as torch has here), called as
    a torch head is: a float32 tensor in, a tensor out."""

    def __init__(self, segment: bytes) -> None:
        self.session = create_session(segment, threads=1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0])


def load_device_head(model: ModelView, plan: dict[str, Any], segment: bytes | None) -> Callable[..., Any]:
    """The plan's head as ``model.runtime`` runs it: the torch module from a safetensors segment
    (:func:`qpart.client.runtime.load_head`), or an ONNX Runtime session (identity at cut 0)."""
    if model.runtime is HeadRuntime.TORCH:
        return load_head(HeadSpec.model_validate(plan), segment)
    if segment is None:
        return lambda x: x
    return OrtHead(segment)


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


# Seconds of interleaved timing rounds per re-profile (models.timing.interleaved_medians). In the
# run before (bench/results/e2e.json at b90a80c, in git history) one profile of 9 calls per cut
# read the CNN at 0.905 ms on this machine; the cell that followed took a median 1.267 ms, and the
# planner lost 25.1% there.
PROFILE_SECONDS = {"head": 2.0, "encode": 0.5, "coding": 1.0}  # coding: deflate and zstd, 0.5 s before


def reprofile(model: ModelView, image: np.ndarray, clock: ReferenceClock) -> None:
    """Measure the host's head, encode and coding times again. This shared machine's speed drifts
    over seconds to minutes (seen: the whole CNN 34% faster twenty minutes after the profile), and a
    device's time is host time x host FLOP/s / device FLOP/s: with a stale profile the planner's
    device times and the measured ones run on different clocks. The reference workload is timed in
    the same rounds: the cell's rounds scale device time by it (bench.harness.device_clock)."""
    # the trained model on a real image: what the device runs; the reference in the same rounds
    x = torch.from_numpy(image)
    heads = (head_calls(model.name, trained=True, x=x) if model.runtime is HeadRuntime.TORCH
             else [lambda: None, *(functools.partial(h, x) for h in model.onnx_heads)])  # cut 0: no head
    with torch.inference_mode():
        *model.host_head_s, model.reference_s = interleaved_medians(
            [*heads, clock.call], warmup=2, repeats=3, min_seconds=PROFILE_SECONDS["head"], **HEAD_RUNS)
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


def _head(model: ModelView, plan: dict[str, Any], segment: bytes | None) -> Callable[..., Any]:
    key = plan["pattern_id"]
    if key not in model.heads:
        model.heads[key] = load_device_head(model, plan, segment)
    return model.heads[key]


SERVER_PARTS = ("queue", "compute", "decode")
"""What an answer's server time is made of, each kept per run (its median per strategy in the grid):
the wait for the tail worker, the compute (decoding included), and the decoding alone."""


def server_timing(header: str | None, name: str = "decode") -> float | None:
    """Seconds of the ``name`` metric of a ``Server-Timing`` field (None: absent)."""
    for metric in (header or "").split(","):
        parts = [p.strip() for p in metric.split(";")]
        if parts[0] == name:
            for param in parts[1:]:
                if param.startswith("dur="):
                    return float(param[4:]) / 1e3
    return None


def server_parts(answer: dict[str, Any], timing: str | None) -> dict[str, float]:
    """An answer's server time in :data:`SERVER_PARTS` (decode 0 where ``Server-Timing`` is absent)."""
    return {"queue": float(answer["queue_s"]), "compute": float(answer["compute_s"]),
            "decode": server_timing(timing) or 0.0}


def run_once(client: httpx.Client, url: str, model: ModelView, plan: dict[str, Any],
             head: Callable[..., Any], image: np.ndarray, ratio: float, link: Link) -> dict[str, float]:
    """One inference: head on the device (timed, scaled), upload, tail on the server."""
    x = torch.from_numpy(image)
    # steady-state head time (median of 9) after 5 warm-up runs: the device just idled on the link
    # and its first runs are slow (seen: up to 1.5x). reprofile times every head the same way, and
    # under inference mode, as the device runtime runs its heads: timed outside it, a torch head
    # recorded its autograd graph (the fmnist-mobilenet's whole model read 17-53% over its profile
    # in the warm cells of a quick grid at 675757f)
    with torch.inference_mode():
        host_head = (median_seconds(lambda: head(x), warmup=HEAD_RUNS["settle"], repeats=HEAD_RUNS["burst"])
                     if plan["cut"] > 0 else 0.0)
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
        return {"local": local, "round_trip": 0.0, "server": 0.0, "upload_bytes": 0.0}
    link.wire.quiet()
    start = time.perf_counter()
    r = client.post(url + plan["infer_url"], content=packet, headers=headers)
    round_trip = time.perf_counter() - start
    r.raise_for_status()
    body = r.json()
    return {"local": local, "round_trip": round_trip, "server": body["queue_s"] + body["compute_s"],
            "upload_bytes": float(len(packet)),  # the body as sent (compressed where the plan says)
            **server_parts(body, r.headers.get("server-timing"))}


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
            "measured_upload_bytes": statistics.median(r.get("upload_bytes", 0.0) for r in runs),
            "measured_server_s": statistics.median(r["server"] for r in runs),
            **{f"measured_{part}_s": statistics.median(r.get(part, 0.0) for r in runs)
               for part in SERVER_PARTS}}
