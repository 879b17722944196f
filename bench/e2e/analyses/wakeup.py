"""What a halted vCPU's wake-up adds to a loopback exchange, with and without idle spinners.

``python -m bench.e2e.analyses.wakeup --json PATH`` measures what :class:`bench.harness.spin.IdleSpinners`
does for the grid: loopback GETs of ``/v2/health/live`` and cut-0 tail requests against
``qpart serve`` (pinned as the grid pins them), in blocks with and without the spinners,
interleaved; it writes each block's percentiles of the round trip and of the part of it outside
the server's own queue and compute time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench import REPO, write_json
from bench.e2e.artifacts import write_artifacts
from bench.harness.loadgen import GENERATOR_CORE, start_server
from bench.harness.spin import IdleSpinners

PERCENTILES = (10, 25, 50, 75, 90)


def _percentiles(values: list[float]) -> list[float]:
    return [float(v) for v in np.percentile(values, PERCENTILES)]


def measure(client: httpx.Client, url: str, infer: tuple[str, bytes, dict[str, str]],
            n: int) -> dict[str, Any]:
    """``n`` health GETs and ``n`` tail requests, alternating: percentiles in seconds."""
    live, trip, rest = [], [], []
    path, body, headers = infer
    for _ in range(n):
        t = time.perf_counter()
        client.get(url + "/v2/health/live")
        live.append(time.perf_counter() - t)
        t = time.perf_counter()
        answer = client.post(url + path, content=body, headers=headers).json()
        trip.append(time.perf_counter() - t)
        rest.append(trip[-1] - answer["queue_s"] - answer["compute_s"])
    return {"health_s": _percentiles(live), "tail_round_trip_s": _percentiles(trip),
            "tail_outside_server_s": _percentiles(rest)}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--blocks", type=int, default=3, help="blocks of each kind, interleaved (default 3)")
    parser.add_argument("--requests", type=int, default=200, help="requests of each route per block")
    args = parser.parse_args(argv)
    from qpart.client.plans import PacketFormat
    from qpart.client.runtime import encode_for_plan, upload_body
    from qpart.models.data import Split, load_split

    port = 18622
    with tempfile.TemporaryDirectory(prefix="qpart-spin-") as tmp:
        write_artifacts(REPO / "artifacts", ["fmnist-cnn"], Path(tmp))
        server = start_server([sys.executable, "-m", "qpart", "serve", "--artifacts", tmp],
                              f"http://127.0.0.1:{port}", "/v2/health/ready",
                              {"QPART_PORT": str(port), "QPART_TORCH_THREADS": "1"})
        os.sched_setaffinity(0, {int(GENERATOR_CORE)})
        blocks: list[dict[str, Any]] = []
        try:
            with httpx.Client(timeout=30) as client:
                info = client.get(f"{server.url}/v1/models/fmnist-cnn").json()
                p = next(p for p in info["patterns"] if p["cut"] == 0 and 0 < p["level"] <= 0.01)
                plan = {**p, "model": "fmnist-cnn", "version": info["version"], "cuts": info["cuts"]}
                fmt = PacketFormat.model_validate(plan)
                body, headers = upload_body(fmt, encode_for_plan(load_split(Split.TEST, limit=1).images, fmt))
                infer = (p["infer_url"], body, headers)
                measure(client, server.url, infer, 20)  # warm-up
                for b in range(2 * args.blocks):
                    spinning = b % 2 == 1
                    with IdleSpinners(enabled=spinning):
                        time.sleep(0.2)
                        got = measure(client, server.url, infer, args.requests)
                        blocks.append({"spinners": spinning, **got})
                    print(f"block {b}: spinners {spinning}: health p50 {got['health_s'][2] * 1e3:.2f} ms",
                          file=sys.stderr)
        finally:
            server.stop()
    write_json(args.json, {"percentiles": PERCENTILES, "blocks": blocks, "requests": args.requests})


if __name__ == "__main__":
    main()
