"""The demo: start the server on the committed artifacts, run devices against it, print a table.

Each row is one device profile at one channel rate for one model: the plan the server chose, the
bytes that crossed the link, the predicted end-to-end time next to the measured one, and the
accuracy on the first test images, preprocessed as each model's card declares (fmnist-mobilenet:
RGB 64×64 with per-channel mean and std). The link here is loopback (not rate-shaped), so measured
transfer times are shorter than predicted at low rates; ``bench.e2e`` shapes the link for real.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from qpart.client.runtime import DeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.errors import CommandError
from qpart.models.data import Split
from qpart.models.registry import get_model
from qpart.models.sources import FashionMnistSource

DEVICES = ("raspberry-pi-4", "jetson-nano", "phone-soc")
RATES_MBPS = (1.0, 20.0, 100.0)
MODELS = ("fmnist-cnn", "fmnist-resnet", "fmnist-mobilenet")


def _test_images(model: str, images: int) -> tuple[np.ndarray, np.ndarray]:
    """The first test images as ``model``'s card preprocesses them, and their labels."""
    source = FashionMnistSource(Split.TEST, limit=images, spec=get_model(model).preprocess)
    batch = next(source.batches(images))
    return batch.images, np.asarray(batch.labels)


def _require_free(port: int) -> None:
    """Refuse a port something already listens on: its answers would pass for the demo server's."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise CommandError(f"port {port} on 127.0.0.1 is in use (another server?); stop it or pass "
                               "--port with a free one") from exc


def _start_server(artifacts: Path, port: int) -> subprocess.Popen[bytes]:
    _require_free(port)
    env = {**os.environ, "QPART_PORT": str(port), "QPART_HOST": "127.0.0.1"}
    proc = subprocess.Popen([sys.executable, "-m", "qpart", "serve", "--artifacts", str(artifacts)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CommandError("the demo server exited; run `qpart serve --artifacts artifacts` to see why")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise CommandError("the demo server did not become ready within 120 s")


def run_demo(artifacts: Path, images: int = 200, demand: float = 0.01, port: int = 8765) -> Table:
    """Run every (model, device, rate) once; returns the printed table."""
    console = Console(width=170)  # wide enough for every column when not writing to a terminal
    tests = {model: _test_images(model, images) for model in MODELS}
    table = Table(title=f"QPART demo: {images} Fashion-MNIST test images per row, demand {demand:.2%}")
    for col in ("model", "device", "rate", "cut", "level", "act bits", "weight bits (mean)",
                "bytes down", "bytes up", "predicted s", "measured s", "accuracy"):
        table.add_column(col, justify="right" if col not in ("model", "device") else "left")
    console.print(f"starting the server on 127.0.0.1:{port} with {artifacts} …")
    server = _start_server(artifacts, port)
    try:
        with tempfile.TemporaryDirectory() as cache:
            for model in MODELS:
                x, labels = tests[model]
                for device in DEVICES:
                    for rate in RATES_MBPS:
                        settings = DeviceSettings(server=f"http://127.0.0.1:{port}",
                                                  cache_dir=Path(cache) / device)
                        runtime = DeviceRuntime(settings, device=device)
                        try:
                            run = runtime.infer(x, model, demand, rate_bps=rate * 1e6)
                        finally:
                            runtime.close()
                        p = run.plan
                        bits = list(p.weight_bits.values())
                        acc = float(np.mean(np.array(run.predictions) == labels))
                        table.add_row(model, device, f"{rate:g} Mb/s", f"{p.cut}/{p.cuts - 1}",
                                      f"{p.level:.2%}", str(p.activation_bits),
                                      f"{np.mean(bits):.1f}" if bits else "-", str(run.downloaded_bytes),
                                      str(run.uploaded_bytes), f"{p.predicted.time_s.total:.3f}",
                                      f"{run.timings_s['total']:.3f}", f"{acc:.3f}")
    finally:
        server.terminate()
        server.wait(30)
    console.print(table)
    console.print("measured times are over loopback (no rate shaping); the server was stopped.")
    return table
