"""A well-formed client's latency while hostile clients hold connections, and what refusing a huge
header costs the server.

``python -m bench.micro.hostile --json PATH [--idle 2000] [--trickle 100] [--seconds 25] [--rounds 2]``

The server (``qpart serve`` on the committed fmnist-cnn artifact, shipped connection settings,
core 0) is measured in interleaved rounds: a quiet phase, then an attacked one, each time the same
client (one keep-alive connection, sequential 1-sample ``/v2`` infers, core 1). In the attacked
phase one attacker process (asyncio, core 1) keeps ``--idle`` connections open that never send a
byte, reopening each one the server closes, and a second one keeps ``--trickle`` connections that
send a request head a byte a second; each trickler records how long the server let it live. Then
the reproducers of the robustness suite run once each, followed by the four well-formed requests
(timed), and a 100 MiB header is sent while the server's RSS is sampled every 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench import REPO, write_json
from bench.harness.loadgen import GENERATOR_CORE, pinned, start_server
from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan
from qpart.server.settings import ServerSettings

PORT = 18731
URL = f"http://127.0.0.1:{PORT}"
V2 = "/v2/models/fmnist-cnn/infer"
ONE = {"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.5] * 784}]}


# ---- the attacker (its own process) ------------------------------------------------------------


async def _connect(opened: asyncio.Event | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    try:
        pair = await asyncio.open_connection("127.0.0.1", PORT)
    except OSError:
        await asyncio.sleep(0.05)
        return None
    if opened is not None:
        opened.set()
    return pair


async def _idle(deadline: list[float], reopened: list[int], opened: asyncio.Event) -> None:
    while time.monotonic() < deadline[0]:
        pair = await _connect(opened)
        if pair is None:
            continue
        reader, writer = pair
        try:
            async with asyncio.timeout(max(0.01, deadline[0] - time.monotonic())):
                await reader.read()  # until the server closes it
            reopened[0] += 1
        except (TimeoutError, OSError):
            pass
        writer.close()


async def _trickle(deadline: list[float], lifetimes: list[tuple[float, float]],
                   opened: asyncio.Event) -> None:
    while time.monotonic() < deadline[0]:
        started = time.monotonic()  # before the connect: the server's clock starts later
        pair = await _connect(opened)
        if pair is None:
            continue
        reader, writer = pair
        connected = time.monotonic()  # the server's clock starts at its accept, at or after this
        writer.write(b"GET /v2/health/ready HTTP/1.1\r\nX-Slow: ")
        try:
            while time.monotonic() < deadline[0]:
                await writer.drain()
                try:
                    async with asyncio.timeout(1.0):
                        if not await reader.read(4096) and reader.at_eof():
                            lifetimes.append((time.monotonic() - connected, time.monotonic() - started))
                            break
                except TimeoutError:
                    writer.write(b"a")  # one byte a second
        except OSError:
            lifetimes.append((time.monotonic() - connected, time.monotonic() - started))
        writer.close()


async def _attack(idle: int, trickle: int, seconds: float) -> dict[str, Any]:
    """Open every connection, say so on stdout, then hold them for ``seconds``."""
    reopened, lifetimes = [0], list[tuple[float, float]]()
    opened = [asyncio.Event() for _ in range(idle + trickle)]
    deadline = [time.monotonic() + 3600]  # moved once every connection is open
    tasks = [asyncio.create_task(_idle(deadline, reopened, e)) for e in opened[:idle]]
    tasks += [asyncio.create_task(_trickle(deadline, lifetimes, e)) for e in opened[idle:]]
    await asyncio.gather(*(e.wait() for e in opened))
    print("open", flush=True)
    deadline[0] = time.monotonic() + seconds
    await asyncio.gather(*tasks)
    return {"idle_reopened": reopened[0], "trickle_lifetimes_s": lifetimes}


def attack_main(idle: int, trickle: int, seconds: float) -> None:
    """Entry of the attacker subprocess: prints "open" once every connection is, then its JSON
    summary."""
    print(json.dumps(asyncio.run(_attack(idle, trickle, seconds))))


# ---- the measuring side ------------------------------------------------------------------------


def _client(seconds: float) -> list[float]:
    latencies = []
    with httpx.Client(base_url=URL, timeout=30) as c:
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            start = time.perf_counter()
            answer = c.post(V2, json=ONE)
            latencies.append(time.perf_counter() - start)
            if answer.status_code != 200:
                raise RuntimeError(f"well-formed request answered {answer.status_code}: {answer.text}")
    return latencies


def _summary(latencies: list[float]) -> dict[str, float]:
    q = np.quantile(latencies, [0.5, 0.99])
    return {"requests": len(latencies), "p50_s": float(q[0]), "p99_s": float(q[1]), "max_s": max(latencies)}


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _phase(attacked: bool, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    if not attacked:
        return {"attacked": False, **_summary(_client(args.seconds))}
    # Two attacker processes: the tricklers' own event loop is not the one that reopens
    # thousands of idle connections at once, so their clocks read the server, not themselves.
    attackers = [_start_attacker(args.idle, 0, args.seconds + 2),
                 _start_attacker(0, args.trickle, args.seconds + 2)]
    fds, done = [_open_fds(pid)], threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            fds.append(_open_fds(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    latencies = _client(args.seconds)
    done.set()
    sampler.join()
    reports = [json.loads(a.communicate(timeout=args.seconds + 60)[0].strip().splitlines()[-1])
               for a in attackers]
    lifetimes = reports[1]["trickle_lifetimes_s"]
    return {"attacked": True, **_summary(latencies), "server_fds_min_max": [min(fds), max(fds)],
            "idle_reopened": reports[0]["idle_reopened"],
            "trickles_closed": len(lifetimes),
            # From the connect's return (the server's timer starts at its accept, at or after it)
            # and from before the connect (which waits its turn among thousands of others).
            "trickle_lifetime_from_connected_s": _spread([c for c, _ in lifetimes]),
            "trickle_lifetime_from_connecting_s": _spread([s for _, s in lifetimes])}


def _start_attacker(idle: int, trickle: int, seconds: float) -> subprocess.Popen[str]:
    """An attacker process, once it has opened its connections."""
    cmd = pinned([sys.executable, "-m", "bench.micro.hostile", "--attacker", "--idle", str(idle),
                  "--trickle", str(trickle), "--seconds", str(seconds)], GENERATOR_CORE)
    attacker = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert attacker.stdout is not None
    if attacker.stdout.readline().strip() != "open":
        raise RuntimeError("the attacker did not open its connections")
    return attacker


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _huge_header(pid: int, mib: int = 100) -> dict[str, Any]:
    before, peak, done = _rss(pid), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss(pid))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    head = b"GET /v2/health/ready HTTP/1.1\r\nX-Big: " + b"a" * (mib << 20)
    answer = b""
    with socket.create_connection(("127.0.0.1", PORT), timeout=30) as sock:
        start = time.perf_counter()
        with contextlib.suppress(OSError):  # the server closes long before the last byte
            sock.sendall(head)
        with contextlib.suppress(OSError):
            answer = sock.recv(200)
    refused_s = time.perf_counter() - start
    time.sleep(0.2)
    done.set()
    sampler.join()
    return {"header_mib": mib, "answer": answer.split(b"\r\n", 1)[0].decode() or "closed",
            "refused_within_s": refused_s, "rss_before_mib": before / 2**20,
            "rss_peak_growth_mib": (max(peak[0], _rss(pid)) - before) / 2**20}


def _reproducers() -> dict[str, Any]:
    """Each finding's request, then the four well-formed requests timed."""
    with httpx.Client(base_url=URL, timeout=30) as c:
        info = c.get("/v1/models/fmnist-cnn").json()
        cut0 = next(p for p in info["patterns"] if p["cut"] == 0 and p["level"] == 0.01)
        packet = encode_for_plan(np.full((1, 1, 28, 28), 0.5, np.float32), PacketFormat.model_validate(cut0))
        segment = next(p["segment"] for p in info["patterns"] if p["segment"])
        hostile: dict[str, Callable[[], httpx.Response]] = {
            "empty batch": lambda: c.post(V2, json={"inputs": [{"name": "input", "shape": [0, 1, 28, 28],
                                                                "datatype": "FP32", "data": []}]}),
            "batch over the queue": lambda: c.post(V2, json={"inputs": [{
                "name": "input", "shape": [300, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 300 * 784}]}),
            "gzip plan": lambda: c.post("/v1/plan", content=b"{}", headers={"Content-Encoding": "gzip"}),
            "multi-range": lambda: c.get(segment["url"], headers={"Range": "bytes=0-1,5-9"}),
            "case-variant range": lambda: c.get(segment["url"], headers={"Range": "Bytes=0-9"}),
            "range past the end": lambda: c.get(segment["url"], headers={"Range": "bytes=99999999-"}),
            "infinite head time": lambda: c.post("/v1/plan", content=b'{"model": "fmnist-cnn", '
                b'"accuracy_demand": 0.01, "rate_bps": 1e6, "device": {"name": "x", "flops_per_s": 1e9, '
                b'"power_compute_w": 1, "power_tx_w": 1, "measured": {"fmnist-cnn": {"version": "v", '
                b'"head_s": [Infinity], "warmup": 0, "repeats": 1}}}}',
                headers={"Content-Type": "application/json"}),
        }
        well_formed: dict[str, Callable[[], httpx.Response]] = {
            "v2 infer": lambda: c.post(V2, json=ONE),
            "cut-0 tail infer": lambda: c.post(cut0["infer_url"], content=packet),
            "plan": lambda: c.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                                     "rate_bps": 1e6}),
            "segment": lambda: c.get(segment["url"]),
        }
        out: dict[str, Any] = {}
        for name, send in hostile.items():
            status = send().status_code
            times: dict[str, dict[str, float]] = {}
            for check, request in well_formed.items():
                start = time.perf_counter()
                code = request().status_code
                times[check] = {"status": code, "seconds": time.perf_counter() - start}
            out[name] = {"status": status, "then": times}
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/hostile.json")
    parser.add_argument("--idle", type=int, default=2000, help="connections that never send a byte")
    parser.add_argument("--trickle", type=int, default=100, help="connections trickling a head")
    parser.add_argument("--seconds", type=float, default=25.0, help="client time per phase")
    parser.add_argument("--rounds", type=int, default=2, help="quiet/attacked pairs, interleaved")
    parser.add_argument("--attacker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attacker:
        attack_main(args.idle, args.trickle, args.seconds)
        return
    artifacts = REPO / "artifacts"
    server = start_server([sys.executable, "-m", "qpart", "serve", "--artifacts", str(artifacts),
                           "--port", str(PORT)], URL, "/v2/health/ready")
    try:
        pid = server.proc.pid
        phases = [_phase(attacked, pid, args) for _ in range(args.rounds) for attacked in (False, True)]
        shipped = ServerSettings.model_fields
        doc = {"settings": {"idle": args.idle, "trickle": args.trickle, "seconds": args.seconds,
                            "header_timeout_s": shipped["header_timeout_s"].default,
                            "max_connections": shipped["max_connections"].default},
               "phases": phases,
               "p99_attacked_over_quiet": [b["p99_s"] / a["p99_s"] for a, b in zip(phases[::2], phases[1::2],
                                                                                   strict=True)],
               "reproducers": _reproducers(), "huge_header": _huge_header(pid)}
    finally:
        server.stop()
    write_json(args.json, doc)
    print(json.dumps({k: doc[k] for k in ("p99_attacked_over_quiet", "huge_header")}, indent=1))
    for phase in phases:
        print({k: v for k, v in phase.items() if k != "attacked"} | {"attacked": phase["attacked"]})


if __name__ == "__main__":
    main()
