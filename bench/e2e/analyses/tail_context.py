"""What a lone cut-0 tail request takes on the server, by what the client did just before it.

``python -m bench.e2e.analyses.tail_context [--model fmnist-mobilenet] [--rounds 60] [--gap-ms 20]
--json PATH``

In issue 27's grids the server priced a cut's tail by its last lone requests, which before each
sitting are the link probe's, and the rounds then measured fmnist-mobilenet's cut-0 tail up to
0.8 ms slower than that price, more on the devices whose heads run in torch on the grid's host than
on the one whose heads run in ONNX Runtime. This measures the server's reported ``compute_s`` of
one cut-0 packet (sent as is, no shaping) after each of these, in interleaved rounds (a fresh random
order each round), the server pinned to its core and this client to the other, the idle cores
kept busy (``bench.harness.spin``), as in the grid:

- ``back-to-back``: nothing;
- ``sleep``: ``--gap-ms`` of sleep;
- ``busy``: ``--gap-ms`` of a pure-Python loop (the client's core busy, little memory traffic);
- ``torch``: the model's float forward pass in torch on the client (one thread, as the grid's
  device), repeated for ``--gap-ms`` (finishing the pass it is in).

Writes the per-condition median, quartiles and count of ``compute_s``, and of how long the
client's work before it took (``before``), through :func:`bench.write_json` with provenance. Run
it as the grid runs, under ``OMP_NUM_THREADS=1``. With the spinners on, ``sleep`` leaves the
client's core to a spinner, not halted.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch

from bench import write_json
from bench.e2e.artifacts import write_artifacts
from bench.e2e.grid import model_images
from bench.harness.loadgen import GENERATOR_CORE, start_server
from bench.harness.spin import IdleSpinners
from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan
from qpart.models.registry import get_model

PORT = 18520
CONDITIONS = ("back-to-back", "sleep", "busy", "torch")


def _repeat(work: Callable[[], object]) -> Callable[[float], None]:
    """A condition: ``work`` again and again until its seconds are up (finishing the one it is in)."""
    def run(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            work()
    return run


def measure(url: str, model: str, rounds: int, gap_s: float,
            rng: random.Random) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per condition, the server's ``compute_s`` of each cut-0 request, and how long the client's
    work before it took (``torch`` finishes the forward pass it is in, so it may run past the gap)."""
    info = httpx.get(f"{url}/v1/models/{model}", timeout=30).json()
    pattern = min((p for p in info["patterns"] if p["cut"] == 0 and p["level"] <= 0.01),
                  key=lambda p: p["activation_bits"])
    image = model_images(model, 1)
    packet = encode_for_plan(image, PacketFormat.model_validate(pattern))
    net = get_model(model).load().eval()
    x = torch.from_numpy(image)
    before: dict[str, Callable[[float], None]] = {
        "back-to-back": lambda s: None, "sleep": time.sleep, "busy": _repeat(lambda: None),
        "torch": _repeat(lambda: net(x))}
    out: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    took: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    order = list(CONDITIONS)
    with httpx.Client(timeout=30) as client, torch.inference_mode():
        for r in range(rounds + 5):  # the first 5 rounds warm up
            rng.shuffle(order)
            for c in order:
                start = time.perf_counter()
                before[c](gap_s)
                spent = time.perf_counter() - start
                answer = client.post(url + pattern["infer_url"], content=packet)
                answer.raise_for_status()
                if r >= 5:
                    out[c].append(float(answer.json()["compute_s"]))
                    took[c].append(spent)
    return out, took


def summary(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Median, quartiles (seconds) and count per condition."""
    out = {}
    for c, v in samples.items():
        q = statistics.quantiles(v, n=4)
        out[c] = {"median_s": statistics.median(v), "q1_s": q[0], "q3_s": q[2], "n": len(v)}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="fmnist-mobilenet")
    parser.add_argument("--rounds", type=int, default=60, help="measured rounds (after 5 to warm up)")
    parser.add_argument("--gap-ms", type=float, default=20.0,
                        help="how long the client does each condition's thing before a request, ms")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--no-spin", dest="spin", action="store_false",
                        help="let the cores halt when idle (the grid keeps them busy: bench.harness.spin)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    with IdleSpinners(enabled=args.spin), tempfile.TemporaryDirectory(prefix="qpart-tail-context-") as tmp:
        write_artifacts(args.artifacts, [args.model], Path(tmp))
        env = {"QPART_PORT": str(PORT), "QPART_TORCH_THREADS": "1"}
        server = start_server([sys.executable, "-m", "qpart", "serve", "--artifacts", tmp],
                              f"http://127.0.0.1:{PORT}", "/v2/health/ready", env)
        os.sched_setaffinity(0, {int(GENERATOR_CORE)})
        torch.set_num_threads(1)  # as the grid's device (bench.e2e.grid), one core
        try:
            samples, took = measure(server.url, args.model, args.rounds, args.gap_ms / 1e3, random.Random(0))
        finally:
            server.stop()
    doc: dict[str, Any] = {"model": args.model, "rounds": args.rounds, "gap_ms": args.gap_ms,
                           "spin": args.spin, "compute": summary(samples), "before": summary(took),
                           "samples_s": samples}
    write_json(args.json, doc)
    for c, s in doc["compute"].items():
        print(f"{c:>13}: median {s['median_s'] * 1e3:.3f} ms (quartiles {s['q1_s'] * 1e3:.3f}, "
              f"{s['q3_s'] * 1e3:.3f}; n {s['n']})", file=sys.stderr)


if __name__ == "__main__":
    main()
