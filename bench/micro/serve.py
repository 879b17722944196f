"""Tail-inference throughput with dynamic batching on and off, and the planner's own latency.

``python -m bench.micro.serve [--json PATH] [--seconds S] [--rounds R] [--model M ...]``

Two servers run side by side on loopback, both pinned to core 0 with one torch thread: batching on
(``QPART_MAX_BATCH_SIZE=32``, queue delay ``--delay``, default 0 as the server's) and off (``=1``);
every other setting is the default. The load
generator (wrk, :mod:`bench.harness.loadgen`) runs on core 1: ``C`` clients, each on its own keep-alive
connection, POST a real activation packet of the all-server plan (cut 0: the whole model runs on
the server) back to back for ``S`` seconds. For every model, round and client count the two
servers are measured one right after the other, so that the machine's drift (it is shared and
noisy) hits both alike; the speed-up reported is the median over rounds of the per-round ratio.
Each run also reports, from the server's own metrics over the run, the mean batch size and the
batch compute time per sample inside the server, and from /proc the server's CPU per request in
its event loop's thread and in its tail workers. Once a round, a bare uvicorn app
(:mod:`bench.micro.floor_server`) takes the same load: the HTTP floor that no server on this stack goes
below. Once a round per model, at 32 clients, the product's engine alone behind a bare ASGI app
(``bench.micro.floor_server --artifacts``, batching on and off): what the speed-up would be if the web
layers (FastAPI, Starlette, middleware) cost nothing. :func:`cpu_at_32` sets these side by side.

The planner's own p99 is timed in process over varied requests (``Engine.plan``: no HTTP), and
once more over HTTP from one client.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench import REPO, write_json
from bench.harness.loadgen import Server, require_wrk, start_server, wrk
from qpart.server.schemas import WeightPreset

CLIENTS = (1, 8, 32)
MODELS = ("fmnist-cnn", "fmnist-resnet")
CONFIGS = {True: 32, False: 1}  # batching -> QPART_MAX_BATCH_SIZE


def _start(artifacts: Path, port: int, max_batch: int, delay_s: float) -> Server:
    env = {"QPART_PORT": str(port), "QPART_MAX_BATCH_SIZE": str(max_batch), "QPART_TORCH_THREADS": "1",
           "QPART_MAX_QUEUE": "4096", "QPART_MAX_QUEUE_DELAY_S": str(delay_s)}
    cmd = [sys.executable, "-m", "qpart", "serve", "--artifacts", str(artifacts)]
    return start_server(cmd, f"http://127.0.0.1:{port}", "/v2/health/ready", env)


def _start_floor(port: int, artifacts: Path | None = None, max_batch: int = 1,
                 delay_s: float = 0.0) -> Server:
    """bench.micro.floor_server: the bare HTTP floor, or with ``artifacts`` the engine alone (configured
    as :func:`_start` configures the product)."""
    cmd = [sys.executable, "-m", "bench.micro.floor_server", "--port", str(port)]
    env = {"QPART_MAX_BATCH_SIZE": str(max_batch), "QPART_TORCH_THREADS": "1", "QPART_MAX_QUEUE": "4096",
           "QPART_MAX_QUEUE_DELAY_S": str(delay_s)}
    return start_server([*cmd, "--artifacts", str(artifacts)] if artifacts else cmd,
                        f"http://127.0.0.1:{port}", "/", env)


def _bare_run(label: str, bare: Server, server: Server, target: tuple[str, bytes], clients: int,
              seconds: int) -> dict[str, Any]:
    """A bench.micro.floor_server under the load ``server`` takes at ``target`` (its URL and packet)."""
    url, packet = target
    if not url.startswith(server.url):
        raise ValueError(f"{url} is not on {server.url}")
    path = url.removeprefix(server.url)
    f = _cpu_split(bare, lambda: wrk(bare.url + path, packet, "application/octet-stream", clients, seconds))
    print(f"{label} clients={clients:>2} {f['throughput_rps']:7.1f} req/s  CPU/request "
          f"{f['cpu_s_per_request'] * 1e6:5.0f} us (loop {f['loop_cpu_s_per_request'] * 1e6:4.0f})  "
          f"server CPU {f['server_cpu_share']:.0%}  generator CPU {f['generator_cpu_share']:.0%}",
          file=sys.stderr)
    return f


def _packet(url: str, model: str) -> tuple[str, bytes]:
    """The infer URL and a real activation packet of ``model``'s all-server plan."""
    from qpart.client.plans import PlanResponse
    from qpart.client.runtime import encode_for_plan  # the device's own encoder
    from qpart.models.data import Split, load_split

    plan = httpx.post(f"{url}/v1/plan", json={"model": model, "accuracy_demand": 0.01,
                                              "rate_bps": 1e6, "device": "raspberry-pi-4"}).json()
    if plan["cut"] != 0:
        raise RuntimeError(f"expected the all-server cut for the benchmark, got {plan['cut']}")
    image = load_split(Split.TEST, limit=1).images
    return f"{url}{plan['infer_url']}", encode_for_plan(image, PlanResponse.model_validate(plan))


