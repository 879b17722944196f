"""The grid: the server, the shaped link, and every cell at every rate, model, device and preset."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import random
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from bench import cpu_ticks, steal_fraction
from bench.e2e.artifacts import is_float, write_artifacts
from bench.e2e.baselines import Baseline, load_baselines
from bench.e2e.config import (
    DEMAND,
    DEVICES,
    FILLER_PORT,
    PORT,
    PRESET_NAMES,
    QUICK_DEVICES,
    QUICK_PRESETS,
    QUICK_RATES_MBPS,
    RATES_MBPS,
    RUNTIMES,
)
from bench.e2e.device import Link, ModelView, OrtHead, device_profile, host_flops_per_s, reprofile
from bench.e2e.gating import gated_summary, sitting_cells
from bench.e2e.probes import fit_link, measure_link, probe_exchange, probe_rtt
from bench.e2e.repetitions import merge
from bench.e2e.sitting import run_sitting
from bench.harness.device_clock import ReferenceClock
from bench.harness.exchange import PROBE_WINDOW, TRAFFIC_WINDOW, ExchangeProbe, overhead
from bench.harness.link import ShapedLink
from bench.harness.loadgen import GENERATOR_CORE, Server, start_server
from bench.harness.shaped_server import CONTROL_PORT_ENV
from bench.harness.spin import IdleSpinners
from qpart.kernels.onnx_segment import HeadRuntime
from qpart.models.data import Split, load_split, load_split_pixels
from qpart.models.registry import get_model
from qpart.models.sources import FashionMnistSource
from qpart.profiles.artifacts import load_artifact


def _view(client: httpx.Client, url: str, name: str, artifacts: Path, image: np.ndarray,
          clock: ReferenceClock, runtime: HeadRuntime = HeadRuntime.TORCH) -> ModelView:
    """The device's view of one model for one head runtime; an ONNX device loads each cut's
    lossless ONNX segment once (unshaped, before the grid), to time its heads in every profile."""
    info = client.get(f"{url}/v1/models/{name}", params={"runtime": runtime.value}).json()
    torch.set_num_threads(1)
    view = ModelView(name, info["version"], info["cuts"], info["server_tail_s"], info["patterns"],
                     load_artifact(artifacts / name), [], [], info["answer_bytes"], runtime=runtime,
                     decode_s=info["server_decode_s"])
    if runtime is HeadRuntime.ONNX:
        lossless = {p["cut"]: p for p in info["patterns"] if is_float(p)}
        view.onnx_heads = [OrtHead(client.get(url + lossless[k]["segment"]["url"]).content)
                           for k in range(1, view.cuts)]
    reprofile(view, image, clock)
    return view


def device_runtime(device: str) -> HeadRuntime:
    """What runs ``device``'s heads in the grid (:data:`bench.e2e.config.RUNTIMES`)."""
    return HeadRuntime(RUNTIMES.get(device, "torch"))


def _measure_sitting(*, client: httpx.Client, url: str, model: ModelView, device: str,
                     presets: tuple[str, ...], link: Link, images: np.ndarray, pixels: np.ndarray,
                     baselines: list[Baseline], reps: tuple[int, int, float], clock: ReferenceClock,
                     probes: deque[ExchangeProbe], probe_rng: random.Random, repetition: int,
                     implied: deque[float]) -> dict[str, Any]:
    """One sitting (:mod:`bench.e2e.sitting`): its cells' records under ``"cells"``, with the CPU
    steal it ran under, the overhead its traffic implied and the segments it downloaded."""
    # Before every sitting, one clock for prediction and measurement: host head times (an all-device
    # run took 2.25 ms where its profile, taken three cells earlier, said 1.62) and the exchange's
    # overhead and upload rate (one cut-0 exchange took 2.1 to 3.1 ms across one rate's cells).
    ticks = cpu_ticks()
    started = time.perf_counter()
    reprofile(model, images[:1], clock)
    profile, ratios = device_profile(device, [model])
    profiled = time.perf_counter()
    probes.append(probe_exchange(client, url, model, images[:1], link, probe_rng))
    fitted, link.upload_rate_bps = fit_link(model, link, probes)
    link.rtt_s = overhead(fitted, implied)
    probed = time.perf_counter()
    records, implied_s, got = run_sitting(client, url, model, profile, ratios[model.name], presets, link,
                                          images, pixels, baselines, reps, clock, repetition)
    steal = steal_fraction(ticks, cpu_ticks())
    wall = {"profile": profiled - started, "probe": probed - profiled}
    common = {"device": device, "runtime": model.runtime.value, "rate_mbps": link.rate_mbps,
              "model": model.name, "goodput_mbps": link.goodput_bps / 1e6, "rtt_s": link.rtt_s,
              "probe_rtt_s": fitted,
              "upload_rate_mbps": None if link.upload_rate_bps is None else link.upload_rate_bps / 1e6,
              "probe": dataclasses.asdict(probes[-1]), "speed_ratio": ratios[model.name],
              "cpu_steal": steal}
    total = time.perf_counter() - started
    cells = [{**common, **r, "wall_s": {**wall, **r["wall_s"], "total": total}} for r in records]
    return {"cells": cells, "cpu_steal": steal, "implied_rtt_s": implied_s, "downloaded": sorted(got)}


