"""A cell's strategies: each one's plan, its price by the cost model, its runs in interleaved rounds,
and its record beside the measurement (:mod:`bench.e2e.sitting` measures the cells of a sitting)."""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from bench.e2e.artifacts import is_float
from bench.e2e.baselines import ENCODER_PREFIX, Baseline, product_quality, profile
from bench.e2e.baselines import predict as predict_baseline
from bench.e2e.config import CLOCK, DEMAND
from bench.e2e.device import Link, ModelView, measured_j
from bench.harness.device_clock import ReferenceClock
from qpart.kernels.coding import Coding
from qpart.kernels.onnx_segment import HeadRuntime
from qpart.models.image_codecs import parse_rung_id
from qpart.profiles.costs import PlanInputs
from qpart.profiles.devices import DeviceProfile
from qpart.server.planning.images import INPUT_PNG
from qpart.server.planning.planner import image_pattern, price, price_image, price_options
from qpart.server.schemas import PRESETS, WeightPreset


@dataclass
class Choice:
    """A strategy's plan in a cell and what the cost model predicts for it."""

    plan: dict[str, Any]
    predicted: dict[str, Any]


def _inputs(device: DeviceProfile, preset: str, link: Link, held: set[str]) -> PlanInputs:
    return PlanInputs(device, PRESETS[WeightPreset(preset)], link.goodput_bps, link.rtt_s, 1, 1.0,
                      frozenset(held), upload_codings=frozenset(Coding), upload_rate_bps=link.upload_rate_bps)


def _predict(model: ModelView, p: dict[str, Any], inputs: PlanInputs) -> dict[str, Any]:
    if is_image_plan(p["pattern_id"]):  # an input-image plan: priced by the server's own figures
        image, predicted = p["input_image"], p["predicted"]
        if p["pattern_id"] == INPUT_PNG:
            pattern = image_pattern(model.artifact, INPUT_PNG, image["png_bytes"])
            encode_s = image["encode_s"]
        else:
            webp = image["webp"][0]
            pattern = image_pattern(model.artifact, p["pattern_id"], webp["bytes"], level=p["level"])
            encode_s = webp["encode_s"]
        return price_image(model.artifact, pattern, encode_s, inputs, predicted["time_s"]["server"],
                           model.answer_bytes).model_dump()
    seg = p["segment"]
    pattern = model.pattern(p["pattern_id"])
    costs = price(model.artifact, pattern, seg["id"] if seg else None, seg["size_bytes"] if seg else 0,
                  inputs, model.tail_s[pattern.cut], model.answer_bytes, model.decode_at(pattern.cut))
    return costs.model_dump()


def is_image_plan(pattern_id: str) -> bool:
    """Whether a plan uploads the device's input image (ADR 0014's PNG, ADR 0015's WebP)."""
    return pattern_id == INPUT_PNG or parse_rung_id(pattern_id) is not None


def choose_fixed(model: ModelView, strategy: str, inputs: PlanInputs) -> dict[str, Any]:
    """The fixed strategy's pattern (its best cut by predicted objective where it has a choice)."""
    last = model.cuts - 1
    lossless = [p for p in model.patterns if is_float(p)]  # every cut's, pruned ones too
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


def _transfer_as_sent(model: ModelView, p: dict[str, Any], inputs: PlanInputs) -> float:
    """The cost model's transfer seconds for a pattern plan in the coding it was sent in (its
    ``upload_encoding``), not the cheapest under ``inputs``' weights."""
    seg = p["segment"]
    pattern = model.pattern(p["pattern_id"])
    options = price_options(model.artifact, pattern, seg["id"] if seg else None,
                            seg["size_bytes"] if seg else 0, inputs, model.tail_s[pattern.cut],
                            model.answer_bytes, model.decode_at(pattern.cut))
    sent = p.get("upload_encoding", "identity")
    return next(o for o in options if o.upload_encoding == sent).time_s.transfer