def _tail_sums(server: Server, model: str) -> tuple[float, float, float]:
    """From the server's /metrics: (batches run, samples in them, seconds of batch compute)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == model and sample.name in (
                    "qpart_tail_batch_size_count", "qpart_tail_batch_size_sum",
                    "qpart_tail_compute_duration_seconds_sum"):
                found[sample.name] = sample.value
    return (found.get("qpart_tail_batch_size_count", 0.0), found.get("qpart_tail_batch_size_sum", 0.0),
            found.get("qpart_tail_compute_duration_seconds_sum", 0.0))


def _measured(server: Server, url: str, body: bytes, content_type: str, clients: int,
              seconds: int, model: str) -> dict[str, Any]:
    """wrk's figures, the server's CPU share, and from its own metrics the mean batch size and
    the compute time per sample inside the server over the run."""
    before = _tail_sums(server, model)
    result = _cpu_split(server, lambda: wrk(url, body, content_type, clients, seconds))
    batches, samples, compute = (b - a for a, b in zip(before, _tail_sums(server, model), strict=True))
    result["mean_batch"] = samples / batches if batches else None
    result["server_compute_s_per_sample"] = compute / samples if samples else None
    return result


def _cpu_split(server: Server, load: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``load()``'s wrk figures plus the server's CPU share of a core and its CPU per answered
    request: in total, in the event loop's thread (the main one) and in all other threads (the
    tail workers)."""
    threads0, cpu0, t0 = server.thread_cpu_seconds(), server.cpu_seconds(), time.perf_counter()
    result = load()
    threads1, cpu1 = server.thread_cpu_seconds(), server.cpu_seconds()
    result["server_cpu_share"] = (cpu1 - cpu0) / (time.perf_counter() - t0)
    pid = server.proc.pid
    answered = max(1, result["requests"] - result["non_2xx"])
    loop = threads1.get(pid, 0.0) - threads0.get(pid, 0.0)
    result["cpu_s_per_request"] = (cpu1 - cpu0) / answered
    result["loop_cpu_s_per_request"] = loop / answered
    result["worker_cpu_s_per_request"] = (cpu1 - cpu0 - loop) / answered
    return result


