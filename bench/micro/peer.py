"""The whole float model served by ``qpart serve`` and by four peers, side by side (issue 54).

``python -m bench.micro.peer --json PATH [--seconds S] [--rounds R] [--model fmnist-cnn] [--server NAME ...]``
(as root)

The peers (:mod:`bench.micro.peers`), each in its own virtualenv made on first use with torch
pinned first (the CPU build on local disk), none of them a dependency of this project:

- ``triton``: Triton Inference Server 2.51 (the ``tritonserver`` binary shipped in PyPI's
  ``nvidia-pytriton`` wheel) running its Python backend, with a generated model repository:
  ``max_batch_size`` 32, dynamic batching, one CPU instance; what Triton users deploy for a torch
  model without a C++ backend;
- ``pytriton``: the same Triton through PyTriton (one bound Python function, ``@batch``);
- ``kserve``: KServe's Python model server (``bench/micro/kserve_model.py``);
- ``litserve``: LitServe with a LitAPI that takes the same v2 JSON body (batches of up to 32);
  it speaks no binary tensors.

Every server runs the same graph (:class:`bench.micro.peers.graph.ServedGraph`: what ``qpart
serve`` runs for ``/v2/models/{m}/infer``) with one torch thread; before any timing, every server
must give the same top-1 on real test images, with every payload it speaks.

Everything runs in a private network namespace: the command re-executes itself under
``unshare -n``, brings ``lo`` up, and starts the servers (pinned to core 0, with everything they
start; qpart with its default settings) and the load generator (wrk, pinned to core 1; each client
is its own keep-alive connection) inside, all on 127.0.0.1. Each round measures, for each payload
and client count (1, 8, 32), every server back to back, ``S`` seconds each, with a batch-1 Open
Inference Protocol v2 infer request of one test image:

- ``json``: the tensor as a JSON list of 784 floats, JSON logits back;
- ``binary``: the binary tensor extension, a JSON header then the raw little-endian bytes
  (``Inference-Header-Content-Length``), with ``binary_data_output`` asking for binary logits.

Reported per run: throughput, p50/p99 latency, errors (non-2xx and socket errors), the server's
CPU share of one core and its CPU seconds per request (its whole process group), the share of the
server's core busy with anything else (a disturbed run shows here), wrk's own CPU share, and the
mean batch the server formed where it counts them (qpart's ``qpart_tail_batch_size``, Triton's
statistics). Then, per payload, client count and peer, qpart's throughput over the peer's: the
median of the rounds and the lowest round, and at 32 clients the CPU per request over the peer's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypeAlias

import httpx
import numpy as np
import numpy.typing as npt
import torch

from bench import write_json
from bench.harness.loadgen import (
    PRIVATE_NETWORK_FLAG,
    SERVER_CORE,
    core_busy_seconds,
    enter_private_network,
    require_wrk,
    wrk,
)
from bench.micro.peers.servers import (
    SERVERS,
    SPEAKS,
    Payload,
    ServerName,
    Started,
    batch_counts,
    server_versions,
    start,
)
from bench.micro.peers.venvs import KSERVE, LITSERVE, TRITON, Venv
from qpart.models import METRICS, hits_of

Body: TypeAlias = tuple[bytes, str, dict[str, str]]  # body, content type, extra headers

CLIENTS = (1, 8, 32)
PAYLOADS: tuple[Payload, ...] = ("json", "binary")
VENVS: dict[ServerName, Venv] = {"kserve": KSERVE, "triton": TRITON, "pytriton": TRITON, "litserve": LITSERVE}
PACKAGES: dict[ServerName, str] = {"kserve": "kserve", "triton": "nvidia-pytriton",
                                   "pytriton": "nvidia-pytriton", "litserve": "litserve"}
VERIFY_IMAGES = 16
BINARY = "application/octet-stream"
HEADER = "Inference-Header-Content-Length"


def infer_bodies(image: npt.NDArray[np.float32]) -> dict[Payload, Body]:
    """A batch-1 v2 infer request of ``image`` ``[1, C, H, W]``, as JSON and as binary tensors."""
    tensor = {"name": "input", "shape": list(image.shape), "datatype": "FP32"}
    as_json = json.dumps({"inputs": [{**tensor, "data": image.reshape(-1).tolist()}]}).encode()
    raw = np.ascontiguousarray(image, dtype="<f4").tobytes()
    head = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return {"json": (as_json, "application/json", {}),
            "binary": (head + raw, BINARY, {HEADER: str(len(head))})}


def decode_logits(response: httpx.Response) -> npt.NDArray[np.float32]:
    """The ``logits`` of a v2 infer response, JSON or binary."""
    response.raise_for_status()
    split = response.headers.get(HEADER)
    body = response.content
    doc = json.loads(body[: int(split)] if split is not None else body)
    out = next(o for o in doc["outputs"] if o["name"] == "logits")
    if split is None:
        return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    return np.frombuffer(body[int(split):], dtype="<f4").reshape(out["shape"])


def verify_same_model(urls: dict[ServerName, str], n: int = VERIFY_IMAGES) -> dict[str, Any]:
    """Every server, every payload it speaks, ``n`` test images: the same top-1 everywhere, or
    SystemExit."""
    from qpart.models.data import Split, load_split

    data = load_split(Split.TEST, limit=n)
    diff = 0.0
    correct = 0
    with httpx.Client(timeout=30) as client:
        for image, label in zip(data.images, data.labels, strict=True):
            logits: dict[tuple[ServerName, Payload], npt.NDArray[np.float32]] = {}
            for payload, (body, content_type, headers) in infer_bodies(image[None]).items():
                for server, url in urls.items():
                    if payload in SPEAKS[server]:
                        r = client.post(url, content=body,
                                        headers={"content-type": content_type, **headers})
                        logits[(server, payload)] = decode_logits(r)
            top1 = {f"{k[0]}/{k[1]}": int(v.argmax()) for k, v in logits.items()}
            if len(set(top1.values())) != 1:
                raise SystemExit(f"the servers disagree on a test image (label {label}): {top1}")
            ours = torch.from_numpy(logits[("qpart", "json")]).reshape(1, -1)
            correct += int(hits_of(METRICS["top1-drop"], ours, np.array([label]))[0])
            diff = max(diff, *(float(np.abs(v - logits[("qpart", k[1])]).max()) for k, v in logits.items()))
    return {"test_images": n, "servers": list(urls), "top1_agree": True, "top1_correct": correct,
            "max_abs_logit_diff": diff}


def _measured(name: ServerName, started: Started, url: str, body: Body, clients: int, seconds: int,
              model: str) -> dict[str, Any]:
    content, content_type, headers = body
    server = started.server
    before = batch_counts(name, started.stats_url, model)
    cpu0, core0, t0 = server.cpu_seconds(), core_busy_seconds(SERVER_CORE), time.perf_counter()
    result = wrk(url, content, content_type, clients, seconds, headers=headers)
    wall = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0
    after = batch_counts(name, started.stats_url, model)
    result["server_cpu_share"] = cpu / wall
    result["server_cpu_s_per_request"] = cpu / max(1, result["requests"])
    # Busy time of the server's core that is not the server: loopback kernel work, other processes,
    # steal. Large values mean the run was disturbed (the machine is shared).
    result["server_core_other_share"] = (core_busy_seconds(SERVER_CORE) - core0) / wall - cpu / wall
    result["mean_batch"] = ((after[0] - before[0]) / (after[1] - before[1])
                            if before is not None and after is not None and after[1] > before[1] else None)
    return result


def run(model: str, seconds: int, versions: dict[str, str], servers: tuple[ServerName, ...],
        rounds: int = 3) -> dict[str, Any]:
    """Start the servers, verify them, measure every payload and client count in ``rounds``
    interleaved rounds; the JSON document."""
    from qpart.models.data import Split, load_split

    require_wrk()
    bodies = infer_bodies(load_split(Split.TEST, limit=1).images)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="qpart-peer-") as tmp:
        started: dict[ServerName, Started] = {}
        try:
            for name in servers:
                started[name] = start(name, model, Path(tmp))
            urls = {name: f"{s.server.url}/v2/models/{model}/infer" for name, s in started.items()}
            versions = {**versions, **server_versions(started)}
            verification = verify_same_model(urls)
            for name in servers:  # warm-up: allocator, first batches, lazy imports
                for payload in SPEAKS[name]:
                    content, content_type, headers = bodies[payload]
                    wrk(urls[name], content, content_type, 4, 1, headers=headers)
            for rnd in range(rounds):
                for payload in PAYLOADS:
                    for clients in CLIENTS:
                        for name in servers:  # back to back, so the shared machine's drift hits all
                            if payload not in SPEAKS[name]:
                                continue
                            r = _measured(name, started[name], urls[name], bodies[payload], clients, seconds,
                                          model)
                            runs.append({"server": name, "payload": payload, "round": rnd, **r})
                            print(_row(runs[-1]), file=sys.stderr)
        finally:
            for s in started.values():
                s.server.stop()
    return {"versions": versions, "model": model, "runs": runs, "rounds": rounds,
            "ratios": ratios(runs, rounds), "verification": verification, "seconds_per_run": seconds,
            "batch": 1,
            "setup": "private network namespace (unshare -n), all on 127.0.0.1; every server pinned to core "
                     "0 with everything it starts, 1 torch thread, batches of at most 32 (qpart's default, "
                     "Triton's max_batch_size with dynamic batching, LitServe's max_batch_size with a 1 ms "
                     "batch timeout; KServe forms none); wrk pinned to core 1; qpart with its default "
                     "settings; KServe REST only, per-request log lines off; each round measures every "
                     "server back to back at each payload and client count"}


def ratios(runs: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    """Per payload, peer and client count: qpart's throughput over the peer's (median and lowest of
    the rounds), and at 32 clients qpart's CPU per request over the peer's (median)."""
    out: dict[str, Any] = {}
    for payload in PAYLOADS:
        for peer in sorted({r["server"] for r in runs if r["payload"] == payload} - {"qpart"}):
            entry: dict[str, Any] = {}
            for clients in CLIENTS:
                per_round = [_pick(runs, "qpart", payload, clients, r)["throughput_rps"]
                             / _pick(runs, peer, payload, clients, r)["throughput_rps"]
                             for r in range(rounds)]
                entry[str(clients)] = {"median": statistics.median(per_round), "lowest": min(per_round),
                                       "rounds": per_round}
            cpu = [_pick(runs, "qpart", payload, 32, r)["server_cpu_s_per_request"]
                   / _pick(runs, peer, payload, 32, r)["server_cpu_s_per_request"] for r in range(rounds)]
            entry["cpu_per_request_at_32"] = statistics.median(cpu)
            out[f"{payload}/{peer}"] = entry
    return out


def _pick(runs: list[dict[str, Any]], server: str, payload: Payload, clients: int,
          rnd: int) -> dict[str, Any]:
    return next(r for r in runs
                if (r["server"], r["payload"], r["clients"], r["round"]) == (server, payload, clients, rnd))


def _row(r: dict[str, Any]) -> str:
    batch = f"{r['mean_batch']:6.1f}" if r.get("mean_batch") is not None else "     -"
    return (f"{r['server']:<9} {r['payload']:<7} {r['clients']:>7} {r['throughput_rps']:8.1f} "
            f"{r['p50_s'] * 1e3:8.2f} {r['p99_s'] * 1e3:8.2f} {r['server_cpu_share']:8.0%} "
            f"{r['server_cpu_s_per_request'] * 1e3:11.2f} {r['server_core_other_share']:10.0%} "
            f"{r['generator_cpu_share']:8.0%} {batch} {r['errors']:>6}")


def print_table(doc: dict[str, Any]) -> None:
    """The runs as a table, then the ratios."""
    print(f"{doc['model']}, {doc['versions']}, {doc['seconds_per_run']} s per run; "
          f"verification: {doc['verification']}")
    print(f"{'server':<9} {'payload':<7} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'srv CPU':>8} {'srv ms/req':>11} {'core other':>10} {'wrk CPU':>8} {'batch':>6} {'errors':>6}")
    for r in doc["runs"]:
        print(_row(r))
    print("qpart's throughput over the peer's, median (lowest) of the rounds; CPU per request at 32")
    for key, entry in doc["ratios"].items():
        cells = "  ".join(f"{c}: {entry[c]['median']:.2f} ({entry[c]['lowest']:.2f})"
                          for c in map(str, CLIENTS))
        print(f"{key:<18} {cells}  cpu/req: {entry['cpu_per_request_at_32']:.2f}")
    errors = sum(r["errors"] for r in doc["runs"])
    if errors:
        print(f"WARNING: {errors} failed requests (see 'errors' per run)")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    args_in = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.micro.peer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--seconds", type=int, default=5, help="duration of each load run (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of the grid; a ratio "
                        "is the median of the per-round ratios (default 3)")
    parser.add_argument("--model", default="fmnist-cnn", choices=("fmnist-cnn", "fmnist-resnet"),
                        help="model to serve on every server (default fmnist-cnn)")
    parser.add_argument("--server", action="append", choices=[s for s in SERVERS if s != "qpart"],
                        help="peer(s) to measure beside qpart (default: all four)")
    args = parser.parse_args(args_in)
    servers: tuple[ServerName, ...] = ("qpart", *(args.server or [s for s in SERVERS if s != "qpart"]))
    if os.environ.get(PRIVATE_NETWORK_FLAG) != "1":
        for name in servers[1:]:  # needs the package index: before the namespace cuts the network
            VENVS[name].ensure()
    enter_private_network("bench.micro.peer", args_in)
    versions: dict[str, str] = {}
    for name in servers[1:]:
        version = VENVS[name].installed(PACKAGES[name])
        if version is None:
            raise SystemExit(f"{PACKAGES[name]} is not installed in {VENVS[name].path}: run bench.micro.peer "
                             "outside a namespace once to create it")
        versions[name] = version
    doc = run(args.model, args.seconds, versions, servers, args.rounds)
    print_table(doc)
    write_json(args.json, doc, indent=2)


if __name__ == "__main__":
    main()