def model_images(model: str, n: int) -> np.ndarray:
    """The first ``n`` test images as ``model``'s card preprocesses them (what the device feeds its
    head; for the 28x28 models the IDX pixels over 255, for fmnist-mobilenet 3x64x64 RGB)."""
    source = FashionMnistSource(Split.TEST, limit=n, spec=get_model(model).preprocess)
    return next(source.batches(n)).images


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The grid; returns the JSON document."""
    rates = args.rate or (QUICK_RATES_MBPS if args.quick else RATES_MBPS)
    images = {m: model_images(m, args.max_reps) for m in args.model}
    pixels = load_split_pixels(Split.TEST, limit=args.max_reps)[0]  # what the device holds: the IDX bytes
    baselines = {m: load_baselines(m, autoencoders=args.autoencoders,
                                   artifact=load_artifact(args.artifacts / m)) for m in args.model}
    cells: list[dict[str, Any]] = []
    # the cores never halt while the grid runs (bench.harness.spin: a halted vCPU's wake-up on this host
    # took the median loopback exchange from 1.45-1.74 to 3.29-3.53 ms, results/spin.json)
    with IdleSpinners(enabled=args.spin), tempfile.TemporaryDirectory(prefix="qpart-e2e-") as tmp:
        write_artifacts(args.artifacts, list(args.model), Path(tmp))
        env = {"QPART_PORT": str(PORT), "QPART_TORCH_THREADS": "1", CONTROL_PORT_ENV: str(FILLER_PORT),
               "QPART_SEGMENT_CACHE_BYTES": str(256 << 20)}
        server: Server = start_server([sys.executable, "-m", "bench.harness.shaped_server",
                                       "--artifacts", tmp, "--autoencoders", str(args.autoencoders)],
                                      f"http://127.0.0.1:{PORT}", "/v2/health/ready", env)
        os.sched_setaffinity(0, {int(GENERATOR_CORE)})
        wire = ShapedLink(server_control_port=FILLER_PORT)
        try:
            with wire.client(timeout=300) as client:
                url = server.url
                first = images[args.model[0]]
                # the reference workload (bench.harness.device_clock) takes a 1x28x28 image, whatever the
                # models
                clock = ReferenceClock(torch.from_numpy(load_split(Split.TEST, limit=1).images))
                devices = QUICK_DEVICES if args.quick else DEVICES
                runtimes = sorted({device_runtime(d) for d in devices})
                views = [{r: _view(client, url, m, Path(tmp), images[m][:1], clock, r) for r in runtimes}
                         for m in args.model]
                probe_rng = random.Random(0)  # the order within each probe's pairs
                for rate in rates:
                    first_view = next(iter(views[0].values()))
                    rtt = probe_rtt(client, url, first_view, first[:1], wire, rate)  # for the goodput only
                    link = measure_link(client, url, first_view, wire, rtt)
                    print(f"rate {rate:g} Mbit/s: goodput {link.goodput_bps / 1e6:.2f} Mbit/s",
                          file=sys.stderr)
                    for by_runtime in views:
                        model = next(iter(by_runtime.values()))
                        measure = functools.partial(
                            _measure_sitting, client=client, url=url, link=link, images=images[model.name],
                            pixels=pixels, baselines=baselines[model.name],
                            reps=(args.reps, args.max_reps, args.cell_seconds), clock=clock,
                            probe_rng=probe_rng)
                        cells += _model_cells(args, measure, client, url, by_runtime, link,
                                              images[model.name], probe_rng)
        finally:
            wire.set_rate(None)
            wire.close()
            server.stop()
    return {"cells": cells, "summary": gated_summary(cells, args.steal_gate), "demand": DEMAND,
            "reps": {"least": args.reps, "most": args.max_reps, "cell_seconds": args.cell_seconds},
            "repetitions": args.repetitions, "quick": args.quick, "idle_spinners": args.spin,
            "runtimes": {d: device_runtime(d).value for d in devices},
            "host_flops_per_s": {v.name: host_flops_per_s(v) for by in views for v in by.values()
                                 if v.runtime is HeadRuntime.TORCH}}


def _model_cells(args: argparse.Namespace, measure: Callable[..., dict[str, Any]], client: httpx.Client,
                 url: str, views: dict[HeadRuntime, ModelView], link: Link, images: np.ndarray,
                 probe_rng: random.Random) -> list[dict[str, Any]]:
    """One rate and model: a sitting per device (every preset, cold and warm), ``args.repetitions``
    times interleaved (repetition r of every device before repetition r + 1 of any); merged per cell."""
    devices = QUICK_DEVICES if args.quick else DEVICES
    presets = QUICK_PRESETS if args.quick else PRESET_NAMES
    # A full window from the start: the first cells smooth as the later do.
    model = next(iter(views.values()))  # the probe's cut-0 exchange is the same for every runtime
    probes = deque((probe_exchange(client, url, model, images[:1], link, probe_rng)
                    for _ in range(PROBE_WINDOW)), maxlen=PROBE_WINDOW)
    implied: deque[float] = deque(maxlen=TRAFFIC_WINDOW)  # from the sittings' traffic
    reps: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in range(args.repetitions):
        for d in devices:
            one = functools.partial(measure, model=views[device_runtime(d)], device=d, presets=tuple(presets),
                                    probes=probes, implied=implied, repetition=r)
            for cell in sitting_cells(one, probes, implied, args.steal_gate, args.steal_retries):
                reps.setdefault((d, cell["preset"], cell["cache"]), []).append({**cell, "repetition": r})
    return [merge(v) for v in reps.values()]
