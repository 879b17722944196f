"""Idle spinners: keep this virtual machine's CPUs awake while a benchmark times wake-ups on them.

On this KVM guest an idle vCPU halts, and the hypervisor takes from a fraction of a millisecond to
a few milliseconds to run it again when work arrives for it: a loopback HTTP exchange between two
pinned processes then waits once or twice for a halted vCPU. A real device and a real server do
not halt between a request and its answer like that. :class:`IdleSpinners` runs one busy loop per
core at ``SCHED_IDLE`` (the scheduler runs it only when nothing else wants the core, and preempts
it at once when something does), so the cores never halt and a wake-up is a context switch.

``python -m bench.spin --json PATH`` measures what that does: loopback GETs of ``/v2/health/live``
and cut-0 tail requests against ``qpart serve`` (pinned as the grid pins them), in blocks with and
without the spinners, interleaved; it writes each block's percentiles of the round trip and of the
part of it outside the server's own queue and compute time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import numpy as np

from bench import REPO, write_json

PERCENTILES = (10, 25, 50, 75, 90)


# A spinner's whole program (``python -S -c``, stdlib only, so it is SCHED_IDLE within a few ms of
# starting, not after importing this package): it dies with its parent (PR_SET_PDEATHSIG, and a
# parent already gone when that was set), so a benchmark killed with SIGKILL leaves no busy loop.
# The death signal follows the thread that started the spinner: enter IdleSpinners from the main
# thread (a worker thread's exit would stop the spinners early).
SPINNER = """
import ctypes, os, signal, sys
core, parent = int(sys.argv[1]), int(sys.argv[2])
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
os.sched_setaffinity(0, {core})
try:
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(0)
while True:
    pass
"""


class IdleSpinners:
    """One ``SCHED_IDLE`` busy loop per core while the ``with`` block runs (none where the system
    has no SCHED_IDLE or ``enabled`` is false)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setaffinity")
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> IdleSpinners:
        if self.enabled:
            for core in sorted(os.sched_getaffinity(0)):
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-S", "-c", SPINNER, str(core), str(os.getpid())]))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.wait()
        self._procs.clear()


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
    from bench.e2e.artifacts import write_artifacts
    from bench.loadgen import GENERATOR_CORE, start_server
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
