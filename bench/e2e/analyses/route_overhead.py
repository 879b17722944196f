"""What a request costs beyond the server's reported work, by route: the product's input-image plan
(``/v1/.../patterns/input-png/infer``) against :mod:`bench.harness.baseline_routes`' ``/bench/input``, the
same PNG body to each.

``python -m bench.e2e.analyses.route_overhead [--pairs 400] --json route-overhead-<commit>.json``

``bench.e2e`` prices a strategy's server time from the answer's ``queue_s + compute_s`` and counts
the rest of the round trip as transfer. Work a route does outside that figure (middleware, body
reading, parsing, the answer's encoding) is then transfer the link probe never priced for it. The
two routes run the same model on the same pool; this measures, on loopback without shaping, each
route's round trip less its reported server time, in pairs sent in a random order, and a
bootstrap interval of the difference of the medians. One ``bench.harness.shaped_server`` process (the
module the grid serves with), no filler, neither pinned nor spun as the grid pins and spins. The
interval is one server process's: runs in fresh processes here differ by more than it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench import REPO, free_port, start_server, write_json
from bench.harness.codecs import encode
from qpart.models.data import Split, load_split_pixels
from qpart.profiles.artifacts import load_artifact
from qpart.server.planning.images import CONTENT_TYPE, INPUT_PNG

MODEL = "fmnist-cnn"
ROUTES = ("product", "bench")


def _one(client: httpx.Client, url: str, path: str, body: bytes, headers: dict[str, str]) -> dict[str, float]:
    start = time.perf_counter()
    r = client.post(url + path, content=body, headers=headers)
    round_trip = time.perf_counter() - start
    r.raise_for_status()
    answer = r.json()
    server = answer["queue_s"] + answer["compute_s"]
    return {"round_trip_s": round_trip, "server_s": server, "outside_s": round_trip - server}


def bootstrap_difference(a: list[float], b: list[float], draws: int = 2000, seed: int = 0) -> list[float]:
    """95% interval of median(a) - median(b), resampling the pairs."""
    rng = np.random.default_rng(seed)
    x, y = np.asarray(a), np.asarray(b)
    idx = rng.integers(0, len(x), (draws, len(x)))
    diffs = np.median(x[idx], axis=1) - np.median(y[idx], axis=1)
    return [float(np.quantile(diffs, 0.025)), float(np.quantile(diffs, 0.975))]


def measure(url: str, pairs: int, version: str, seed: int = 0) -> dict[str, Any]:
    """``pairs`` requests to each route, the same image's PNG, in a random order within each pair."""
    body = encode(load_split_pixels(Split.TEST, limit=1)[0][0], "png")
    product = f"/v1/models/{MODEL}/versions/{version}/patterns/{INPUT_PNG}/infer"
    paths: dict[str, tuple[str, dict[str, str]]] = {"product": (product, {"Content-Type": CONTENT_TYPE}),
                                                    "bench": (f"/bench/input/{MODEL}", {})}
    rng = random.Random(seed)
    runs: dict[str, list[dict[str, float]]] = {r: [] for r in ROUTES}
    with httpx.Client(timeout=30) as client:
        for _ in range(20):  # warm both routes and the connection
            for route in ROUTES:
                _one(client, url, paths[route][0], body, paths[route][1])
        for _ in range(pairs):
            order = list(ROUTES)
            rng.shuffle(order)
            for route in order:
                runs[route].append(_one(client, url, paths[route][0], body, paths[route][1]))
    out: dict[str, Any] = {"model": MODEL, "body_bytes": len(body), "pairs": pairs, "seed": seed,
                           "routes": {}}
    for route in ROUTES:
        out["routes"][route] = {k: statistics.median(r[k] for r in runs[route])
                                for k in ("round_trip_s", "server_s", "outside_s")}
    outside = {r: [x["outside_s"] for x in runs[r]] for r in ROUTES}
    out["outside_difference_s"] = out["routes"]["product"]["outside_s"] - out["routes"]["bench"]["outside_s"]
    out["outside_difference_ci95_s"] = bootstrap_difference(outside["product"], outside["bench"])
    out["outside_s"] = outside  # every request's, in the order sent (the interval recomputes from them)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=400, help="requests to each route (default 400)")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts", help="artifacts to serve")
    parser.add_argument("--json", type=Path, required=True, help="where to write the result")
    args = parser.parse_args(argv)
    port = free_port()
    proc = start_server(port, args.artifacts, command=("bench.harness.shaped_server",),
                        env={"QPART_TORCH_THREADS": "1"})
    try:
        doc = measure(f"http://127.0.0.1:{port}", args.pairs, load_artifact(args.artifacts / MODEL).version)
    finally:
        proc.terminate()
        proc.wait(30)
    write_json(args.json, doc)
    r, (low, high) = doc["routes"], doc["outside_difference_ci95_s"]
    print(f"outside the reported server time: product {r['product']['outside_s'] * 1e3:.3f} ms, "
          f"bench {r['bench']['outside_s'] * 1e3:.3f} ms, difference "
          f"{doc['outside_difference_s'] * 1e3:+.3f} ms (95% {low * 1e3:+.3f} to {high * 1e3:+.3f})")


if __name__ == "__main__":
    main()
