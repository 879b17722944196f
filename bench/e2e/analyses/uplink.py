"""How the shaped link prices upload size: cut-0 tail requests of every activation encoding.

``python -m bench.e2e.analyses.uplink --rate 100 [--rounds 200] [--model fmnist-cnn] [--json PATH]`` (root)

Inside the private network namespace of :mod:`bench.e2e`, with its shaper and
:meth:`bench.harness.link.ShapedLink.quiet` before every request, the same image is uploaded at cut 0
with every activation bit width the artifact has (3 to 8 bits, float32), round after round
in a fresh random order.
A real link at ``R`` bit/s adds ``8 * bytes / R`` per request; on this machine's ``tbf`` the
difference between the largest and the smallest upload shows how much of that the emulation
reproduces (the planner's cost model assumes all of it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench import REPO, write_json
from bench.e2e import write_artifacts
from bench.harness.link import ShapedLink
from bench.harness.loadgen import GENERATOR_CORE, enter_private_network, start_server
from bench.harness.shaped_server import CONTROL_PORT_ENV
from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan

PORT = 18600
FILLER_PORT = 18601  # bench.harness.shaped_server's orders (filler frames per response)
WARMUP_ROUNDS = 10
IMAGE = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)


def _packets(client: httpx.Client, url: str, model: str) -> dict[int, tuple[str, PacketFormat, bytes]]:
    info = client.get(f"{url}/v1/models/{model}").json()
    out: dict[int, tuple[str, PacketFormat, bytes]] = {}
    for p in info["patterns"]:
        if p["cut"] == 0 and p["activation_bits"] not in out:
            plan = PacketFormat.model_validate(p)
            out[p["activation_bits"]] = (p["infer_url"], plan, encode_for_plan(IMAGE, plan))
    return out


@dataclass
class Session:
    """The shaped link, a client on it, the server's URL and its cut-0 packets by bit width."""

    wire: ShapedLink
    client: httpx.Client
    url: str
    packets: dict[int, tuple[str, PacketFormat, bytes]]


@contextlib.contextmanager
def shaped_session(model: str, artifacts: Path) -> Iterator[Session]:
    """bench.harness.shaped_server with ``model`` on :data:`PORT`, this process on the generator's core,
    and an unshaped :class:`ShapedLink` whose rate the caller sets; all undone on exit."""
    with tempfile.TemporaryDirectory(prefix="qpart-uplink-") as tmp:
        write_artifacts(artifacts, [model], Path(tmp))
        server = start_server([sys.executable, "-m", "bench.harness.shaped_server", "--artifacts", tmp],
                              f"http://127.0.0.1:{PORT}", "/v2/health/ready",
                              {"QPART_PORT": str(PORT), "QPART_TORCH_THREADS": "1",
                               CONTROL_PORT_ENV: str(FILLER_PORT)})
        try:
            os.sched_setaffinity(0, {int(GENERATOR_CORE)})
            wire = ShapedLink(server_control_port=FILLER_PORT)
            try:
                with wire.client(timeout=60) as client:
                    yield Session(wire, client, server.url, _packets(client, server.url, model))
            finally:
                wire.set_rate(None)
                wire.close()
        finally:
            server.stop()


def run(rate_mbps: float, rounds: int, model: str, artifacts: Path) -> dict[str, Any]:
    """Round trips per encoding at ``rate_mbps``; the JSON document."""
    with shaped_session(model, artifacts) as session:
        packets = session.packets
        session.wire.set_rate(rate_mbps)
        times: dict[int, list[float]] = {b: [] for b in packets}
        rests: dict[int, list[float]] = {b: [] for b in packets}
        order = list(packets)
        rng = random.Random(0)
        for i in range(rounds + WARMUP_ROUNDS):
            rng.shuffle(order)
            for bits in order:
                url, plan, packet = packets[bits]
                for _ in range(3):  # as bench.e2e's device encodes before each upload
                    encode_for_plan(IMAGE, plan)
                session.wire.quiet()
                start = time.perf_counter()
                r = session.client.post(session.url + url, content=packet)
                elapsed = time.perf_counter() - start
                r.raise_for_status()
                if i >= WARMUP_ROUNDS:
                    times[bits].append(elapsed)
                    answer = r.json()
                    rests[bits].append(elapsed - answer["queue_s"] - answer["compute_s"])
    rows: list[dict[str, Any]] = [{"activation_bits": b, "upload_bytes": len(packets[b][2]),
             "round_trip_median_s": statistics.median(t),
             "round_trip_deciles_s": statistics.quantiles(t, n=10),
             "transfer_median_s": statistics.median(rests[b])} for b, t in sorted(times.items())]
    small, large = min(rows, key=lambda r: r["upload_bytes"]), max(rows, key=lambda r: r["upload_bytes"])
    return {"rate_mbps": rate_mbps, "rounds": rounds, "model": model, "encodings": rows,
            "largest_minus_smallest_s": large["round_trip_median_s"] - small["round_trip_median_s"],
            "transfer_largest_minus_smallest_s": large["transfer_median_s"] - small["transfer_median_s"],
            "wire_difference_s": 8 * (large["upload_bytes"] - small["upload_bytes"]) / (rate_mbps * 1e6)}


def link_arguments(doc: str | None, rounds: int) -> argparse.ArgumentParser:
    """The shaped-link benchmarks' options: rate, rounds, model, artifacts, JSON output."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, required=True, help="shaped rate in Mbit/s")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"measured rounds (default {rounds})")
    parser.add_argument("--model", default="fmnist-cnn")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser


def link_main(module: str, doc: str | None, rounds: int,
              run: Callable[[float, int, str, Path], dict[str, Any]],
              report: Callable[[dict[str, Any], float], None], argv: list[str] | None,
              tools: tuple[str, ...] = ("tc",)) -> None:
    """A shaped-link benchmark's command line: its options (:func:`link_arguments`), a re-run in a
    private network namespace (which needs ``tools``), ``run``, ``report`` and the JSON file."""
    argv = sys.argv[1:] if argv is None else argv
    args = link_arguments(doc, rounds).parse_args(argv)
    enter_private_network(module, argv, tools=tools, mtu=1500)
    result = run(args.rate, args.rounds, args.model, args.artifacts)
    report(result, args.rate)
    if args.json:
        write_json(args.json, result)


def _report(doc: dict[str, Any], rate_mbps: float) -> None:
    for r in doc["encodings"]:
        print(f"{r['activation_bits']:2d} bits, {r['upload_bytes']:5d} B: round trip "
              f"{r['round_trip_median_s'] * 1e3:.3f} ms (median)")
    print(f"largest - smallest upload: {doc['largest_minus_smallest_s'] * 1e3:+.3f} ms measured "
          f"(round trip less the server's queue + compute, as bench.e2e counts transfers: "
          f"{doc['transfer_largest_minus_smallest_s'] * 1e3:+.3f} ms), "
          f"{doc['wire_difference_s'] * 1e3:+.3f} ms on a real {rate_mbps:g} Mbit/s wire")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    link_main("bench.e2e.analyses.uplink", __doc__, 200, run, _report, argv)


if __name__ == "__main__":
    main()
