"""Tail-inference throughput with dynamic batching on and off, and the planner's own latency.

``python -m bench.serve [--json PATH] [--seconds S] [--artifacts DIR]``

One run starts the server twice on loopback (``QPART_MAX_BATCH_SIZE=32`` vs ``1``), pinned to
core 0, and drives it from this process pinned to core 1: ``C`` simulated devices, each with its
own connection pool, POST a real activation packet (cut 0, the whole model on the server) back to
back for ``S`` seconds. Reported: throughput, p50/p99 latency, the generator's CPU share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
CLIENTS = (1, 8, 32)


def _start(artifacts: Path, port: int, max_batch: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "QPART_PORT": str(port), "QPART_MAX_BATCH_SIZE": str(max_batch),
           "QPART_MAX_QUEUE": "4096", "QPART_MAX_QUEUE_DELAY_S": "0.002", "QPART_TORCH_THREADS": "1"}
    cmd = [sys.executable, "-m", "qpart", "serve", "--artifacts", str(artifacts)]
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() >= 2:  # type: ignore[operator]
        cmd = ["taskset", "-c", "0", *cmd]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not become ready")


def _packet(url: str) -> tuple[str, bytes]:
    from client.runtime import encode_for_plan  # the device's own encoder
    from models.data import Split, load_split

    plan = httpx.post(f"{url}/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                              "rate_bps": 1e6, "device": "raspberry-pi-4"}).json()
    if plan["cut"] != 0:
        raise RuntimeError(f"expected the all-server cut for the benchmark, got {plan['cut']}")
    image = load_split(Split.TEST, limit=1).images
    return f"{url}{plan['infer_url']}", encode_for_plan(image, plan)


async def _client(url: str, packet: bytes, stop: float, latencies: list[float], errors: list[int]) -> None:
    async with httpx.AsyncClient(timeout=30) as client:  # one connection pool per simulated device
        while time.perf_counter() < stop:
            start = time.perf_counter()
            response = await client.post(url, content=packet)
            if response.status_code == 200:
                latencies.append(time.perf_counter() - start)
            else:
                errors.append(response.status_code)


async def _load(url: str, packet: bytes, clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[int] = []
    cpu0 = time.process_time()
    start = time.perf_counter()
    stop = start + seconds
    await asyncio.gather(*(_client(url, packet, stop, latencies, errors) for _ in range(clients)))
    wall = time.perf_counter() - start
    return {"clients": clients, "requests": len(latencies), "errors": len(errors),
            "throughput_rps": len(latencies) / wall,
            "p50_s": float(np.percentile(latencies, 50)), "p99_s": float(np.percentile(latencies, 99)),
            "generator_cpu_share": (time.process_time() - cpu0) / wall}


def _plan_p99(url: str, n: int = 300) -> float:
    body = {"model": "fmnist-cnn", "accuracy_demand": 0.005, "rate_bps": 5e6, "device": "phone-soc"}
    times = []
    with httpx.Client() as client:
        for _ in range(n):
            start = time.perf_counter()
            client.post(f"{url}/v1/plan", json=body).raise_for_status()
            times.append(time.perf_counter() - start)
    return float(np.percentile(times, 99))


def run(artifacts: Path, seconds: float) -> dict[str, Any]:
    """Both server configurations, every client count; returns the JSON document."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    runs = []
    plan_p99 = None
    for batching, max_batch in ((True, 32), (False, 1)):
        port = 18000 + max_batch
        proc = _start(artifacts, port, max_batch)
        try:
            url, packet = _packet(f"http://127.0.0.1:{port}")
            asyncio.run(_load(url, packet, 4, 1.0))  # warm-up
            for clients in CLIENTS:
                result = asyncio.run(_load(url, packet, clients, seconds))
                runs.append({"batching": batching, **result})
                rps = result["throughput_rps"]
                print(f"batching={batching!s:<5} clients={clients:>2}  {rps:7.1f} req/s  "
                      f"p50 {result['p50_s'] * 1e3:6.1f} ms  p99 {result['p99_s'] * 1e3:6.1f} ms  "
                      f"generator CPU {result['generator_cpu_share']:.0%}", file=sys.stderr)
            if batching:
                plan_p99 = _plan_p99(f"http://127.0.0.1:{port}")
        finally:
            proc.terminate()
            proc.wait(30)
    on32 = next(r for r in runs if r["batching"] and r["clients"] == 32)
    off32 = next(r for r in runs if not r["batching"] and r["clients"] == 32)
    return {"runs": runs, "plan_p99_s": plan_p99, "seconds_per_run": seconds,
            "batching_speedup_at_32": on32["throughput_rps"] / off32["throughput_rps"],
            "model": "fmnist-cnn", "cut": 0,
            "note": "server pinned to core 0 (1 torch thread), generator to core 1"}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each load run")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    args = parser.parse_args(argv)
    doc = run(args.artifacts, args.seconds)
    print(json.dumps({k: v for k, v in doc.items() if k != "runs"}, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
