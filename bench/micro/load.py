"""Soak test: many simulated devices with mixed demands against the real server, for a bounded time.

``python -m bench.micro.load --json PATH [--devices 64] [--seconds 180] [--cache-mib 4]``

The server (``qpart serve`` on the committed artifacts, pinned to core 0) gets a small segment
cache budget so that segments are evicted and rebuilt under load. Each simulated device (an
asyncio task on core 1 with its own HTTP connection pool) loops: pick a model, a device profile,
an accuracy demand, a channel rate and a weight preset at random; ask for a plan; download the
plan's head segment unless it holds it (each device keeps the last few; one iteration in ten it
also prefetches a random segment listed by GET /v1/models, which later plans may use); upload a
real activation packet for the plan's cut (computed once per pattern with the real head on a
test image) and read the answer; think for up to 20 ms. Everything stops at the deadline.

Reported: the generator's own CPU share (near 100%: it, not the server, sets the pace),
throughput and p50/p99 latency per route, errors (anything but 2xx, and transport
failures) apart from deliberate shedding (503/429 with Retry-After, counted apart), the server's
RSS every second, and the segment cache's resident bytes against its budget every second (from
``/metrics``). RSS growth is measured from the median of the five samples after the first
minute to the median of the last five; the peak after the first minute is reported too.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import statistics
import sys
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from bench import REPO, write_json
from bench.harness.loadgen import GENERATOR_CORE, Server, start_server
from qpart.client.plans import PlanResponse
from qpart.client.runtime import encode_for_plan, load_head
from qpart.models.data import Split, load_split
from qpart.server.schemas import WeightPreset

MODELS = ("fmnist-cnn", "fmnist-resnet")
DEVICES = ("raspberry-pi-4", "jetson-nano", "phone-soc", "qpart-paper")
DEMANDS = (0.0, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05)
PORT = 18700
HELD_PER_DEVICE = 3
PREFETCH = 0.1  # share of iterations in which a device also prefetches a segment


@dataclass
class Stats:
    """Latencies and outcomes per route."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    shed: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def record(self, route: str, start: float, response: httpx.Response | None, error: str = "") -> bool:
        """Count one request; True when it succeeded."""
        if response is not None and response.status_code in (503, 429) and "retry-after" in response.headers:
            self.shed[route] += 1
            return False
        if response is None or response.status_code >= 300:
            detail = error or (f"{response.status_code} {response.text[:200]}" if response else "no answer")
            self.errors[route].append(detail)
            return False
        self.latencies[route].append(time.perf_counter() - start)
        return True


class Packets:
    """One real activation packet per pattern, made once with the real head."""

    def __init__(self) -> None:
        self._image = load_split(Split.TEST, limit=1).images
        self._packets: dict[str, bytes] = {}

    def for_plan(self, plan: dict[str, Any], segment: bytes | None) -> bytes:
        key = plan["plan_id"]
        if key not in self._packets:
            typed = PlanResponse.model_validate(plan)
            head = load_head(typed, segment)
            with torch.inference_mode():
                act = head(torch.from_numpy(self._image)).numpy()
            self._packets[key] = encode_for_plan(act, typed)
        return self._packets[key]


async def _timed(stats: Stats, route: str, call: Any) -> httpx.Response | None:
    start = time.perf_counter()
    try:
        response: httpx.Response = await call
    except httpx.HTTPError as exc:
        stats.record(route, start, None, f"{type(exc).__name__}: {exc}")
        return None
    return response if stats.record(route, start, response) else None


async def _fetch(client: httpx.AsyncClient, stats: Stats, seg: dict[str, Any],
                 segments: dict[str, bytes]) -> bytes | None:
    got = await _timed(stats, "segment", client.get(seg["url"]))
    if got is None:
        return None
    if hashlib.sha256(got.content).hexdigest() != seg["sha256"]:
        stats.errors["segment"].append(f"segment {seg['id'][:12]} does not match its sha256")
        return None
    return segments.setdefault(seg["id"], got.content)