def plan_requests(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` varied plan requests: every model, device preset, weight preset, demand and rate."""
    rng = np.random.default_rng(seed)
    grid = list(itertools.product(MODELS, ("raspberry-pi-4", "jetson-nano", "phone-soc"),
                                  tuple(p.value for p in WeightPreset),
                                  (0.0, 0.002, 0.005, 0.01, 0.02, 0.05)))
    out = []
    for i in range(n):
        model, device, weights, demand = grid[i % len(grid)]
        out.append({"model": model, "device": device, "weights": weights, "accuracy_demand": demand,
                    "rate_bps": float(10 ** rng.uniform(5, 9))})
    return out


def planner_p99(artifacts: Path, n: int = 2000) -> float:
    """p99 of ``Engine.plan`` in process (segments indexed first, as the server's warm-up does)."""
    from qpart.server.api.app import load_engine
    from qpart.server.schemas import PlanRequest
    from qpart.server.settings import ServerSettings

    engine = load_engine(ServerSettings(artifacts=artifacts))
    requests = [PlanRequest.model_validate(r) for r in plan_requests(n)]
    times = []
    for req in requests:
        start = time.perf_counter()
        engine.plan(req)
        times.append(time.perf_counter() - start)
    return float(np.percentile(times, 99))


def speedup_at_32(runs: list[dict[str, Any]], models: list[str]) -> dict[str, Any]:
    """Per model: the on/off throughput ratio at 32 clients in each round, and their median."""
    out = {}
    for model in models:
        on, off = ([r for r in runs if (r["model"], r["batching"], r["clients"]) == (model, b, 32)]
                   for b in (True, False))
        ratios = [a["throughput_rps"] / b["throughput_rps"] for a, b in zip(on, off, strict=True)]
        out[model] = {"median": statistics.median(ratios), "per_round": ratios}
    return out


def cpu_at_32(runs: list[dict[str, Any]], floors: list[dict[str, Any]], models: list[str]) -> dict[str, Any]:
    """Where a request's server CPU goes at 32 clients, medians over rounds, and what batching
    could still gain from it.

    Both servers saturate their core, so throughput is one over CPU per request. Work that both
    configurations do per request (HTTP, routing, decoding, the answer) lowers both: for the
    speed-up to reach 2x that way, it would have to shed ``2 x on - off`` seconds per request
    (``shared_saving_for_2x_s``), which only the event loop's work above the HTTP floor
    (``on_loop_above_floor_s``) can give. ``server_cpu_share`` (of one core) tells whether the
    core was indeed saturated.
    """
    keys = ("cpu_s_per_request", "loop_cpu_s_per_request", "worker_cpu_s_per_request", "server_cpu_share")
    floor = statistics.median(f["cpu_s_per_request"] for f in floors) if floors else None
    out: dict[str, Any] = {"http_floor_cpu_s_per_request": floor}
    for model in models:
        row: dict[str, Any] = {}
        for batching, name in ((True, "on"), (False, "off")):
            rows = [r for r in runs if (r["model"], r["batching"], r["clients"]) == (model, batching, 32)]
            row[name] = {k: statistics.median(r[k] for r in rows) for k in keys}
        on, off = row["on"]["cpu_s_per_request"], row["off"]["cpu_s_per_request"]
        row["cpu_ratio"] = off / on
        row["shared_saving_for_2x_s"] = 2 * on - off
        row["on_loop_above_floor_s"] = None if floor is None else row["on"]["loop_cpu_s_per_request"] - floor
        out[model] = row
    return out


def run(artifacts: Path, seconds: int, rounds: int, models: list[str],
        delay_s: float = 0.0) -> dict[str, Any]:
    """Both server configurations, every model, round and client count; the JSON document."""
    require_wrk()
    servers = {batching: _start(artifacts, 18100 + max_batch, max_batch, delay_s if batching else 0.0)
               for batching, max_batch in CONFIGS.items()}
    floor = _start_floor(18099)
    engine_only = {batching: _start_floor(18097 - max_batch, artifacts, max_batch,
                                          delay_s if batching else 0.0)
                   for batching, max_batch in CONFIGS.items()}
    runs: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    bare: list[dict[str, Any]] = []
    try:
        targets = {(b, m): _packet(s.url, m) for b, s in servers.items() for m in models}
        for url, packet in targets.values():  # warm-up: first batches, allocator
            wrk(url, packet, "application/octet-stream", 4, 1)
        for rnd, model, clients in itertools.product(range(rounds), models, CLIENTS):
            target = targets[(True, model)]
            if model == models[0] and clients == CLIENTS[-1]:  # once a round: the same packet, same load
                f = _bare_run("HTTP floor (bare uvicorn app)", floor, servers[True], target, clients, seconds)
                floors.append({"round": rnd, **f})
            if clients == CLIENTS[-1]:
                for batching in (True, False):
                    f = _bare_run(f"round {rnd} {model:<14} engine only, batching={batching!s:<5}",
                                  engine_only[batching], servers[True], target, clients, seconds)
                    bare.append({"model": model, "round": rnd, "batching": batching, **f})
            for batching in (True, False):
                url, packet = targets[(batching, model)]
                r = _measured(servers[batching], url, packet, "application/octet-stream", clients, seconds,
                              model)
                runs.append({"model": model, "round": rnd, "batching": batching, **r})
                print(f"round {rnd} {model:<14} batching={batching!s:<5} clients={clients:>2} "
                      f"{r['throughput_rps']:7.1f} req/s  p50 {r['p50_s'] * 1e3:6.1f} ms  "
                      f"p99 {r['p99_s'] * 1e3:6.1f} ms  server CPU {r['server_cpu_share']:.0%}  "
                      f"batch {r['mean_batch'] or 0:4.1f}  compute/sample "
                      f"{(r['server_compute_s_per_sample'] or 0) * 1e6:5.0f} us  "
                      f"CPU/request {r['cpu_s_per_request'] * 1e6:5.0f} us (loop "
                      f"{r['loop_cpu_s_per_request'] * 1e6:4.0f})  "
                      f"generator CPU {r['generator_cpu_share']:.0%}", file=sys.stderr)
        http_plan = wrk(f"{servers[True].url}/v1/plan",
                        json.dumps(plan_requests(1)[0]).encode(), "application/json", 1, seconds)
    finally:
        for server in (*servers.values(), floor, *engine_only.values()):
            server.stop()

    def pick(model: str, batching: bool, clients: int) -> list[dict[str, Any]]:
        return [r for r in runs if (r["model"], r["batching"], r["clients"]) == (model, batching, clients)]

    summary = []
    for model, clients, batching in itertools.product(models, CLIENTS, (True, False)):
        rows = pick(model, batching, clients)
        summary.append({"model": model, "clients": clients, "batching": batching,
                        "throughput_rps": statistics.median(r["throughput_rps"] for r in rows),
                        "p50_s": statistics.median(r["p50_s"] for r in rows),
                        "p99_s": statistics.median(r["p99_s"] for r in rows)})
    return {"runs": runs, "summary": summary, "batching_speedup_at_32": speedup_at_32(runs, models),
            "cpu_per_request_at_32": cpu_at_32(runs, floors, models), "http_floor_runs": floors,
            "engine_only_speedup_at_32": speedup_at_32(bare, models),
            "engine_only_cpu_per_request_at_32": cpu_at_32(bare, floors, models), "engine_only_runs": bare,
            "plan_p99_s": planner_p99(artifacts), "plan_http_p99_s": http_plan["p99_s"],
            "seconds_per_run": seconds, "rounds": rounds, "cut": 0,
            "configs": {"on": {"max_batch_size": 32, "max_queue_delay_s": delay_s},
                        "off": {"max_batch_size": 1}},
            "note": "both servers pinned to core 0 (1 torch thread), wrk to core 1; speed-up = median "
                    "over rounds of on/off throughput measured back to back"}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--seconds", type=int, default=5, help="duration of each load run")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of the whole grid")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="QPART_MAX_QUEUE_DELAY_S of the batching server (default 0, the server's)")
    parser.add_argument("--model", action="append", choices=MODELS, help="model(s) to load (default: both)")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    args = parser.parse_args(argv)
    doc = run(args.artifacts, args.seconds, args.rounds, args.model or list(MODELS), args.delay)
    print("model           clients  batching  req/s    p50 ms   p99 ms")
    for row in doc["summary"]:
        print(f"{row['model']:<15} {row['clients']:>7}  {row['batching']!s:<8} {row['throughput_rps']:7.1f}"
              f"  {row['p50_s'] * 1e3:7.2f}  {row['p99_s'] * 1e3:7.2f}")
    for model, s in doc["batching_speedup_at_32"].items():
        print(f"{model}: batching speed-up at 32 clients {s['median']:.2f}x "
              f"(rounds: {', '.join(f'{r:.2f}' for r in s['per_round'])})")
    cpu = doc["cpu_per_request_at_32"]
    us = 1e6
    for model in doc["batching_speedup_at_32"]:
        c = cpu[model]
        on, off = c["on"], c["off"]
        print(f"{model}: server CPU per request at 32 clients: on {on['cpu_s_per_request'] * us:.0f} us "
              f"(event loop {on['loop_cpu_s_per_request'] * us:.0f}, workers "
              f"{on['worker_cpu_s_per_request'] * us:.0f}), off {off['cpu_s_per_request'] * us:.0f} us "
              f"(event loop {off['loop_cpu_s_per_request'] * us:.0f}, workers "
              f"{off['worker_cpu_s_per_request'] * us:.0f}); 2x needs "
              f"{c['shared_saving_for_2x_s'] * us:.0f} us less shared work, the batched event loop "
              f"has {(c['on_loop_above_floor_s'] or 0) * us:.0f} us above the HTTP floor "
              f"({(cpu['http_floor_cpu_s_per_request'] or 0) * us:.0f} us)")
    for model, sp in doc["engine_only_speedup_at_32"].items():
        print(f"{model}: engine alone behind a bare ASGI app (no FastAPI, Starlette or middleware): "
              f"batching speed-up at 32 clients {sp['median']:.2f}x "
              f"(rounds: {', '.join(f'{r:.2f}' for r in sp['per_round'])})")
    print(f"planner p99: {doc['plan_p99_s'] * 1e3:.2f} ms in process, "
          f"{doc['plan_http_p99_s'] * 1e3:.2f} ms over HTTP")
    if args.json:
        write_json(args.json, doc, indent=2)


if __name__ == "__main__":
    main()