def implied_rtt(model: ModelView, exchanged: dict[str, dict[str, Any]],
                runs: dict[str, list[dict[str, float]]], inputs: PlanInputs) -> float | None:
    """The exchange overhead a sitting's own traffic implies (None if no plan crossed the link):
    for each plan that did, the median of its exchanges' rests (round trip less the server's time)
    less what the cost model prices its transfer at besides the overhead, in the coding it was sent
    in, no download; the median over those plans."""
    if not exchanged:
        return None
    held = frozenset(p["segment"]["id"] for p in exchanged.values() if p.get("segment"))
    bare = dataclasses.replace(inputs, rtt_s=0.0, held=held)
    rests = {k: statistics.median(r["round_trip"] - r["server"] for r in runs[k]) for k in exchanged}
    return float(statistics.median(rests[k] - _transfer_as_sent(model, p, bare)
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

    Each round's image is drawn from all ``images`` without replacement (``rng``), and every
    pattern of the round runs on it. Taken in order, a repetition of few rounds ran on the same
    first test images every time: at 1 Mbit/s (5 rounds) fmnist-mobilenet's cut-0 upload measured
    the first five images' median deflated size, 883 B, where the cost model prices the
    calibration's mean, 1,037 B (grid at 79ce700), and the codec baselines, priced at the mean
    size of all ``images``, were measured on those five as well.
    """
    runs: dict[str, list[dict[str, float]]] = {pid: [] for pid in patterns}
    order = [*patterns, CLOCK]
    speeds: list[float] = []
    least, most, seconds = reps
    picks = rng.sample(range(images), images)
    started = time.perf_counter()
    while len(speeds) < most and (len(speeds) < least or time.perf_counter() - started < seconds):
        i = picks[len(speeds) % images]
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


def forced_cuts(model: ModelView, inputs: PlanInputs) -> dict[str, dict[str, Any]]:
    """``cut-k``: at every calibrated cut k, the planner's own cheapest pattern there among those it may
    offer for the demand (level at most :data:`DEMAND`), so that every cut's prediction is checked."""
    allowed = [p for p in model.patterns if p["level"] <= DEMAND]
    out = {}
    for k in range(model.cuts):
        options = [p for p in allowed if p["cut"] == k]
        if options:
            best = min(options, key=lambda p: (_predict(model, p, inputs)["objective"], p["level"]))
            out[f"cut-{k}"] = model.plan_of(best)
    return out


def _plan(client: httpx.Client, url: str, model: ModelView, device: DeviceProfile, preset: str,
          link: Link, held: set[str], image: dict[str, Any] | None) -> tuple[dict[str, Any], float]:
    body: dict[str, Any] = {"model": model.name, "version": model.version, "accuracy_demand": DEMAND,
            "rate_bps": link.goodput_bps, "rtt_s": link.rtt_s, "upload_rate_bps": link.upload_rate_bps,
            "upload_codings": sorted(Coding), "weights": preset,
            "device": device.model_dump(mode="json"),
            "held_segments": sorted(h for h in held if not h.startswith(ENCODER_PREFIX))}
    if image is not None:
        body["input_image"] = image
    if model.runtime is not HeadRuntime.TORCH:
        body["runtime"] = model.runtime.value
    start = time.perf_counter()
    plan = client.post(f"{url}/v1/plan", json=body)
    plan_s = time.perf_counter() - start
    plan.raise_for_status()
    qplan = plan.json()
    qplan["pattern_id"] = qplan["plan_id"].split("/", 1)[1]  # plan_id = model@version/pattern_id
    qplan["input_image"] = image
    return qplan, plan_s


def image_offer(baselines: list[Baseline], model: ModelView, pixels: np.ndarray, images: np.ndarray,
                ratio: float) -> dict[str, Any] | None:
    """What the device offers the planner of its input image (ADR 0014), from the ``input-png``
    baseline's figures (None without that baseline): the mean PNG size of the cell's images, and
    this host's encode time scaled to the device, as that baseline is priced and run; and, as the
    product's client does, the WebP at the lowest quality the calibration promises at the demand
    (ADR 0015), from that quality's baseline."""
    png = next((b for b in baselines if b.name == INPUT_PNG), None)
    if png is None:
        return None
    profile(png, model, pixels, images[:1])
    height, width = pixels.shape[-2:]
    offer: dict[str, Any] = {"png_bytes": round(png.upload_bytes), "width": int(width), "height": int(height),
                             "encode_s": png.host_local_s * ratio}
    webp = offered_webp(baselines, model)
    if webp is not None:
        profile(webp, model, pixels, images[:1])
        quality = int(webp.codec.partition("@")[2])
        offer["webp"] = [{"quality": quality, "bytes": round(webp.upload_bytes),
                          "encode_s": webp.host_local_s * ratio}]
    return offer


def offered_webp(baselines: list[Baseline], model: ModelView) -> Baseline | None:
    """The baseline of the WebP quality the device offers (:func:`product_quality`), if any."""
    quality = product_quality(model.artifact)
    return next((b for b in baselines if quality is not None and b.codec == f"webp@{quality}"), None)


def _results(model: ModelView, device: DeviceProfile, preset: str, inputs: PlanInputs, ratio: float,
             qplan: dict[str, Any], plans: dict[str, dict[str, Any]], baselines: list[Baseline],
             download_s: dict[str, float], runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Every strategy's prediction beside its measurement (``runs``: each strategy's and baseline's,
    by name: the runs of its pattern or baseline)."""
    def flops(cut: int) -> float:
        return model.artifact.cuts[cut].head_flops

    out = {}
    for s, p in plans.items():
        predicted = qplan["predicted"] if s == "qpart" else _predict(model, p, inputs)
        measured = measured_j(device, preset, flops(p["cut"]), download_s[s], runs[s])
        out[s] = _record(predicted, p["cut"], measured, pattern_id=p["pattern_id"],
                         meets_demand=meets_demand(s, p), test_drop=p.get("test_drop"),
                         download_s=download_s[s])
    for b in baselines:
        lossless = next(p for p in model.patterns if is_float(p) and p["cut"] == b.cut)
        predicted = predict_baseline(b, model, device, inputs, ratio,
                                     lossless["segment"] if b.kind == "ae" else None)
        measured = measured_j(device, preset, flops(b.cut), download_s[b.name], runs[b.name])
        out[b.name] = _record(predicted, b.cut, measured, pattern_id=b.name, meets_demand=b.meets_demand,
                              test_drop=b.test_drop, download_s=download_s[b.name],
                              upload_bytes=b.upload_bytes)
    return out


def _record(predicted: dict[str, Any], cut: int, measured: dict[str, float], **extra: Any) -> dict[str, Any]:
    """One strategy's entry in a cell: the cost model's prediction beside the measurement."""
    return {"predicted_J": predicted["objective"], "predicted_time_s": predicted["time_s"]["total"],
            "predicted_local_s": predicted["time_s"]["local"],
            "predicted_transfer_s": predicted["time_s"]["transfer"],
            "predicted_server_s": predicted["time_s"]["server"],
            **measured, "cut": cut, "transfer_bytes": predicted["transfer_bytes"], **extra}