def _hold(held: OrderedDict[str, None], segment_id: str) -> None:
    held[segment_id] = None
    while len(held) > HELD_PER_DEVICE:
        held.popitem(last=False)


async def device(url: str, seed: int, deadline: float, stats: Stats, packets: Packets,
                 segments: dict[str, bytes]) -> None:
    """One simulated device until the deadline."""
    rng = random.Random(seed)
    held: OrderedDict[str, None] = OrderedDict()
    listings: dict[str, list[dict[str, Any]]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while time.perf_counter() < deadline:
            model = rng.choice(MODELS)
            if rng.random() < PREFETCH:  # a device filling its cache for later (GET /v1/models)
                if model not in listings:
                    r = await _timed(stats, "models", client.get(f"/v1/models/{model}"))
                    if r is None:
                        continue
                    listings[model] = [p["segment"] for p in r.json()["patterns"] if p["segment"]]
                seg = rng.choice(listings[model])
                if seg["id"] not in held and await _fetch(client, stats, seg, segments) is not None:
                    _hold(held, seg["id"])
            body = {"model": model, "device": rng.choice(DEVICES),
                    "accuracy_demand": rng.choice(DEMANDS), "rate_bps": 10 ** rng.uniform(5.5, 8.5),
                    "weights": rng.choice([p.value for p in WeightPreset]), "held_segments": list(held)}
            r = await _timed(stats, "plan", client.post("/v1/plan", json=body))
            if r is None:
                continue
            plan = r.json()
            seg = plan["segment"]
            if seg and seg["id"] not in held:
                if await _fetch(client, stats, seg, segments) is None:
                    continue
                _hold(held, seg["id"])
            if plan["infer_url"]:
                packet = packets.for_plan(plan, segments[seg["id"]] if seg else None)
                await _timed(stats, "infer", client.post(plan["infer_url"], content=packet))
            await asyncio.sleep(rng.uniform(0, 0.02))


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _cache_bytes(text: str) -> tuple[float, float]:
    values = {}
    for line in text.splitlines():
        if line.startswith(("qpart_segment_cache_resident_bytes ", "qpart_segment_cache_budget_bytes ")):
            name, value = line.split()
            values[name] = float(value)
    return values["qpart_segment_cache_resident_bytes"], values["qpart_segment_cache_budget_bytes"]


async def monitor(server: Server, deadline: float, samples: list[dict[str, float]]) -> None:
    """Every second: the server's RSS and the segment cache's resident bytes and budget."""
    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        while time.perf_counter() < deadline:
            resident, budget = _cache_bytes((await client.get("/metrics")).text)
            samples.append({"t_s": time.perf_counter() - start, "rss_bytes": _rss_bytes(server.proc.pid),
                            "cache_resident_bytes": resident, "cache_budget_bytes": budget})
            await asyncio.sleep(1.0)


async def drive(server: Server, devices: int, seconds: float) -> tuple[Stats, list[dict[str, float]], float]:
    """All devices and the monitor until the deadline; returns the stats, samples and wall time."""
    stats, packets = Stats(), Packets()
    samples: list[dict[str, float]] = []
    segments: dict[str, bytes] = {}
    start = time.perf_counter()
    deadline = start + seconds
    await asyncio.gather(monitor(server, deadline, samples),
                         *(device(server.url, i, deadline, stats, packets, segments) for i in range(devices)))
    return stats, samples, time.perf_counter() - start


def report(stats: Stats, samples: list[dict[str, float]], wall: float, devices: int) -> dict[str, Any]:
    """The JSON document."""
    routes = {}
    for route in ("plan", "models", "segment", "infer"):
        lat = stats.latencies.get(route, [])
        routes[route] = {"requests": len(lat), "throughput_rps": len(lat) / wall,
                         "p50_s": float(np.percentile(lat, 50)) if lat else None,
                         "p99_s": float(np.percentile(lat, 99)) if lat else None,
                         "errors": len(stats.errors.get(route, [])), "shed": stats.shed.get(route, 0),
                         "error_examples": stats.errors.get(route, [])[:5]}
    # Medians of five one-second samples at both ends: a single sample swings by +-4% here.
    after_minute = [s for s in samples if s["t_s"] >= 60.0] or samples
    base = statistics.median(s["rss_bytes"] for s in after_minute[:5])
    end = statistics.median(s["rss_bytes"] for s in samples[-5:])
    peak = max(s["rss_bytes"] for s in after_minute)
    return {"devices": devices, "seconds": wall, "routes": routes,
            "errors_total": sum(r["errors"] for r in routes.values()),
            "shed_total": sum(r["shed"] for r in routes.values()),
            "rss_first_minute_bytes": base, "rss_end_bytes": end, "rss_growth": end / base - 1.0,
            "rss_max_after_first_minute_bytes": peak, "rss_max_growth": peak / base - 1.0,
            "cache_budget_bytes": max(s["cache_budget_bytes"] for s in samples),
            "cache_resident_max_bytes": max(s["cache_resident_bytes"] for s in samples),
            "cache_over_budget_samples": sum(1 for s in samples
                                             if s["cache_resident_bytes"] > s["cache_budget_bytes"]),
            "samples": samples}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--devices", type=int, default=64, help="simulated devices (default 64)")
    parser.add_argument("--seconds", type=float, default=180.0, help="run time (default 180; >= 60 "
                        "for the RSS growth figure)")
    parser.add_argument("--cache-mib", type=float, default=4.0, help="server's segment cache budget")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    args = parser.parse_args(argv)
    env = {"QPART_PORT": str(PORT), "QPART_TORCH_THREADS": "1",
           "QPART_SEGMENT_CACHE_BYTES": str(int(args.cache_mib * 2**20))}
    server = start_server([sys.executable, "-m", "qpart", "serve", "--artifacts", str(args.artifacts)],
                          f"http://127.0.0.1:{PORT}", "/v2/health/ready", env)
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {int(GENERATOR_CORE)})
    torch.set_num_threads(1)
    cpu0 = time.process_time()
    try:
        stats, samples, wall = asyncio.run(drive(server, args.devices, args.seconds))
    finally:
        server.stop()
    doc = report(stats, samples, wall, args.devices)
    # One core's worth (1.0) means the devices, not the server, set the pace.
    doc["generator_cpu_share"] = (time.process_time() - cpu0) / wall
    write_json(args.json, doc)
    for route, r in doc["routes"].items():
        p50 = f"{r['p50_s'] * 1e3:.1f}" if r["p50_s"] is not None else "-"
        p99 = f"{r['p99_s'] * 1e3:.1f}" if r["p99_s"] is not None else "-"
        print(f"{route:<8} {r['requests']:>7} req  {r['throughput_rps']:7.1f} req/s  p50 {p50} ms  "
              f"p99 {p99} ms  errors {r['errors']}  shed {r['shed']}")
    mib = 2**20
    print(f"errors {doc['errors_total']} (shed apart: {doc['shed_total']}); RSS "
          f"{doc['rss_first_minute_bytes'] / mib:.1f} MiB after the first minute -> "
          f"{doc['rss_end_bytes'] / mib:.1f} MiB at the end ({doc['rss_growth']:+.1%}; peak "
          f"{doc['rss_max_after_first_minute_bytes'] / mib:.1f} MiB, {doc['rss_max_growth']:+.1%}); "
          f"segment cache "
          f"max {doc['cache_resident_max_bytes'] / mib:.2f} MiB of {doc['cache_budget_bytes'] / mib:.2f} "
          f"MiB budget ({doc['cache_over_budget_samples']} samples over); generator CPU "
          f"{doc['generator_cpu_share']:.0%} of a core")


if __name__ == "__main__":
    main()
